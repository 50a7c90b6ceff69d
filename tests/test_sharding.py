"""Tensor-parallel sharding and exported graph segments, without MPI.

Covers spmd_serve/models/sharding.py (`shard_dims` errors and KV-head replication, the
q-head → KV-head mapping of `shard_weights`, vocab padding), spmd_serve/models/segment.py and
spmd_serve/worker/model_runner.py: the tiny demo checkpoint is exported at tp = 1, 2 and 4 (4 >
its 2 KV heads, so KV heads are replicated) and every rank's segments are run in-process, with the
collectives done by hand (partials summed = allreduce, logits concatenated = gather) and each
rank's own paged KV pool written at the slot mapping, as ModelRunner.execute does.  A chunked
prefill and several decode steps of 3 sequences must give the same logits at every tp (≤ 1e-4), the
same cached K/V, and match a plain numpy Llama forward.  Also: `spmd_serve export` errors.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from spmd_serve.models.sharding import ShardingError, shard_dims, shard_weights

TINY = {"vocab_size": 1024, "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2}


# ---------------------------------------------------------------- shard_dims

@pytest.mark.parametrize("cfg,tp,needles", [
    (dict(TINY), 3, ["num_attention_heads=4", "--tp 3"]),
    (dict(TINY), 8, ["num_attention_heads=4", "--tp 8"]),
    (dict(TINY, num_attention_heads=12, num_key_value_heads=4), 6, ["num_key_value_heads=4", "--tp 6"]),
    (dict(TINY, num_attention_heads=24, num_key_value_heads=8, intermediate_size=192), 12,
     ["num_key_value_heads=8", "--tp 12"]),
    (dict(TINY, intermediate_size=190), 4, ["intermediate_size=190", "--tp 4"]),
    (dict(TINY), 0, ["--tp must be >= 1"]),
])
def test_impossible_splits_are_refused_with_the_reason(cfg, tp, needles):
    with pytest.raises(ShardingError) as e:
        shard_dims(cfg, tp)
    assert all(n in str(e.value) for n in needles), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("nh,kvh,tp,heads,kv_local", [
    (4, 2, 1, 4, 2), (4, 2, 2, 2, 1), (4, 2, 4, 1, 1), (8, 8, 4, 2, 2), (8, 2, 8, 1, 1),
    (8, 4, 2, 4, 2), (16, 2, 4, 4, 1)])
def test_dims_split_or_replicate_kv_heads(nh, kvh, tp, heads, kv_local):
    d = shard_dims(dict(TINY, num_attention_heads=nh, num_key_value_heads=kvh, hidden_size=4 * nh), tp)
    assert (d.heads, d.kv_heads, d.group, d.head_dim) == (heads, kv_local, heads // kv_local, 4)
    assert d.intermediate == 192 // tp and d.vocab == 1024 and d.vocab_local == 1024 // tp


def test_kv_heads_default_to_attention_heads_and_vocab_pads_up():
    cfg = {k: v for k, v in TINY.items() if k != "num_key_value_heads"}
    d = shard_dims(dict(cfg, vocab_size=1001), 4)
    assert (d.heads, d.kv_heads, d.vocab, d.vocab_local) == (1, 1, 1001, 251)


def _random_hf(cfg: dict, rng) -> dict[str, np.ndarray]:
    h, nh, kvh, inter, v = (cfg[k] for k in ("hidden_size", "num_attention_heads",
                                             "num_key_value_heads", "intermediate_size", "vocab_size"))
    d = h // nh
    w = {"model.embed_tokens.weight": rng.standard_normal((v, h)), "model.norm.weight": rng.standard_normal(h),
         "lm_head.weight": rng.standard_normal((v, h))}
    p = "model.layers.0."
    shapes = {"self_attn.q_proj": (nh * d, h), "self_attn.k_proj": (kvh * d, h), "self_attn.v_proj": (kvh * d, h),
              "self_attn.o_proj": (h, nh * d), "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
              "mlp.down_proj": (h, inter)}
    w.update({p + k + ".weight": rng.standard_normal(s) for k, s in shapes.items()})
    w[p + "input_layernorm.weight"] = rng.standard_normal(h)
    w[p + "post_attention_layernorm.weight"] = rng.standard_normal(h)
    return {k: x.astype(np.float32) for k, x in w.items()}


@pytest.mark.parametrize("nh,kvh,tp", [(4, 2, 1), (4, 2, 2), (4, 2, 4), (8, 2, 8), (8, 4, 2), (8, 8, 4),
                                       (16, 2, 4), (6, 3, 3)])
def test_shard_weights_keep_each_query_head_with_its_kv_head(nh, kvh, tp):
    cfg = dict(TINY, num_attention_heads=nh, num_key_value_heads=kvh, hidden_size=2 * nh,
               intermediate_size=6 * tp, vocab_size=10, num_hidden_layers=1)
    hf = _random_hf(cfg, np.random.default_rng(nh * 100 + kvh * 10 + tp))
    dims = shard_dims(cfg, tp)
    d, a = dims.head_dim, "model.layers.0.self_attn."
    ranks = [shard_weights(hf, cfg, dims, r) for r in range(tp)]
    for r, w in enumerate(ranks):
        assert w["layers.0.k"].shape == (cfg["hidden_size"], dims.kv_heads * d)
        for local_q in range(dims.heads):
            j = r * dims.heads + local_q                               # global query head
            np.testing.assert_array_equal(w["layers.0.q"][:, local_q * d:(local_q + 1) * d],
                                          hf[a + "q_proj.weight"][j * d:(j + 1) * d].T)
            local_kv = local_q // dims.group                           # what the attention uses
            g = j // (nh // kvh)                                       # HF grouped-query mapping
            for name in ("k", "v"):
                np.testing.assert_array_equal(w[f"layers.0.{name}"][:, local_kv * d:(local_kv + 1) * d],
                                              hf[a + f"{name}_proj.weight"][g * d:(g + 1) * d].T)
    # row-parallel o/down and column-parallel gate/up/lm_head reassemble to the full matrices
    np.testing.assert_array_equal(np.concatenate([w["layers.0.o"] for w in ranks], 0), hf[a + "o_proj.weight"].T)
    np.testing.assert_array_equal(np.concatenate([w["layers.0.down"] for w in ranks], 0),
                                  hf["model.layers.0.mlp.down_proj.weight"].T)
    np.testing.assert_array_equal(np.concatenate([w["layers.0.gate"] for w in ranks], 1),
                                  hf["model.layers.0.mlp.gate_proj.weight"].T)
    embed = np.concatenate([w["embed"] for w in ranks], 0)
    head = np.concatenate([w["lm_head"] for w in ranks], 1)
    assert embed.shape[0] == head.shape[1] == dims.vocab_local * tp
    np.testing.assert_array_equal(embed[:10], hf["model.embed_tokens.weight"])
    np.testing.assert_array_equal(head[:, :10], hf["lm_head.weight"].T)
    assert not embed[10:].any() and not head[:, 10:].any()            # vocab padding is zero


# ---------------------------------------------------------------- in-process tensor parallelism

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

    sched = Scheduler(SchedulerConfig(max_num_seqs=4, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                                      block_ratio=1.0, max_waiting=8, max_num_batched_tokens=24,
                                      max_model_len=64))
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


class SimRank:
    """One rank's loaded segments and its own KV pool (what ModelRunner holds)."""

    def __init__(self, model_dir: Path, rank: int, onednn_min_tokens: int = 0) -> None:
        from spmd_serve.worker.kv_cache import KVCachePool
        from spmd_serve.worker.model_runner import Segment

        rank_dir = model_dir / f"rank_{rank}"
        manifest = json.loads((rank_dir / "manifest.json").read_text())
        self.dims, self.inv_freq = manifest["dims"], manifest["inv_freq"]
        self.segments = [Segment(rank_dir, spec, 1, onednn_min_tokens=onednn_min_tokens)
                         for spec in manifest["segments"]]
        self.pool = KVCachePool(self.dims["num_layers"], NUM_BLOCKS, BLOCK_SIZE,
                                self.dims["kv_heads"], self.dims["head_dim"])
        for seg in self.segments:
            seg.bind_cache(self.pool)


def run_step(ranks: list[SimRank], plan) -> np.ndarray:
    from spmd_serve.models.sharding import ShardDims
    from spmd_serve.models.step_tables import step_feeds

    names = {n for seg in ranks[0].segments for n in seg.inputs}
    base = step_feeds(plan, ShardDims(**ranks[0].dims), np.asarray(ranks[0].inv_freq, np.float32), BLOCK_SIZE, names)
    feeds = [dict(base) for _ in ranks]
    num_segments = len(ranks[0].segments)
    assert all(len(r.segments) == num_segments for r in ranks)
    decode = bool(plan.query_lens.max() == 1)
    for k in range(num_segments):
        outs = [r.segments[k].run(f, decode) for r, f in zip(ranks, feeds)]
        for r, out in zip(ranks, outs):
            for layer in r.segments[k].kv_layers:
                r.pool.write(layer, plan.slot_mapping, out[f"k_new_{layer}"], out[f"v_new_{layer}"])
        if ranks[0].segments[k].gathers_logits:
            assert k == num_segments - 1
            logits = np.concatenate([o["logits"] for o in outs], axis=1)        # gather over vocab
            return logits[:, : ranks[0].dims["vocab"]]
        total = np.sum([o["partial"] for o in outs], axis=0, dtype=np.float32)  # allreduce
        for f, o in zip(feeds, outs):
            f["partial"] = total.copy()
            if "hidden" in o:
                f["hidden"] = o["hidden"]
    raise AssertionError("no segment produced logits")


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

    def rope(x):                                                # [t, d]
        return x * cos + np.concatenate([-x[:, d // 2:], x[:, : d // 2]], 1) * sin

    h = w["model.embed_tokens.weight"][tokens]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        x = rms(h, w[p + "input_layernorm.weight"])
        q, k, v = (x @ w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        heads = []
        for j in range(nh):
            g = j // (nh // kvh)
            s = rope(q[:, j * d:(j + 1) * d]) @ rope(k[:, g * d:(g + 1) * d]).T / math.sqrt(d)
            s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
            pr = np.exp(s - s.max(-1, keepdims=True))
            heads.append(pr / pr.sum(-1, keepdims=True) @ v[:, g * d:(g + 1) * d])
        h = h + np.concatenate(heads, 1) @ w[p + "self_attn.o_proj.weight"].T
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms(h, w["model.norm.weight"]) @ w["lm_head.weight"].T


@pytest.fixture(scope="module")
def served_tp4(demo_checkpoint, tmp_path_factory) -> Path:
    from spmd_serve.export import export_checkpoint

    return export_checkpoint(demo_checkpoint, tmp_path_factory.mktemp("served") / "tp4", tp=4)


@pytest.fixture(scope="module")
def tp_runs(served_tp1, served_tp2, served_tp4):
    """tp → (per-step logits, the ranks with their filled KV pools); plans are shared."""
    plans, tokens, rows = make_plans()
    runs = {}
    for tp, model_dir in ((1, served_tp1), (2, served_tp2), (4, served_tp4)):
        ranks = [SimRank(Path(model_dir), r) for r in range(tp)]
        runs[tp] = ([run_step(ranks, plan) for plan in plans], ranks)
    return plans, tokens, rows, runs


def test_exported_layout(served_tp4):
    cfg = json.loads((served_tp4 / "config.json").read_text())
    assert cfg["spmd_serve"]["tp"] == 4
    for r in range(4):
        m = json.loads((served_tp4 / f"rank_{r}" / "manifest.json").read_text())
        assert m["rank"] == r and m["dims"]["kv_heads"] == 1 and m["dims"]["heads"] == 1
        names = [s["name"] for s in m["segments"]]
        assert names == [f"seg_{i}" for i in range(6)]                 # embed, 2×(attn, mlp), head
        assert [s["kv_layers"] for s in m["segments"]] == [[], [0], [], [1], [], []]
        assert m["segments"][-1]["outputs"] == ["logits"]


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_logits_equal_tp1(tp_runs, tp):
    plans, _, _, runs = tp_runs
    base, got = runs[1][0], runs[tp][0]
    for step, (plan, a, b) in enumerate(zip(plans, base, got)):
        assert a.shape == b.shape == (plan.num_seqs, 1024), step
        assert np.abs(a - b).max() <= 1e-4, (step, np.abs(a - b).max())


@pytest.mark.parametrize("tp", [1, 2])
def test_decode_graphs_and_onednn_predictors_give_the_same_logits(tp_runs, served_tp1, served_tp2, tp):
    """With a oneDNN twin (as ModelRunner loads by default), steps of < 5 single-token queries run
    the decode graph and every other step the general graph on oneDNN: same logits as plain."""
    plans, _, _, runs = tp_runs
    ranks = [SimRank(Path(served_tp1 if tp == 1 else served_tp2), r, onednn_min_tokens=5) for r in range(tp)]
    assert all(seg.plain_decode_only == bool(seg.kv_layers) for seg in ranks[0].segments)
    kinds = {(p.query_lens.max() == 1 and p.num_tokens < 5, p.num_tokens >= 5) for p in plans}
    assert (True, False) in kinds and (False, True) in kinds            # both predictors ran
    for step, plan in enumerate(plans):
        got, want = run_step(ranks, plan), runs[1][0][step]
        assert np.abs(got - want).max() <= 1e-4, (step, np.abs(got - want).max())


def test_onednn_predictor_knob(served_tp1, monkeypatch):
    """SPMD_ONEDNN_MIN_TOKENS: unset = automatic (on for a small model), 0 = one plain predictor
    of the general graph, anything but a count = a one-line configuration error."""
    from spmd_serve.config import ConfigError
    from spmd_serve.worker.model_runner import ModelRunner

    auto = ModelRunner(served_tp1, 0, None, 4, BLOCK_SIZE)
    assert auto.onednn_min_tokens == 5 and auto.segments[0].batched is not None
    assert auto.segments[0].plain_decode_only
    monkeypatch.setenv("SPMD_ONEDNN_MIN_TOKENS", "0")
    off = ModelRunner(served_tp1, 0, None, 4, BLOCK_SIZE)
    assert off.segments[0].batched is None and not off.segments[0].plain_decode_only
    monkeypatch.setenv("SPMD_ONEDNN_MIN_TOKENS", "many")
    with pytest.raises(ConfigError, match="SPMD_ONEDNN_MIN_TOKENS='many'"):
        ModelRunner(served_tp1, 0, None, 4, BLOCK_SIZE)


def test_tp1_logits_equal_numpy_reference(tp_runs, demo_checkpoint):
    plans, tokens, rows, runs = tp_runs
    ref = {i: reference_logits(Path(demo_checkpoint), toks) for i, toks in tokens.items()}
    assert len(plans) >= 5
    for step, (logits, step_rows) in enumerate(zip(runs[1][0], rows)):
        want = np.stack([ref[i][pos] for i, pos in step_rows])
        assert np.abs(logits - want).max() <= 1e-4, (step, np.abs(logits - want).max())
        assert logits.std() > 1.0                                      # not a degenerate model


@pytest.mark.parametrize("tp", [2, 4])
def test_each_rank_caches_its_kv_heads(tp_runs, tp):
    _, _, _, runs = tp_runs
    full = runs[1][1][0].pool                                          # [NB, bs, 2 kv heads, d]
    assert np.abs(full.k[0]).max() > 0
    for r, rank in enumerate(runs[tp][1]):
        head = r * 2 // tp                                             # 2 KV heads over tp ranks
        for layer in range(2):
            for mine, ref in ((rank.pool.k[layer], full.k[layer]), (rank.pool.v[layer], full.v[layer])):
                assert mine.shape[2] == 1
                assert np.abs(mine - ref[:, :, head:head + 1]).max() <= 1e-4


# ---------------------------------------------------------------- export errors

def test_export_tp3_is_a_one_line_error(demo_checkpoint, tmp_path, capsys):
    from spmd_serve.export import main

    out = tmp_path / "out"
    rc = main(["--checkpoint", str(demo_checkpoint), "--out", str(out), "--tp", "3"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("spmd_serve export: error:") and err.count("\n") == 1, err
    assert "num_attention_heads" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []         # nothing half-written
    from spmd_serve.cli import main as cli_main                        # `spmd_serve export ...`

    assert cli_main(["export", "--checkpoint", str(demo_checkpoint), "--out", str(out), "--tp", "3"]) == 2
    assert "num_attention_heads" in capsys.readouterr().err


@pytest.mark.parametrize("config,named", [({"architectures": ["MistralForCausalLM"]}, "MistralForCausalLM"),
                                          ({"model_type": "gpt2"}, "gpt2")])
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
