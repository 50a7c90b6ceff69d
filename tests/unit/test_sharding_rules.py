"""Tensor-parallel sharding rules and export errors, without running graphs.

Covers spmd_serve/export/llama/sharding.py (`shard_dims` errors and KV-head replication, the
q-head → KV-head mapping of `shard_weights`, vocab padding) and the one-line errors of
`spmd_serve export` (an impossible TP degree, an unsupported architecture).  The exported graphs
themselves are run in tests/graphs/test_sharding.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from spmd_serve.export.llama.sharding import ShardingError, shard_dims, shard_weights

TINY = {
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


# ---------------------------------------------------------------- shard_dims


@pytest.mark.parametrize(
    "cfg,tp,needles",
    [
        (dict(TINY), 3, ["num_attention_heads=4", "--tp 3"]),
        (dict(TINY), 8, ["num_attention_heads=4", "--tp 8"]),
        (dict(TINY, num_attention_heads=12, num_key_value_heads=4), 6, ["num_key_value_heads=4", "--tp 6"]),
        (
            dict(TINY, num_attention_heads=24, num_key_value_heads=8, intermediate_size=192),
            12,
            ["num_key_value_heads=8", "--tp 12"],
        ),
        (dict(TINY, intermediate_size=190), 4, ["intermediate_size=190", "--tp 4"]),
        (dict(TINY), 0, ["--tp must be >= 1"]),
    ],
)
def test_impossible_splits_are_refused_with_the_reason(cfg, tp, needles):
    with pytest.raises(ShardingError) as e:
        shard_dims(cfg, tp)
    assert all(n in str(e.value) for n in needles), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "nh,kvh,tp,heads,kv_local",
    [
        (4, 2, 1, 4, 2),
        (4, 2, 2, 2, 1),
        (4, 2, 4, 1, 1),
        (8, 8, 4, 2, 2),
        (8, 2, 8, 1, 1),
        (8, 4, 2, 4, 2),
        (16, 2, 4, 4, 1),
    ],
)
def test_dims_split_or_replicate_kv_heads(nh, kvh, tp, heads, kv_local):
    d = shard_dims(dict(TINY, num_attention_heads=nh, num_key_value_heads=kvh, hidden_size=4 * nh), tp)
    assert (d.heads, d.kv_heads, d.group, d.head_dim) == (heads, kv_local, heads // kv_local, 4)
    assert d.intermediate == 192 // tp and d.vocab == 1024 and d.vocab_local == 1024 // tp


def test_kv_heads_default_to_attention_heads_and_vocab_pads_up():
    cfg = {k: v for k, v in TINY.items() if k != "num_key_value_heads"}
    d = shard_dims(dict(cfg, vocab_size=1001), 4)
    assert (d.heads, d.kv_heads, d.vocab, d.vocab_local) == (1, 1, 1001, 251)


def _random_hf(cfg: dict, rng) -> dict[str, np.ndarray]:
    h, nh, kvh, inter, v = (
        cfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size")
    )
    d = h // nh
    w = {
        "model.embed_tokens.weight": rng.standard_normal((v, h)),
        "model.norm.weight": rng.standard_normal(h),
        "lm_head.weight": rng.standard_normal((v, h)),
    }
    p = "model.layers.0."
    shapes = {
        "self_attn.q_proj": (nh * d, h),
        "self_attn.k_proj": (kvh * d, h),
        "self_attn.v_proj": (kvh * d, h),
        "self_attn.o_proj": (h, nh * d),
        "mlp.gate_proj": (inter, h),
        "mlp.up_proj": (inter, h),
        "mlp.down_proj": (h, inter),
    }
    w.update({p + k + ".weight": rng.standard_normal(s) for k, s in shapes.items()})
    w[p + "input_layernorm.weight"] = rng.standard_normal(h)
    w[p + "post_attention_layernorm.weight"] = rng.standard_normal(h)
    return {k: x.astype(np.float32) for k, x in w.items()}


@pytest.mark.parametrize(
    "nh,kvh,tp", [(4, 2, 1), (4, 2, 2), (4, 2, 4), (8, 2, 8), (8, 4, 2), (8, 8, 4), (16, 2, 4), (6, 3, 3)]
)
def test_shard_weights_keep_each_query_head_with_its_kv_head(nh, kvh, tp):
    cfg = dict(
        TINY,
        num_attention_heads=nh,
        num_key_value_heads=kvh,
        hidden_size=2 * nh,
        intermediate_size=6 * tp,
        vocab_size=10,
        num_hidden_layers=1,
    )
    hf = _random_hf(cfg, np.random.default_rng(nh * 100 + kvh * 10 + tp))
    dims = shard_dims(cfg, tp)
    d, a = dims.head_dim, "model.layers.0.self_attn."
    ranks = [shard_weights(hf, cfg, dims, r) for r in range(tp)]
    for r, w in enumerate(ranks):
        assert w["layers.0.k"].shape == (cfg["hidden_size"], dims.kv_heads * d)
        for local_q in range(dims.heads):
            j = r * dims.heads + local_q  # global query head
            np.testing.assert_array_equal(
                w["layers.0.q"][:, local_q * d : (local_q + 1) * d], hf[a + "q_proj.weight"][j * d : (j + 1) * d].T
            )
            local_kv = local_q // dims.group  # what the attention uses
            g = j // (nh // kvh)  # HF grouped-query mapping
            for name in ("k", "v"):
                np.testing.assert_array_equal(
                    w[f"layers.0.{name}"][:, local_kv * d : (local_kv + 1) * d],
                    hf[a + f"{name}_proj.weight"][g * d : (g + 1) * d].T,
                )
    # row-parallel o/down and column-parallel gate/up/lm_head reassemble to the full matrices
    np.testing.assert_array_equal(np.concatenate([w["layers.0.o"] for w in ranks], 0), hf[a + "o_proj.weight"].T)
    np.testing.assert_array_equal(
        np.concatenate([w["layers.0.down"] for w in ranks], 0), hf["model.layers.0.mlp.down_proj.weight"].T
    )
    np.testing.assert_array_equal(
        np.concatenate([w["layers.0.gate"] for w in ranks], 1), hf["model.layers.0.mlp.gate_proj.weight"].T
    )
    embed = np.concatenate([w["embed"] for w in ranks], 0)
    head = np.concatenate([w["lm_head"] for w in ranks], 1)
    assert embed.shape[0] == head.shape[1] == dims.vocab_local * tp
    np.testing.assert_array_equal(embed[:10], hf["model.embed_tokens.weight"])
    np.testing.assert_array_equal(head[:, :10], hf["lm_head.weight"].T)
    assert not embed[10:].any() and not head[:, 10:].any()  # vocab padding is zero


# ---------------------------------------------------------------- export errors


def test_export_tp3_is_a_one_line_error(demo_checkpoint, tmp_path, capsys):
    from spmd_serve.export import main

    out = tmp_path / "out"
    rc = main(["--checkpoint", str(demo_checkpoint), "--out", str(out), "--tp", "3"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("spmd_serve export: error:") and err.count("\n") == 1, err
    assert "num_attention_heads" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing half-written
    from spmd_serve.cli import main as cli_main  # `spmd_serve export ...`

    assert cli_main(["export", "--checkpoint", str(demo_checkpoint), "--out", str(out), "--tp", "3"]) == 2
    assert "num_attention_heads" in capsys.readouterr().err


@pytest.mark.parametrize(
    "config,named",
    [({"architectures": ["MistralForCausalLM"]}, "MistralForCausalLM"), ({"model_type": "gpt2"}, "gpt2")],
)
def test_unsupported_architecture_is_refused(tmp_path, capsys, config, named):
    from spmd_serve.export import ExportError, export_checkpoint, main

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(dict(TINY, **config)))
    with pytest.raises(ExportError) as e:
        export_checkpoint(ckpt, tmp_path / "out", tp=1)
    assert named in str(e.value) and "LlamaForCausalLM" in str(e.value)
    assert main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spmd_serve export: error:") and "LlamaForCausalLM" in err and named in err
    assert not (tmp_path / "out").exists()
