"""Rank 0's sampling time per step on the CPU path: spmd_serve.engine.sampler.sample (ops.sample's
numpy twin) on [batch, vocab] logits, batch 1 and 32, vocab 8000 and 32000, greedy and top-p.

    python benchmarks/sampling_step.py [--sampler FILE.py] [--repeats 15]

`--sampler` times another module's `sample(logits, requests)` instead (e.g. an older sampler taken
with `git show REV:spmd_serve/engine/sampler.py > /tmp/old.py`), so before/after runs can be
interleaved on a shared machine.  Prints one line per case: the median and min in ms per step.
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import numpy as np

from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request

CASES = {"greedy": dict(temperature=0.0), "top_p": dict(temperature=0.8, top_p=0.9)}
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
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    sample = load_sample(args.sampler)
    for case in CASES:
        for vocab in (8000, 32000):
            for batch in (1, 32):
                med, best = time_case(sample, batch, vocab, case, args.repeats)
                print(
                    f"{case:6s} vocab {vocab:5d} batch {batch:2d}: median {med:8.2f} ms  min {best:8.2f} ms", flush=True
                )


if __name__ == "__main__":
    main()
