"""The pure-Python parts of benchmarks/peers (the llama.cpp comparison), without building llama.cpp:
the GGUF conversion's q/k permutation (against both RoPE conventions), its tensor names, its
SentencePiece reader (against sentencepiece itself), the ratio tables, the sdist's commit."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from benchmarks.peers import gguf_convert, ratios
from benchmarks.peers.build_llama import vendored_commit


def _rope_freqs(d: int, pos: int, theta: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    ang = pos * theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # [d/2]
    return np.cos(ang), np.sin(ang)


def rope_hf(x: np.ndarray, pos: int) -> np.ndarray:
    """HF Llama: each head [d] rotates (x[j], x[j + d/2]) pairs (rotate_half)."""
    d = x.shape[-1]
    cos, sin = _rope_freqs(d, pos)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def rope_ggml_norm(x: np.ndarray, pos: int) -> np.ndarray:
    """llama.cpp's LLAMA rope type: each head rotates adjacent (x[2j], x[2j + 1]) pairs."""
    d = x.shape[-1]
    cos, sin = _rope_freqs(d, pos)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


@pytest.mark.parametrize("n_head,n_kv,d", [(4, 2, 16), (8, 8, 8), (6, 3, 32)])
def test_permuted_qk_give_the_same_attention_scores_under_llama_cpp_rope(n_head, n_kv, d):
    rng = np.random.default_rng(0)
    hidden = 24
    wq, wk = rng.standard_normal((n_head * d, hidden)), rng.standard_normal((n_kv * d, hidden))
    x_q, x_k = rng.standard_normal(hidden), rng.standard_normal(hidden)
    pq, pk = 7, 3
    q_hf = rope_hf((wq @ x_q).reshape(n_head, d), pq)
    k_hf = rope_hf((wk @ x_k).reshape(n_kv, d), pk)
    q_gg = rope_ggml_norm((gguf_convert.permute_qk(wq, n_head) @ x_q).reshape(n_head, d), pq)
    k_gg = rope_ggml_norm((gguf_convert.permute_qk(wk, n_kv) @ x_k).reshape(n_kv, d), pk)
    group = n_head // n_kv
    scores_hf = np.einsum("hd,hd->h", q_hf, np.repeat(k_hf, group, axis=0))
    scores_gg = np.einsum("hd,hd->h", q_gg, np.repeat(k_gg, group, axis=0))
    np.testing.assert_allclose(scores_gg, scores_hf, rtol=1e-10, atol=1e-10)
    # and the rotated vectors are the same numbers, interleaved
    np.testing.assert_allclose(q_gg[:, 0::2], q_hf[:, : d // 2], atol=1e-10)
    np.testing.assert_allclose(q_gg[:, 1::2], q_hf[:, d // 2 :], atol=1e-10)


def test_unpermuted_weights_would_not_match():
    """The permutation is needed: without it the scores differ (the test above can fail)."""
    rng = np.random.default_rng(1)
    wq, wk, x = rng.standard_normal((16, 8)), rng.standard_normal((16, 8)), rng.standard_normal(8)
    hf = np.sum(rope_hf((wq @ x).reshape(1, 16), 5) * rope_hf((wk @ x).reshape(1, 16), 2))
    raw = np.sum(rope_ggml_norm((wq @ x).reshape(1, 16), 5) * rope_ggml_norm((wk @ x).reshape(1, 16), 2))
    assert abs(hf - raw) > 1e-3


def test_tensor_names():
    name = gguf_convert.gguf_tensor_name
    assert name("model.embed_tokens.weight") == "token_embd.weight"
    assert name("lm_head.weight") == "output.weight"
    assert name("model.norm.weight") == "output_norm.weight"
    assert name("model.layers.3.self_attn.q_proj.weight") == "blk.3.attn_q.weight"
    assert name("model.layers.11.mlp.down_proj.weight") == "blk.11.ffn_down.weight"
    assert name("model.layers.0.post_attention_layernorm.weight") == "blk.0.ffn_norm.weight"
    with pytest.raises(ValueError):
        name("model.layers.0.self_attn.rotary_emb.inv_freq")


def test_tensor_names_match_gguf_py_when_installed():
    import gguf

    table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    hf = [*gguf_convert.GLOBAL_NAMES] + [f"model.layers.1.{k}.weight" for k in gguf_convert.LAYER_NAMES]
    for n in hf:
        assert gguf_convert.gguf_tensor_name(n) == table.get_name(n, try_suffixes=(".weight",)), n


def test_sentencepiece_reader_matches_sentencepiece(demo_checkpoint):
    import sentencepiece as spm

    proto = (demo_checkpoint / "tokenizer.model").read_bytes()
    sp = spm.SentencePieceProcessor(model_proto=proto)
    pieces, scores, types = gguf_convert.sentencepiece_vocab(proto)
    assert len(pieces) == len(scores) == len(types) == sp.get_piece_size()
    for i in range(sp.get_piece_size()):
        assert pieces[i].decode("utf-8") == sp.id_to_piece(i)
        assert scores[i] == pytest.approx(sp.get_score(i))
        want = 2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else None
        if want is not None:
            assert types[i] == want, (i, sp.id_to_piece(i))
    # the demo's chat markers are user-defined symbols: llama.cpp must match them whole
    assert [types[sp.piece_to_id(m)] for m in ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")] == [4] * 4
    assert set(types) <= {1, 2, 3, 4, 5, 6}
    assert gguf_convert.sentencepiece_adds_prefix(proto) is True


def test_convert_tensors_with_gguf_py_when_installed(demo_checkpoint):
    import gguf

    cfg, _, weights = gguf_convert.load_checkpoint(demo_checkpoint)
    for outtype, want in (("f32", np.float32), ("f16", np.float16), ("q8_0", np.uint8)):
        out = {name: (data, kind) for name, data, kind in gguf_convert.convert_tensors(gguf, cfg, weights, outtype)}
        assert len(out) == len(weights)
        assert out["blk.0.attn_norm.weight"][0].dtype == np.float32
        assert out["blk.0.ffn_up.weight"][0].dtype == want
    back = gguf.quants.dequantize(out["token_embd.weight"][0], gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_allclose(back, weights["model.embed_tokens.weight"], atol=0.05)


def _bench_doc(levels: dict[int, tuple[float, float, float]], failed: int = 0) -> dict:
    runs = [
        {
            "concurrency": c,
            "completed": 8,
            "failed": failed,
            "output_throughput": tok_s,
            "total_input_tokens": 8 * 128,
            "total_output_tokens": 8 * 128,
            "ttft_ms": {"mean": 0, "median": ttft / 2, "p99": ttft},
            "tpot_ms": {"mean": 0, "median": tpot, "p99": 0},
        }
        for c, (tok_s, tpot, ttft) in levels.items()
    ]
    return json.loads(json.dumps({"config": {}, "runs": runs}))


def test_ratio_tables():
    ours = ratios.level_stats([_bench_doc({1: (100.0, 9.2, 50.0)}), _bench_doc({8: (200.0, 35.6, 800.0)})])
    peer = ratios.level_stats([_bench_doc({1: (250.0, 3.4, 25.0), 8: (800.0, 10.0, 400.0)}, failed=1)])
    assert ours[1]["prompt_tokens_per_request"] == 128
    r = ratios.ratio_row(ours, peer, [1, 8, 32])
    assert r["output_tok_s"] == {1: pytest.approx(0.4), 8: pytest.approx(0.25), 32: None}
    assert r["ttft_p99"] == {1: pytest.approx(2.0), 8: pytest.approx(2.0), 32: None}
    raw = ratios.raw_table({"ours": ours, "peer": peer}, [1, 8, 32])
    assert "| ours | 100 (9.2) | 200 (35.6) | — | 0.05 s | 0.80 s | — |" in raw
    assert "250 (3.4), 1 failed" in raw
    table = ratios.ratio_table({"ours ÷ peer": r}, [1, 8, 32])
    assert "| ours ÷ peer | 0.40 | 0.25 | — | 2.00 | 2.00 | — |" in table


def test_vendored_commit_from_changelog():
    log = (
        "# Changelog\n\n## [Unreleased]\n\n## [0.3.36]\n\n"
        "- feat: update llama.cpp to ggml-org/llama.cpp@0c1e57098\n\n"
        "## [0.3.35]\n\n- feat: update llama.cpp to ggml-org/llama.cpp@4df29be4f\n- fix: x\n"
    )
    assert vendored_commit(log, "0.3.36") == "0c1e57098"
    assert vendored_commit(log, "0.3.35") == "4df29be4f"
    assert vendored_commit(log, "0.3.1") == "unknown"


def test_best_of_rounds_keeps_each_level_whole():
    slow = ratios.level_stats([_bench_doc({1: (80.0, 12.0, 90.0), 8: (300.0, 20.0, 500.0)})])
    fast = ratios.level_stats([_bench_doc({1: (100.0, 9.0, 120.0), 8: (250.0, 25.0, 400.0)})])
    best = ratios.best_of([slow, fast])
    assert best[1] == fast[1] and best[8] == slow[8]  # by output tok/s, TTFT of the same run


def test_merge_keeps_the_least_disturbed_level():
    from benchmarks.peers.ratios import merge_report

    def row(name, levels):
        return {"name": name, "levels": levels}

    lvl = {1: {"output_tok_s": 10.0, "foreign_cpu": 0.3}, 8: {"output_tok_s": 50.0, "foreign_cpu": 0.0}}
    report = {"rows": {"ours-f32": row("a", lvl)}}
    old = json.loads(
        json.dumps(
            {
                "command": "earlier",
                "checks": {"reference": "a"},
                "rows": {
                    "ours-f32": row(
                        "a",
                        {1: {"output_tok_s": 12.0, "foreign_cpu": 0.05}, 8: {"output_tok_s": 60.0, "foreign_cpu": 0.2}},
                    ),
                    "llama-f32": row("b", {1: {"output_tok_s": 30.0, "foreign_cpu": 0.0}}),
                },
            }
        )
    )
    merge_report(report, old)
    assert list(report["rows"]) == ["ours-f32", "llama-f32"]
    assert report["rows"]["ours-f32"]["levels"][1]["output_tok_s"] == 12.0  # less disturbed
    assert report["rows"]["ours-f32"]["levels"][8]["output_tok_s"] == 50.0
    assert report["rows"]["llama-f32"]["levels"] == {1: {"output_tok_s": 30.0, "foreign_cpu": 0.0}}
    assert report["merged_from"] == ["earlier"] and report["checks_merged"] == [{"reference": "a"}]


def test_machine_records_the_isa_the_ratios_turn_on():
    from benchmarks.peers.machine import ISA_FLAGS, machine

    m = machine()
    flags = set(next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")).split())
    assert m["isa"] == [f for f in ISA_FLAGS if f in flags]
    assert re.fullmatch(r"\d+/\d+", m["cpu_family_model"]) and m["nproc"] >= 1


def test_row_notes_name_each_rounds_start_up_time():
    levels = ratios.level_stats([_bench_doc({1: (100.0, 9.2, 50.0)})])
    levels[1]["foreign_cpu"] = 0.02
    rounds = [{"loadavg_after": (1.46, 0, 0), "ready_s": 7.84}, {"loadavg_after": (0.9, 0, 0)}]  # merged: no time
    notes = ratios.row_notes([{"name": "ours", "levels": levels, "rounds": rounds}]).splitlines()
    assert notes[0] == (
        "ours: ready after [7.8, None] s; other processes' share of the cores during each level kept {1: '2%'}, "
        "1-min load average after each round [1.5, 0.9]"
    )
    assert notes[1] == "tokens per request (prompt/output, the server's usage) ours: {1: '128.0/128.0'}"
