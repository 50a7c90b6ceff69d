"""Runs the offline engine on several served model directories in one `mpirun` (test helper).

    mpirun -n N python -m tests.support.export_parity_driver SPEC.json OUT.npz
SPEC = {"models": [dir or {"dir": dir, "kv_int8": bool}, ...], "prompts": [[ids]], "params": {...},
"engine": {...}}.  One MPI job for all models saves the ~3 s per job of starting Python + Paddle
on every rank.  Rank 0 writes `tokens_<i>` and `logits_<i>` for model i.
"""

from __future__ import annotations

import json
import sys

import numpy as np


def run_driver(tp: int, spec: dict, workdir) -> np.lib.npyio.NpzFile:
    """Run this driver under `mpirun -n tp` on `spec` (written into workdir); the loaded results."""
    from pathlib import Path

    from tests.support.mpi_job import run_mpi
    from tests.support.server_process import mpi_env, mpirun

    workdir = Path(workdir)
    (workdir / f"spec{tp}.json").write_text(json.dumps(spec))
    out = workdir / f"out{tp}.npz"
    cmd = mpirun(
        tp, sys.executable, "-m", "tests.support.export_parity_driver", str(workdir / f"spec{tp}.json"), str(out)
    )
    root = Path(__file__).resolve().parents[2]
    r = run_mpi(cmd, mpi_env(), timeout=300, cwd=str(root))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return np.load(out)


def main(spec_path: str, out_path: str) -> int:
    from spmd_serve.engine.offline import generate
    from spmd_serve.sampling_params import SamplingParams

    spec = json.loads(open(spec_path).read())
    engine = dict(spec.get("engine", {}))
    engine["eos_token_ids"] = frozenset(engine.get("eos_token_ids", ()))
    out = {}
    for i, model in enumerate(spec["models"]):  # a dir, or {"dir": ..., "kv_int8": true}
        model_dir, kv_int8 = (model, False) if isinstance(model, str) else (model["dir"], model.get("kv_int8", False))
        res = generate(
            model_dir, spec["prompts"], SamplingParams(**spec["params"]), capture_logits=True, kv_int8=kv_int8, **engine
        )
        if res is not None:
            out[f"tokens_{i}"] = np.array(res["tokens"], dtype=np.int64)
            out[f"logits_{i}"] = np.stack(res["logits"])
    if out:
        np.savez(out_path, **out)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
