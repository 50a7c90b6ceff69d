"""The sampling kernel's CUDA source (ops/kernels/sample*.cu*) run on the CPU through the emulation
shim (tests/support/ops_emulation.py), driven by the real `sample_gpu` wrapper: its tokens and top
ids equal the numpy twin's bit for bit and its logprobs within 1e-4, as the `gpu` tests require on a
device.  So CI checks the kernel's logic (the radix searches, the candidate buffer and the multi-pass
path, penalties through the shared bitmap and the hash table, top-n, every dtype) on every change,
and a GPU session only has its speed left to measure.  One emulated CUDA thread is one host thread:
the batches are a few rows, in blocks of 256 threads (1024 on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from ops import sample as sp
from ops import sample_cuda
from tests.support.ops_emulation import HostDevice, emulated  # noqa: F401  (emulated: a pytest fixture)
from tests.support.ops_sample_reference import (
    assert_same,
    check_16bit,
    check_edge_cases,
    check_greedy_scan,
    check_sampled_split,
    check_split_gather_lists,
    make_batch,
    run_gpu,
)

EMULATED_THREADS = 256  # a block of 1024 host threads is ~10x slower to emulate; the kernel takes 128..1024


@pytest.fixture
def host(emulated, monkeypatch) -> HostDevice:  # noqa: F811  (the fixture imported above)
    """Kernels built and launched with EMULATED_THREADS threads a block (so the twin's results must
    not depend on the block size, as they must not on a GPU)."""
    build = sample_cuda.compile_options
    monkeypatch.setattr(sample_cuda, "compile_options", lambda dt: (*build(dt), f"-DTHREADS={EMULATED_THREADS}"))
    monkeypatch.setattr(sample_cuda, "THREADS", EMULATED_THREADS)
    return HostDevice(emulated)


@pytest.mark.parametrize("cap", [None, 0])  # None: on-chip candidates; 0: multi-pass over the row
@pytest.mark.parametrize("v_sz,scale", [(3000, 1.0), (3000, 12.0), (37, 2.0)])
def test_sample_source_emulated_equals_twin_fp32(host, cap, v_sz, scale) -> None:
    batch = make_batch(np.random.default_rng(v_sz + int(scale)), 4, v_sz, scale=scale, gen_len=12, n_eos=3)
    assert_same(run_gpu(host, batch, n_top=5, cap=cap), sp.sample_cpu(**batch, num_logprobs=5))


@pytest.mark.parametrize("cap", [None, 0])
def test_sample_source_emulated_edge_cases(host, cap) -> None:
    check_edge_cases(host, cap, v_sz=2000, big_k=1500, rows=4)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_sample_source_emulated_16bit(host, dtype) -> None:
    check_16bit(host, dtype, rows=4, v_sz=3001)


@pytest.mark.parametrize("dtype,v_sz", [("fp32", 20011), ("fp16", 4099), ("bf16", 37)])
def test_split_scan_emulated_equals_twin(host, dtype, v_sz) -> None:
    """Greedy rows split over several blocks (10 chunks at 20011 tokens, 2 at 4099, 1 at 37)."""
    check_greedy_scan(host, dtype, v_sz)


@pytest.mark.parametrize("dtype,v_sz,cap", [("fp32", 20011, None), ("fp32", 20011, 0), ("bf16", 9001, None)])
def test_sampled_split_emulated_equals_twin(host, dtype, v_sz, cap) -> None:
    """Sampled rows split over several blocks (10 chunks at 20011 tokens, 5 at 9001), the region
    from the chunks' lists or (cap 0, or a region past the lists) from the histograms alone."""
    check_sampled_split(host, dtype, v_sz, cap)


def test_split_gather_past_one_chunk_list_emulated_equals_twin(host, monkeypatch) -> None:
    """One SM: two rows of 24000 tokens in 4 chunks of 6144, so a chunk can hold more wanted tokens
    than its list (the first row) or fewer (the second)."""
    from ops import runtime

    monkeypatch.setattr(runtime, "sm_count", lambda: 1)
    check_split_gather_lists(host, rows=2, v_sz=24000)
