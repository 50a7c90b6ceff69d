"""DeepSeek-V2/V3 export (issue 14): checkpoints read back exactly, the fp8 layout dequantises to
its weights, the references agree, the MLA pool's bytes, the MTP draft exported, refusals (no MPI).

* every format (HF single / sharded safetensors, PaddleNLP's own save_pretrained, with MTP layers)
  reads back to exactly the HF weights the checkpoint was made from;
* the published fp8 layout (float8_e4m3fn + 128x128 `weight_scale_inv`, tiled when a weight spans several blocks)
  reads back as the exact decode, within fp8 rounding of its weights; its e4m3 table equals one written independently;
* PaddleNLP's DeepseekV2/V3ForCausalLM (with this repo's shims) and an independent float64 numpy
  implementation written from DeepSeek's published modeling code agree to 1e-4 on both configs;
* the pool holds layers x (kv_lora_rank + qk_rope_head_dim) floats per token, and a context that
  would not fit as expanded per-head K/V fits; the MTP layer is exported as a draft model (`mtp/`);
* refused in one line: unsupported routing / scoring / rope scaling / activations, a split that
  does not divide, missing MTP tensors.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from tests.support.deepseek_zoo import CONFIGS, FORMATS, fp8_e4m3_table, make_weights, to_fp8, write, write_fp8
from tests.support.linear_weights import twin_tolerance


@pytest.fixture(scope="module")
def sources():
    from tests.support.deepseek_reference import reference_from_weights

    out = {}
    for name, cfg in CONFIGS.items():
        weights = make_weights(cfg)
        out[name] = (cfg, weights, reference_from_weights(cfg, weights, keep_mtp=True))
    return out


@pytest.mark.parametrize("fmt", FORMATS[:2] + ("paddlenlp_safetensors", "paddlenlp_pdparams"))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_format_reads_back_the_same_weights(name, fmt, sources, tmp_path):
    from spmd_serve.export.checkpoint import load_checkpoint

    cfg, weights, ref = sources[name]
    ckpt = write(fmt, tmp_path / "ckpt", cfg, weights, ref)
    _, mc, got, source = load_checkpoint(ckpt)
    assert source["format"] == ("huggingface" if fmt.startswith("hf") else "paddlenlp")
    assert (mc.architecture, mc.q_lora_rank, mc.topk_method) == (
        cfg["architectures"][0],
        cfg["q_lora_rank"],
        cfg["topk_method"],
    )
    # PaddleNLP's MTP layer uses the model's embedding, norm and head (and has an eh_proj bias)
    mtp = f"model.layers.{cfg['num_hidden_layers']}."
    shared = (mtp + "embed_tokens.weight", mtp + "shared_head.head.weight", mtp + "shared_head.norm.weight")
    want = {k: v for k, v in weights.items() if fmt.startswith("hf") or k not in shared}
    assert sorted(k for k in got if k != mtp + "eh_proj.bias") == sorted(want)
    for k, v in want.items():
        assert np.array_equal(got[k], v), k


def test_e4m3_tables_agree():
    from spmd_serve.export.weight_files import E4M3

    ours, independent = E4M3, fp8_e4m3_table()
    assert np.array_equal(np.isnan(ours), np.isnan(independent))
    assert np.array_equal(ours[~np.isnan(ours)], independent[~np.isnan(independent)])
    assert ours[0x7E] == 448 and ours[0x01] == 2.0**-9 and ours[0xB8] == -1.0


@pytest.mark.parametrize("block", [128, 16])
def test_fp8_layout_dequantises_to_its_weights(block, tmp_path):
    """128: the published block (each tiny weight is one block); 16: several blocks per weight, so
    the scales' tiling is exercised.  Exact decode, and within fp8 rounding of the source weights."""
    from spmd_serve.export.checkpoint import load_checkpoint

    cfg = CONFIGS["v3"]
    weights = make_weights(cfg)
    ckpt, decoded = write_fp8(tmp_path / "fp8", cfg, weights, block)
    _, _, got, _ = load_checkpoint(ckpt)
    assert not any(k.endswith("_scale_inv") for k in got)
    for k in got:
        assert np.array_equal(got[k], decoded[k]), k
    w = weights["model.layers.1.mlp.experts.3.down_proj.weight"]  # [64, 32]
    q, scale = to_fp8(w, block)
    assert scale.shape == (-(-64 // block), -(-32 // block))
    full = np.repeat(np.repeat(scale, block, 0), block, 1)[:64, :32]
    # e4m3 keeps 3 mantissa bits: half a step is <= 2^-4 of the value's binade
    assert np.all(np.abs(got["model.layers.1.mlp.experts.3.down_proj.weight"] - w) <= np.abs(w) * 2**-4 + full * 2**-10)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_numpy_float64_reference_agrees_with_paddlenlp(name, sources):
    import paddle

    from tests.support.deepseek_numpy import forward_logits
    from tests.support.deepseek_reference import reference_from_weights

    cfg, weights, _ = sources[name]
    ref = reference_from_weights(cfg, weights)
    ids = [1, *np.random.default_rng(3).integers(3, 512, 69).tolist()]  # past YaRN's original context
    with paddle.no_grad():
        theirs = ref(input_ids=paddle.to_tensor([ids]), use_cache=False, return_dict=True).logits[0].numpy()
    ours = forward_logits(cfg, weights, ids)
    assert np.abs(theirs - ours).max() <= 1e-4, np.abs(theirs - ours).max()


@pytest.fixture(scope="module")
def exported(sources, tmp_path_factory):
    from spmd_serve.export import export_checkpoint

    cfg, weights, ref = sources["v3"]
    root = tmp_path_factory.mktemp("v3")
    return export_checkpoint(write("hf", root / "ckpt", cfg, weights), root / "served", tp=2), weights


def test_mla_pool_bytes_per_token_and_capacity(exported, monkeypatch):
    from spmd_serve.kv_layout import CacheTensor, KVLayout
    from spmd_serve.manifest import read_manifest
    from spmd_serve.worker import capacity

    out, _ = exported
    cfg = CONFIGS["v3"]
    layout = read_manifest(out / "rank_1").kv_cache
    layers, latent = cfg["num_hidden_layers"], cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    assert layout.bytes_per_token() == layers * latent * 4 == 480
    nh = cfg["num_attention_heads"]
    expanded = layers * nh * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"] + cfg["v_head_dim"]) * 4
    assert expanded == 4 * layout.bytes_per_token()  # 1920 vs 480 bytes here; 71x for V3 (61 layers x 128 heads)
    serve = SimpleNamespace(
        block_size=16, block_bs=8, max_seq_len=4096, max_dec_len=512, use_cache_kv_int8=False, num_blocks=lambda: 2048
    )
    budget = 2048 * 16 * 1000  # bytes: 1000 per token of the 32768-token pool
    monkeypatch.setattr(capacity.psutil, "virtual_memory", lambda: SimpleNamespace(available=budget / 0.9))
    capacity.check_kv_fits(serve, layout, 1)  # 480 bytes per token: fits
    k, v = CacheTensor("k", (nh, cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])), CacheTensor("v", (nh, 16))
    expanded_layout = KVLayout("kv_heads", layers, (k, v))  # per-head K and V, as the reference caches
    assert expanded_layout.bytes_per_token() == expanded
    with pytest.raises(capacity.ConfigError, match="largest BLOCK_BS that fits"):
        capacity.check_kv_fits(serve, expanded_layout, 1)


def test_no_graph_holds_an_op_that_needs_avx512(exported):
    """Paddle's fused_rms_norm CPU kernel is AVX-512 code (SIGILL on an AMD Zen 3, seen in a
    session): no saved graph of any rank, target or MTP draft, may hold it (layers.rms_norm)."""
    from tests.support.saved_graphs import op_names

    out, _ = exported
    graphs = sorted(out.glob("**/rank_*/*.json"))
    graphs = [g for g in graphs if g.name != "manifest.json"]
    assert len(graphs) >= 4, graphs  # both ranks of the target and of mtp/
    for g in graphs:  # in a saved graph it is `fused_rms_norm_quant`
        assert not [n for n in op_names(g) if "rms_norm" in n and not n.startswith("spmd_")], g


def test_mtp_layer_is_exported_as_a_draft_model(exported):
    """The MTP layer is `mtp/`, a one-layer export of its own at the target's tp (its numbers:
    tests/graphs/test_mtp_export.py); the target's head also outputs the hidden rows it reads."""
    from spmd_serve.manifest import read_manifest

    out, _ = exported
    served = json.loads((out / "config.json").read_text())["spmd_serve"]
    assert served["mtp"] == {"folder": "mtp", "layer": 3, "served": True}
    draft = json.loads((out / "mtp" / "config.json").read_text())
    assert draft["num_hidden_layers"] == 1 and draft["spmd_serve"]["tp"] == 2
    assert draft["spmd_serve"]["mtp_draft"]["convention"] == "huggingface"
    for rank in range(2):
        m = read_manifest(out / "mtp" / f"rank_{rank}")
        assert m.kv_cache.num_layers == 1 and m.dims.num_layers == 1
        assert "prev_hidden" in m.segments[0].inputs and "hidden_rows" in m.segments[-1].outputs
        assert "hidden_rows" in read_manifest(out / f"rank_{rank}").segments[-1].outputs
    assert served["kv_int8"] is False  # the MLA pool is fp32 only


def test_int8_kv_cache_is_refused_with_the_reason(exported):
    from spmd_serve.config import ConfigError
    from spmd_serve.worker.model_runner import read_rank_manifest

    with pytest.raises(ConfigError, match="the mla_latent KV cache .* has no int8 form"):
        read_rank_manifest(exported[0] / "rank_0", kv_int8=True)


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"topk_method": "top2"}, "topk_method='top2' is not supported"),
        ({"scoring_func": "tanh"}, "scoring_func='tanh' is not supported"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling type 'linear'"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"n_group": 3}, "the groups must split the experts evenly"),
        ({"tie_word_embeddings": True}, "tie_word_embeddings=true"),
    ],
)
def test_unsupported_configs_are_refused(change, needle, tmp_path, capsys):
    from spmd_serve.export import main

    cfg = dict(CONFIGS["v2"], **change)
    ckpt = write("hf", tmp_path / "ckpt", cfg, make_weights(CONFIGS["v2"]))
    assert main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spmd_serve export: error:") and err.count("\n") == 1 and needle in err, err


@pytest.mark.parametrize(
    "tp, needle", [(3, "num_attention_heads=4 is not divisible by --tp 3"), (8, "num_attention_heads=4")]
)
def test_splits_that_do_not_divide_are_refused(tp, needle, tmp_path, capsys):
    from spmd_serve.export import main

    ckpt = write("hf", tmp_path / "ckpt", CONFIGS["v2"], make_weights(CONFIGS["v2"]))
    assert main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "out"), "--tp", str(tp)]) == 2
    assert needle in capsys.readouterr().err


def test_missing_mtp_layer_is_refused(tmp_path, capsys):
    from spmd_serve.export import main

    cfg = CONFIGS["v3"]
    weights = {k: v for k, v in make_weights(cfg).items() if not k.startswith("model.layers.3.self_attn")}
    ckpt = write("hf", tmp_path / "ckpt", cfg, weights)
    assert main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "out")]) == 2
    assert "num_nextn_predict_layers=1: model.layers.3.self_attn" in capsys.readouterr().err


# ---------------------------------------------------------------- weight-only quantisation


@pytest.mark.parametrize("method", ["weight_only_int8", "weight_only_int4"])
def test_quantised_graph_computes_the_dequantised_weights(method, sources):
    """The quantised stages (attention, w_uk / w_uv, routed and shared experts, dense MLP, embedding,
    lm_head) compute what fp32 stages holding the numpy-dequantised weights compute."""
    from spmd_serve.export.families import parse_model_config
    from spmd_serve.export.quant import QuantStack, QuantWeight
    from tests.support.deepseek_eager import dequantised, eager_logits

    cfg, weights, _ = sources["v3"]
    family, mc = parse_model_config(cfg)
    dims = family.shard_dims(mc, 1)
    group = family.quant_group(mc, dims, None) if method == "weight_only_int4" else None
    rank = family.rank_weights(mc, weights, dims, 0, method, group)
    kinds = {k: type(v).__name__ for k, v in rank.items() if k.startswith("layers.1.")}
    assert {k for k, t in kinds.items() if t == "QuantStack"} == {
        f"layers.1.{n}" for n in ("w_uk", "w_uv", "experts.gate_up", "experts.down")
    }
    assert kinds["layers.1.router"] == "ndarray" and isinstance(rank["lm_head"], QuantWeight)
    assert all(isinstance(rank[f"layers.0.{n}"], QuantWeight) for n in ("q_a", "q_b", "kv_a", "o", "gate", "down"))
    assert isinstance(rank["layers.2.experts.down"], QuantStack)
    ids = [1, *range(50, 80)]
    got, want = eager_logits(cfg, rank, ids), eager_logits(cfg, dequantised(rank), ids)
    assert np.abs(got - want).max() <= 1e-4, np.abs(got - want).max()
    # and the integers are the served fp32 weights' within half a quantisation step (the scales
    # belong to their weights: row-parallel ones from the unsharded weight).  The logits are not
    # compared with fp32's: on random weights the router flips on such perturbations (bf16
    # rounding moves this model's logits by ~4).
    fp32, qmax = family.rank_weights(mc, weights, dims, 0, None, None), 127 if group is None else 7
    for k, deq in dequantised(rank).items():
        if k != "config":
            err, amax = np.abs(deq - fp32[k]).max(), np.abs(fp32[k]).max()
            assert err <= amax / qmax * 0.5001, (k, err, amax)


@pytest.mark.parametrize("method", ["weight_only_int8", "weight_only_int4"])
def test_quantised_experts_run_the_grouped_op(method, sources):
    """With the C++ ops a quantised MoE stage (`spmd_moe_experts_int8` / `_int4`) = its dequantised twin."""
    import paddle

    from spmd_serve.export.deepseek.moe import MoeStage
    from spmd_serve.export.families import parse_model_config
    from spmd_serve.export.variant import GraphVariant
    from tests.support.deepseek_eager import dequantised

    cfg, weights, _ = sources["v3"]
    family, mc = parse_model_config(cfg)
    dims = family.shard_dims(mc, 1)
    group = family.quant_group(mc, dims, None) if method == "weight_only_int4" else None
    rank = family.rank_weights(mc, weights, dims, 0, method, group)
    layer = next(i for i in range(mc.num_layers) if mc.is_moe(i))
    quant, fp32 = MoeStage(rank, dims, layer, 0), MoeStage(dequantised(rank), dims, layer, 0)
    variant = GraphVariant(cpp_ops=True)
    assert quant._grouped(variant)
    rng = np.random.default_rng(5)
    h, delta = (paddle.to_tensor(rng.standard_normal((19, mc.hidden)).astype(np.float32)) for _ in range(2))
    with paddle.no_grad():
        got, want = (stage(h, delta, {}, variant)[1].numpy() for stage in (quant, fp32))
    assert np.abs(want).max() > 0.01
    np.testing.assert_allclose(got, want, **twin_tolerance(method, want, 1e-4, 1e-5))


def test_int4_group_must_divide_every_per_rank_input(tmp_path, capsys):
    from spmd_serve.export import main

    ckpt = write("hf", tmp_path / "ckpt", CONFIGS["v3"], make_weights(CONFIGS["v3"]))
    quant = ["--quant", "weight_only_int4", "--quant-group", "32"]
    assert main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "o"), *quant]) == 2
    assert "kv_lora_rank + qk_rope_head_dim (w_uv) 40" in capsys.readouterr().err
