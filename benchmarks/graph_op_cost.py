"""What one instruction of a saved graph costs beyond its kernel: chains of N ops in a graph saved and
run by paddle.inference with the runner's settings (batch_paddle_gc, tune_malloc), timed for N = 1
and N + 1; the slope is the cost an op.  It says how much a fused op (fewer instructions a step)
could save: RESULTS.md "Session 46".

    python benchmarks/graph_op_cost.py [--threads 2] [--ops 100] [--cases norm,linear,scale]

Cases: `norm` (spmd_rms_norm on [1, 512]: almost all framework), `linear` (spmd_linear_panels, x [1, 512]
@ a distinct 1 MB weight an op, as a decode step's o projection at `--demo small`; the same in a C++
loop over `gemm()` reads ~22 µs an op with two threads here), `scale` (Paddle's own op, for
reference).  Prints one line per case: µs a run for 1 and N + 1 ops, and µs an op.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import paddle
from paddle import inference

from ops import paddle_ext
from spmd_serve.worker.malloc import tune_malloc
from spmd_serve.worker.predictor import batch_paddle_gc

H = 512  # hidden size of --demo small


class Chain(paddle.nn.Layer):
    """`n` ops of one case in a row, each on the previous op's output."""

    def __init__(self, n: int, case: str) -> None:
        super().__init__()
        self.n, self.case = n, case
        self.norm_w = self.create_parameter([H], default_initializer=paddle.nn.initializer.Constant(1.0))
        init = paddle.nn.initializer.Constant(1.0 / H)  # x stays ~1 along the chain: no denormals
        weights = [self.create_parameter([H, H], default_initializer=init) for _ in range(n if case == "linear" else 0)]
        self.weights = paddle.nn.ParameterList(weights)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        for i in range(self.n):
            if self.case == "norm":
                x = paddle_ext.run_op("spmd_rms_norm", x, self.norm_w, 1e-6)
            elif self.case == "linear":
                x = paddle_ext.run_op("spmd_linear_panels", x, self.weights[i])
            else:
                x = paddle.scale(x, 1.0001)  # not 1.0: saving a graph whose output is its input fails
        return x


def run_seconds(n: int, case: str, workdir: Path, runs: int) -> float:
    """Median seconds of one predictor run (feed included) of a saved chain of `n` ops."""
    path = str(workdir / f"{case}{n}")
    spec = [paddle.static.InputSpec([None, H], "float32")]
    paddle.jit.save(paddle.jit.to_static(Chain(n, case), input_spec=spec, full_graph=True), path)
    cfg = inference.Config(path + ".json", path + ".pdiparams")
    cfg.disable_gpu()
    cfg.disable_glog_info()
    cfg.set_cpu_math_library_num_threads(1)
    cfg.disable_mkldnn()
    predictor = inference.create_predictor(cfg)
    handle = predictor.get_input_handle(predictor.get_input_names()[0])
    x = np.ones((1, H), np.float32)
    times = []
    for _ in range(runs + runs // 10):
        t0 = time.perf_counter()
        handle.reshape([1, H])
        handle.copy_from_cpu(x)
        predictor.run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[runs // 10 :])  # the first tenth is warm-up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="the op library's threads")
    ap.add_argument("--ops", type=int, default=100, help="N: the long chain has N + 1 ops")
    ap.add_argument("--cases", default="norm,linear,scale")
    ap.add_argument("--runs", type=int, default=2000)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")  # cpp_extension's missing-ccache notice
    paddle_ext.set_num_threads(args.threads)
    batch_paddle_gc()  # as the runner: without it each op's dead tensors went to Paddle's thread pool (perf)
    tune_malloc()
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            one = run_seconds(1, case, Path(tmp), args.runs)
            many = run_seconds(args.ops + 1, case, Path(tmp), args.runs)
            print(
                f"{case}: threads {args.threads}, 1 op {one * 1e6:.1f} µs a run, {args.ops + 1} ops "
                f"{many * 1e6:.1f} µs -> {(many - one) / args.ops * 1e6:.2f} µs an op"
            )


if __name__ == "__main__":
    main()
