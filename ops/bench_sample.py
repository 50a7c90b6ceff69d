"""Where a sampled `sample_gpu` call's device time goes: `python -m ops.bench sample_phases`.

Two views of 128 rows x 128k fp32 logits per case: the time of each launch of one call (zero, split
scan, plan, split second read, main kernel; CUDA events after each launch, every call queued behind
a spin kernel so Python's launch cost is not in the gaps), and the main kernel built with
`-DSAMPLE_STOP=k` (ops/kernels/sample.cu: it returns after phase k), timed alone: the cumulative
time to the end of each phase.  Phases: 1 loads / first read, 2 weights and the region, 3 the
"did not fit" gather, 4 top-k, 5 top-p, 6 the draw's select; the full kernel adds jth_id.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from . import runtime, sample_cuda, sample_launch
from .bench_timing import Buffers, event, spin

STOPS = {1: "first read / loads", 2: "weights, region", 3: "gather", 4: "top-k", 5: "top-p", 6: "draw select"}
# (label, logit scale, parameters); the logits are normal * scale, as ops.bench's sampling rows
CASES: list[tuple[str, float, dict[str, float]]] = [
    ("T=1", 2.0, {}),
    ("top_p=0.9", 2.0, {"top_p": 0.9}),
    ("top_k=50 top_p=0.9", 2.0, {"top_k": 50, "top_p": 0.9}),
    ("peaked top_p=0.9", 8.0, {"top_p": 0.9}),
]


def launch_times(fn: Callable[[], object], iters: int = 10) -> dict[str, float]:
    """Mean device seconds of each traced launch of `fn` (sample_launch.TRACE names)."""
    drv, chk = runtime.driver, runtime._check
    fn()
    chk(drv.cuCtxSynchronize(), "cuCtxSynchronize")
    marks: list[tuple[str, Any]] = []

    def mark(name: str) -> None:
        e = event()
        chk(drv.cuEventRecord(e, drv.CUstream(0)), "cuEventRecord")
        marks.append((name, e))

    spin(0.05 + 0.002 * iters)  # every call queued before the first one runs
    sample_launch.TRACE = mark
    try:
        for _ in range(iters):
            mark("start")
            fn()
    finally:
        sample_launch.TRACE = None
    chk(drv.cuCtxSynchronize(), "cuCtxSynchronize")
    total: dict[str, float] = defaultdict(float)
    for (_, e0), (name, e1) in zip(marks, marks[1:]):
        if name != "start":
            total[name] += chk(drv.cuEventElapsedTime(e0, e1), "cuEventElapsedTime") / 1e3 / iters
    for _, e in marks:
        drv.cuEventDestroy(e)
    return dict(total)


def sample_args(bufs: Buffers, batch: int, vocab: int, scale: float = 2.0, **over: float) -> dict[str, Any]:
    """sample_gpu's arguments on the device: [batch, vocab] fp32 logits (normal * scale), the
    sampling parameters `over` (temperature, top_p, top_k; defaults: T 1, neither), no penalties,
    seed 1 and counter = row, outputs for tokens and logprobs."""
    rng = np.random.default_rng(0)
    rows = dict(temperature=1.0, top_p=1.0, top_k=0, rep_penalty=1.0, freq_penalty=0.0, pres_penalty=0.0) | over
    args: dict[str, Any] = {
        k: bufs.upload(np.full(batch, v, np.int32 if k == "top_k" else np.float32)) for k, v in rows.items()
    }
    args |= dict(
        seeds=bufs.upload(np.ones(batch, np.uint64)),
        counters=bufs.upload(np.arange(batch, dtype=np.int64)),
        min_tokens=bufs.upload(np.zeros(batch, np.int32)),
        num_generated=bufs.upload(np.zeros(batch, np.int32)),
        eos_ids=bufs.upload(np.full((batch, 1), -1, np.int32)),
        gen_token_ids=bufs.upload(np.full((batch, 0), -1, np.int32)),
        out_tokens=bufs.empty((batch,), np.int32),
        out_logprobs=bufs.empty((batch,), np.float32),
    )
    args["logits"] = bufs.upload(rng.standard_normal((batch, vocab), dtype=np.float32) * scale)
    return args


def sample_phases() -> None:
    """Print, per case, each launch's time and the main kernel's cumulative time per phase."""
    print("sampled call, 128 x 131072 fp32: device us per launch; main kernel ended after phase k (cumulative)")
    for label, scale, over in CASES:
        bufs = Buffers()
        args = sample_args(bufs, 128, 128 * 1024, scale, **over)
        per = launch_times(lambda: sample_cuda.sample_gpu(**args))  # noqa: B023
        row = "  ".join(f"{name} {sec * 1e6:.1f}" for name, sec in per.items())
        print(f"{label:<20} total {sum(per.values()) * 1e6:.1f}: {row}")
        stops = []
        for k, phase in STOPS.items():
            sample_cuda.PROFILE_OPTIONS = (f"-DSAMPLE_STOP={k}",)
            try:
                stops.append(f"{k} {phase} {launch_times(lambda: sample_cuda.sample_gpu(**args))['main'] * 1e6:.1f}")  # noqa: B023
            finally:
                sample_cuda.PROFILE_OPTIONS = ()
        print(f"{'':<20} main ended after: " + "; ".join(stops) + f"; full {per['main'] * 1e6:.1f}")
        bufs.free()
