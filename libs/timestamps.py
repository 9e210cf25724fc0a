"""Epoch milliseconds as ``google.protobuf.Timestamp``: the one conversion every convert module needs."""

from __future__ import annotations

from typing import overload

from google.protobuf.timestamp_pb2 import Timestamp


@overload
def ts(ms: int) -> Timestamp: ...


@overload
def ts(ms: None) -> None: ...


@overload
def ts(ms: int | None) -> Timestamp | None: ...


def ts(ms: int | None) -> Timestamp | None:
    """A Timestamp for ``ms``; an absent time stays absent (the field is left unset)."""
    if ms is None:
        return None
    stamp = Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp
