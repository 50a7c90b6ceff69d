"""Build time: `spmd_serve export` turns a checkpoint into a served model directory.

    cli.py          the `spmd_serve export` command
    pipeline.py     export_checkpoint / export_rank / ensure_demo_model: the directory, atomically
    checkpoint.py   reading HF / PaddleNLP checkpoints (safetensors, pdparams; sharded or not): the files'
                    tensors by weight_files.py (safetensors) and pdparams.py (Paddle's pickles), lazy.py
    static_model.py the original tool's static inference models (static_files.py reads their files,
                    weight_layout.py undoes weight_quantize's int8/int4 packing)
    family.py       what an architecture family provides; families.py: the registry
    llama/          the Llama family (Llama 2/3, Qwen2/2.5): config, tensor names, sharding, quant, stages
    deepseek/       the DeepSeek family (V2, V3/R1): MLA, MoE with expert parallelism, the MTP layer as a
                    draft export beside the target (`mtp/`, a family `Companion`)
    quant.py        weight-only int8/int4 arithmetic (numpy)
    segment.py      stages → graph segments between collectives, traced per `GraphVariant` (variant.py)
    layers.py       linear layers (dense, int8, int4), norms; graph_inputs.py: per-step graph inputs
    calibrate.py    int8 KV scales; graph_ops.py: C++ graph ops or Paddle's own
    demo/           the offline demo checkpoint

What the runtime reads of an export is spmd_serve/manifest.py and served_config.py; no runtime
package imports this one (the composition roots may: the server makes the demo model on first use).
Importing it does not import Paddle (tracing does, when it runs).
"""

from __future__ import annotations

from spmd_serve.export.cli import main
from spmd_serve.export.errors import ExportError
from spmd_serve.export.pipeline import ensure_demo_model, export_checkpoint

__all__ = ["ExportError", "ensure_demo_model", "export_checkpoint", "main"]
