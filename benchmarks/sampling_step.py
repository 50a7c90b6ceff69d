"""Rank 0's sampling time per step on the CPU path: spmd_serve.engine.sampler.sample (ops.sample's
numpy twin) on [batch, vocab] logits, batch 1 and 32, vocab 8000 and 32000 (and --vocab), greedy,
top-p and plain (temperature 1: the OpenAI API's default).

    python benchmarks/sampling_step.py [--sampler FILE.py] [--native] [--vocab 128256] [--repeats 15]

`--sampler` times another module's `sample(logits, requests)` instead (e.g. an older sampler taken
with `git show REV:spmd_serve/engine/sampler.py > /tmp/old.py`), so before/after runs can be
interleaved on a shared machine.  `--native` loads the op library first, so the draws run in C
(ops/sample_native.py), as on a CPU server; each case is then timed both ways, back to back.  Prints
one line per case: the median and min in ms per step.
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import numpy as np

from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request

CASES = {"greedy": dict(temperature=0.0), "top_p": dict(temperature=0.8, top_p=0.9), "plain": dict(temperature=1.0)}
GENERATED = 32  # output tokens each request already has (penalty/EOS inputs)


def load_sample(path: str | None):
    if path is None:
        from spmd_serve.engine.sampler import sample

        return sample
    spec = importlib.util.spec_from_file_location("alt_sampler", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.sample


def requests(batch: int, vocab: int, case: str) -> list[Request]:
    rng = np.random.default_rng(batch)
    out = []
    for i in range(batch):
        r = Request(
            str(i), [1, 2, 3], SamplingParams(seed=i, max_tokens=4096, **CASES[case]), eos_token_ids=frozenset({2})
        )
        r.output_token_ids = [int(t) for t in rng.integers(3, vocab, GENERATED)]
        out.append(r)
    return out


def time_case(sample, batch: int, vocab: int, case: str, repeats: int) -> tuple[float, float]:
    # logits like a model's: a few strong candidates over a normal background
    logits = (np.random.default_rng(vocab).standard_normal((batch, vocab)) * 2.0).astype(np.float32)
    reqs = requests(batch, vocab, case)
    sample(logits, reqs)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sample(logits, reqs)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3, min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sampler", help="a .py file whose sample(logits, requests) is timed instead")
    ap.add_argument("--native", action="store_true", help="numpy twin against the C draws, interleaved")
    ap.add_argument("--vocab", type=int, action="append", help="vocabulary sizes (default 8000, 32000)")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    sample = load_sample(args.sampler)
    ways = {"": lambda: None}
    if args.native:
        from ops import paddle_ext, sample_native

        paddle_ext.load()
        kernels, ways = sample_native.kernels, {"numpy": lambda: None, "C": sample_native.kernels}
    for case in CASES:
        for vocab in args.vocab or (8000, 32000):
            for batch in (1, 32):
                for way, steps in ways.items():
                    if args.native:
                        sample_native.kernels = steps  # what the sampler asks for its draws
                    med, best = time_case(sample, batch, vocab, case, args.repeats)
                    what = f"{case:6s} vocab {vocab:6d} batch {batch:2d} {way:5s}"
                    print(f"{what}: median {med:8.2f} ms  min {best:8.2f} ms", flush=True)
    if args.native:
        sample_native.kernels = kernels


if __name__ == "__main__":
    main()
