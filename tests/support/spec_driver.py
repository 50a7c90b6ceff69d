"""Runs the same multi-turn chats under several engine settings in one `mpirun` (test helper):
speculative decoding on and off, prefix caching, pool sizes.

    mpirun -n N python -m tests.support.spec_driver MODEL_DIR SPEC.json OUT.json

SPEC: {"system": [ids], "turns": [[[ids] per turn] per chat], "params": {...}, "engine": {...},
"settings": [{EngineSettings fields that differ}, ...]}.  Every rank opens its shard once (the
pool sized by "engine"); rank 0 runs one engine per setting over the same ranks and writes, per
setting, each request's tokens, the preemptions, the drafts verified and accepted, and the steps.
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
    out: list[dict[str, Any]] = []
    step_id = 0
    for changes in spec["settings"]:
        engine = make_engine(comm, runner, model_dir, dataclasses.replace(settings, **changes), len(spec["turns"]))
        engine.step_id = step_id
        rounds = run_chats(engine, spec["system"], spec["turns"], SamplingParams(**spec["params"]))
        reqs = [r for rnd in rounds for r in rnd]
        engine.scheduler.check_invariants()
        out.append(
            {
                "tokens": [[r.output_token_ids for r in rnd] for rnd in rounds],
                "preemptions": sum(r.num_preemptions for r in reqs),
                "drafts": engine.stats.drafts,
                "accepted": engine.stats.accepted,
                "steps": engine.step_id - step_id,
                "free_blocks": engine.scheduler.block_manager.num_free_blocks,
            }
        )
        step_id = engine.step_id
    comm.send_plan(StepPlan.shutdown(step_id + 1))
    with open(out_path, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
