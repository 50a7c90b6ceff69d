"""USE_WARMUP=1: push a short greedy request through every rank before reporting ready, so the
first user request does not pay for graph initialisation and first-touch of memory."""
from __future__ import annotations

from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request


def warm_up(engine, tokenizer, max_tokens: int = 4) -> None:
    prompt = tokenizer.encode("Warm-up request: hello world.") or [tokenizer.bos_token_id or 1]
    req = Request("__warmup__", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    engine.scheduler.add_request(req)
    while engine.scheduler.has_unfinished():
        engine.step()
