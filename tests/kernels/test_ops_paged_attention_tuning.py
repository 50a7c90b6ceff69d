"""ops.paged_attention's tuning knobs (pa.TUNING) and its tensor-core path (MMA).

CI: every variant ops.bench times compiles; the CUDA-core variants and the MMA path run on the CPU
emulation and equal the twin.  GPU (marked `gpu`): each variant and the MMA path (int8 pools too)
against the twin, on scores spread wide so the running max moves.
"""

from __future__ import annotations

import numpy as np
import pytest

from ops import paged_attention as pa
from ops import runtime
from tests.support.attention_cases import check_against_twin, make_case
from tests.support.ops_emulation import HostDevice, emulated  # noqa: F401  (emulated: a pytest fixture)
from tests.support.ops_helpers import cupy_device, needs_gpu  # noqa: F401  (pytest fixtures)

# the tuning variants ops.bench times (pa.TUNING knobs; ops.bench.VARIANTS); the defaults are the source's
TUNINGS = [
    {"TILE_SOFTMAX": 0},
    {"UNROLL": 4},
    {"UNROLL": 1, "NUM_THREADS": 256},
    {"NUM_THREADS": 512},
    {"RESCALE_SLACK": 8},
    {"NUM_THREADS": 256, "TILE_SOFTMAX": 1, "RESCALE_SLACK": 8},
    {"UNROLL": 8, "TILE_SOFTMAX": 1, "RESCALE_SLACK": 4},
    {"MMA": 0},
    {"MMA_THREADS": 32},
    {"MMA_THREADS": 128},
    {"MMA": 2},
]
TUNING_IDS = [pa.describe_tuning(k).replace(" ", "-") for k in TUNINGS]


def on_cuda_cores(knobs: dict[str, int]) -> dict[str, int]:
    """A variant of the CUDA-core kernel's knobs runs there for 16-bit pools too (MMA 0)."""
    return knobs if any(k.startswith("MMA") for k in knobs) else {"MMA": 0, **knobs}


def sharp_case(seed: int, lens: list[int], group: int, head_dim: int, block_size: int = 8) -> tuple:
    """make_case with scores spread over ~±30 log2 units: the running max moves many times (after
    the first token too), which RESCALE_SLACK's lazy rescale must get right."""
    q, k, v, tables, cl = make_case(np.random.default_rng(seed), lens, 2, group, head_dim, block_size)
    return q * 6, k, v, tables, cl


@pytest.mark.parametrize("kv_int8", [False, True])
@pytest.mark.parametrize("knobs", TUNINGS, ids=TUNING_IDS)
def test_tuning_variants_compile(knobs, kv_int8) -> None:
    with pa.tuning(**on_cuda_cores(knobs)):
        options, mma = pa.compile_options("fp16", kv_int8), pa.uses_mma("fp16", kv_int8, 128, 4, 16)
        threads = pa.TUNING["MMA_THREADS" if mma else "NUM_THREADS"]
    assert all(f"-D{k}={v}" in options for k, v in knobs.items() if not k.startswith("MMA"))
    assert f"-DNUM_THREADS={threads}" in options and f"-DMMA={int(mma)}" in options
    assert runtime.compile_cubin(pa.SOURCE, "paged_attention_split", "sm_90", options)


def test_unknown_tuning_knob_is_refused() -> None:
    with pytest.raises(ValueError, match="UNROL"), pa.tuning(UNROL=4):
        pass
    assert pa.TUNING["UNROLL"] == 2


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("kv_int8", [False, True])
@pytest.mark.parametrize("group", [4, 8])
@pytest.mark.parametrize("knobs", TUNINGS, ids=TUNING_IDS)
def test_tuning_variants_on_gpu_equal_twin(cupy_device, knobs, group, kv_int8) -> None:
    """Each variant ops.bench times gives the twin's output (single pass and split-K)."""
    case = sharp_case(11, [1, 16, 17, 100, 300, 0, 63], group, head_dim=128, block_size=16)
    with pa.tuning(**on_cuda_cores(knobs)):
        for partition_blocks in (0, None):
            check_against_twin(cupy_device, case, "fp16", kv_int8, partition_blocks)


EMULATED_TUNINGS = [
    {"UNROLL": 4, "TILE_SOFTMAX": 1},
    {"NUM_THREADS": 256, "RESCALE_SLACK": 8, "TILE_SOFTMAX": 0},
    {"TILE_SOFTMAX": 1, "RESCALE_SLACK": 4},
]


@pytest.mark.parametrize("knobs", EMULATED_TUNINGS, ids=pa.describe_tuning)
def test_tuning_variants_emulated(emulated, knobs) -> None:
    case = sharp_case(12, [1, 16, 21, 0, 50, 7], group=4, head_dim=64)
    with pa.tuning(**on_cuda_cores(knobs)):
        for partition_blocks in (0, 2):
            check_against_twin(HostDevice(emulated), case, "bf16", False, partition_blocks)


# the tensor-core path (MMA 1): fp16/bf16, head_dim 64/128, GROUP <= 16, blocks of a multiple of 16
MMA_CASES = [("fp16", False, 4, 64, 16), ("bf16", True, 16, 64, 32), ("fp16", True, 1, 128, 16)]


@pytest.mark.parametrize("dtype,kv_int8,group,head_dim,block_size", MMA_CASES)
def test_mma_path_emulated(emulated, dtype, kv_int8, group, head_dim, block_size) -> None:
    """Tiles cut by the context's end (17, 50), a context of one token and of none, single pass and
    split-K; scores spread wide so the running max moves."""
    q, k, v, tables, cl = make_case(np.random.default_rng(13), [1, 17, 50, 0, 33], 2, group, head_dim, block_size)
    with pa.tuning(MMA=2):
        assert "-DMMA=1" in pa.compile_options(dtype, kv_int8, head_dim, group, block_size)
        for partition_blocks in (0, 1):
            check_against_twin(HostDevice(emulated), (q * 4, k, v, tables, cl), dtype, kv_int8, partition_blocks)


def test_mma_path_chooses_its_split_and_equals_twin_emulated(emulated, monkeypatch) -> None:
    """A context past SHORT_CONTEXT on the tensor-core path: the automatic choice asks the split
    kernel's occupancy and splits (few CTAs: the shortest partitions, 256 tokens, 3 for 600)."""
    asked = []
    choose = pa.choose_partition_blocks
    monkeypatch.setattr(pa, "choose_partition_blocks", lambda *a: asked.append((a, choose(*a))) or asked[-1][1])
    case = make_case(np.random.default_rng(15), [600, 3, 290], 2, 4, 64, 16)
    check_against_twin(HostDevice(emulated), case, "fp16", False, None)
    assert asked == [((3, 2, 16, 600, 132, 132 * 6), 256 // 16)]  # (B, kv heads, block, context, SMs, wave)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("kv_int8", [False, True])
@pytest.mark.parametrize("group,head_dim", [(1, 128), (4, 128), (8, 64), (16, 128)])
@pytest.mark.parametrize("partition_blocks", [0, 1, None])
def test_mma_path_on_gpu_equals_twin(cupy_device, dtype, kv_int8, group, head_dim, partition_blocks) -> None:
    case = sharp_case(14, [1, 16, 17, 100, 300, 0, 63], group, head_dim, block_size=32)
    with pa.tuning(MMA=2):  # (int8 pools too)
        check_against_twin(cupy_device, case, dtype, kv_int8, partition_blocks)


def test_mma_applies_only_where_it_can() -> None:
    """The default: tensor cores for 16-bit queries over 16-bit pools, with their own CTA size."""
    on = pa.compile_options("fp16", False, 128, 4, 16)
    assert "-DMMA=1" in on and f"-DNUM_THREADS={pa.TUNING['MMA_THREADS']}" in on
    assert pa.threads_per_cta("bf16", False, 64, 8, 32) == pa.TUNING["MMA_THREADS"]
    off = pa.compile_options("fp16", True, 128, 4, 16)  # int8 pools: measured slower there
    assert "-DMMA=0" in off and f"-DNUM_THREADS={pa.TUNING['NUM_THREADS']}" in off
    assert "-DMMA=0" in pa.compile_options("fp32", False, 128, 4, 16)  # fp32 queries: CUDA cores
    assert "-DMMA=0" in pa.compile_options("fp16", False, 256, 4, 16)  # registers: D <= 128
    assert "-DMMA=0" in pa.compile_options("fp16", False, 128, 4, 8)  # a tile spans blocks
    assert "-DMMA=0" in pa.compile_options("bf16", False, 128, 32, 16)  # 16 rows a tile
    with pa.tuning(MMA=2):
        assert "-DMMA=1" in pa.compile_options("fp16", True, 128, 4, 16)
    with pa.tuning(MMA=0):
        assert "-DMMA=0" in pa.compile_options("fp16", False, 128, 4, 16)
