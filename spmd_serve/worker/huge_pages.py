"""The parameters a rank loaded, moved onto 2 MB pages (transparent huge pages) once at start-up.

A decode step reads every weight once, so its speed is the memory's.  On the Zen 4 VM of sessions
52-54 a two-thread read of 4 KB pages ran at 38-51 GB/s and of 2 MB pages at 55-61 (in a VM a TLB
miss is a nested walk of the guest's and the host's tables, one per 64 lines on 4 KB pages); the
`--demo 1b` f32 batch-1 step ran 1.06-1.08x faster, 1.02-1.04x while the VM's memory was in its
slow state (benchmarks/RESULTS.md "Session 54").  llama.cpp's mmapped GGUF gets large page-cache
folios from the kernel; Paddle's parameters are malloc'd, and this machine's THP setting is
`madvise`, so they sat on 4 KB pages.

With worker/malloc.py's settings every block malloc makes comes from the brk heap, so what the
predictors loaded is the heap's growth while they loaded: `HeapGrowth` marks it and `collapse`
asks the kernel to move it onto huge pages (`madvise(MADV_HUGEPAGE)`, then `MADV_COLLAPSE`, Linux
6.1+: synchronous, 1.7-2.5 s a GB on this VM, mostly getting fresh 2 MB pages).  Best effort: the
kernel collapses what it can (ENOMEM where no free 2 MB page is left, EINVAL on kernels without it
or THP off) and the report says how much it did.  The weights' bytes, and so every result, are unchanged.
"""

from __future__ import annotations

import ctypes
import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from spmd_serve.worker.malloc import heap_stats, libc

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # <linux/mman.h>
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@dataclass(frozen=True)
class Collapsed:
    """What `collapse` did: `asked` bytes of the range (whole huge pages), `huge` of them now on
    huge pages (the kernel's count, /proc/self/smaps), in `seconds`; `reason` when not all."""

    asked: int
    huge: int
    seconds: float
    reason: str = ""

    def line(self) -> str:
        mb = 1 << 20
        why = f" ({self.reason})" if self.reason else ""
        return f"parameters on 2 MB pages: {self.huge // mb} of {self.asked // mb} MB in {self.seconds:.1f} s{why}"


def _libc() -> ctypes.CDLL | None:
    """malloc.py's C library with sbrk and madvise typed, None without them."""
    c = libc()
    if c is None or not hasattr(c, "sbrk") or not hasattr(c, "madvise"):
        return None
    c.sbrk.restype, c.sbrk.argtypes = ctypes.c_void_p, [ctypes.c_long]
    c.madvise.restype, c.madvise.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return c


def thp_mode() -> str:
    """The kernel's THP setting (always / madvise / never), "" where it has none."""
    try:
        text = THP_ENABLED.read_text()
    except OSError:
        return ""
    return text[text.find("[") + 1 : text.find("]")] if "[" in text else ""


def huge_bytes(lo: int, hi: int) -> int:
    """Bytes of [lo, hi) on anonymous huge pages: the AnonHugePages of the mappings inside it."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):  # a mapping's first line: start-end perms ...
                start, end = (int(x, 16) for x in head.split("-"))
                inside = lo <= start and end <= hi
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1]) * 1024
    return total


def collapse(lo: int, hi: int) -> Collapsed:
    """Put the whole huge pages of [lo, hi) on huge pages (see the module docstring)."""
    a, b = -(-lo // HUGE_PAGE) * HUGE_PAGE, hi // HUGE_PAGE * HUGE_PAGE  # [a, b): the whole 2 MB pages inside
    c, mode = _libc(), thp_mode()
    if b <= a or c is None or mode in ("", "never"):
        reason = "no whole 2 MB page" if b <= a else "no libc" if c is None else f"THP is '{mode or 'absent'}'"
        return Collapsed(max(b - a, 0), 0, 0.0, reason)
    t = time.perf_counter()
    reason = ""
    # the first keeps the range eligible for huge pages after; the second does the work
    for advice, name in ((MADV_HUGEPAGE, "MADV_HUGEPAGE"), (MADV_COLLAPSE, "MADV_COLLAPSE")):
        if c.madvise(a, b - a, advice) != 0:
            err = ctypes.get_errno()
            reason = f"{name}: {errno.errorcode.get(err, err)}, {os.strerror(err)}"
            break
    return Collapsed(b - a, huge_bytes(a, b), time.perf_counter() - t, reason)


class HeapGrowth:
    """The brk heap's top when made; `collapse()` moves what the heap grew since onto huge pages.
    The free chunk at the top counts as growth: the next blocks are carved from it first."""

    def __init__(self) -> None:
        self._libc = _libc()
        stats = heap_stats()
        self.start = self._top() - (stats["top_free"] if stats else 0)

    def _top(self) -> int:
        return self._libc.sbrk(0) if self._libc is not None else 0

    def collapse(self) -> Collapsed:
        return collapse(self.start, self._top())
