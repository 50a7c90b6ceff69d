"""`spmd_serve bench`: the metric math on synthetic timings (exact values), the runner with a stub
request function, and the real client code against the in-process fake-engine Harness."""

from __future__ import annotations

import asyncio
import json
import math

import numpy as np
import pytest

from spmd_serve.bench.backends import Target
from spmd_serve.bench.metrics import RequestResult, calculate_metrics, summarize
from spmd_serve.bench.prompts import Prompt, synthetic_prompts
from spmd_serve.bench.runner import arrival_times, phase_split, run_once, sweep
from tests.support.fakes import OFFSET, FakeTokenizer

PRINTABLE = (OFFSET + 33, OFFSET + 127)  # FakeTokenizer ids of '!'..'~': every id has text


def result(chunks: list[tuple[float, int]], latency: float, prompt_len: int = 4) -> RequestResult:
    r = RequestResult(prompt_len=prompt_len)
    for t, k in chunks:
        r.add_chunk(t, k)
    r.latency, r.success = latency, True
    return r


# ---- metric math -------------------------------------------------------------------------------
def test_request_ttft_and_per_token_itl():
    r = result([(0.5, 1), (0.7, 1), (1.3, 3)], latency=1.4)
    assert r.ttft == 0.5 and r.output_tokens == 5
    # one gap of 0.2 s, then a 3-token chunk 0.6 s later: three gaps of 0.2 s
    assert r.itl == pytest.approx([0.2, 0.2, 0.2, 0.2])
    r.add_chunk(2.0, 0)  # an empty chunk is no token
    assert r.output_tokens == 5 and len(r.itl) == 4


def test_calculate_metrics_exact():
    a = result([(0.1, 1), (0.2, 1), (0.3, 1), (0.4, 1), (0.5, 1)], latency=0.5, prompt_len=10)
    b = result([(0.3, 1), (0.9, 1)], latency=1.0, prompt_len=20)
    c = result([(0.2, 1)], latency=0.2, prompt_len=30)  # one token: no TPOT
    bad = RequestResult(error="HTTP 400: too long")
    m = calculate_metrics(
        [a, b, c, bad, RequestResult(error="HTTP 400: too long"), RequestResult(error="boom")], duration_s=2.0
    )
    assert (m.completed, m.failed) == (3, 3)
    assert m.errors == ["HTTP 400: too long", "boom"]
    assert (m.total_input_tokens, m.total_output_tokens) == (60, 8)
    assert m.request_throughput == 1.5 and m.output_throughput == 4.0 and m.total_token_throughput == 34.0
    assert m.ttft_ms["mean"] == pytest.approx(200.0) and m.ttft_ms["median"] == pytest.approx(200.0)
    # TPOT: a (0.5-0.1)/4 = 0.1, b (1.0-0.3)/1 = 0.7
    assert m.tpot_ms["mean"] == pytest.approx(400.0) and m.tpot_ms["median"] == pytest.approx(400.0)
    assert m.tpot_ms["p99"] == pytest.approx(100 + 0.99 * 600)
    # ITL: four gaps of 0.1 and one of 0.6
    assert m.itl_ms["mean"] == pytest.approx(200.0) and m.itl_ms["median"] == pytest.approx(100.0)
    assert m.e2el_ms["mean"] == pytest.approx(1700 / 3) and m.e2el_ms["median"] == pytest.approx(500.0)


def test_summarize_percentiles_match_numpy_and_empty_is_zero():
    vals = [0.001 * i for i in range(1, 101)]
    s = summarize(vals)
    assert s["p99"] == pytest.approx(np.percentile(np.arange(1, 101), 99))
    assert s["median"] == pytest.approx(50.5) and s["std"] == pytest.approx(np.std(np.arange(1, 101)))
    assert summarize([]) == {"mean": 0.0, "median": 0.0, "std": 0.0, "p99": 0.0}


def test_arrivals_poisson_seeded_and_inf_at_once():
    assert arrival_times(4, math.inf, 0) == [0.0] * 4
    t = arrival_times(2000, 50.0, 7)
    assert t == arrival_times(2000, 50.0, 7) and t[0] == 0.0 and all(np.diff(t) >= 0)
    assert np.mean(np.diff(t)) == pytest.approx(1 / 50, rel=0.1)


def test_phase_split_per_step_and_per_handoff():
    before = {"phase:execute": 1.0, "phase:io_handoff": 0.1, "steps": 10, "handoffs": 10, "sampled": 10}
    after = {"phase:execute": 3.0, "phase:io_handoff": 0.2, "steps": 20, "handoffs": 30, "sampled": 330}
    p = phase_split(before, after)
    assert p == {
        "steps": 10,
        "mean_batch": 32.0,
        "ms_per_step": {"execute": pytest.approx(200.0), "io_handoff": pytest.approx(5.0)},
    }


def test_synthetic_prompts_exact_length_no_specials_and_seeded():
    tok = FakeTokenizer()
    ps = synthetic_prompts(tok, 5, 17, seed=3, id_range=(0, OFFSET + 50))
    assert all(len(p.token_ids) == 17 for p in ps)
    assert not {1, 2} & {i for p in ps for i in p.token_ids}  # BOS / EOS never drawn
    assert ps == synthetic_prompts(tok, 5, 17, seed=3, id_range=(0, OFFSET + 50))
    assert ps[0].text == tok.decode(ps[0].token_ids)


def test_runner_counts_failures_from_a_stub_backend():
    async def stub(conn, target, prompt):
        if prompt.token_ids[0] % 2:
            return RequestResult(error=f"odd {prompt.token_ids[0]}")
        return result([(0.01, 1), (0.02, target.output_len - 1)], 0.03)

    prompts = [Prompt([i], "") for i in range(6)]
    results, duration = asyncio.run(run_once(Target("native", "http://unused", output_len=3), prompts, 2, fn=stub))
    m = calculate_metrics(results, duration)
    assert (m.completed, m.failed, m.total_output_tokens) == (3, 3, 9)
    assert m.errors == ["odd 1", "odd 3", "odd 5"]


# ---- against the fake-engine Harness (real HTTP server, real client code) -----------------------
@pytest.mark.parametrize("backend", ["openai-completions", "openai-chat", "native"])
def test_bench_against_harness(srv, backend):
    prompts = synthetic_prompts(srv.tokenizer, 14, 8, seed=1, id_range=PRINTABLE)  # 2 levels x (1 warm-up + 6)
    runs = asyncio.run(sweep(Target(backend, srv.base, output_len=5), prompts, [1, 3], math.inf))
    assert [r.concurrency for r in runs] == [1, 3]
    for r in runs:
        m = r.metrics
        assert (m.completed, m.failed, m.errors) == (6, 0, [])
        assert m.total_output_tokens == 30 and all(x.output_tokens == 5 for x in r.results)
        assert all(len(x.itl) == 4 and 0 < x.ttft <= x.latency for x in r.results)
        if backend != "openai-chat":  # exact prompt ids; chat adds the template's tokens
            assert m.total_input_tokens == 48
        else:
            assert m.total_input_tokens > 48
    assert all(cmd.params.min_tokens == 5 for cmd in srv.engine.added)
    # every level and warm-up on prompts of its own: a repeated prompt would measure a prompt cache
    sent = [tuple(cmd.prompt_token_ids) for cmd in srv.engine.added]
    assert len(sent) == 14 and len(set(sent)) == 14


def test_sweep_refuses_prompts_that_do_not_split_into_levels(srv):
    prompts = synthetic_prompts(srv.tokenizer, 5, 8, seed=1, id_range=PRINTABLE)
    with pytest.raises(ValueError, match="do not split into 2 levels"):
        asyncio.run(sweep(Target("native", srv.base, output_len=5), prompts, [1, 3], math.inf))


@pytest.mark.parametrize("backend", ["openai-completions", "openai-chat", "native"])
def test_bench_counts_server_errors(srv, backend):
    # Harness: MAX_DEC_LEN 64, so asking for 100 output tokens is refused with 400 every time
    prompts = synthetic_prompts(srv.tokenizer, 4, 8, seed=1, id_range=PRINTABLE)
    runs = asyncio.run(sweep(Target(backend, srv.base, output_len=100), prompts, [2], math.inf, warmup=0))
    m = runs[0].metrics
    assert (m.completed, m.failed) == (0, 4)
    assert len(m.errors) >= 1 and all(e.startswith("HTTP 400") for e in m.errors)
    assert "64" in m.errors[0]  # the message names the limit


def test_bench_cli_end_to_end_on_harness(srv, tmp_path, monkeypatch, capsys):
    from spmd_serve.bench import cli

    tok = srv.tokenizer
    tok.special_token_ids = frozenset()
    monkeypatch.setattr(cli, "load_tokenizer", lambda d: tok)
    real = cli.synthetic_prompts
    monkeypatch.setattr(cli, "synthetic_prompts", lambda t, n, L, s: real(t, n, L, s, id_range=PRINTABLE))
    out = tmp_path / "r.json"
    rc = cli.main(
        [
            "--backend",
            "native",
            "--base-url",
            srv.base,
            "--tokenizer",
            "x",
            "--input-len",
            "6",
            "--output-len",
            "4",
            "--num-prompts",
            "5",
            "--concurrency",
            "1,2",
            "--json",
            str(out),
            "--plot-dir",
            str(tmp_path / "plots"),
            "--no-progress",
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert [r["concurrency"] for r in doc["runs"]] == [1, 2]
    assert all(r["completed"] == 5 and r["total_output_tokens"] == 20 for r in doc["runs"])
    assert set(doc["runs"][0]["ttft_ms"]) == {"mean", "median", "std", "p99"}
    assert doc["config"]["input_len"] == 6 and doc["config"]["request_rate"] is None
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "itl_hist.png",
        "latency.png",
        "throughput.png",
        "ttft_hist.png",
    ]
    assert "out tok/s" in capsys.readouterr().out
