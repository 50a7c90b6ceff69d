"""glibc malloc settings for the graph runtime, applied once per rank process before the graphs run.

Paddle's CPU allocator takes every intermediate tensor from malloc and frees it at once.  With
glibc's defaults a block above the mmap threshold (128 KiB, raised dynamically only up to the
largest block freed so far) is a fresh mmap, and freed memory at the top of the heap beyond the
trim threshold goes back to the kernel: either way the next step's tensor of the same size
page-faults in again and is zeroed by the kernel.  At batch 32 that was most of a gather's time
(a 4 MB past-K gather: 3-6 ms, 0.1-0.2 ms with the settings below; RESULTS.md "Speed change 3").

`tune_malloc` keeps blocks up to 32 MiB (glibc's maximum) on the heap and keeps up to
`MALLOC_KEEP_BYTES` of freed heap mapped, so steady-state steps reuse the same pages.
`SPMD_MALLOC_TUNING=0` leaves glibc's defaults (e.g. to compare, or under another allocator).
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>
MMAP_THRESHOLD_MAX = 32 << 20  # glibc refuses more on 64-bit (HEAP_MAX_SIZE / 2)
MALLOC_KEEP_BYTES = 1 << 30


def tune_malloc() -> bool:
    """Apply the malloc settings above; False when not glibc (nothing changed)."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) and mallopt(M_TRIM_THRESHOLD, MALLOC_KEEP_BYTES))
