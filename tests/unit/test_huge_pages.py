"""worker/huge_pages.py: what a rank's heap grew by while its predictors loaded goes onto 2 MB pages,
bytes unchanged, and the report says how much the kernel moved (its own count, from smaps) or why
not.  Each case runs in a child process: the malloc settings and the collapse are process-wide."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import platform
import subprocess
import sys

from spmd_serve.worker.huge_pages import HUGE_PAGE, collapse, thp_mode

CHILD = """
import ctypes, json, sys, zlib
from spmd_serve.worker.malloc import tune_malloc
from spmd_serve.worker.huge_pages import HeapGrowth
def rollup():  # the process's anonymous huge pages, the kernel's sum over every mapping
    return next(int(l.split()[1]) << 10 for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages:"))
assert tune_malloc()
heap = HeapGrowth()
n = int(sys.argv[1])
buf = (ctypes.c_uint8 * n)()              # on the heap (tune_malloc: no mmapped blocks)
ctypes.memmove(buf, bytes(range(256)) * (n // 256), n)
before, huge_before = zlib.crc32(bytes(buf)), rollup()
done = heap.collapse()
lo, hi = ctypes.addressof(buf), ctypes.addressof(buf) + n
print(json.dumps({"asked": done.asked, "huge": done.huge, "reason": done.reason, "line": done.line(),
                  "inside": lo >= heap.start, "same": zlib.crc32(bytes(buf)) == before,
                  "rollup_grew": rollup() - huge_before}))
"""


def run_child(nbytes: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(nbytes)], capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def collapse_expected() -> bool:
    """This kernel has MADV_COLLAPSE (Linux 6.1) and THP is not off."""
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return (major, minor) >= (6, 1) and thp_mode() in ("always", "madvise")


def test_the_heaps_growth_goes_onto_huge_pages_unchanged():
    got = run_child(24 << 20)
    assert got["inside"] and got["same"]  # the buffer was the heap's growth, and its bytes survived
    assert got["asked"] >= 22 << 20  # the growth's whole 2 MB pages: the buffer, less its ragged ends
    if collapse_expected():
        assert got["reason"] == "", got["line"]
        assert got["huge"] == got["asked"]  # the kernel's count of the range, all of it
        assert got["rollup_grew"] == got["huge"]  # and the process's total grew by as much
    else:
        assert got["huge"] == 0 and got["reason"], got["line"]
    assert got["line"].startswith(f"parameters on 2 MB pages: {got['huge'] >> 20} of {got['asked'] >> 20} MB")


def test_a_range_without_a_whole_huge_page_is_left_alone():
    lo = 7 * HUGE_PAGE + 4096
    done = collapse(lo, lo + HUGE_PAGE)  # straddles a boundary: no whole 2 MB page inside, nothing asked
    assert (done.asked, done.huge, done.reason) == (0, 0, "no whole 2 MB page")


def test_a_range_the_process_does_not_map_reports_the_kernels_refusal():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = (
        ctypes.c_void_p,
        [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long],
    )
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = 3 * HUGE_PAGE
    lo = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert libc.munmap(lo, size) == 0  # an address range nothing maps now
    done = collapse(lo, lo + size)
    assert done.huge == 0 and done.asked >= HUGE_PAGE
    if thp_mode() in ("always", "madvise"):
        assert done.reason.startswith("MADV_HUGEPAGE: ENOMEM"), done.reason  # madvise's "not mapped"
