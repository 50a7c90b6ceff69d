"""What the MTP draft's hidden-rows output costs the plain path: deepseek-tiny exported with its MTP
layer (the head graph also outputs `hidden_rows`) and without it (the checkpoint's MTP layer removed:
the graphs of before), a decode step of B sequences with C tokens of past each, through
ModelRunner.execute at TP 1.  Runs alternate A, B, C, A, ... in one process; each prints its median
and 25th percentile.

    A  no MTP layer: no hidden_rows output (the plain path before)
    B  with it, keep_hidden=False: the output exists, not copied out (the plain path now)
    C  with it, keep_hidden=True: copied out every step (rank 0 with SPECULATE_METHOD=mtp)

    python benchmarks/mtp_hidden_cost.py [--batch 1 32] [--past 256] [--runs 200]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from spmd_serve.export import export_checkpoint
from spmd_serve.export.demo.checkpoint import write_demo_checkpoint
from spmd_serve.protocol import RUN, StepPlan
from spmd_serve.worker.model_runner import ModelRunner

BLOCK = 16


class Solo:
    """One rank's collectives: nothing to send, gather or sum."""

    def gather_vocab(self, logits: np.ndarray) -> np.ndarray:
        return logits

    def allreduce_(self, x: np.ndarray) -> np.ndarray:
        return x


def without_mtp(ckpt: Path, out: Path) -> Path:
    """The checkpoint with its MTP layer removed (num_nextn_predict_layers 0)."""
    from safetensors.numpy import load_file, save_file

    cfg = json.loads((ckpt / "config.json").read_text())
    out.mkdir()
    for f in ckpt.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            (out / f.name).write_bytes(f.read_bytes())
    (out / "config.json").write_text(json.dumps(dict(cfg, num_nextn_predict_layers=0)))
    layer = f"model.layers.{cfg['num_hidden_layers']}."
    weights = load_file(str(ckpt / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if not k.startswith(layer)}, str(out / "model.safetensors"))
    return out


def decode_plan(batch: int, past: int) -> StepPlan:
    """One new token for each of `batch` sequences with `past` tokens each, in blocks of their own."""
    per = -(-(past + 1) // BLOCK)
    tables = np.arange(batch * per, dtype=np.int64).reshape(batch, per)
    pos = np.full(batch, past, np.int64)
    slots = tables[:, past // BLOCK] * BLOCK + past % BLOCK
    ids = np.arange(batch, dtype=np.int64) + 5
    return StepPlan(RUN, 0, ids, pos, np.ones(batch, np.int64), pos.copy(), tables, slots)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--past", type=int, default=256)
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ckpt = write_demo_checkpoint(root / "ckpt", "deepseek-tiny")
        with_mtp = export_checkpoint(ckpt, root / "with")
        before = export_checkpoint(without_mtp(ckpt, root / "ckpt-nomtp"), root / "before")
        assert (with_mtp / "mtp").is_dir() and not (before / "mtp").exists()
        blocks = max(args.batch) * -(-(args.past + 1) // BLOCK)
        runners = {
            "A before": ModelRunner(before, 0, Solo(), blocks, BLOCK),
            "B plain now": ModelRunner(with_mtp, 0, Solo(), blocks, BLOCK),
            "C keep_hidden": ModelRunner(with_mtp, 0, Solo(), blocks, BLOCK, keep_hidden=True),
        }
        for batch in args.batch:
            plan = decode_plan(batch, args.past)
            times: dict[str, list[float]] = {k: [] for k in runners}
            for _ in range(10):  # warm-up
                for r in runners.values():
                    r.execute(plan)
            for _ in range(args.runs):
                for name, r in runners.items():
                    t0 = time.perf_counter()
                    r.execute(plan)
                    times[name].append(time.perf_counter() - t0)
            base = float(np.median(times["A before"]))
            for name, ts in times.items():
                med, q25 = float(np.median(ts)), float(np.percentile(ts, 25))
                print(
                    f"batch {batch:3d} past {args.past}: {name:14s} median {med * 1e3:.3f} ms  p25 "
                    f"{q25 * 1e3:.3f} ms  ({med / base:.3f}x A)"
                )


if __name__ == "__main__":
    main()
