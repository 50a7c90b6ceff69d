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
from spmd_serve.worker.malloc import MALLOC_KEEP_BYTES

CHILD = """
import ctypes, json, sys, zlib
from spmd_serve.worker.malloc import tune_malloc
from spmd_serve.worker.huge_pages import HeapGrowth
def rollup():  # the process's anonymous huge pages, the kernel's sum over every mapping
    return next(int(l.split()[1]) << 10 for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages:"))
PATTERN = bytes(range(256)) * 4096  # 1 MB, allocated before the heap is marked
def written(n):  # a block on the heap (tune_malloc: no mmapped blocks), every byte written, no temporaries
    buf = (ctypes.c_uint8 * n)()
    for off in range(0, n, len(PATTERN)):
        ctypes.memmove(ctypes.addressof(buf) + off, PATTERN, len(PATTERN))
    return buf
assert tune_malloc()
n, reserve = int(sys.argv[1]), int(sys.argv[2])
huge_at_start = rollup()
heap = HeapGrowth(reserve)
buf = written(n)
before, huge_before = zlib.crc32(buf), rollup()
done = heap.collapse()
huge_after = rollup()
later = written(n)  # the heap's growth after: 4 KB pages, as without a reserve
lo, hi = ctypes.addressof(buf), ctypes.addressof(buf) + n
print(json.dumps({"asked": done.asked, "huge": done.huge, "reason": done.reason, "line": done.line(),
                  "as_loaded": done.as_loaded,
                  "inside": lo >= heap.start, "same": zlib.crc32(buf) == before,
                  "huge_as_written": huge_before - huge_at_start, "rollup_grew": huge_after - huge_at_start,
                  "later_grew": rollup() - huge_after}))
"""


def run_child(nbytes: int, reserve: int = 0) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(nbytes), str(reserve)],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def collapse_expected() -> bool:
    """This kernel has MADV_COLLAPSE (Linux 6.1) and THP is not off."""
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return (major, minor) >= (6, 1) and thp_mode() in ("always", "madvise")


def check_on_huge_pages(got: dict, nbytes: int) -> None:
    """The buffer was the heap's growth, its bytes survived, and the kernel counts the report's pages."""
    assert got["inside"] and got["same"]
    assert got["asked"] >= nbytes - HUGE_PAGE  # the growth's whole 2 MB pages: the buffer, less its ragged ends
    if collapse_expected():
        assert got["reason"] == "", got["line"]
        assert got["huge"] == got["asked"]  # the kernel's count of the range, all of it
        assert got["rollup_grew"] == got["huge"]  # and the process's total grew by as much
    else:
        assert got["huge"] == 0 and got["reason"], got["line"]
    mb = {k: got[k] >> 20 for k in ("huge", "asked", "as_loaded")}
    head = f"parameters on 2 MB pages: {mb['huge']} of {mb['asked']} MB ({mb['as_loaded']} MB as loaded"
    assert got["line"].startswith(head), got["line"]


def test_the_heaps_growth_goes_onto_huge_pages_unchanged():
    got = run_child(24 << 20)
    check_on_huge_pages(got, 24 << 20)
    assert got["huge_as_written"] == got["as_loaded"] == 0  # 4 KB pages until the collapse moved them


def test_with_a_reserve_the_growth_is_written_onto_huge_pages_and_the_rest_stays_on_4_kb_pages():
    # more than the load, as served, and more than glibc keeps of a freed top (MALLOC_KEEP_BYTES):
    # address space only, its untouched rest costs no memory
    got = run_child(24 << 20, reserve=MALLOC_KEEP_BYTES + (64 << 20))
    check_on_huge_pages(got, 24 << 20)
    if collapse_expected():
        # on 2 MB pages as written, and the report says so: nothing was left to move
        assert got["huge_as_written"] == got["as_loaded"] == got["huge"]
    assert got["later_grew"] == 0  # the reserve's unused rest went back to 4 KB pages


def test_a_reserve_short_of_the_load_still_ends_with_all_of_it_on_huge_pages():
    got = run_child(24 << 20, reserve=8 << 20)  # the collapse moves what went past the reserve
    check_on_huge_pages(got, 24 << 20)


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
