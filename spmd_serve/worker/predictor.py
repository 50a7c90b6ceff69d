"""One `paddle.inference` predictor of a saved graph and its input/output handles.

Every step of a segment runs on this one predictor, whatever its size and whatever the model's:
the graphs' heavy ops are our C++ ops (ops/paddle_ext.py) on the op library's threads, so Paddle's
own math library keeps one thread (`paddle_threads`) and oneDNN stays off (it would hold a second,
reordered copy of the weights).  A `--graph-ops paddle` export's graphs are Paddle's ops only; the
runner gives Paddle the rank's threads then.
"""

from __future__ import annotations

from pathlib import Path

from spmd_serve.manifest import SegmentSpec


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
        self.predictor = inference.create_predictor(cfg)
        self.inputs = {n: self.predictor.get_input_handle(n) for n in self.predictor.get_input_names()}
        self.outputs = [self.predictor.get_output_handle(n) for n in self.predictor.get_output_names()]
        self.output_names: tuple[str, ...] = spec.outputs
