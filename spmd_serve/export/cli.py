"""`spmd_serve export`: a HuggingFace or PaddleNLP Llama/Qwen2/DeepSeek checkpoint → the served model directory.

It also converts the original tool's static inference models (what `download_model` fetches; Llama
and Qwen2), keeping their weight-only quantisation unless `--quant` says otherwise.

`--demo chat|tiny|small|1b|deepseek-tiny` first writes a demo checkpoint (export/demo/: the trained chat
model, or deterministic random weights, with a trained SentencePiece tokenizer) so everything works offline.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from spmd_serve.export.demo.checkpoint import DEMO_PRESETS
from spmd_serve.export.errors import ExportError
from spmd_serve.export.families import SUPPORTED_ARCHS
from spmd_serve.export.graph_ops import GRAPH_OPS
from spmd_serve.export.pipeline import SOURCE_QUANT, export_checkpoint
from spmd_serve.manifest import QUANT_METHODS
from spmd_serve.served_config import AUTO_DTYPE, DTYPES, ServedConfig


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="spmd_serve export", description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--checkpoint",
        type=Path,
        help="HuggingFace or PaddleNLP checkpoint directory, or the original tool's static inference model "
        f"({', '.join(SUPPORTED_ARCHS)})",
    )
    src.add_argument(
        "--demo",
        choices=DEMO_PRESETS,
        help="write and export a built-in demo model (chat: trained; 1b: Llama-3.2-1B's shape, ~4 GB in fp32)",
    )
    ap.add_argument("--out", type=Path, required=True, help="served model directory to write")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (one rank_<i>/ per rank)")
    ap.add_argument(
        "--dtype",
        default=AUTO_DTYPE,
        choices=(AUTO_DTYPE, *DTYPES),
        help="bfloat16 / float16: the weights held so (half the memory and the bytes a decode step reads; the "
        "graphs compute in float32); auto (default): bfloat16 or float16 when every weight of the checkpoint is "
        "such a value (a bf16 or fp16 checkpoint: the float32 export's outputs exactly), else float32",
    )
    ap.add_argument(
        "--quant",
        default=SOURCE_QUANT,
        choices=(SOURCE_QUANT, "none", *QUANT_METHODS),
        help="weight-only quantisation of q/k/v/o/gate/up/down (int8 per output channel; "
        "int4 per output channel and input group); source (default): as the checkpoint is (a static "
        "inference model's weight_only_int8/int4, else none)",
    )
    ap.add_argument(
        "--quant-group",
        type=int,
        default=None,
        help="int4 group size (input units per scale; default: the largest of 64..8 that divides "
        "every per-rank input size)",
    )
    ap.add_argument(
        "--graph-ops",
        default="auto",
        choices=GRAPH_OPS,
        help="cpp: our C++ ops in the graphs (threaded GEMMs, norms and paged attention for every step, "
        "all-reduce inside one graph per rank; built with g++ and the MPI headers); paddle: Paddle's own ops only "
        "(tp > 1: a graph per stage); auto: cpp when it builds here",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        quant = None if args.quant == "none" else args.quant
        opts = dict(tp=args.tp, dtype=args.dtype, quant=quant, quant_group=args.quant_group, graph_ops=args.graph_ops)
        if args.demo:
            from spmd_serve.export.demo.checkpoint import write_demo_checkpoint

            with tempfile.TemporaryDirectory() as ckpt:
                write_demo_checkpoint(Path(ckpt), args.demo)
                export_checkpoint(Path(ckpt), args.out, **opts)
        else:
            export_checkpoint(args.checkpoint, args.out, **opts)
    except (ExportError, FileNotFoundError) as e:
        print(f"spmd_serve export: error: {e}", file=sys.stderr)
        return 2
    served = ServedConfig.from_json(json.loads((args.out / "config.json").read_text())["spmd_serve"])
    print(f"exported to {args.out} (tp={args.tp}, dtype={served.dtype}, quant={served.quant and served.quant.method})")
    if (served.options.get("mtp") or {}).get("served"):
        print(f"its MTP layer as a draft model in {args.out / 'mtp'} (SPECULATE_METHOD=mtp)")
    return 0
