"""DeepSeek's MTP layer exported as a draft model (export/deepseek/mtp.py), against PaddleNLP.

The tiny V3 checkpoint (tests/support/deepseek_zoo.py, one MTP layer) is exported from its
PaddleNLP `save_pretrained` (PaddleNLP's conventions, a non-zero eh_proj bias) and from its HF
form (vLLM's conventions, the layer's own shared_head).  Each `mtp/` export, at tp 1 (C++ ops:
the decode graph runs the second step) and tp 2 (a graph per stage, collectives played in this
process), must give what PaddleNLP's `DeepseekV2MTPLayer` + norm + lm_head give on the same hidden
rows and tokens (HF: eh_proj's halves swapped to PaddleNLP's concatenation, shared_head's norm and
head): a prefill's every row, then one more token reading the MTP's own KV; and its `hidden_rows`
are the layer's output before the norm (what further drafts chain on).  The target's own head
graph outputs the hidden rows the convention reads (PaddleNLP: before the final norm; HF: after).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.deepseek_zoo import CONFIGS, make_weights, write
from tests.support.sim_ranks import SimRank, run_outputs

CFG = CONFIGS["v3"]
L, H = CFG["num_hidden_layers"], CFG["hidden_size"]
N, P = 21, 20  # tokens of the sequence; the MTP's prefill, then one step reading its KV
BLOCK_SIZE, NUM_BLOCKS = 16, 4
TOL = 1e-4


def _plan(ids: np.ndarray, start: int):
    """One sequence's step over `ids` at positions start.., every row's logits; slot = position."""
    from spmd_serve.protocol import RUN, StepPlan

    n = len(ids)
    pos = np.arange(start, start + n, dtype=np.int64)
    table = np.arange(NUM_BLOCKS, dtype=np.int64)[None]
    one = np.ones(1, np.int64)
    return StepPlan(RUN, 0, ids.astype(np.int64), pos, one * n, one * start, table, pos.copy(), one * n)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """(tokens, hidden rows of the target, per convention: (checkpoint, MTP reference outputs))."""
    import paddle

    from tests.support.deepseek_reference import reference_from_weights

    weights = make_weights(CFG)
    ids = np.random.default_rng(5).integers(3, CFG["vocab_size"], N + 1)
    ids[0] = 1
    root = tmp_path_factory.mktemp("mtp")
    ref = reference_from_weights(CFG, weights, keep_mtp=True)
    model = ref.deepseek_v3
    bias = np.random.default_rng(6).standard_normal(H).astype(np.float32) * 0.5
    model.layers[L].eh_proj.bias.set_value(paddle.to_tensor(bias))
    paddle_ckpt = write("paddlenlp_safetensors", root / "paddlenlp", CFG, weights, ref)

    # the HF layer as PaddleNLP's code: eh_proj's halves in PaddleNLP's order, shared_head as norm / head
    w = weights[f"model.layers.{L}.eh_proj.weight"]
    hf_view = dict(weights, **{f"model.layers.{L}.eh_proj.weight": np.concatenate([w[:, H:], w[:, :H]], axis=1)})
    hf_view["model.norm.weight"] = weights[f"model.layers.{L}.shared_head.norm.weight"]
    hf_view["lm_head.weight"] = weights[f"model.layers.{L}.shared_head.head.weight"]
    refs = {"paddlenlp": (ref, paddle_ckpt), "huggingface": (reference_from_weights(CFG, hf_view, keep_mtp=True), None)}
    refs["huggingface"] = (refs["huggingface"][0], write("hf", root / "hf", CFG, weights))

    captured = {}
    target = reference_from_weights(CFG, weights).deepseek_v3  # (with MTP layers its forward drops a position)
    target.layers[L - 1].register_forward_post_hook(lambda _l, _i, out: captured.update(pre=out))
    with paddle.no_grad():
        target(input_ids=paddle.to_tensor(ids[None, :N]), use_cache=False)
        pre = captured["pre"][0] if isinstance(captured["pre"], tuple) else captured["pre"]
        rows = {"paddlenlp": pre[0].numpy(), "huggingface": target.norm(pre)[0].numpy()}
        out = {}
        for conv, (reference, _) in refs.items():
            base = reference.deepseek_v3
            e = base.embed_tokens(paddle.to_tensor(ids[None, 1 : N + 1]))  # token i + 1 for hidden row i
            pos = paddle.arange(N, dtype="int64")[None]
            h = base.layers[L](paddle.to_tensor(rows[conv][None]), e, position_ids=pos, attention_mask=None)
            h = h[0] if isinstance(h, tuple) else h
            out[conv] = (h[0].numpy(), reference.lm_head(base.norm(h))[0].numpy())
    return ids, rows, {conv: (refs[conv][1], *out[conv]) for conv in refs}


@pytest.fixture(scope="module")
def exports(case, tmp_path_factory):
    from spmd_serve.export import export_checkpoint

    _, _, by_conv = case
    root = tmp_path_factory.mktemp("served")
    return {
        (conv, tp): export_checkpoint(ckpt, root / f"{conv}{tp}", tp=tp, graph_ops="auto" if tp == 1 else "paddle")
        for conv, (ckpt, _, _) in by_conv.items()
        for tp in (1, 2)
    }


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("conv", ["paddlenlp", "huggingface"])
def test_mtp_graphs_equal_paddlenlp_mtp_layer(case, exports, conv, tp):
    ids, rows, by_conv = case
    _, want_hidden, want_logits = by_conv[conv]
    mtp = exports[(conv, tp)] / "mtp"
    record = json.loads((mtp / "config.json").read_text())["spmd_serve"]["mtp_draft"]
    assert (record["convention"], record["layer"]) == (conv, L)
    assert record["target_hidden"] == ("pre_norm" if conv == "paddlenlp" else "post_norm")
    ranks = [SimRank(mtp, r, NUM_BLOCKS, BLOCK_SIZE) for r in range(tp)]
    assert ranks[0].pool.layout.num_layers == 1  # its own one-layer pool
    first = run_outputs(ranks, _plan(ids[1 : P + 1], 0), {"prev_hidden": rows[conv][:P]})
    second = run_outputs(ranks, _plan(ids[P + 1 : N + 1], P), {"prev_hidden": rows[conv][P:N]})
    got_logits = np.concatenate([first["logits"], second["logits"]])
    got_hidden = np.concatenate([first["hidden_rows"], second["hidden_rows"]])
    assert got_logits.shape == want_logits.shape == (N, CFG["vocab_size"])
    assert np.abs(got_logits - want_logits).max() <= TOL, np.abs(got_logits - want_logits).max(axis=1)
    assert np.abs(got_hidden - want_hidden).max() <= TOL, np.abs(got_hidden - want_hidden).max()
    assert want_logits.std() > 1.0  # not a degenerate layer


@pytest.mark.parametrize("conv", ["paddlenlp", "huggingface"])
def test_target_head_outputs_the_rows_its_mtp_reads(case, exports, conv):
    ids, rows, _ = case
    target = exports[(conv, 1)]
    ranks = [SimRank(target, 0, NUM_BLOCKS, BLOCK_SIZE)]
    out = run_outputs(ranks, _plan(ids[:N], 0))
    assert out["hidden_rows"].shape == (N, H)
    assert np.abs(out["hidden_rows"] - rows[conv]).max() <= TOL, np.abs(out["hidden_rows"] - rows[conv]).max()
    served = json.loads((target / "config.json").read_text())["spmd_serve"]
    assert served["mtp"] == {"folder": "mtp", "layer": L, "served": True}
