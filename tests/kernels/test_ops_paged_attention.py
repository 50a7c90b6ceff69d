"""ops.paged_attention.

CI (no GPU): the numpy twin against a plain per-token loop reference (float64) on random inputs,
edge cases included (context length 1 and 0, last block partly / exactly filled, GQA groups 1/4/8,
int8 KV); split-K twin == single-pass twin; the partition heuristic; every dtype x int8-KV variant
compiles with NVRTC for sm_80 and sm_90; the CUDA source run on the CPU emulation
(tests/support/ops_emulation.py) equals the twin.
GPU (marked `gpu`, skipped without one): every kernel against its twin; tolerances relative to the
output's max magnitude: fp32 1e-4, fp16 2e-3, bf16 2e-2.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ops import kv_cache_write as kvw
from ops import paged_attention as pa
from ops import runtime
from tests.support.ops_emulation import HostDevice, emulated  # noqa: F401  (emulated: a pytest fixture)
from tests.support.ops_helpers import (  # noqa: F401  (pytest fixtures)
    ARCHS,
    assert_compiles,
    cupy_device,
    from_storage,
    needs_gpu,
    tmp_kernel_cache,
    to_storage,
)

TOL = {"fp32": 1e-4, "fp16": 2e-3, "bf16": 2e-2}


def make_case(rng, lens, kv_heads, group, head_dim=32, block_size=8, spare_blocks=3):
    """Random query + pools + shuffled block tables for sequences of the given context lengths."""
    b = len(lens)
    max_blocks = max(1, max(-(-n // block_size) for n in lens))
    num_blocks = b * max_blocks + spare_blocks
    q = rng.standard_normal((b, kv_heads * group, head_dim)).astype(np.float32)
    k = rng.standard_normal((num_blocks, block_size, kv_heads, head_dim)).astype(np.float32)
    v = rng.standard_normal((num_blocks, block_size, kv_heads, head_dim)).astype(np.float32)
    tables = rng.permutation(num_blocks)[: b * max_blocks].reshape(b, max_blocks).astype(np.int32)
    return q, k, v, tables, np.array(lens, np.int32)


def reference_attention(q, k_cache, v_cache, tables, lens, k_scale=None, v_scale=None):
    """Obviously-correct loop: per sequence, query head and token, in float64."""
    b_sz, q_heads, hd = q.shape
    bs, kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = np.zeros((b_sz, q_heads, hd))
    for b in range(b_sz):
        for h in range(q_heads):
            kvh = h // (q_heads // kv_heads)
            scores, values = [], []
            for t in range(int(lens[b])):
                blk, off = tables[b, t // bs], t % bs
                key = k_cache[blk, off, kvh].astype(np.float64) * (1.0 if k_scale is None else k_scale[kvh])
                values.append(v_cache[blk, off, kvh].astype(np.float64) * (1.0 if v_scale is None else v_scale[kvh]))
                scores.append(float(q[b, h].astype(np.float64) @ key) / math.sqrt(hd))
            if scores:
                w = np.exp(np.array(scores) - max(scores))
                out[b, h] = (w[:, None] * np.array(values)).sum(0) / w.sum()
    return out


def check_against_twin(device, case, dtype: str, kv_int8: bool, partition_blocks: int | None) -> None:
    """paged_attention_gpu on `case` (make_case's arrays) stored as `dtype` (int8 pools with per-head
    scales) and placed by `device` (put / get: a GPU, or the emulation's HostDevice) equals the twin
    within TOL[dtype] of the output's largest magnitude."""
    q, k, v, tables, cl = case
    qs, qv = to_storage(q, dtype)
    if kv_int8:
        scales = [(np.abs(x).max(axis=(0, 1, 3)) / 127).astype(np.float32) for x in (k, v)]
        k_st, v_st = (kvw.quantize_int8(x, s) for x, s in zip((k, v), scales))
        k_val, v_val = k_st, v_st
    else:
        scales = [None, None]
        (k_st, k_val), (v_st, v_val) = to_storage(k, dtype), to_storage(v, dtype)
    out = device.put(np.full(q.shape, 3, qs.dtype))
    pa.paged_attention_gpu(
        *map(device.put, (qs, k_st, v_st, tables, cl)),
        *[device.put(s) if s is not None else None for s in scales],
        out=out,
        partition_blocks=partition_blocks,
        max_context_len=int(cl.max()),
    )
    want = pa.paged_attention_cpu(qv, k_val, v_val, tables, cl, *scales)
    err = np.abs(from_storage(device.get(out), dtype) - want).max() / np.abs(want).max()
    assert err <= TOL[dtype], f"partition_blocks={partition_blocks}: max error {err:.2e} (tolerance {TOL[dtype]})"


# ----------------------------------------------------------------------------- twin
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("lens", [[1], [8, 1, 13], [16, 5, 24, 3]], ids=["len1", "mixed", "full+partial"])
def test_paged_attention_twin_matches_loop(group, lens) -> None:
    rng = np.random.default_rng(group * 100 + len(lens))
    q, k, v, tables, cl = make_case(rng, lens, kv_heads=2, group=group)
    got = pa.paged_attention(q, k, v, tables, cl)  # numpy input: dispatches to the twin
    assert got.shape == q.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, reference_attention(q, k, v, tables, cl), rtol=1e-5, atol=1e-5)


def test_paged_attention_twin_context_len_one_returns_that_value() -> None:
    rng = np.random.default_rng(3)
    q, k, v, tables, cl = make_case(rng, [1, 1], kv_heads=2, group=2)
    got = pa.paged_attention_cpu(q, k, v, tables, cl)
    for b in range(2):  # softmax over a single token is 1: the output is its V row
        np.testing.assert_allclose(got[b], np.repeat(v[tables[b, 0], 0], 2, axis=0), rtol=1e-6)


def test_paged_attention_twin_zero_context_and_out_argument() -> None:
    rng = np.random.default_rng(4)
    q, k, v, tables, cl = make_case(rng, [0, 7], kv_heads=1, group=4)
    out = np.full(q.shape, 9.0, np.float16)
    assert pa.paged_attention_cpu(q, k, v, tables, cl, out=out) is out
    assert np.all(out[0] == 0)
    np.testing.assert_allclose(out[1], reference_attention(q, k, v, tables, cl)[1], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("group", [1, 4])
def test_paged_attention_twin_int8_kv(group) -> None:
    rng = np.random.default_rng(5)
    q, k, v, tables, cl = make_case(rng, [19, 1, 8], kv_heads=2, group=group)
    ks = (np.abs(k).max(axis=(0, 1, 3)) / 127).astype(np.float32)
    vs = (np.abs(v).max(axis=(0, 1, 3)) / 127).astype(np.float32)
    k8, v8 = kvw.quantize_int8(k, ks), kvw.quantize_int8(v, vs)
    got = pa.paged_attention_cpu(q, k8, v8, tables, cl, ks, vs)
    np.testing.assert_allclose(got, reference_attention(q, k8, v8, tables, cl, ks, vs), rtol=1e-5, atol=1e-5)
    # and close to the unquantised attention (the int8 error is a few scale steps)
    np.testing.assert_allclose(got, reference_attention(q, k, v, tables, cl), atol=0.1)


@pytest.mark.parametrize("partition_blocks", [1, 2, 3])
def test_split_k_twin_equals_single_pass(partition_blocks) -> None:
    rng = np.random.default_rng(6)
    q, k, v, tables, cl = make_case(rng, [1, 8, 9, 40, 23, 0], kv_heads=2, group=4)
    single = pa.paged_attention_cpu(q, k, v, tables, cl, partition_blocks=0)
    split = pa.paged_attention_cpu(q, k, v, tables, cl, partition_blocks=partition_blocks)
    np.testing.assert_allclose(split, single, rtol=1e-5, atol=1e-6)


def test_partition_heuristic() -> None:
    assert pa.choose_partition_blocks(64, 8, 64, 2048, sm_count=132) == 0  # 512 CTAs fill the GPU
    assert pa.choose_partition_blocks(1, 8, 64, 256, sm_count=132) == 0  # short context: one pass
    assert pa.choose_partition_blocks(2, 8, 64, 32768, sm_count=132) == 8  # 512-token partitions
    assert pa.choose_partition_blocks(2, 8, 1024, 32768, sm_count=132) == 1


# ----------------------------------------------------------------------------- NVRTC compile (CI)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("label", list(pa.VARIANTS))
def test_every_kernel_compiles(label, arch) -> None:
    assert_compiles(pa, label, arch)


@pytest.mark.parametrize("head_dim,group", [(64, 1), (256, 8)])
def test_other_attention_shapes_compile(head_dim, group) -> None:
    options = pa.compile_options("fp16", False, head_dim, group)
    assert runtime.compile_cubin(pa.SOURCE, "paged_attention", "sm_90", options)


# the tuning variants ops.bench times (pa.TUNING knobs; ops.bench.VARIANTS); the defaults are the source's
TUNINGS = [
    {"TILE_SOFTMAX": 0},
    {"UNROLL": 4},
    {"UNROLL": 1, "NUM_THREADS": 256},
    {"NUM_THREADS": 512},
    {"RESCALE_SLACK": 8},
    {"NUM_THREADS": 256, "TILE_SOFTMAX": 1, "RESCALE_SLACK": 8},
    {"UNROLL": 8, "TILE_SOFTMAX": 1, "RESCALE_SLACK": 4},
    {"MMA": 1},
]
TUNING_IDS = [pa.describe_tuning(k).replace(" ", "-") for k in TUNINGS]


def sharp_case(seed: int, lens: list[int], group: int, head_dim: int, block_size: int = 8) -> tuple:
    """make_case with scores spread over ~±30 log2 units: the running max moves many times (after
    the first token too), which RESCALE_SLACK's lazy rescale must get right."""
    q, k, v, tables, cl = make_case(np.random.default_rng(seed), lens, 2, group, head_dim, block_size)
    return q * 6, k, v, tables, cl


@pytest.mark.parametrize("kv_int8", [False, True])
@pytest.mark.parametrize("knobs", TUNINGS, ids=TUNING_IDS)
def test_tuning_variants_compile(knobs, kv_int8) -> None:
    with pa.tuning(**knobs):
        options = pa.compile_options("fp16", kv_int8)
    assert all(f"-D{k}={v}" in options for k, v in knobs.items())
    assert runtime.compile_cubin(pa.SOURCE, "paged_attention_split", "sm_90", options)


def test_unknown_tuning_knob_is_refused() -> None:
    with pytest.raises(ValueError, match="UNROL"), pa.tuning(UNROL=4):
        pass
    assert pa.TUNING["UNROLL"] == 2


# ----------------------------------------------------------------------------- GPU: kernel == twin
@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("kv_int8", [False, True])
@pytest.mark.parametrize("group,head_dim", [(1, 64), (4, 128), (8, 128)])
@pytest.mark.parametrize("partition_blocks", [0, 1, 3, None])
def test_paged_attention_gpu_equals_twin(cupy_device, dtype, kv_int8, group, head_dim, partition_blocks) -> None:
    rng = np.random.default_rng(8)
    lens = [1, 16, 17, 100, 300, 0, 63]  # single token, exactly full, partial last block, empty
    case = make_case(rng, lens, kv_heads=2, group=group, head_dim=head_dim, block_size=16)
    check_against_twin(cupy_device, case, dtype, kv_int8, partition_blocks)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("kv_int8", [False, True])
@pytest.mark.parametrize("group", [4, 8])
@pytest.mark.parametrize("knobs", TUNINGS, ids=TUNING_IDS)
def test_tuning_variants_on_gpu_equal_twin(cupy_device, knobs, group, kv_int8) -> None:
    """Each variant ops.bench times gives the twin's output (single pass and split-K)."""
    case = sharp_case(11, [1, 16, 17, 100, 300, 0, 63], group, head_dim=128, block_size=16)
    with pa.tuning(**knobs):
        for partition_blocks in (0, None):
            check_against_twin(cupy_device, case, "fp16", kv_int8, partition_blocks)


# ----------------------------------------------------------------------------- CUDA source on the CPU
@pytest.mark.parametrize("dtype,kv_int8,group,head_dim", [("fp16", False, 4, 128), ("bf16", True, 2, 64)])
def test_paged_attention_source_emulated(emulated, dtype, kv_int8, group, head_dim) -> None:
    case = make_case(np.random.default_rng(10), [1, 16, 21, 0, 50], kv_heads=2, group=group, head_dim=head_dim)
    for partition_blocks in (0, 2):  # single pass, then split-K + reduce
        check_against_twin(HostDevice(emulated), case, dtype, kv_int8, partition_blocks)


EMULATED_TUNINGS = [
    {"UNROLL": 4, "TILE_SOFTMAX": 1},
    {"NUM_THREADS": 256, "RESCALE_SLACK": 8, "TILE_SOFTMAX": 0},
    {"TILE_SOFTMAX": 1, "RESCALE_SLACK": 4},
]


@pytest.mark.parametrize("knobs", EMULATED_TUNINGS, ids=pa.describe_tuning)
def test_tuning_variants_emulated(emulated, knobs) -> None:
    case = sharp_case(12, [1, 16, 21, 0, 50, 7], group=4, head_dim=64)
    with pa.tuning(**knobs):
        for partition_blocks in (0, 2):
            check_against_twin(HostDevice(emulated), case, "bf16", False, partition_blocks)


# the tensor-core path (MMA 1): fp16/bf16, head_dim 64/128, GROUP <= 16, blocks of a multiple of 16
MMA_CASES = [("fp16", False, 4, 64, 16), ("bf16", True, 16, 64, 32), ("fp16", True, 1, 128, 16)]


@pytest.mark.parametrize("dtype,kv_int8,group,head_dim,block_size", MMA_CASES)
def test_mma_path_emulated(emulated, dtype, kv_int8, group, head_dim, block_size) -> None:
    """Tiles cut by the context's end (17, 50), a context of one token and of none, single pass and
    split-K; scores spread wide so the running max moves."""
    q, k, v, tables, cl = make_case(np.random.default_rng(13), [1, 17, 50, 0, 33], 2, group, head_dim, block_size)
    with pa.tuning(MMA=1):
        assert "-DMMA=1" in pa.compile_options(dtype, kv_int8, head_dim, group, block_size)
        for partition_blocks in (0, 1):
            check_against_twin(HostDevice(emulated), (q * 4, k, v, tables, cl), dtype, kv_int8, partition_blocks)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("kv_int8", [False, True])
@pytest.mark.parametrize("group,head_dim", [(1, 128), (4, 128), (8, 64), (16, 128)])
@pytest.mark.parametrize("partition_blocks", [0, 1, None])
def test_mma_path_on_gpu_equals_twin(cupy_device, dtype, kv_int8, group, head_dim, partition_blocks) -> None:
    case = sharp_case(14, [1, 16, 17, 100, 300, 0, 63], group, head_dim, block_size=32)
    with pa.tuning(MMA=1):
        check_against_twin(cupy_device, case, dtype, kv_int8, partition_blocks)


def test_mma_applies_only_where_it_can() -> None:
    with pa.tuning(MMA=1):
        assert "-DMMA=0" in pa.compile_options("fp32", False, 128, 4, 16)  # fp32 queries: CUDA cores
        assert "-DMMA=0" in pa.compile_options("fp16", False, 256, 4, 16)  # registers: D <= 128
        assert "-DMMA=0" in pa.compile_options("fp16", False, 128, 4, 8)  # a tile spans blocks
        assert "-DMMA=0" in pa.compile_options("bf16", False, 128, 32, 16)  # 16 rows a tile
    assert "-DMMA=0" in pa.compile_options("fp16", False, 128, 4, 16)  # off by default
