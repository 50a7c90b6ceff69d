"""Tensor-parallel sharding and exported graph segments, without MPI.

Covers spmd_serve/export/segment.py and spmd_serve/worker/model_runner.py (the sharding rules
and export errors are in tests/unit/test_sharding_rules.py): the tiny demo checkpoint is exported at
tp = 1, 2 and 4 (4 >
its 2 KV heads, so KV heads are replicated) and every rank's segments are run in-process, with the
collectives done by hand (partials summed = allreduce, logits concatenated = gather) and each
rank's own paged KV pool written at the slot mapping, as ModelRunner.execute does.  A chunked
prefill and several decode steps of 3 sequences must give the same logits at every tp (≤ 1e-4), the
same cached K/V, and match a plain numpy Llama forward.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.support.sim_ranks import SimRank, run_step

# ------------------------------------------------ in-process tensor parallelism (tests/support/sim_ranks.py)

BLOCK_SIZE, NUM_BLOCKS = 4, 32
PROMPTS = [[1, 17, 300, 5, 999], [1] + list(range(40, 50)), [1] + list(range(700, 716))]


def make_plans() -> tuple[list, dict[int, list[int]], list[list[tuple[int, int]]]]:
    """Plans of a real scheduler run (chunked prefill next to decode, then pure decode), teacher-forced
    with fixed "sampled" tokens so every tp sees identical inputs.  Also returns each request's
    final tokens and, per step, (request index, position of its last token) for each row."""
    from spmd_serve.engine.plan_builder import build_plan
    from spmd_serve.sampling_params import SamplingParams
    from spmd_serve.scheduler.request import Request
    from spmd_serve.scheduler.scheduler import Scheduler, SchedulerConfig

    sched = Scheduler(
        SchedulerConfig(
            max_num_seqs=4,
            num_blocks=NUM_BLOCKS,
            block_size=BLOCK_SIZE,
            block_ratio=1.0,
            max_waiting=8,
            max_num_batched_tokens=24,
            max_model_len=64,
        )
    )
    reqs = [Request(str(i), p, SamplingParams(max_tokens=5, min_tokens=5)) for i, p in enumerate(PROMPTS)]
    for r in reqs:
        sched.add_request(r)
    rng = np.random.default_rng(7)
    plans, rows = [], []
    while sched.has_unfinished():
        out = sched.schedule()
        plans.append(build_plan(out, len(plans), BLOCK_SIZE))
        rows.append([(reqs.index(s.request), s.start + s.num_new_tokens - 1) for s in out.seqs])
        sched.update(out, {s.request.req_id: int(rng.integers(3, 1024)) for s in out.seqs if s.samples})
    assert any(p.query_lens.max() > 1 and p.ctx_lens.max() > 0 for p in plans), "no chunked prefill step"
    assert any(p.block_tables.shape[1] > 1 for p in plans)
    return plans, {i: r.all_token_ids for i, r in enumerate(reqs)}, rows


def reference_logits(ckpt: Path, tokens: list[int]) -> np.ndarray:
    """Plain float64 numpy Llama over a whole sequence (causal, no cache): logits at every position."""
    from safetensors.numpy import load_file

    cfg = json.loads((ckpt / "config.json").read_text())
    w = {k: v.astype(np.float64) for k, v in load_file(str(ckpt / "model.safetensors")).items()}
    nh, kvh, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rms_norm_eps"]
    d, t = cfg["hidden_size"] // nh, len(tokens)

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, d, 2) / d)
    ang = np.arange(t)[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))

    def rope(x):  # [t, d]
        return x * cos + np.concatenate([-x[:, d // 2 :], x[:, : d // 2]], 1) * sin

    h = w["model.embed_tokens.weight"][tokens]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        x = rms(h, w[p + "input_layernorm.weight"])
        q, k, v = (x @ w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        heads = []
        for j in range(nh):
            g = j // (nh // kvh)
            s = rope(q[:, j * d : (j + 1) * d]) @ rope(k[:, g * d : (g + 1) * d]).T / math.sqrt(d)
            s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
            pr = np.exp(s - s.max(-1, keepdims=True))
            heads.append(pr / pr.sum(-1, keepdims=True) @ v[:, g * d : (g + 1) * d])
        h = h + np.concatenate(heads, 1) @ w[p + "self_attn.o_proj.weight"].T
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms(h, w["model.norm.weight"]) @ w["lm_head.weight"].T


@pytest.fixture(scope="module")
def served_tp4(demo_checkpoint, tmp_path_factory) -> Path:
    from spmd_serve.export import export_checkpoint

    # a graph per stage: SimRank plays the collectives between them in this one process
    return export_checkpoint(demo_checkpoint, tmp_path_factory.mktemp("served") / "tp4", tp=4, graph_ops="paddle")


@pytest.fixture(scope="module")
def tp_runs(served_tp1, served_tp2_segments, served_tp4):
    """tp → (per-step logits, the ranks with their filled KV pools); plans are shared."""
    plans, tokens, rows = make_plans()
    runs = {}
    for tp, model_dir in ((1, served_tp1), (2, served_tp2_segments), (4, served_tp4)):
        ranks = [SimRank(Path(model_dir), r, NUM_BLOCKS, BLOCK_SIZE) for r in range(tp)]
        runs[tp] = ([run_step(ranks, plan) for plan in plans], ranks)
    return plans, tokens, rows, runs


def test_exported_layout(served_tp4):
    cfg = json.loads((served_tp4 / "config.json").read_text())
    assert cfg["spmd_serve"]["tp"] == 4
    for r in range(4):
        m = json.loads((served_tp4 / f"rank_{r}" / "manifest.json").read_text())
        assert m["rank"] == r and m["dims"]["kv_heads"] == 1 and m["dims"]["heads"] == 1
        names = [s["name"] for s in m["segments"]]
        assert names == [f"seg_{i}" for i in range(6)]  # embed, 2×(attn, mlp), head
        assert [s["kv_layers"] for s in m["segments"]] == [[], [0], [], [1], [], []]
        assert m["segments"][-1]["outputs"] == ["logits"]


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_logits_equal_tp1(tp_runs, tp):
    plans, _, _, runs = tp_runs
    base, got = runs[1][0], runs[tp][0]
    for step, (plan, a, b) in enumerate(zip(plans, base, got)):
        assert a.shape == b.shape == (plan.num_seqs, 1024), step
        assert np.abs(a - b).max() <= 1e-4, (step, np.abs(a - b).max())


def test_tp1_logits_equal_numpy_reference(tp_runs, demo_checkpoint):
    plans, tokens, rows, runs = tp_runs
    ref = {i: reference_logits(Path(demo_checkpoint), toks) for i, toks in tokens.items()}
    assert len(plans) >= 5
    for step, (logits, step_rows) in enumerate(zip(runs[1][0], rows)):
        want = np.stack([ref[i][pos] for i, pos in step_rows])
        assert np.abs(logits - want).max() <= 1e-4, (step, np.abs(logits - want).max())
        assert logits.std() > 1.0  # not a degenerate model


@pytest.mark.parametrize("tp", [2, 4])
def test_each_rank_caches_its_kv_heads(tp_runs, tp):
    _, _, _, runs = tp_runs
    full = runs[1][1][0].pool  # [NB, 2 kv heads, bs, d]
    assert np.abs(full.k[0]).max() > 0
    for r, rank in enumerate(runs[tp][1]):
        head = r * 2 // tp  # 2 KV heads over tp ranks
        for layer in range(2):
            for mine, ref in ((rank.pool.k[layer], full.k[layer]), (rank.pool.v[layer], full.v[layer])):
                assert mine.shape[1] == 1
                assert np.abs(mine - ref[:, head : head + 1]).max() <= 1e-4
