"""What a thinking budget costs rank 0 a step (engine/think_budget.py): `think_budget.forced` for one
request inside its think block, its state read on token by token, over a vocabulary of random bytes.

    python benchmarks/think_budget_step.py [--vocab 150000] [--steps 8000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from spmd_serve.engine import think_budget
from spmd_serve.engine.json_masks import JsonVocab
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=150_000)
    ap.add_argument("--steps", type=int, default=8_000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    vocab = JsonVocab([bytes(rng.integers(97, 123, rng.integers(1, 8)).tolist()) for _ in range(args.vocab)])
    params = SamplingParams(
        max_tokens=args.steps + 1, think_budget=args.steps + 1, think_inside=True, think_open=(1,), think_close=(2,)
    )
    req = Request("r", [1], params)
    ids = rng.integers(3, args.vocab, args.steps).tolist()
    start = time.perf_counter()
    for t in ids:
        think_budget.forced(req, vocab)
        req.output_token_ids.append(t)
    per_step = (time.perf_counter() - start) / args.steps
    print(f"think_budget.forced: {per_step * 1e6:.1f} us a step ({args.steps} steps, vocabulary {args.vocab})")


if __name__ == "__main__":
    main()
