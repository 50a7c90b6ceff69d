"""The original tool's static inference models, made in the tests from HF-named weights (test helper).

What `download_model` fetches was made by PaddleNLP's exporter: `LlamaForCausalLMBlockInferenceModel`
/ `Qwen2ForCausalLMBlockInferenceModel` (paddlenlp/experimental/transformers/) load the checkpoint
with `set_state_dict` (which fuses q|k|v and gate|up, names the parameters `fuse<model>.<i>.…`, and
for weight-only models packs them with `paddle.nn.quant.weight_quantize`), then `to_static` +
`paddle.jit.save` write `rank_<i>/model.json` + `model.pdiparams`.  That last step traces
`generate()`, whose fused ops live in the GPU-only `paddlenlp_ops` package, so it cannot run here.
This helper runs everything up to it with PaddleNLP's own classes and Paddle's own CPU
`weight_quantize` (fp16/bf16 input only, as on the GPU), and saves exactly those parameters, under
their names, with `paddle.jit.save` of a program that reads every one of them (Paddle 3: model.json)
or `paddle.static.save_inference_model` (Paddle 2: model.pdmodel).  The tensor-parallel ranks get
the shards PaddleNLP's own `_get_tensor_parallel_mappings` cuts.

It runs in a child process (`python -m tests.support.static_models`), because making the GPU
classes construct on a CPU needs process-wide stand-ins: an import-only `paddlenlp_ops` module, the
`arch` weight_quantize packs for (there is no GPU to ask), and for tp > 1 a model-parallel group id,
RNG tracker and a plain embedding of the rank's vocabulary rows in place of fleet's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def write_static_model(
    out: Path,
    config: dict,
    weights: dict[str, np.ndarray],
    quant: str | None = None,
    tp: int = 1,
    dtype: str | None = None,
    arch: int = 80,
    program: str = "json",
    group: int = -1,
) -> Path:
    """`out/` as the original tool publishes a model: config.json and `rank_<r>/model.{json|pdmodel}` +
    `model.pdiparams`.  dtype: float32 unquantised, float16 (the CPU weight_quantize's) otherwise."""
    out.mkdir(parents=True, exist_ok=True)
    dtype = dtype or ("float16" if quant else "float32")
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(Path(tmp) / "w.npz", **weights)
        spec = dict(config=config, quant=quant or "", tp=tp, dtype=dtype, arch=arch, program=program, group=group)
        (Path(tmp) / "spec.json").write_text(json.dumps(spec))
        env = {"PYTHONPATH": str(ROOT), "GLOG_minloglevel": "2", "PATH": "/usr/bin:/bin"}
        for rank in range(tp):  # one process per rank, as the exporter runs (parameter names repeat)
            res = subprocess.run(
                [sys.executable, "-m", "tests.support.static_models", tmp, str(out), str(rank)],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if res.returncode:
                raise RuntimeError(f"building rank {rank} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    static_keys = dict(quant_type=quant or "", dtype=dtype, tensor_parallel_degree=tp, weightonly_group_size=group)
    (out / "config.json").write_text(json.dumps(dict(config, **static_keys), indent=1))
    return out


# ---------------------------------------------------------------- the child process


def _stand_ins(arch: int, tp: int) -> None:
    import importlib.machinery
    import types

    import paddle
    import paddle.incubate.nn.functional as F
    import paddle.nn.quant.quantized_linear as ql

    ops = types.ModuleType("paddlenlp_ops")
    ops.__spec__ = importlib.machinery.ModuleSpec("paddlenlp_ops", None)

    def missing(name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def op(*_a, **_k):
            raise RuntimeError(f"paddlenlp_ops.{name} is a GPU op")

        return op

    ops.__getattr__ = missing  # type: ignore[attr-defined]
    sys.modules["paddlenlp_ops"] = ops
    if not hasattr(F, "fused_moe"):  # PaddleNLP 3.0.0b4 imports it; this Paddle moved it
        F.fused_moe = None
    ql._get_arch_info = lambda: arch
    if tp > 1:
        import paddle.distributed.fleet as fleet
        from paddle.distributed.fleet.meta_parallel import get_rng_state_tracker

        class Group:
            def get_model_parallel_group(self):
                return types.SimpleNamespace(id=0)

        class VocabParallelEmbedding(paddle.nn.Embedding):  # fleet's name: its parameter is named after it
            def __init__(self, vocab: int, hidden: int, weight_attr=None, **_kw):
                super().__init__(vocab // tp, hidden)

        fleet.get_hybrid_communicate_group = lambda: Group()
        fleet.meta_parallel.VocabParallelEmbedding = VocabParallelEmbedding
        get_rng_state_tracker().add("model_parallel_rng", 1234)


def _rank_model(spec: dict, weights: dict[str, np.ndarray], rank: int):
    """PaddleNLP's Block inference model of rank `rank`, its parameters set by its own set_state_dict."""
    from paddlenlp.experimental.transformers import (
        LlamaForCausalLMBlockInferenceModel,
        Qwen2ForCausalLMBlockInferenceModel,
    )
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from tests.support.paddlenlp_reference import _paddle_name_and_layout

    cfg, tp = spec["config"], spec["tp"]
    qwen = cfg["architectures"][0].startswith("Qwen2")
    config_cls, base, cls = (
        (Qwen2Config, Qwen2ForCausalLM, Qwen2ForCausalLMBlockInferenceModel)
        if qwen
        else (LlamaConfig, LlamaForCausalLM, LlamaForCausalLMBlockInferenceModel)
    )
    config = config_cls(**cfg)
    config.update(
        dict(
            quant_type=spec["quant"],
            weightonly_group_size=spec["group"],
            tensor_parallel_degree=tp,
            tensor_parallel_rank=rank,
            cachekv_int8_type=None,
            append_attn=False,
            block_size=64,
            max_seq_len=256,
        )
    )
    prefix, tied = ("qwen2." if qwen else "llama."), bool(cfg.get("tie_word_embeddings"))
    state = {}
    for hf_name, w in weights.items():
        name, transpose = _paddle_name_and_layout(hf_name, prefix, tied)
        if not (tied and hf_name == "lm_head.weight"):
            state[name] = np.ascontiguousarray(w.T if transpose else w)
    if tp > 1:  # the rank's shards, cut by PaddleNLP's own tensor-parallel mappings
        cuts = base._get_tensor_parallel_mappings(config, is_split=True)
        state = {k: cuts[k.removeprefix(prefix)](v) if k.removeprefix(prefix) in cuts else v for k, v in state.items()}
    model = cls(config)
    model.set_state_dict(state)
    return model


def _save_pir(model, out: Path) -> None:
    import paddle

    class EveryParameter(paddle.nn.Layer):
        """A program that reads each parameter, so jit.save writes all of them under their names."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            for p in self.inner.parameters():
                x = x + p.cast("float32").sum() * 0.0
            return x

    spec = [paddle.static.InputSpec([1], "float32", "x")]
    paddle.jit.save(paddle.jit.to_static(EveryParameter(model), input_spec=spec, full_graph=True), str(out / "model"))


def _save_pdmodel(model, out: Path) -> None:
    """Paddle 2's format: a ProgramDesc whose persistable variables are the parameters."""
    import paddle

    params = {p.name: p.numpy() for p in model.parameters()}
    paddle.enable_static()
    with paddle.pir_utils.OldIrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [1], "float32")
            y = x
            for name, value in params.items():
                zero = paddle.nn.initializer.Constant(0.0)
                v = paddle.static.create_parameter(list(value.shape), str(value.dtype), name, default_initializer=zero)
                y = y + paddle.cast(paddle.numel(v), "float32") * 0.0  # reads v (Paddle 2 cannot cast int8)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        scope = paddle.static.global_scope()
        for name, value in params.items():
            scope.find_var(name).get_tensor().set(value, paddle.CPUPlace())
        paddle.static.save_inference_model(str(out / "model"), [x], [y], exe, program=main)


def main(argv: list[str]) -> None:
    import paddle

    tmp, out, rank = Path(argv[0]), Path(argv[1]), int(argv[2])
    spec = json.loads((tmp / "spec.json").read_text())
    _stand_ins(spec["arch"], spec["tp"])
    paddle.set_default_dtype(spec["dtype"])
    model = _rank_model(spec, dict(np.load(tmp / "w.npz")), rank)
    rank_dir = out / f"rank_{rank}"
    rank_dir.mkdir(parents=True, exist_ok=True)
    (_save_pdmodel if spec["program"] == "pdmodel" else _save_pir)(model, rank_dir)


if __name__ == "__main__":
    main(sys.argv[1:])


def snap_to_int8_grid(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same model with every 2-D weight (linears per output channel, embedding and lm_head per
    vocab row) made exactly `q * s` with q in [-127, 127] reaching ±127 and s an fp16 of 4 significant
    bits, and every other tensor an fp16 value: weights that the static exporter's fp16 cast and
    weight_quantize, and `spmd_serve export --quant weight_only_int8`, all keep exactly."""
    out = {}
    for name, w in weights.items():
        if w.ndim != 2:
            out[name] = w.astype(np.float16).astype(np.float32)
            continue
        amax = np.maximum(np.abs(w).max(axis=1, keepdims=True), 1e-6) / 127
        e = np.floor(np.log2(amax))
        s = (np.round(amax / 2.0**e * 8) / 8 * 2.0**e).astype(np.float32)  # 4 significant bits
        q = np.clip(np.rint(w / s), -127, 127)
        rows = np.arange(len(w))
        top = np.abs(w).argmax(axis=1)
        q[rows, top] = np.sign(w[rows, top]) * 127  # the row's absmax is exactly 127 s
        out[name] = (q * s).astype(np.float32)
    return out
