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
TOL_ENGINE = 1e-3  # steps of other shapes (chunks, decode graphs) than one whole-sequence pass
K = 3  # drafts per propose in the engine test: the first, then two chain steps


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
    out = {
        (conv, tp): export_checkpoint(ckpt, root / f"{conv}{tp}", tp=tp, graph_ops="auto" if tp == 1 else "paddle")
        for conv, (ckpt, _, _) in by_conv.items()
        for tp in (1, 2)
    }
    # Paddle's attention: a step's decodes and prefill chunks run as separate passes (hidden rows reassembled)
    hf = by_conv["huggingface"][0]
    out[("huggingface", "paddle")] = export_checkpoint(hf, root / "hf-paddle", graph_ops="paddle")
    return out


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


TARGETS = [("paddlenlp", 1), ("huggingface", 1), ("huggingface", "paddle"), ("paddlenlp", 2), ("huggingface", 2)]


@pytest.mark.parametrize("conv, kind", TARGETS, ids=[f"{c}-{k}" for c, k in TARGETS])
def test_target_head_outputs_the_rows_its_mtp_reads(case, exports, conv, kind):
    ids, rows, _ = case
    target = exports[(conv, kind)]
    ranks = [SimRank(target, r, NUM_BLOCKS, BLOCK_SIZE) for r in range(2 if kind == 2 else 1)]
    out = run_outputs(ranks, _plan(ids[:N], 0))
    assert out["hidden_rows"].shape == (N, H)
    assert np.abs(out["hidden_rows"] - rows[conv]).max() <= TOL, np.abs(out["hidden_rows"] - rows[conv]).max()
    served = json.loads((target / "config.json").read_text())["spmd_serve"]
    assert served["mtp"] == {"folder": "mtp", "layer": L, "served": True}


# ---------------------------------------------------------------- the proposer on the exported graphs


class _Solo:
    """One rank's collectives: nothing to send, gather or sum."""

    size, rank = 1, 0

    def send_plan(self, plan) -> None:
        pass

    def gather_vocab(self, logits):
        return logits

    def allreduce_(self, x):
        return x


def _ideal(target: SimRank, mtp: SimRank, tokens: list[int], chain: list[tuple[int, np.ndarray]]):
    """What the MTP predicts over a whole sequence in one pass each: the target's hidden rows of
    `tokens` (of the convention's kind), the MTP's logits and own rows at every position; `chain`:
    further (token, the MTP's own row feeding it) rows after the last."""
    c = len(tokens) - 1  # the rows of positions 0..c-1 read token i + 1
    hidden = run_outputs([target], _plan(np.asarray(tokens[:c]), 0))["hidden_rows"]
    ids = np.asarray(tokens[1:] + [t for t, _ in chain])
    prev = np.concatenate([hidden, *[h[None] for _, h in chain]]) if chain else hidden
    return run_outputs([mtp], _plan(ids, 0), {"prev_hidden": prev})


ENGINE_CASES = [("paddlenlp", 1, 8), ("huggingface", 1, 8), ("huggingface", "paddle", 8), ("huggingface", 1, 3)]


@pytest.mark.parametrize("conv, kind, blocks", ENGINE_CASES, ids=[f"{c}-{k}-{b}" for c, k, b in ENGINE_CASES])
def test_the_proposer_drafts_what_the_mtp_layer_predicts(case, exports, conv, kind, blocks):
    """An engine (TP 1, chunked prefill, drafts every step; C++ ops, and Paddle's whose decodes and
    prefill chunks run as separate passes; a pool that preempts) with the MTP proposer: at every propose,
    each request's first draft comes from the MTP's logits at its last computed position, equal to
    one whole-sequence pass of the target then the MTP over its tokens (so every target step's rows
    were fed, at the right positions, rejected drafts' rows left out); each further draft's logits
    equal that pass with the earlier drafts fed after, each on the MTP's own row before it."""
    from spmd_serve.engine.draft_model import draft_pool_blocks
    from spmd_serve.engine.offline import EngineSettings, make_engine
    from spmd_serve.sampling_params import SamplingParams
    from spmd_serve.scheduler.request import Request
    from spmd_serve.worker.model_runner import ModelRunner

    model = exports[(conv, kind)]
    s = EngineSettings(
        num_blocks=blocks,  # 3: the two requests cannot hold their 2 blocks each at once (preemption)
        block_size=BLOCK_SIZE,
        max_num_seqs=2,
        max_num_batched_tokens=8,  # prompts prefilled in chunks
        speculate_method="mtp",
        speculate_max_draft_token_num=K,
        speculate_min_acceptance=0.0,
        speculate_model_path=str(model / "mtp"),
    )
    comm = _Solo()
    runner = ModelRunner(model, 0, comm, s.num_blocks, s.block_size, keep_hidden=True)
    pool = draft_pool_blocks(s.num_blocks, s.max_num_seqs, K, s.block_size)
    draft = ModelRunner(model / "mtp", 0, comm, pool, s.block_size, malloc_tuning=False, keep_hidden=True)
    engine = make_engine(comm, runner, str(model), s, 2, draft_runner=draft)
    prop = engine.speculator.proposer
    calls = []  # per propose call: [(tokens known, kept logits)] of its drafting requests, its chain runs
    run, propose = prop.run, prop.propose

    def recording_run(rows, hidden):
        logits = run(rows, hidden)
        if calls and calls[-1][2]:  # inside propose: a chain step
            calls[-1][1].append(([r.token_ids[0] for r in rows], logits.copy()))
        return logits

    def recording_propose(requests, k):
        live = [r for r in requests if (n := prop._next.get(r)) is not None and n.position == r.num_computed_tokens - 1]
        calls.append(([(list(r.all_token_ids), prop._next[r].logits.copy()) for r in live], [], True))
        propose(requests, k)
        calls[-1] = (*calls[-1][:2], False)

    prop.run, prop.propose = recording_run, recording_propose
    ids = case[0]
    params = SamplingParams(max_tokens=10, min_tokens=10, temperature=0.0)
    for i, prompt in enumerate(([int(t) for t in ids[:13]], [int(t) for t in ids[5:N]])):
        engine.scheduler.add_request(Request(str(i), prompt, params))
    while engine.scheduler.has_unfinished():
        engine.step()
    drafting = [c for c in calls if c[0]]
    assert engine.stats.drafts > 0 and sum(len(c[0]) for c in drafting) >= 10
    assert (engine.num_preemptions > 0) == (blocks == 3)
    assert all(len(chain) == K - 1 for _, chain, _ in drafting)  # a chain step per further draft
    target, mtp = (SimRank(d, 0, NUM_BLOCKS, BLOCK_SIZE) for d in (model, model / "mtp"))
    for live, chain, _ in drafting:
        for i, (tokens, kept) in enumerate(live):
            fed: list[tuple[int, np.ndarray]] = []  # (draft, the MTP's own row before it)
            whole, got = _ideal(target, mtp, tokens, fed), kept
            for drafts, logits in chain:
                err = np.abs(got - whole["logits"][-1]).max()
                assert err <= TOL_ENGINE, (len(tokens), len(fed), err)
                assert drafts[i] == int(np.argmax(got))  # greedy: the arg-max
                fed.append((drafts[i], whole["hidden_rows"][-1]))
                whole, got = _ideal(target, mtp, tokens, fed), logits[i]
            assert np.abs(got - whole["logits"][-1]).max() <= TOL_ENGINE
