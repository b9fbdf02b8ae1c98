"""Give back the pages of a read-only file mapping once their bytes are copied.

`torch.load(..., mmap=True)` maps a `.bin` file privately; every page a read
touches stays resident (and counts toward the process's peak RSS) until the map
goes away, so reading a 10 GB `.bin` tensor by tensor would end with 10 GB
resident. `madvise(MADV_DONTNEED)` on a clean page of a private file mapping
drops it: a later access reads the file again, so no data can change. On
anonymous memory the same call would zero the data, so a range is dropped only
when /proc/self/maps shows it inside a mapping of the expected file.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys

MADV_DONTNEED = 4
PAGE = mmap.PAGESIZE

_libc = None


def _madvise():
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            _libc.madvise.restype = ctypes.c_int
        except (OSError, AttributeError):
            _libc = False
    return _libc.madvise if _libc else None


def file_mappings(path) -> list[tuple[int, int]]:
    """Address ranges [start, end) where this process maps `path` (Linux only)."""
    if not sys.platform.startswith("linux"):
        return []
    target = os.path.realpath(path)
    ranges = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].rstrip("\n") == target:
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    ranges.append((lo, hi))
    except OSError:
        return []
    return ranges


def drop_pages(address: int, length: int, mappings: list[tuple[int, int]]) -> bool:
    """Drop the whole pages of [address, address + length) if they lie in one of `mappings`."""
    if length <= 0:
        return False
    madvise = _madvise()
    start = -(-address // PAGE) * PAGE            # round inward: never touch bytes outside the range
    end = (address + length) // PAGE * PAGE
    if madvise is None or end <= start:
        return False
    if not any(lo <= start and end <= hi for lo, hi in mappings):
        return False
    return madvise(start, end - start, MADV_DONTNEED) == 0
