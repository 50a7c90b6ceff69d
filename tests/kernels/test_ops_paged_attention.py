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

from ops import paged_attention as pa
from ops import runtime
from tests.support.attention_cases import check_against_twin, make_case, pool_scale, quantize_pool
from tests.support.ops_emulation import HostDevice, emulated  # noqa: F401  (emulated: a pytest fixture)
from tests.support.ops_helpers import ARCHS, assert_compiles, cupy_device, needs_gpu, tmp_kernel_cache  # noqa: F401  (pytest fixtures)


def reference_attention(q, k_cache, v_cache, tables, lens, k_scale=None, v_scale=None):
    """Obviously-correct loop: per sequence, query head and token, in float64."""
    b_sz, q_heads, hd = q.shape
    kv_heads, bs = k_cache.shape[1], k_cache.shape[2]  # [NB, kvh, bs, D]
    out = np.zeros((b_sz, q_heads, hd))
    for b in range(b_sz):
        for h in range(q_heads):
            kvh = h // (q_heads // kv_heads)
            scores, values = [], []
            for t in range(int(lens[b])):
                blk, off = tables[b, t // bs], t % bs
                key = k_cache[blk, kvh, off].astype(np.float64) * (1.0 if k_scale is None else k_scale[kvh])
                values.append(v_cache[blk, kvh, off].astype(np.float64) * (1.0 if v_scale is None else v_scale[kvh]))
                scores.append(float(q[b, h].astype(np.float64) @ key) / math.sqrt(hd))
            if scores:
                w = np.exp(np.array(scores) - max(scores))
                out[b, h] = (w[:, None] * np.array(values)).sum(0) / w.sum()
    return out


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
        np.testing.assert_allclose(got[b], np.repeat(v[tables[b, 0], :, 0], 2, axis=0), rtol=1e-6)


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
    ks, vs = pool_scale(k), pool_scale(v)
    k8, v8 = quantize_pool(k, ks), quantize_pool(v, vs)
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
    def choose(batch: int, context: int, wave: int = 792, block_size: int = 64) -> int:
        return pa.choose_partition_blocks(batch, 8, block_size, context, sm_count=132, wave=wave)

    # the tensor-core kernel (6 CTAs an SM on an H200: a wave of 792)
    assert choose(64, 512) == 0  # short context: one pass
    assert choose(64, 1024) == 16  # one 1024-token partition: 512 CTAs
    assert choose(256, 4096) == 16  # the split however many CTAs
    assert choose(16, 1024) == 4  # 128 CTAs, 256 at 8 blocks: fewer than 3 an SM
    assert choose(1, 4096) == 4  # 128 CTAs, but partitions no shorter than 256 tokens
    assert choose(64, 2048) == 8  # 1024 CTAs at 16 blocks: just past a wave
    assert choose(2, 32768) == 16  # 32 partitions x 16 CTAs
    assert choose(2, 32768, block_size=1024) == 1
    # the CUDA-core kernel: one pass once (sequence, KV head) CTAs fill two an SM
    assert choose(64, 2048, wave=0) == 0
    assert choose(2, 32768, wave=0) == 8  # 512-token partitions
    assert choose(2, 32768, wave=0, block_size=1024) == 1


# ----------------------------------------------------------------------------- NVRTC compile (CI)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("label", list(pa.VARIANTS))
def test_every_kernel_compiles(label, arch) -> None:
    assert_compiles(pa, label, arch)


@pytest.mark.parametrize("head_dim,group", [(64, 1), (256, 8)])
def test_other_attention_shapes_compile(head_dim, group) -> None:
    options = pa.compile_options("fp16", False, head_dim, group)
    assert runtime.compile_cubin(pa.SOURCE, "paged_attention", "sm_90", options)


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


# ----------------------------------------------------------------------------- CUDA source on the CPU
@pytest.mark.parametrize("dtype,kv_int8,group,head_dim", [("fp16", False, 4, 128), ("bf16", True, 2, 64)])
def test_paged_attention_source_emulated(emulated, dtype, kv_int8, group, head_dim) -> None:
    """The CUDA-core kernels (the default for fp32 queries and int8 pools)."""
    case = make_case(np.random.default_rng(10), [1, 16, 21, 0, 50], kv_heads=2, group=group, head_dim=head_dim)
    with pa.tuning(MMA=0):
        for partition_blocks in (0, 2):  # single pass, then split-K + reduce
            check_against_twin(HostDevice(emulated), case, dtype, kv_int8, partition_blocks)
