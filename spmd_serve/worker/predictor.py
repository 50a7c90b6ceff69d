"""`paddle.inference` predictors of one saved graph, and which kind runs a step.

Steps with at least `ONEDNN_MIN_TOKENS` tokens run on a oneDNN predictor of each segment (matmuls
~2x faster from ~5 tokens a step, slower below: measured crossover ~4, RESULTS.md "Speed change 3");
smaller decode steps on a plain predictor of the decode graph.  The second predictor holds a second
copy of the rank's weights, so by default it is made only for ranks whose params fit in
`ONEDNN_AUTO_MAX_BYTES`.  SPMD_ONEDNN_MIN_TOKENS=N overrides (0: never, one plain predictor of the
general graph per segment).
"""

from __future__ import annotations

from pathlib import Path

from spmd_serve.manifest import SegmentSpec

ONEDNN_MIN_TOKENS = 5
ONEDNN_AUTO_MAX_BYTES = 2 << 30


def onednn_min_tokens(rank_dir: Path, specs: tuple[SegmentSpec, ...], requested: int | None) -> int:
    """`requested` (SPMD_ONEDNN_MIN_TOKENS) if set, else ONEDNN_MIN_TOKENS when the twins' extra
    weights are small."""
    if requested is not None:
        return requested
    params = {spec.params_name for spec in specs}
    size = sum((rank_dir / f"{p}.pdiparams").stat().st_size for p in params)
    return ONEDNN_MIN_TOKENS if size <= ONEDNN_AUTO_MAX_BYTES else 0


class Predictor:
    """One paddle.inference predictor of a saved graph and its input/output handles."""

    def __init__(self, rank_dir: Path, spec: SegmentSpec, num_threads: int, quantised: bool, onednn: bool) -> None:
        from paddle import inference

        # an int8-KV or decode variant loads its base graph's params (spec.params)
        cfg = inference.Config(str(rank_dir / f"{spec.name}.json"), str(rank_dir / f"{spec.params_name}.pdiparams"))
        cfg.disable_gpu()
        cfg.disable_glog_info()
        cfg.set_cpu_math_library_num_threads(num_threads)
        if onednn:
            cfg.enable_mkldnn()  # primitives are cached per shape (measured: no re-creation cost per step)
        elif hasattr(cfg, "disable_mkldnn"):
            cfg.disable_mkldnn()
        if quantised:
            # constant folding would dequantise the int8/int4 weights once at load, into fp32
            # params: fp32 speed but fp32 memory.  Keep them int8 (memory is the point of --quant).
            cfg.delete_pass("constant_folding_pass")
        self.predictor = inference.create_predictor(cfg)
        self.inputs = {n: self.predictor.get_input_handle(n) for n in self.predictor.get_input_names()}
        self.outputs = [self.predictor.get_output_handle(n) for n in self.predictor.get_output_names()]
        self.output_names: tuple[str, ...] = spec.outputs  # a decode graph may have fewer (no K/V to write)
