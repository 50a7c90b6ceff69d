"""What `spmd_serve export` costs: wall time and peak RSS of one export, with the RSS at each phase
(reading the checkpoint, choosing the dtype, the int8-KV calibration, each rank's graphs), in this
process with the export's own functions wrapped, so the phases are the code's.

    python benchmarks/export_cost.py --checkpoint DIR --out DIR [--tp N] [--dtype D] [--quant Q]
    python benchmarks/export_cost.py --demo small|1b --out DIR [--tp N] ...

`--demo` writes that demo checkpoint first (not timed).  Prints one line per phase boundary (seconds
since the start, RSS, peak so far and the phase it was reached in) and the checkpoint's float32 size
for the ratio.  Used for RESULTS.md "Session 60"; compare builds one after the other on a quiet machine.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from spmd_serve.export import pipeline, segment

PHASES = [(pipeline, "load_checkpoint"), (pipeline, "export_dtype"), (pipeline, "calibrate_kv_scales")]
PHASES += [(pipeline, "export_rank"), (segment, "save_segment")]


class Watch:
    """RSS sampled every 20 ms on a thread; `mark` prints a phase boundary."""

    def __init__(self) -> None:
        self.proc, self.start = psutil.Process(), time.perf_counter()
        self.peak, self.peak_phase, self.phase = 0, "start", "start"
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            rss = self.proc.memory_info().rss
            if rss > self.peak:
                self.peak, self.peak_phase = rss, self.phase
            time.sleep(0.02)

    def mark(self, what: str) -> None:
        rss = self.proc.memory_info().rss
        print(
            f"{time.perf_counter() - self.start:8.1f} s  rss {rss / 1e9:6.2f} GB  peak {self.peak / 1e9:6.2f} GB "
            f"(in {self.peak_phase})  | {what}",
            flush=True,
        )
        self.phase = what

    def wrap(self, module: Any, name: str) -> None:
        fn: Callable[..., Any] = getattr(module, name)

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.mark(f"> {name}")
            try:
                return fn(*args, **kwargs)
            finally:
                self.mark(f"< {name}")

        setattr(module, name, timed)


def checkpoint_bytes(ckpt: Path) -> int:
    """The checkpoint's parameters in float32 (its safetensors' element counts times 4)."""
    from spmd_serve.export.checkpoint import load_checkpoint
    from spmd_serve.export.lazy import shape_of

    _, _, weights, _ = load_checkpoint(ckpt)
    total = 0
    for name in weights:
        n = 1
        for d in shape_of(weights, name):
            n *= d
        total += 4 * n
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", type=Path)
    src.add_argument("--demo", choices=("tiny", "small", "1b"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--quant", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.checkpoint
        if args.demo:
            from spmd_serve.export.demo.checkpoint import write_demo_checkpoint

            ckpt = Path(tmp)
            write_demo_checkpoint(ckpt, args.demo)
        size = checkpoint_bytes(ckpt)
        watch = Watch()
        for module, name in PHASES:
            watch.wrap(module, name)
        pipeline.export_checkpoint(ckpt, args.out, args.tp, dtype=args.dtype, quant=args.quant)
        watch.mark("end")
    print(f"checkpoint {size / 1e9:.2f} GB in float32; peak RSS {watch.peak / 1e9:.2f} GB = {watch.peak / size:.2f}x")


if __name__ == "__main__":
    main()
