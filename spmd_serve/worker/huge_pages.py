"""The parameters a rank loads, on 2 MB pages (transparent huge pages).

A decode step reads every weight once, so its speed is the memory's.  On the Zen 4 VM of sessions
52-54 a two-thread read of 4 KB pages ran at 38-51 GB/s and of 2 MB pages at 55-61 (in a VM a TLB
miss is a nested walk of the guest's and the host's tables, one per 64 lines on 4 KB pages); the
`--demo 1b` f32 batch-1 step ran 1.06-1.08x faster, 1.02-1.04x while the VM's memory was in its
slow state (benchmarks/RESULTS.md "Session 54").  llama.cpp's mmapped GGUF gets large page-cache
folios from the kernel; Paddle's parameters are malloc'd, and this machine's THP setting is
`madvise`, so they sat on 4 KB pages.

With worker/malloc.py's settings every block malloc makes comes from the brk heap, so what the
predictors load is the heap's growth while they load.  `HeapGrowth(reserve)`, made before they
load, grows the heap by the parameters' bytes at once (one malloc, freed: glibc keeps it as the
heap's free top while `keep_freed_top(True)`) and advises that untouched range `MADV_HUGEPAGE`, so
the parameters are written straight onto 2 MB pages as they load.  Its `collapse()` after the load
moves whatever still sits on 4 KB pages (`MADV_COLLAPSE`, Linux 6.1+).

Start-up cost (session 55, RESULTS.md): a 2 MB page the kernel hands out at first write costs
0.13-0.23 s a GB, against 0.46 for 4 KB pages and 0.26-0.29 more to collapse those after.  This VM
has KVM's free page reporting: free 2 MB blocks go back to the host a few seconds after they are
freed, and the first write to one then pays the host's fault, 1.7-2.3 s a GB (4 KB pages come from
smaller blocks, never reported: 0.46 either way).  Served `--demo 1b` f32 (4 GB), each start 10 s
after the last, was ready in 9.8-10.5 s this way, 12.5-13.6 loading onto 4 KB pages and collapsing
after, 3.3-3.6 with `SPMD_HUGE_PAGES=0`; started right after another server had freed its memory,
2.9-11.3 s (median 6.9, against 9.4 collapsing after).  Faulting the reserve in beforehand on two
threads (MADV_POPULATE_WRITE) did not help served (5.5-10.3 s).  Best effort: the kernel gives what
it can (ENOMEM where no free 2 MB page is left, EINVAL on kernels without it or THP off) and the
report says how much it did.  The weights' bytes, and so every result, are unchanged.
"""

from __future__ import annotations

import ctypes
import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from spmd_serve.worker.malloc import heap_stats, keep_freed_top, libc

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_COLLAPSE = 14, 15, 25  # <linux/mman.h>
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@dataclass(frozen=True)
class Collapsed:
    """What `collapse` did: `asked` bytes of the range (whole huge pages), `huge` of them now on
    huge pages (the kernel's count, /proc/self/smaps), `as_loaded` of those before it began (a
    reserve's), in `seconds`; `reason` when not all."""

    asked: int
    huge: int
    seconds: float
    reason: str = ""
    as_loaded: int = 0

    def line(self) -> str:
        mb = 1 << 20
        why = f" ({self.reason})" if self.reason else ""
        head = f"parameters on 2 MB pages: {self.huge // mb} of {self.asked // mb} MB"
        return f"{head} ({self.as_loaded // mb} MB as loaded, the rest moved) in {self.seconds:.1f} s{why}"


def _libc() -> ctypes.CDLL | None:
    """malloc.py's C library with sbrk and madvise typed, None without them."""
    c = libc()
    if c is None or not hasattr(c, "sbrk") or not hasattr(c, "madvise"):
        return None
    c.sbrk.restype, c.sbrk.argtypes = ctypes.c_void_p, [ctypes.c_long]
    c.madvise.restype, c.madvise.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    c.malloc.restype, c.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    c.free.restype, c.free.argtypes = None, [ctypes.c_void_p]
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
    t, before = time.perf_counter(), huge_bytes(a, b)
    reason = ""
    # the first keeps the range eligible for huge pages after; the second does the work
    for advice, name in ((MADV_HUGEPAGE, "MADV_HUGEPAGE"), (MADV_COLLAPSE, "MADV_COLLAPSE")):
        if c.madvise(a, b - a, advice) != 0:
            err = ctypes.get_errno()
            reason = f"{name}: {errno.errorcode.get(err, err)}, {os.strerror(err)}"
            break
    return Collapsed(b - a, huge_bytes(a, b), time.perf_counter() - t, reason, before)


class HeapGrowth:
    """The end of the brk heap's blocks when made; `collapse()` moves what the heap grew by since
    onto huge pages.

    `reserve` > 0 (the bytes about to load; tune_malloc's settings in force): the heap grows by that
    much now and the range is advised `MADV_HUGEPAGE` before anything is written to it (see the
    module docstring); glibc keeps it until `collapse()`.  Blocks are carved from free chunks below
    the top first: in a fresh rank they are a few MB, and what lands there stays on 4 KB pages."""

    def __init__(self, reserve: int = 0) -> None:
        self._libc = c = _libc()
        self.start = self._used_top()
        self._reserved = reserve > 0 and c is not None and thp_mode() != "never" and keep_freed_top(True)
        if self._reserved and c is not None:
            stats = heap_stats() or {"free_held": 0, "top_free": 0}
            # more than any free chunk below the top (together free_held - top_free), so carved from
            # the top and past it: sbrk, nothing touched
            block = c.malloc(max(reserve, stats["free_held"] - stats["top_free"] + HUGE_PAGE))
            c.free(block)  # back into the top chunk, which glibc now never trims
            a, b = -(-self.start // HUGE_PAGE) * HUGE_PAGE, self._top() // HUGE_PAGE * HUGE_PAGE
            if block and b > a:
                c.madvise(a, b - a, MADV_HUGEPAGE)  # the load's page faults now map 2 MB pages

    def _top(self) -> int:
        return self._libc.sbrk(0) if self._libc is not None else 0

    def _used_top(self) -> int:
        """The end of the heap's blocks: the top less its free chunk."""
        stats = heap_stats()
        return self._top() - (stats["top_free"] if stats else 0)

    def collapse(self) -> Collapsed:
        """The growth since made onto huge pages, up to the top's free chunk (never touched: nothing
        to move); with a reserve, up to the end of the last 2 MB page the blocks reach, and the rest
        of the reserve back on 4 KB pages, as the heap's later growth is (its own mapping, so smaps
        counts the parameters' alone).  glibc trims the heap's free top again as tune_malloc set."""
        end = self._used_top()
        if self._reserved and self._libc is not None:
            keep_freed_top(False)
            # that page's tail is the top's free chunk: ours (where the heap maps it: brk may end inside)
            end = min(-(-end // HUGE_PAGE) * HUGE_PAGE, self._top())
            if self._top() > end:
                self._libc.madvise(end, self._top() - end, MADV_NOHUGEPAGE)
        return collapse(self.start, end)
