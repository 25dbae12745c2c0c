"""The driver's freed memory handed back to the system as trials end.

A campaign's driver runs for days; each trial's end has the callbacks (records, retention, trackers) and the
monitor read and rebuild tables over every record, and glibc keeps the pages those passes freed in its arenas:
the driver's resident memory grows with the campaign's trials though the objects are gone
(benchmarks/README.md, "Driver scale"). `malloc_trim(0)` returns every whole free page of every arena
(glibc >= 2.8: not only the top of the heap); elsewhere (another libc, another system) nothing is done.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import time
from functools import lru_cache

MIN_INTERVAL_S = 5.0   # a trim walks every arena: at most this often, whatever the rate trials end at

_last = 0.0


@lru_cache(maxsize=1)
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):   # no such library, or a libc without malloc_trim (musl, macOS)
        return None


def release_freed() -> bool:
    """Hand the pages the process freed back to the system, at most every MIN_INTERVAL_S; whether it did."""
    global _last
    trim = _malloc_trim()
    now = time.monotonic()
    if trim is None or now - _last < MIN_INTERVAL_S:
        return False
    _last = now
    trim(0)
    return True
