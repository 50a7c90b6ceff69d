"""worker/huge_pages.py and worker/params.py: a parameter file is read onto 2 MB pages, bytes
unchanged, each tensor 64-byte aligned, and the report says how much the kernel gave (its own
count, from smaps) or why not; `mapped_zeros` memory is resident only where written."""

from __future__ import annotations

import ctypes
import mmap
import platform

import numpy as np
import pytest

from spmd_serve.worker.huge_pages import HUGE_PAGE, collapse, huge_bytes, mapped_zeros, thp_mode, total
from spmd_serve.worker.malloc import rss_bytes
from spmd_serve.worker.params import PIECE, HostParams
from spmd_serve.worker.pdiparams import read_index
from tests.support.saved_graphs import save_tensors


def collapse_expected() -> bool:
    """This kernel has MADV_COLLAPSE (Linux 6.1) and THP is not off."""
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return (major, minor) >= (6, 1) and thp_mode() in ("always", "madvise")


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 24 MB parameter file, one tensor larger than a read piece, beside odd small ones."""
    rng = np.random.default_rng(1)
    tensors = {
        "w": rng.standard_normal((3000, 2001)).astype(np.float32),  # 24 MB, ends mid-page
        "q": rng.integers(-127, 128, (1001,), dtype=np.int8),
        "b": rng.standard_normal((7,)).astype(np.float32),
    }
    assert tensors["w"].nbytes > PIECE / 3
    return save_tensors(tmp_path_factory.mktemp("huge"), tensors)


@pytest.mark.parametrize("threads", [1, 3])
def test_a_parameter_file_is_read_onto_huge_pages_unchanged(big, threads, monkeypatch):
    monkeypatch.setattr("spmd_serve.worker.params.PIECE", 5 << 20)  # the 24 MB tensor in 5 pieces
    params = HostParams(huge_pages=True, threads=threads)
    arrays = params.arrays(big)
    raw = big.read_bytes()
    for a, e in zip(arrays, read_index(big)):
        assert a.ctypes.data % 64 == 0 and a.dtype == e.dtype and a.shape == e.dims
        assert a.tobytes() == raw[e.offset : e.offset + e.nbytes]
    done = total(params.collapsed)
    assert done.asked >= sum(a.nbytes for a in arrays)
    if collapse_expected():
        assert done.reason == "", done.line()
        # all on 2 MB pages as read (advised first), by the kernel's own count: nothing left to move
        assert done.huge == done.asked == done.as_loaded
        lo = min(a.ctypes.data for a in arrays)
        assert huge_bytes(lo - lo % HUGE_PAGE, lo - lo % HUGE_PAGE + done.asked) == done.huge
    else:
        assert done.huge == 0 and done.reason, done.line()
    mb = {k: getattr(done, k) >> 20 for k in ("huge", "asked", "as_loaded")}
    line = f"parameters on 2 MB pages: {mb['huge']} of {mb['asked']} MB ({mb['as_loaded']} MB as loaded"
    assert line in params.report()
    assert params.arrays(big)[0] is arrays[0]  # read once


def test_without_huge_pages_the_parameters_stay_on_4_kb_pages(big):
    params = HostParams(huge_pages=False)
    arrays = params.arrays(big)
    assert "2 MB" not in params.report() and params.collapsed == []
    lo = min(a.ctypes.data for a in arrays)
    if thp_mode() == "madvise":  # "always" would give them anyway
        assert huge_bytes(lo - lo % HUGE_PAGE, lo - lo % HUGE_PAGE + (32 << 20)) == 0


def test_mapped_zeros_are_resident_only_where_written():
    before = rss_bytes()
    buf = mapped_zeros(256 << 20)
    assert buf.size == 256 << 20 and buf.ctypes.data % HUGE_PAGE == 0 and not buf[:: 1 << 20].any()
    assert rss_bytes() - before < 16 << 20
    buf[: 8 << 20] = 1
    assert (8 << 20) <= rss_bytes() - before < 24 << 20


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
