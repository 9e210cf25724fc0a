"""Epoch milliseconds as ``google.protobuf.Timestamp``: the one conversion every convert module needs.

Built from ``seconds``/``nanos`` directly rather than ``Timestamp.FromMilliseconds``: that
method is pure Python on top of the C message (about 2.5x the cost), and the scheduler
converts several timestamps per task event. The range check it does is kept.
"""

from __future__ import annotations

from typing import overload

from google.protobuf.timestamp_pb2 import Timestamp

# What a Timestamp can hold (0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999Z), as
# FromMilliseconds checks it.
MIN_MS = -62_135_596_800_000
MAX_MS = 253_402_300_799_999


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
    set_ts(stamp, ms)
    return stamp


def set_ts(field: Timestamp, ms: int) -> None:
    """Fill a message's Timestamp ``field`` with ``ms`` in place (no temporary message to copy).

    Assigning marks the field present, also for ``ms == 0``, as a set ``ts(0)`` would.
    """
    if not MIN_MS <= ms <= MAX_MS:
        raise ValueError(f"timestamp out of range: {ms} ms")
    field.seconds = ms // 1000
    field.nanos = ms % 1000 * 1_000_000
