"""Time-sortable UUIDv7 identifiers (RFC 9562).

Ids made in one process sort by creation: the 48-bit millisecond timestamp
leads, and a 12-bit counter (seeded randomly each millisecond) orders ids made
within the same millisecond.  Python 3.14 ships `uuid.uuid7`; we support 3.10.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

__all__ = ["uuid7"]

_lock = threading.Lock()
_last_ms = 0
_counter = 0
_new = object.__new__
_set = object.__setattr__
_UNKNOWN = uuid.SafeUUID.unknown


def uuid7() -> uuid.UUID:
    """Return a new UUIDv7, greater than every one this process made before."""
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms = ms
            # Seed in the lower half so a busy millisecond has room to count.
            _counter = int.from_bytes(os.urandom(2), "big") & 0x7FF
        else:
            _counter += 1
            if _counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                _last_ms += 1
                _counter = 0
        ms, counter = _last_ms, _counter
    rand_b = int.from_bytes(os.urandom(8), "big") & 0x3FFF_FFFF_FFFF_FFFF
    made = _new(uuid.UUID)
    # What `uuid.UUID(int=...)` stores, without its argument checks (a third of
    # the cost here): the value is 128 bits by construction.  Python 3.14's
    # `UUID._from_int` does the same.
    _set(made, "int", (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand_b)
    _set(made, "is_safe", _UNKNOWN)
    return made
