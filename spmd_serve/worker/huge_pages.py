"""The parameters a rank loads, on 2 MB pages (transparent huge pages).

A decode step reads every weight once, so its speed is the memory's.  On the Zen 4 VM of sessions
52-54 a two-thread read of 4 KB pages ran at 38-51 GB/s and of 2 MB pages at 55-61 (in a VM a TLB
miss is a nested walk of the guest's and the host's tables, one per 64 lines on 4 KB pages); the
`--demo 1b` f32 batch-1 step ran 1.06-1.08x faster, 1.02-1.04x while the VM's memory was in its
slow state (benchmarks/RESULTS.md "Session 54").  llama.cpp's mmapped GGUF gets large page-cache
folios from the kernel; the parameters Paddle's predictors malloc'd sat on 4 KB pages (this
machine's THP setting is `madvise`) until session 54.

worker/params.py reads each parameter file into an anonymous mapping of its own, advised
`MADV_HUGEPAGE` (`advise`) before anything is written to it, so the reads' page faults map 2 MB
pages; `collapse` after the read moves whatever still sits on 4 KB pages (`MADV_COLLAPSE`, Linux
6.1+).  (Until session 56 Paddle's predictors read the parameters into the malloc heap, and a
reserve grown at the heap's top before they loaded was advised instead.)

Start-up cost (session 55, RESULTS.md): a 2 MB page the kernel hands out at first write costs
0.13-0.23 s a GB, against 0.46 for 4 KB pages and 0.26-0.29 more to collapse those after.  This VM
has KVM's free page reporting: free 2 MB blocks go back to the host a few seconds after they are
freed, and the first write to one then pays the host's fault, 1.7-2.3 s a GB (4 KB pages come from
smaller blocks, never reported: 0.46 either way).  Served `--demo 1b` f32 (4 GB), each start 10 s
after the last, was ready in 9.8-10.5 s with the heap reserve, 12.5-13.6 loading onto 4 KB pages
and collapsing after, 3.3-3.6 with `SPMD_HUGE_PAGES=0`; started right after another server had freed
its memory, 2.9-11.3 s (median 6.9, against 9.4 collapsing after).  Faulting the reserve in beforehand on two
threads (MADV_POPULATE_WRITE) did not help served (5.5-10.3 s).  Best effort: the kernel gives what
it can (ENOMEM where no free 2 MB page is left, EINVAL on kernels without it or THP off) and the
report says how much it did.  The weights' bytes, and so every result, are unchanged.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spmd_serve.worker.malloc import libc

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
    """malloc.py's C library with madvise typed, None without it."""
    c = libc()
    if c is None or not hasattr(c, "madvise"):
        return None
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
    t, before = time.perf_counter(), huge_bytes(a, b)
    reason = ""
    # the first keeps the range eligible for huge pages after; the second does the work
    for advice, name in ((MADV_HUGEPAGE, "MADV_HUGEPAGE"), (MADV_COLLAPSE, "MADV_COLLAPSE")):
        if c.madvise(a, b - a, advice) != 0:
            err = ctypes.get_errno()
            reason = f"{name}: {errno.errorcode.get(err, err)}, {os.strerror(err)}"
            break
    return Collapsed(b - a, huge_bytes(a, b), time.perf_counter() - t, reason, before)


def advise(lo: int, hi: int, advice: int) -> bool:
    """madvise the whole pages of [lo, hi); False where it failed or there is no libc (best effort:
    the bytes are the same either way)."""
    c = _libc()
    a, b = -(-lo // 4096) * 4096, hi // 4096 * 4096
    return c is not None and b > a and c.madvise(a, b - a, advice) == 0


def total(parts: list[Collapsed]) -> Collapsed:
    """Several ranges' `collapse` results as one (the first reason given, if any)."""
    reason = next((p.reason for p in parts if p.reason), "")
    asked, huge, seconds = (sum(getattr(p, f) for p in parts) for f in ("asked", "huge", "seconds"))
    return Collapsed(asked, huge, seconds, reason, sum(p.as_loaded for p in parts))


def mapped_zeros(nbytes: int, huge_pages: bool = False) -> np.ndarray:
    """[nbytes rounded up to whole 2 MB pages] uint8 zeros starting on a 2 MB boundary, in a private
    anonymous mapping of their own, resident only where written (a calloc'd block can be a freed
    one, which glibc zeroes by writing it all); `huge_pages`: advised `MADV_HUGEPAGE` before any
    write.  The array keeps the mapping alive."""
    size = max(-(-nbytes // HUGE_PAGE), 1) * HUGE_PAGE
    # private: a shared anonymous mapping is shmem, whose huge pages are off by default
    raw = np.frombuffer(mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.uint8)
    skip = -raw.ctypes.data % HUGE_PAGE
    out = raw[skip : skip + size]
    if huge_pages:
        advise(out.ctypes.data, out.ctypes.data + size, MADV_HUGEPAGE)  # the first writes map 2 MB pages
    return out
