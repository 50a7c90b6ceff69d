"""The C++ ops at a vector width this CPU does not have: the kernels are written once against
simd.h's vector, and their tiles, panels and tails depend on its width (16 lanes and 32 registers on
AVX-512: 6 x 4 micro-kernels, one vector a panel row; 8 and 16 on AVX2).  A machine without AVX-512
runs the AVX2 build only, so here the op tests run again against a library built with simd.h's plain
array at 16 lanes (SPMD_OPS_EMULATE_WIDTH=16): every one of AVX-512's code paths but the intrinsics
themselves, which are one call each in simd.h.  Those, and the AMX / VNNI int8 paths, are at least
compiled here for a CPU that has them."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the op tests (float64 references, bit-equal threading and layouts), all but this file's own
OP_TESTS = (
    "test_cpu_gemm_op.py",
    "test_cpu_linear_op.py",
    "test_cpu_norm_linear_op.py",
    "test_cpu_elementwise_op.py",
    "test_cpu_paged_attention_op.py",
    "test_cpu_deepseek_ops.py",
)


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_the_library_has_the_vector_it_was_built_for():
    from ops import paddle_ext

    lanes, plain = paddle_ext.simd()
    emulated = os.environ.get("SPMD_OPS_EMULATE_WIDTH")
    if emulated:  # the run below, or a developer's
        assert (lanes, plain) == (int(emulated), True)
        return
    flags = _cpu_flags()
    if os.environ.get("SPMD_OPS_MARCH"):  # a build for another CPU than this one: any vector
        assert lanes in (8, 16)
    elif "avx512f" in flags:
        assert (lanes, plain) == (16, False)
    elif {"avx2", "fma"} <= flags:
        assert (lanes, plain) == (8, False)
    else:
        assert (lanes, plain) == (8, True)


def test_the_op_tests_pass_at_avx512s_width_on_the_plain_vector():
    env = dict(os.environ, SPMD_OPS_EMULATE_WIDTH="16", PYTHONPATH=str(ROOT))
    here = Path(__file__).parent
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-x",
        *(str(here / name) for name in OP_TESTS),
        f"{Path(__file__)}::test_the_library_has_the_vector_it_was_built_for",
    ]
    # the build (~20 s of -O1 on 2 cores: paddle_ext._emulate_flags) and ~170 op tests (~7 s)
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-3000:]


@pytest.mark.parametrize("width", ("4", "32", "x"))
def test_an_unknown_width_is_refused_by_name(width, monkeypatch):
    from ops import paddle_ext

    monkeypatch.setenv("SPMD_OPS_EMULATE_WIDTH", width)
    with pytest.raises(paddle_ext.ExtensionUnavailable, match=f"SPMD_OPS_EMULATE_WIDTH='{width}': 8 or 16"):
        paddle_ext._emulate_flags()


def test_the_avx512_and_amx_paths_compile(monkeypatch):
    # Sapphire Rapids has every extension a branch of the kernels asks for (AVX-512 F/BW/VBMI/VNNI/BF16,
    # AMX-INT8): each source checked to the end of its templates' instantiation, no code generated
    from ops import paddle_ext

    monkeypatch.setenv("SPMD_OPS_MARCH", "sapphirerapids")
    monkeypatch.delenv("SPMD_OPS_EMULATE_WIDTH", raising=False)
    compiles, _ = paddle_ext._commands(Path("OBJS"), Path("OUT"))
    checks = [
        [*cmd[: cmd.index("-c")], *cmd[cmd.index("-c") + 1 : cmd.index("-o")], "-fsyntax-only"] for cmd in compiles
    ]
    with concurrent.futures.ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        runs = list(pool.map(lambda c: subprocess.run(c, capture_output=True, text=True, timeout=600), checks))
    failed = {cmd[-2]: run.stderr[-3000:] for cmd, run in zip(checks, runs) if run.returncode != 0}
    assert not failed, failed
