"""One `paddle.inference` predictor of a saved graph and its input/output handles.

Every step of a segment runs on this one predictor, whatever its size and whatever the model's:
the graphs' heavy ops are our C++ ops (ops/paddle_ext.py) on the op library's threads, so Paddle's
own math library keeps one thread (`paddle_threads`) and oneDNN stays off (it would hold a second,
reordered copy of the weights).  A `--graph-ops paddle` export's graphs are Paddle's ops only; the
runner gives Paddle the rank's threads then.

Paddle's executor frees each intermediate tensor on a garbage-collector thread, one task per tensor
(tens a step), and that thread spins ~100 us after each task: on a 2-core machine it took ~6 % of the
rank's CPU from the step's own threads and the batch-1 step's median rose 15-20 %
(RESULTS.md "Session 28").  `batch_paddle_gc` makes it free in batches of GC_BATCH_GB of garbage.
"""

from __future__ import annotations

import os
from pathlib import Path

from spmd_serve.manifest import SegmentSpec

GC_BATCH_GB = 0.004  # ~4 MB: at most this much freed memory waits for the next batch (RSS +8 MB measured)


def batch_paddle_gc() -> None:
    """Paddle's executors made after this free garbage GC_BATCH_GB at a time (its
    FLAGS_eager_delete_tensor_gb; 0, its default, frees every tensor alone; < 0 never frees, which
    keeps every step's largest activations: GBs for a 7 B prefill chunk).  A value the user set in
    the environment is kept."""
    if "FLAGS_eager_delete_tensor_gb" not in os.environ:
        import paddle

        paddle.set_flags({"FLAGS_eager_delete_tensor_gb": GC_BATCH_GB})


class Predictor:
    """One paddle.inference predictor of a saved graph and its input/output handles."""

    def __init__(self, rank_dir: Path, spec: SegmentSpec, paddle_threads: int, quantised: bool) -> None:
        from paddle import inference

        # an int8-KV variant loads its base graph's params (spec.params)
        cfg = inference.Config(str(rank_dir / f"{spec.name}.json"), str(rank_dir / f"{spec.params_name}.pdiparams"))
        cfg.disable_gpu()
        cfg.disable_glog_info()
        cfg.set_cpu_math_library_num_threads(paddle_threads)
        if hasattr(cfg, "disable_mkldnn"):
            cfg.disable_mkldnn()
        if quantised:
            # constant folding would dequantise the int8/int4 weights once at load, into fp32
            # params: fp32 speed but fp32 memory.  Keep them int8 (memory is the point of --quant).
            cfg.delete_pass("constant_folding_pass")
        batch_paddle_gc()
        self.predictor = inference.create_predictor(cfg)
        self.inputs = {n: self.predictor.get_input_handle(n) for n in self.predictor.get_input_names()}
        self.outputs = [self.predictor.get_output_handle(n) for n in self.predictor.get_output_names()]
        self.output_names: tuple[str, ...] = spec.outputs
