"""glibc malloc settings for the graph runtime, applied once per rank process before the graphs run.

Paddle's CPU allocator takes every intermediate tensor from malloc and frees it at once.  With
glibc's defaults a block above the mmap threshold (128 KiB, raised dynamically only up to the
largest block freed so far) is a fresh mmap, and freed memory at the top of the heap beyond the
trim threshold goes back to the kernel: either way the next step's tensor of the same size
page-faults in again and is zeroed by the kernel.  At batch 32 that was most of a gather's time
(a 4 MB past-K gather: 3-6 ms, 0.1-0.2 ms with the settings below; RESULTS.md "Speed change 3").

`tune_malloc` keeps every block on the heap and keeps up to `MALLOC_KEEP_BYTES` of freed heap
mapped, so steady-state steps reuse the same pages.  The mmap threshold can be raised only to 32 MiB,
and a 512-token prefill chunk of a 1B model already makes a larger tensor (gate|up: 512 x 16,384
floats), page-faulted in again every step (256 K faults a chunk); so mmap is switched off
(M_MMAP_MAX = 0): 1.07-1.09x that chunk, the same peak RSS (RESULTS.md "Session 44").
`SPMD_MALLOC_TUNING=0` leaves glibc's defaults (e.g. to compare, or under another allocator).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import json
import signal
import sys
from collections.abc import Callable

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # glibc <malloc.h>
MMAP_THRESHOLD_MAX = 32 << 20  # glibc refuses more on 64-bit (HEAP_MAX_SIZE / 2)
MALLOC_KEEP_BYTES = 1 << 30


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The C library (errno kept for `ctypes.get_errno`), None where none is found."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    except (OSError, TypeError):
        return None


def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's mallopt, typed; None when not glibc (musl, macOS)."""
    mallopt = getattr(libc(), "mallopt", None)
    if mallopt is not None:
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def tune_malloc() -> bool:
    """Apply the malloc settings above; False when not glibc (nothing changed)."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    # the threshold too: it also stops glibc's dynamic threshold from moving
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) and mallopt(M_MMAP_MAX, 0)
    # glibc takes the int as a size_t
    return bool(ok and mallopt(M_TRIM_THRESHOLD, MALLOC_KEEP_BYTES))


class _MallInfo2(ctypes.Structure):
    # glibc >= 2.33 <malloc.h> struct mallinfo2: every field a size_t
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_stats() -> dict[str, int] | None:
    """The process's malloc heap, all arenas summed (glibc's `mallinfo2`), or None without it.

    `in_use` is what the program holds (heap chunks + mmapped blocks): it grows only with live
    objects, so a leak shows here.  `free_held` is freed memory glibc keeps mapped for reuse
    (`MALLOC_KEEP_BYTES` allows up to 1 GiB of it per arena): it makes RSS grow without a leak.
    `top_free`: the free chunk at the main heap's top (the next blocks come from it first)."""
    fn = getattr(libc(), "mallinfo2", None)
    if fn is None:
        return None
    fn.restype = _MallInfo2
    m = fn()
    held = {"free_held": m.fordblks, "top_free": m.keepcost}
    return {"in_use": m.uordblks + m.hblkhd, **held, "mmapped": m.hblkhd, "heap": m.arena}


def rss_bytes() -> int:
    """This process's resident set (VmRSS), 0 where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def heap_report(who: str) -> dict[str, object]:
    """`heap_stats`, RSS and Python's own small-object count of this process (`who`: "rank0",
    "http1", ...), for the soak (benchmarks/soak.py) to tell a leak from retention: a C/C++ leak
    grows `in_use`, a Python one `py_blocks` (pymalloc's arenas are mmapped, outside malloc's
    counts); glibc keeping freed pages grows `free_held` only.  `gc_frozen`: the objects start-up left
    out of the collector's walks (gc.freeze: server.py, http_worker.py)."""
    py = {"py_blocks": sys.getallocatedblocks(), "gc_frozen": gc.get_freeze_count()}
    return {"who": who, "rss": rss_bytes(), **py, **(heap_stats() or {})}


def install_heap_report(who: str, signum: int = signal.SIGUSR2) -> None:
    """`kill -USR2 <pid>` prints `heap-report {json}` (`heap_report`) on the process's stderr.  The
    handler runs in the main thread between bytecodes (Python's signal handling), never inside a graph."""

    def report(_signum: int, _frame: object) -> None:
        print("heap-report " + json.dumps(heap_report(who)), file=sys.stderr, flush=True)

    signal.signal(signum, report)
