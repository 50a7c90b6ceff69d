"""Runs the same multi-turn chats twice in one `mpirun`, without and with prefix caching (test helper).

    mpirun -n N python -m tests.support.prefix_chat_driver MODEL_DIR SPEC.json OUT.json

SPEC: {"system": [ids], "turns": [[[ids] per turn] per chat], "params": {...}, "engine": {...}}.
Every rank opens its shard once; rank 0 runs one engine per setting over the same ranks (the
workers stay in their plan loop throughout) and writes, per setting, each request's tokens, its
cached prompt tokens and the run's preemptions and prefix-cache counts.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main(model_dir: str, spec_path: str, out_path: str) -> int:
    import dataclasses

    from spmd_serve.engine.engine import worker_loop
    from spmd_serve.engine.offline import EngineSettings, make_engine, open_ranks, run_chats
    from spmd_serve.protocol import StepPlan
    from spmd_serve.sampling_params import SamplingParams

    spec = json.loads(open(spec_path).read())
    engine_kw = dict(spec.get("engine", {}))
    engine_kw["eos_token_ids"] = frozenset(engine_kw.get("eos_token_ids", ()))
    settings = EngineSettings(**engine_kw)
    comm, runner = open_ranks(model_dir, settings)
    if comm.rank != 0:
        worker_loop(comm, runner)
        return 0
    out: dict[str, Any] = {}
    step_id = 0
    for caching in (False, True):
        s = dataclasses.replace(settings, enable_prefix_caching=caching)
        engine = make_engine(comm, runner, model_dir, s, capacity=len(spec["turns"]))
        engine.step_id = step_id
        rounds = run_chats(engine, spec["system"], spec["turns"], SamplingParams(**spec["params"]))
        step_id = engine.step_id
        reg = engine.metrics.registry
        queries, hits = (reg.get_sample_value(f"spmd_serve:prefix_cache_{k}_total") for k in ("queries", "hits"))
        reqs = [r for rnd in rounds for r in rnd]
        out["caching" if caching else "plain"] = {
            "tokens": [[r.output_token_ids for r in rnd] for rnd in rounds],
            "prompt_lens": [[r.num_prompt_tokens for r in rnd] for rnd in rounds],
            "cached": [[r.num_cached_tokens for r in rnd] for rnd in rounds],
            "preemptions": sum(r.num_preemptions for r in reqs),
            "queries": queries,
            "hits": hits,
        }
    comm.send_plan(StepPlan.shutdown(step_id + 1))
    with open(out_path, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
