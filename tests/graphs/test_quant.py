"""Weight-only quantisation and the int8 KV pool without MPI: numpy quantisers, the in-graph
dequantisation against them, what the export records and start-up accepts, and the per-rank
weight bytes (`.pdiparams`) of fp32 / int8 / int4 exports.

Measured .pdiparams of the tiny Qwen2 (hidden 64, 2 layers, vocab 512; embed + lm_head stay fp32
and are 47 % of it): whole file int8 0.613 / int4 0.556 of fp32; the quantised linears alone
(int8 values + fp32 scales) 0.264 (int8) and 0.156 (int4, group 32) of their fp32 bytes: the ¼ and
⅛ plus the scales (4/in bytes per weight for int8, 4/group for int4).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.model_zoo import ARCHS, make_weights, write

ARCH = "qwen2_untied"


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """(quant, tp) → export directory of the tiny Qwen2."""
    from spmd_serve.export import export_checkpoint

    root = tmp_path_factory.mktemp("quant")
    cfg = ARCHS[ARCH]
    ckpt = write("hf", root / "ckpt", cfg, make_weights(cfg))
    return {
        (q, tp): export_checkpoint(ckpt, root / f"{q}-{tp}", tp=tp, quant=q, quant_group=32, kv_int8=False)
        for q in (None, "weight_only_int8", "weight_only_int4")
        for tp in (1, 2)
    }


@pytest.mark.parametrize("method,group", (("weight_only_int8", None), ("weight_only_int4", 16)))
def test_quantise_dequantise_roundtrip(method, group):
    from spmd_serve.export.quant import QMAX, QuantWeight, dequantize, hf_scales, quantize

    w_hf = np.random.default_rng(0).standard_normal((24, 64)).astype(np.float32)  # HF [out, in]
    s_hf = hf_scales(w_hf, method, group)
    scale = s_hf if method == "weight_only_int8" else np.ascontiguousarray(s_hf.T)
    qw = QuantWeight(method, quantize(w_hf.T, scale, method, group), scale, group)
    assert qw.q.dtype == np.int8 and qw.shape == (64, 24)
    assert qw.q.nbytes == 64 * 24 // (1 if method == "weight_only_int8" else 2)
    back = dequantize(qw)
    step = np.repeat(scale, group, 0) if group else scale[None]
    assert np.all(np.abs(back - w_hf.T) <= step / 2 + 1e-6)  # round to nearest, nothing clipped
    assert np.abs(back / step).max() == pytest.approx(QMAX[method])  # the channel/group max uses the range


@pytest.mark.parametrize("method,group", (("weight_only_int8", None), ("weight_only_int4", 16)))
def test_graph_dequantisation_matches_numpy(method, group):
    import paddle

    from spmd_serve.export.layers import make_linear
    from spmd_serve.export.quant import QuantWeight, dequantize, hf_scales, quantize

    rng = np.random.default_rng(1)
    w_hf = rng.standard_normal((24, 64)).astype(np.float32)
    s_hf = hf_scales(w_hf, method, group)
    scale = s_hf if method == "weight_only_int8" else np.ascontiguousarray(s_hf.T)
    qw = QuantWeight(method, quantize(w_hf.T, scale, method, group), scale, group)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    got = make_linear(qw)(paddle.to_tensor(x)).numpy()
    np.testing.assert_allclose(got, x @ dequantize(qw), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method,group", (("weight_only_int8", None), ("weight_only_int4", 16)))
@pytest.mark.parametrize("rank", (0, 1))
def test_quantised_embedding_gathers_owned_rows(method, group, rank):
    """Vocab-parallel quantised embedding (rank `rank` of 2): owned ids get the dequantised row,
    the others zeros, as the fp32 EmbedStage does."""
    import paddle

    from spmd_serve.export.llama.stages import EmbedStage
    from spmd_serve.export.quant import dequantize, quantize_vocab
    from spmd_serve.manifest import ShardDims

    table = np.random.default_rng(3).standard_normal((48, 64)).astype(np.float32)  # [V_local, H]
    qw = quantize_vocab(table, method, group)
    dims = ShardDims(
        tp=2,
        hidden=64,
        head_dim=16,
        num_layers=1,
        heads=2,
        kv_heads=1,
        intermediate=64,
        vocab=96,
        vocab_local=48,
        rms_norm_eps=1e-6,
        rope_theta=1e4,
    )
    ids = np.array([0, 47, 48, 95, 50, 3], np.int64)
    got = EmbedStage({"embed": qw}, dims, rank)(None, {"input_ids": paddle.to_tensor(ids)})[0].numpy()
    local = ids - 48 * rank
    owned = (local >= 0) & (local < 48)
    want = np.where(owned[:, None], dequantize(qw).T[np.where(owned, local, 0)], 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.abs(want[owned] - table[local[owned]]).max() < np.abs(table).max() / (100 if group is None else 5)


def quantised_shapes(dims: dict) -> list[tuple[int, int]]:
    """[in, out] of every tensor one rank holds quantised: 7 linears per layer, lm_head, embedding."""
    h, d, vl = dims["hidden"], dims["head_dim"], dims["vocab_local"]
    q, kv, inter = dims["heads"] * d, dims["kv_heads"] * d, dims["intermediate"]
    layer = [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]
    return layer * dims["num_layers"] + [(h, vl), (h, vl)]


def rank_param_bytes(model_dir, rank: int) -> int:
    return sum(f.stat().st_size for f in (model_dir / f"rank_{rank}").glob("*.pdiparams"))


@pytest.mark.parametrize("tp", (1, 2))
def test_weight_memory_per_rank(exports, tp):
    """Weight bytes per rank (the rank's .pdiparams files, what its predictor loads): fp32 minus
    exactly what quantising the linears, lm_head and embedding saves; ≈ ¼ (int8) and ⅛ (int4) of
    fp32 plus the scales (4 bytes per output channel for int8, per 32 weights for int4)."""
    for rank in range(tp):
        dims = json.loads((exports[None, tp] / f"rank_{rank}" / "manifest.json").read_text())["dims"]
        shapes = quantised_shapes(dims)
        fp32 = rank_param_bytes(exports[None, tp], rank)
        quantisable = 4 * sum(i * o for i, o in shapes)
        assert quantisable > 0.95 * fp32  # norms and biases are the rest
        for q, stored in (
            ("weight_only_int8", sum(i * o + 4 * o for i, o in shapes)),
            ("weight_only_int4", sum(i * o // 2 + 4 * (i // 32) * o for i, o in shapes)),
        ):
            size = rank_param_bytes(exports[q, tp], rank)
            assert abs((fp32 - size) - (quantisable - stored)) < 2048 * (2 * dims["num_layers"] + 2), (q, size)
            print(f"tp={tp} rank {rank} {q}: {size / fp32:.3f} of fp32 ({size} / {fp32} bytes)")
        assert rank_param_bytes(exports["weight_only_int8", tp], rank) < 0.28 * fp32  # ¼ + scales (in=64)
        assert rank_param_bytes(exports["weight_only_int4", tp], rank) < 0.17 * fp32  # ⅛ + scales (g=32)


def test_config_records_quant(exports):
    from spmd_serve.worker.capacity import check_served_model

    for (q, _tp), d in exports.items():
        served = json.loads((d / "config.json").read_text())
        check_served_model(served)
        rec = served["spmd_serve"]["quant"]
        assert rec == (None if q is None else json.loads((d / "rank_0" / "manifest.json").read_text())["quant"])
        if q is not None:
            assert {"layers.*.down", "lm_head", "embed"} <= set(rec["tensors"]) and rec["unquantised"] == [
                "norms",
                "biases",
            ]
        if q == "weight_only_int4":
            assert rec["group_size"] == 32


def test_startup_refuses_unknown_quant(exports):
    from spmd_serve.config import ConfigError
    from spmd_serve.worker.capacity import check_served_model

    served = json.loads((exports["weight_only_int8", 1] / "config.json").read_text())
    for bad in ("weight_only_int8", {"method": "awq"}, {"method": "weight_only_int4"}):
        with pytest.raises(ConfigError, match="quant|group_size"):
            check_served_model(dict(served, spmd_serve=dict(served["spmd_serve"], quant=bad)))


def test_kv_int8_refused_without_calibrated_export(exports):
    from spmd_serve.config import ConfigError
    from spmd_serve.worker.model_runner import ModelRunner

    with pytest.raises(ConfigError, match="re-export"):
        ModelRunner(exports[None, 1], 0, None, 4, 16, kv_int8=True)


def test_int4_group_must_divide_shard_inputs(tmp_path):
    from spmd_serve.export import ExportError, export_checkpoint

    cfg = ARCHS[ARCH]
    ckpt = write("hf", tmp_path / "ckpt", cfg, make_weights(cfg))
    with pytest.raises(ExportError, match="--quant-group 48"):
        export_checkpoint(ckpt, tmp_path / "out", tp=2, quant="weight_only_int4", quant_group=48)


def test_kv_capacity_counts_int8():
    from spmd_serve.worker.capacity import kv_bytes_per_block

    dims = {"num_layers": 2, "kv_heads": 2, "head_dim": 16}
    assert kv_bytes_per_block(dims, 16, kv_int8=True) * 4 == kv_bytes_per_block(dims, 16)


def test_int8_pool_writes_through_the_ops_twin():
    from ops.kv_cache_write import quantize_int8, slot_rows
    from spmd_serve.kv_layout import KVLayout
    from spmd_serve.worker.kv_cache import KVCachePool

    scales = {"k": [[0.01, 0.02]], "v": [[0.03, 0.04]]}
    pool = KVCachePool(KVLayout.kv_heads(1, 2, 16), 4, 8, scales)
    k, v = np.random.default_rng(2).standard_normal((2, 3, 2, 16)).astype(np.float32)
    pool.write(0, np.array([0, 9, 31]), k, v)
    assert pool.k[0].dtype == np.int8 and pool.nbytes == 2 * 4 * 8 * 2 * 16
    np.testing.assert_array_equal(slot_rows(pool.k[0])[[0, 9, 31]], quantize_int8(k, np.array([0.01, 0.02])))
    assert pool.tensor("v_scale_0").numpy().tolist() == pytest.approx([0.03, 0.04])
