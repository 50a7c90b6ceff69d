"""One `paddle.inference` predictor of a saved graph and its input/output handles.

Every step of a segment runs on this one predictor, whatever its size and whatever the model's:
the graphs' heavy ops are our C++ ops (ops/paddle_ext.py) on the op library's threads, so Paddle's
own math library keeps one thread (`paddle_threads`) and oneDNN stays off (it would hold a second,
reordered copy of the weights).  Its parameters are the rank's one copy (worker/params.py), shared
with any other graph of the same file.  A `--graph-ops paddle` export's graphs are Paddle's ops only; the
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
from spmd_serve.worker.params import HostParams
from spmd_serve.worker.pdiparams import holds_half, read_index

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

    def __init__(
        self, rank_dir: Path, spec: SegmentSpec, paddle_threads: int, quantised: bool, params: HostParams | None
    ) -> None:
        """`params`: the rank's one copy of the parameters, bound into this predictor (None: Paddle
        loads a copy of its own, as the tests' reference does)."""
        # a variant (int8-KV, decode) uses its base graph's params (spec.params)
        program, file = rank_dir / f"{spec.name}.json", rank_dir / f"{spec.params_name}.pdiparams"
        # 16-bit float weights (--dtype bfloat16 / float16) are narrow weights too: keep them so
        quantised = quantised or (file.exists() and holds_half(params.entries(file) if params else read_index(file)))
        if params is None or not file.exists():
            self.predictor = self._create(program, file, paddle_threads, quantised)
        else:
            self.predictor = params.load(program, file, lambda p: self._create(program, p, paddle_threads, quantised))
        self.params = params  # the memory its parameters point at (Paddle does not own it): kept alive
        self.inputs = {n: self.predictor.get_input_handle(n) for n in self.predictor.get_input_names()}
        self.outputs = [self.predictor.get_output_handle(n) for n in self.predictor.get_output_names()]
        self.output_names: tuple[str, ...] = spec.outputs

    @staticmethod
    def _create(program: Path, params: Path, paddle_threads: int, quantised: bool):
        from paddle import inference

        cfg = inference.Config(str(program), str(params))
        cfg.disable_gpu()
        cfg.disable_glog_info()
        cfg.set_cpu_math_library_num_threads(paddle_threads)
        if hasattr(cfg, "disable_mkldnn"):
            cfg.disable_mkldnn()
        if quantised:
            # constant folding would dequantise the int8/int4 (or widen the 16-bit) weights of
            # Paddle-op graphs once at load, into fp32 params: fp32 memory, the point of --quant and
            # --dtype lost; and the skeleton's values (worker/params.py) are what it would fold
            cfg.delete_pass("constant_folding_pass")
        # Elsewhere it stays, though it runs on the skeleton's values (worker/params.py): it folds no
        # op over a parameter in any graph we export (the logits equal Paddle's own load bit for bit,
        # tests/graphs/test_host_params.py), and it saves ~30 us a step on a Paddle-op tiny graph
        # (0.48 against 0.51 ms; the C++-op graphs time the same either way, RESULTS.md "Session 56").
        batch_paddle_gc()
        return inference.create_predictor(cfg)
