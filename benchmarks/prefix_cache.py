"""Prefix caching, measured on the offline engine (no HTTP) of a served model (issue 15).

    mpirun -n 1 python benchmarks/prefix_cache.py [MODEL_DIR] [--trials 5] [--json OUT]

MODEL_DIR defaults to the trained demo model (`ensure_demo_model`, one rank).  Prints one JSON object:

* `ttft`: time to first token of a request whose prompt is a `--prefix-len`-token text prefix plus
  a short question (the first), then of a second request with the same prefix and another question,
  with caching on; and of that second request with caching off.  Each trial uses a new prefix (a
  different window of the demo corpus), and the settings alternate within a trial, so machine noise
  hits both alike; medians over `--trials`.
* `chat`: `--chats` conversations of `--turns` turns sharing a system prompt, each turn sending the
  whole history (chats.txt questions, greedy answers of up to `--max-tokens` tokens), with and without
  caching: wall time, prompt tokens per second served, prefix-cache hits, and whether the answers are
  identical.  The engine uses the server's defaults: 512-token steps, blocks of 64 tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from typing import Any

from spmd_serve.engine.offline import EngineSettings, make_engine, open_ranks, run_chats
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request


def ttft(engine: Any, prompt: list[int], req_id: str) -> float:
    """Seconds from admission to the first sampled token of one request alone in the engine."""
    params = SamplingParams(max_tokens=1, temperature=0.0)
    t0 = time.perf_counter()
    engine.scheduler.add_request(Request(req_id, prompt, params))
    while engine.scheduler.has_unfinished():
        engine.step()
    return time.perf_counter() - t0


def measure_ttft(comm: Any, runner: Any, model_dir: str, s: EngineSettings, text: list[int], args: Any) -> dict:
    cached = make_engine(comm, runner, model_dir, dataclasses.replace(s, enable_prefix_caching=True), 4)
    plain = make_engine(comm, runner, model_dir, s, 4)
    questions = [text[i * 20 : i * 20 + 16] for i in range(2)]  # two different 16-token endings
    first, second, uncached = [], [], []
    ttft(plain, text[: args.prefix_len] + questions[0], "warm-up")
    for t in range(args.trials):
        prefix = [1] + text[(t + 1) * 600 : (t + 1) * 600 + args.prefix_len - 1]
        first.append(ttft(cached, prefix + questions[0], f"first{t}"))
        uncached.append(ttft(plain, prefix + questions[1], f"plain{t}"))
        second.append(ttft(cached, prefix + questions[1], f"second{t}"))
    med = {k: statistics.median(v) for k, v in (("first", first), ("second", second), ("second_uncached", uncached))}
    return {
        "prefix_len": args.prefix_len,
        "trials": args.trials,
        **{f"{k}_ms": round(v * 1e3, 2) for k, v in med.items()},
        "second_over_first": round(med["second"] / med["first"], 3),
        "second_over_uncached": round(med["second"] / med["second_uncached"], 3),
    }


def measure_chats(comm: Any, runner: Any, model_dir: str, s: EngineSettings, tok: Any, args: Any) -> dict:
    from spmd_serve.export.demo.training_data import chat_pairs, chat_text

    pairs = chat_pairs()
    system = [1] + tok.encode(chat_text([("system", " ".join(q for q, _ in pairs[:12]))]))  # a long one
    questions = [q for q, _ in pairs[12:]]

    def turn(c: int, k: int) -> list[int]:
        text = chat_text([("user", questions[(c * args.turns + k) % len(questions)])]) + "<|assistant|>\n"
        return tok.encode(("\n" if k else "") + text)  # the newline after the previous answer's <|end|>

    turns = [[turn(c, k) for k in range(args.turns)] for c in range(args.chats)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    out: dict[str, Any] = {"chats": args.chats, "turns": args.turns, "system_tokens": len(system)}
    answers = {}
    for caching in (False, True, False, True):  # twice each, alternating; the second of each is kept
        engine = make_engine(comm, runner, model_dir, dataclasses.replace(s, enable_prefix_caching=caching), args.chats)
        t0 = time.perf_counter()
        rounds = run_chats(engine, system, turns, params)
        wall = time.perf_counter() - t0
        reqs = [r for rnd in rounds for r in rnd]
        key = "caching" if caching else "plain"
        answers[key] = [r.output_token_ids for r in reqs]
        prompt_tokens = sum(r.num_prompt_tokens for r in reqs)
        out[key] = {
            "wall_s": round(wall, 3),
            "prompt_tokens": prompt_tokens,
            "output_tokens": sum(r.num_output_tokens for r in reqs),
            "cached_tokens": sum(r.num_cached_tokens or 0 for r in reqs),
            "prompt_tokens_per_s": round(prompt_tokens / wall, 1),
            "output_tokens_per_s": round(sum(r.num_output_tokens for r in reqs) / wall, 1),
            "steps": engine.step_id,
        }
    out["speed_up"] = round(out["plain"]["wall_s"] / out["caching"]["wall_s"], 2)
    out["same_answers"] = answers["plain"] == answers["caching"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir", nargs="?")
    ap.add_argument("--prefix-len", type=int, default=512)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--chats", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    from spmd_serve.engine.engine import worker_loop
    from spmd_serve.protocol import StepPlan

    model_dir = args.model_dir
    if model_dir is None:
        from spmd_serve.export import ensure_demo_model

        model_dir = str(ensure_demo_model())
    s = EngineSettings(num_blocks=512, block_size=64, max_num_seqs=args.chats, eos_token_ids=frozenset({2, 6}))
    comm, runner = open_ranks(model_dir, s)
    if comm.rank != 0:
        worker_loop(comm, runner)
        return
    from spmd_serve.export.demo.corpus import base_sentences
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

    tok = ServingTokenizer.from_model_dir(model_dir)
    text = tok.encode(" ".join(base_sentences()))
    result = {
        "model_dir": model_dir,
        "ttft": measure_ttft(comm, runner, model_dir, s, text, args),
        "chat": measure_chats(comm, runner, model_dir, s, tok, args),
    }
    comm.send_plan(StepPlan.shutdown(1 << 30))
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
