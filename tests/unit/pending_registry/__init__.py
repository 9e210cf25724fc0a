"""Unit tests of the pending registry."""
