"""DeepSeek's weight forms in its graphs with the C++ ops.

* 16 bits (`spmd_serve export --dtype bfloat16 | float16`, and --dtype auto on a checkpoint of such
  values): the routed experts, the dense linears and the embedding table are held in 16 bits, the
  weights the export folds a factor into (the query's softmax scale) and MLA's absorbed stacks in
  float32, and the graphs compute in float32.  So a checkpoint of 16-bit values is served with the
  float32 export's logits, bit for bit, at about half the bytes.  (Served under mpirun against
  PaddleNLP: tests/mpi/test_deepseek_parity_mpi.py's bf16 twin.)
* fp32 experts are held in panels (`spmd_moe_experts_panels`); MLA's products run
  `spmd_batched_matmul`, and a quantised export's w_uk / w_uv `spmd_batched_linear_int8` / `_int4`
  (read as held, not dequantised first).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.saved_graphs import op_names
from tests.support.step_logits import rounded_checkpoint, step_logits

EXPERTS = {"bfloat16": "spmd_moe_experts_bf16", "float16": "spmd_moe_experts_f16"}


def config(name: str) -> dict:
    """The zoo's config `name`; "v3-yarn1": V3 with DeepSeek-V3's own mscale = mscale_all_dim, so YaRN
    leaves kv_a's rope columns unscaled (q_a | kv_a held in 16 bits)."""
    from tests.support.deepseek_zoo import CONFIGS

    if name != "v3-yarn1":
        return CONFIGS[name]
    cfg = CONFIGS["v3"]
    return dict(cfg, rope_scaling=dict(cfg["rope_scaling"], mscale_all_dim=1.0))


# V3: q_lora_rank, an MTP layer; V2: no q_lora_rank (q | kv_a carries the softmax scale: float32)
@pytest.mark.parametrize("name,half", [("v3-yarn1", "bfloat16"), ("v2", "float16")])
def test_16_bit_deepseek_export_serves_the_float32_logits_of_its_weights(name, half, tmp_path):
    from spmd_serve.export import export_checkpoint
    from tests.support.deepseek_zoo import make_weights, write

    cfg = config(name)
    ckpt = rounded_checkpoint(write("hf", tmp_path / "src", cfg, make_weights(cfg)), tmp_path / "ckpt", half)
    made = {
        (dtype, ops): export_checkpoint(ckpt, tmp_path / f"{dtype}-{ops}", dtype=dtype, graph_ops=ops)
        for dtype, ops in (("float32", "cpp"), ("auto", "cpp"), ("auto", "paddle"))
    }
    assert json.loads((made["auto", "cpp"] / "config.json").read_text())["spmd_serve"]["dtype"] == half

    def ops(d):
        return set().union(*(op_names(f) for f in (d / "rank_0").glob("seg_*.json")))

    linear = {"bfloat16": "spmd_linear_bf16", "float16": "spmd_linear_f16"}[half]
    assert {EXPERTS[half], linear, "spmd_linear_panels"} <= ops(made["auto", "cpp"])  # the folded query: fp32
    # fp32 experts in panels too; MLA's products (w_uk / w_uv, a chunk's attention) are the C++ op's
    assert {"spmd_moe_experts_panels", "spmd_batched_matmul"} <= ops(made["float32", "cpp"])
    assert not {"spmd_moe_experts", "spmd_moe_experts_panels"} & ops(made["auto", "cpp"])

    def size(d):
        return sum(f.stat().st_size for f in (d / "rank_0").glob("*.pdiparams"))

    assert size(made["auto", "cpp"]) < 0.6 * size(made["float32", "cpp"])
    want = step_logits(made["float32", "cpp"])
    assert np.abs(want[1]).max() > 0.1
    for got, ref in zip(step_logits(made["auto", "cpp"]), want):
        assert np.array_equal(got, ref)
    for got, ref in zip(step_logits(made["auto", "paddle"]), want):  # widened by Paddle's cast: fp32 rounding
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("name", ["v3-yarn1", "v3"])
def test_a_16_bit_deepseek_export_rounds_a_float32_checkpoint(name):
    """--dtype bfloat16 on a float32 checkpoint: the 16-bit weights are the float32 ones rounded to
    nearest even (the experts' too); q_b (the softmax scale), q_a | kv_a where YaRN scales kv_a's rope
    columns, w_uk / w_uv and the router keep float32."""
    from spmd_serve.export.deepseek.mla import MlaStage
    from spmd_serve.export.deepseek.moe import MoeStage
    from spmd_serve.export.families import parse_model_config
    from spmd_serve.export.layers import dense_weights
    from spmd_serve.export.panels import from_panels
    from spmd_serve.export.quant import bf16_bits
    from tests.support.deepseek_zoo import make_weights

    cfg = config(name)
    family, mc = parse_model_config(cfg)
    dims = family.shard_dims(mc, 1)
    rank = family.rank_weights(mc, make_weights(cfg), dims, 0, None, None)
    layer = next(i for i in range(mc.num_layers) if mc.is_moe(i))
    with dense_weights(True, "bfloat16"):
        moe, mla = MoeStage(rank, dims, layer, 0), MlaStage(rank, dims, layer)
    held = moe.gate_up.weight.numpy()  # [E, H, 2I] bf16 bits, each expert in panels
    want = bf16_bits(rank[f"layers.{layer}.experts.gate_up"])
    assert held.dtype == np.uint16 and all(np.array_equal(from_panels(h), w) for h, w in zip(held, want))
    dtypes = {k: str(v.weight.dtype) for k, v in (("q_b", mla.q_b), ("proj_a", mla.proj_a), ("w_uk", mla.w_uk))}
    proj_a = "paddle.bfloat16" if name == "v3-yarn1" else "paddle.float32"
    assert dtypes == {"q_b": "paddle.float32", "proj_a": proj_a, "w_uk": "paddle.float32"}
    assert str(moe.router.weight.dtype) == "paddle.float32" and str(moe.shared_down.weight.dtype) == "paddle.bfloat16"


@pytest.mark.parametrize("method", ["weight_only_int8", "weight_only_int4"])
def test_quantised_mla_stacks_run_the_batched_ops(method, tmp_path):
    """A quantised export's graphs read w_uk / w_uv with `spmd_batched_linear_int8` / `_int4`, which
    compute what the fp32 op computes over the dequantised stacks (to the int8 ops' rounding of x)."""
    import paddle

    from spmd_serve.export import export_checkpoint
    from spmd_serve.export.deepseek.batched import BatchedLinear
    from spmd_serve.export.quant import dequantize_stack, quantize_stack
    from spmd_serve.export.variant import GraphVariant
    from tests.support.deepseek_zoo import CONFIGS, make_weights, write
    from tests.support.linear_weights import twin_tolerance

    cfg = CONFIGS["v2"]
    out = export_checkpoint(write("hf", tmp_path / "src", cfg, make_weights(cfg)), tmp_path / "q", quant=method)
    op = "spmd_batched_linear_int8" if method == "weight_only_int8" else "spmd_batched_linear_int4"
    assert op in set().union(*(op_names(f) for f in (out / "rank_0").glob("seg_*.json")))
    rng = np.random.default_rng(3)
    stack = quantize_stack(rng.standard_normal((4, 16, 32)).astype(np.float32), method, 8)
    x = paddle.to_tensor(rng.standard_normal((4, 7, 16)).astype(np.float32))
    cpp = GraphVariant(cpp_ops=True)
    with paddle.no_grad():
        got = BatchedLinear(stack)(x, cpp).numpy()
        want = BatchedLinear(dequantize_stack(stack))(x, cpp).numpy()
        general = BatchedLinear(stack)(x).numpy()  # Paddle's ops: dequantised, then matmul
    np.testing.assert_allclose(got, want, **twin_tolerance(method, want, 1e-5, 1e-5))
    np.testing.assert_allclose(general, want, rtol=1e-5, atol=1e-5)
