"""The linear ops (ops/cpu_kernels/linear.cc) against float64 numpy, their errors, and their place in
an export: every graph of a C++-ops export calls its weight type's op (fp32, int8, int4), and a
prefill and a decode step give the logits of the same model exported with Paddle's ops only."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.linear_weights import int8_input, twin_tolerance
from tests.support.saved_graphs import op_names
from tests.support.step_logits import ROUND, rounded_checkpoint, step_logits

DEMO_SMALL = [(512, 1024), (512, 512), (512, 3072), (1536, 512), (512, 8000)]  # [K, N]: qkv, o, gate_up, down, lm_head


def op(name: str, *arrays: np.ndarray) -> np.ndarray:
    import paddle

    from ops import paddle_ext

    return paddle_ext.run_op(name, *[paddle.to_tensor(a) for a in arrays]).numpy()


def operands(rows: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """x [rows, k] fp32, fp32 w [k, n], int8 q [k, n], scale [n]."""
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((rows, k), np.float32),
        rng.standard_normal((k, n), np.float32),
        rng.integers(-127, 128, (k, n), dtype=np.int8),
        (rng.random(n, np.float32) + 0.5) / 127,
    )


def check(y: np.ndarray, ref: np.ndarray) -> None:
    assert y.dtype == np.float32 and y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max(initial=0))


@pytest.mark.parametrize("rows", range(1, 21))  # the streaming kernel up to 8 rows, the blocked one above
def test_ragged_shapes_match_float64(rows):
    x, w, q, scale = operands(rows, 67, 131)  # K and N not multiples of the vector width
    check(op("spmd_linear", x, w), x.astype(np.float64) @ w)
    check(op("spmd_linear_int8", x, q, scale), (int8_input(x).astype(np.float64) @ q) * scale)


@pytest.mark.parametrize("rows", (1, 4, 16))
@pytest.mark.parametrize("k", (1, 7, 8, 9, 16, 23, 24, 40))  # around the 8-row passes and 16-row prefetch
def test_short_k_around_the_row_pass_match_float64(rows, k):
    x, w, q, scale = operands(rows, k, 67, seed=k)
    q[0, :3] = -128  # the full int8 range, not only the quantiser's
    check(op("spmd_linear", x, w), x.astype(np.float64) @ w)
    check(op("spmd_linear_int8", x, q, scale), (int8_input(x).astype(np.float64) @ q) * scale)


@pytest.mark.parametrize("rows", (1, 4))
@pytest.mark.parametrize("k,n", DEMO_SMALL)
def test_demo_small_shapes(rows, k, n):
    x, w, q, scale = operands(rows, k, n, seed=k + n)
    check(op("spmd_linear", x, w), x.astype(np.float64) @ w)
    check(op("spmd_linear_int8", x, q, scale), (int8_input(x).astype(np.float64) @ q) * scale)


@pytest.mark.parametrize("lead", ([2, 3], [0], [7]))
def test_leading_dimensions_and_empty_inputs(lead):
    x, w, q, scale = operands(int(np.prod(lead)), 35, 40)
    x = x.reshape([*lead, 35])  # [..., K] → [..., N]
    check(op("spmd_linear", x, w), x.astype(np.float64) @ w)
    check(op("spmd_linear_int8", x, q, scale), (int8_input(x).astype(np.float64) @ q) * scale)


@pytest.mark.parametrize(
    "name,arrays,message",
    [
        ("spmd_linear", lambda x, w, q, s: (x.astype(np.float64), w), "x must be float32"),
        (
            "spmd_linear",
            lambda x, w, q, s: (x, w[:-1]),
            r"x's last dimension \(16\) must equal the weight's rows K \(15\)",
        ),
        ("spmd_linear", lambda x, w, q, s: (x, w[0]), "the weight must be 2-D"),
        ("spmd_linear", lambda x, w, q, s: (x, q), "the weight must be float32"),
        ("spmd_linear_bf16", lambda x, w, q, s: (x, w), "the weight must be bfloat16"),
        ("spmd_linear_bf16", lambda x, w, q, s: (x, q), "the weight must be bfloat16"),
        ("spmd_linear_int8", lambda x, w, q, s: (x, w, s), "the weight must be int8"),
        ("spmd_linear_int8", lambda x, w, q, s: (x, q, s[:-1]), r"scale must be \[N\] = \[24\]"),
        ("spmd_linear_int8", lambda x, w, q, s: (x, q, s.astype(np.float64)), "scale must be float32"),
    ],
)
def test_bad_inputs_are_refused_with_a_reason(name, arrays, message):
    with pytest.raises(Exception, match=message):
        op(name, *arrays(*operands(2, 16, 24)))


@pytest.fixture(scope="module")
def export(demo_checkpoint, tmp_path_factory):
    """(quant, graph ops) → the tiny demo exported so, made once."""
    from spmd_serve.export import export_checkpoint

    made: dict = {}

    def get(quant: str | None, graph_ops: str):
        if (quant, graph_ops) not in made:
            out = tmp_path_factory.mktemp("served") / f"{quant}-{graph_ops}"
            made[quant, graph_ops] = export_checkpoint(
                demo_checkpoint, out, quant=quant, kv_int8=False, graph_ops=graph_ops
            )
        return made[quant, graph_ops]

    return get


@pytest.mark.parametrize("quant", (None, "weight_only_int8", "weight_only_int4"))
def test_every_graph_uses_the_ops_with_paddles_logits(quant, export):
    # fp32 weights in the panel layout (export/panels.py): the ops that read it
    name = {None: "spmd_linear_panels", "weight_only_int8": "spmd_linear_int8", "weight_only_int4": "spmd_linear_int4"}
    name = name[quant]
    cpp, paddle_ops = export(quant, "cpp"), export(quant, "paddle")
    manifest = json.loads((cpp / "rank_0" / "manifest.json").read_text())
    assert [s["name"] for s in manifest["segments"]] == ["seg_0"]  # one graph for every step
    ops = op_names(cpp / "rank_0" / "seg_0.json")
    # o_proj or down + add + RMSNorm + gate|up (+ SwiGLU) or the next qkv (export/deferred.py)
    fused = name.replace("spmd_linear", "spmd_linear_norm_linear")
    assert {name, fused, "spmd_paged_attention", "spmd_add_rms_norm", "spmd_rms_norm"} <= ops
    assert not {"matmul", "fused_rms_norm", "swiglu", "gather_nd", "spmd_swiglu"} & ops  # no Paddle GEMM left
    general_ops = op_names(paddle_ops / "rank_0" / "seg_0.json")
    assert not any(n.startswith("spmd_") for n in general_ops)
    assert not [n for n in general_ops if "rms_norm" in n]  # fused_rms_norm(_quant) is AVX-512 code
    for fast, general in zip(step_logits(cpp), step_logits(paddle_ops)):
        np.testing.assert_allclose(fast, general, **twin_tolerance(quant, general, 1e-4, 1e-4 * np.abs(general).max()))
        assert (fast.argmax(-1) == general.argmax(-1)).all()


@pytest.mark.parametrize("half", ROUND)
def test_16_bit_export_serves_the_float32_logits_of_its_weights(demo_checkpoint, export, tmp_path, half):
    """--dtype bfloat16 / float16 holds every linear's weights and the embedding table in 16 bits (half
    their bytes) and computes in fp32: on a checkpoint whose weights are such values it gives the fp32
    export's logits bit for bit (the C++ ops; Paddle's ops: within fp32 rounding), and on any
    checkpoint the fp32 export's logits within the rounding of the weights, with its greedy tokens.
    The export's default (--dtype auto) picks the 16-bit dtype for the former."""
    from spmd_serve.export import export_checkpoint

    ckpt = rounded_checkpoint(demo_checkpoint, tmp_path / "ckpt", half)
    made = {  # "auto": the default
        (dtype, ops): export_checkpoint(ckpt, tmp_path / f"{dtype}-{ops}", dtype=dtype, kv_int8=False, graph_ops=ops)
        for dtype in ("float32", "auto")
        for ops in ("cpp", "paddle")
    }
    made = {(half if d == "auto" else d, ops): path for (d, ops), path in made.items()}
    served = json.loads((made[half, "cpp"] / "config.json").read_text())["spmd_serve"]
    assert served["dtype"] == half
    ops = op_names(made[half, "cpp"] / "rank_0" / "seg_0.json")
    name = {"bfloat16": "spmd_linear_bf16", "float16": "spmd_linear_f16"}[half]
    assert {name, name.replace("spmd_linear", "spmd_linear_norm_linear")} <= ops
    assert not {"spmd_linear_panels", "matmul"} & ops
    size = {k: (d / "rank_0" / "seg_0.pdiparams").stat().st_size for k, d in made.items()}
    assert size[half, "cpp"] < 0.51 * size["float32", "cpp"]  # every weight but the norms
    want = step_logits(made["float32", "cpp"])
    for got, ref in zip(step_logits(made[half, "cpp"]), want):
        assert np.array_equal(got, ref)
    for got, ref in zip(step_logits(made[half, "paddle"]), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    fp32 = step_logits(export(None, "cpp"))  # the original float32 weights
    rounded = step_logits(export_checkpoint(demo_checkpoint, tmp_path / "b", dtype=half, kv_int8=False))
    for got, ref in zip(rounded, fp32):
        np.testing.assert_allclose(got, ref, rtol=0.05, atol=0.02 * np.abs(ref).max())
        assert not np.array_equal(got, ref) and (got.argmax(-1) == ref.argmax(-1)).all()
