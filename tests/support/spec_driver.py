"""Runs the same multi-turn chats under several engine settings in one `mpirun` (test helper):
speculative decoding on and off, prefix caching, pool sizes.

    mpirun -n N python -m tests.support.spec_driver MODEL_DIR SPEC.json OUT.json

SPEC: {"system": [ids], "turns": [[[ids] per turn] per chat], "params": {...}, "engine": {...},
"settings": [{EngineSettings fields that differ; "params" where a setting samples otherwise}, ...]}.
Every rank opens its shard once (the pool sized by "engine"); rank 0 runs one engine per setting
over the same ranks (the workers stay in their plan loop throughout) and writes, per setting, each
request's tokens, the preemptions, the drafts verified and accepted, the steps and the free blocks
at the end.  "engine" may name a
draft model (`speculate_model_path`), opened once on every rank for the settings that use it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any


def drive_settings(
    model_dir: str, spec: dict[str, Any], settings: list[dict[str, Any]], record: Callable[[Any, list], dict]
) -> list[dict[str, Any]] | None:
    """On every rank; rank 0 returns `record(engine, rounds)` per setting, the others None."""
    import dataclasses

    from spmd_serve.engine.engine import worker_loop
    from spmd_serve.engine.offline import EngineSettings, make_engine, open_draft, open_ranks, run_chats
    from spmd_serve.protocol import StepPlan
    from spmd_serve.sampling_params import SamplingParams

    engine_kw = dict(spec.get("engine", {}))
    engine_kw["eos_token_ids"] = frozenset(engine_kw.get("eos_token_ids", ()))
    base = EngineSettings(**engine_kw)
    comm, runner = open_ranks(model_dir, base)
    draft_runner = open_draft(comm, base)  # engine.speculate_model_path: a draft model for every setting
    if comm.rank != 0:
        worker_loop(comm, runner, draft_runner)
        return None
    out, step_id = [], 0
    for changes in settings:
        changes = dict(changes)
        params = SamplingParams(**changes.pop("params", spec["params"]))
        s = dataclasses.replace(base, **changes)
        engine = make_engine(comm, runner, model_dir, s, len(spec["turns"]), draft_runner=draft_runner)
        engine.step_id = step_id
        rounds = run_chats(engine, spec["system"], spec["turns"], params)
        engine.scheduler.check_invariants()
        out.append({**record(engine, rounds), "steps": engine.step_id - step_id})
        step_id = engine.step_id
    comm.send_plan(StepPlan.shutdown(step_id + 1))
    return out


def _record(engine: Any, rounds: list) -> dict[str, Any]:
    reqs = [r for rnd in rounds for r in rnd]
    return {
        "tokens": [[r.output_token_ids for r in rnd] for rnd in rounds],
        "preemptions": sum(r.num_preemptions for r in reqs),
        "drafts": engine.stats.drafts,
        "accepted": engine.stats.accepted,
        "free_blocks": engine.scheduler.block_manager.num_free_blocks,
    }


def main(model_dir: str, spec_path: str, out_path: str) -> int:
    spec = json.loads(open(spec_path).read())
    out = drive_settings(model_dir, spec, spec["settings"], _record)
    if out is not None:
        with open(out_path, "w") as f:
            json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))


def run_driver(n: int, module: str, model_dir: Any, spec: dict[str, Any], tmp_path: Any) -> Any:
    """The test side: `mpirun -n n python -m module MODEL_DIR SPEC.json OUT.json`; OUT's JSON."""
    from tests.support.mpi_job import run_mpi
    from tests.support.server_process import mpi_env, mpirun

    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "out.json"
    cmd = mpirun(n, sys.executable, "-m", module, str(model_dir), str(tmp_path / "spec.json"), str(out))
    res = run_mpi(cmd, mpi_env(), timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    return json.loads(out.read_text())
