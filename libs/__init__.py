"""Code shared by more than one taskgate process."""
