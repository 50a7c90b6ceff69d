"""`spmd_serve export`: a HuggingFace or PaddleNLP Llama/Qwen2 checkpoint → the served model directory.

Writes CONTRACT §7's layout: the checkpoint's config/tokenizer files, plus one `rank_<i>/` per
tensor-parallel rank holding that rank's graph segments (`seg_<k>.json` + `.pdiparams`) and a
`manifest.json` that tells the runtime how to feed and join them.  Which checkpoints are read is
models/checkpoint.py's business; which architectures, models/arch.py's.  `--demo tiny|small` first
writes a deterministic checkpoint (weights + trained SentencePiece tokenizer) so everything
works offline.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np

from spmd_serve.models.arch import SUPPORTED_ARCHS, ModelConfig, UnsupportedModel, check_dtype_runnable
from spmd_serve.models.checkpoint import CheckpointError, load_checkpoint
from spmd_serve.models.sharding import ShardDims, ShardingError, shard_dims, shard_weights

EXPORT_FORMAT = 1
# Copied verbatim from the checkpoint when present (tokenizer + generation defaults).
AUX_FILES = ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
             "tokenizer.model", "sentencepiece.bpe.model", "tokenizer.json", "added_tokens.json",
             "vocab.json", "merges.txt")


class ExportError(Exception):
    """The checkpoint cannot be exported; the message says why."""


def export_rank(cfg: dict | ModelConfig, weights: dict[str, np.ndarray], dims: ShardDims, rank: int, out: Path) -> None:
    from spmd_serve.models.segment import build_segments, save_segment

    rank_dir = out / f"rank_{rank}"
    rank_dir.mkdir(parents=True, exist_ok=True)
    segments = build_segments(shard_weights(weights, cfg, dims, rank), dims, rank)
    for seg in segments:
        save_segment(seg, dims, str(rank_dir / seg.spec.name))
    manifest = {"format": EXPORT_FORMAT, "rank": rank, "dims": asdict(dims),
                "segments": [asdict(seg.spec) for seg in segments]}
    (rank_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))


def export_checkpoint(ckpt: Path, out: Path, tp: int = 1, dtype: str = "float32") -> Path:
    """Export into `out` atomically (a temp dir renamed at the end), so a crash leaves nothing half-made."""
    ckpt = Path(ckpt)
    try:
        check_dtype_runnable(dtype)
        cfg, mc, weights, source = load_checkpoint(ckpt)
        dims = shard_dims(mc, tp)
    except (CheckpointError, UnsupportedModel, ShardingError) as e:
        raise ExportError(str(e)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name in AUX_FILES:
            if (ckpt / name).is_file():
                shutil.copy2(ckpt / name, tmp / name)
        for rank in range(tp):
            export_rank(mc, weights, dims, rank, tmp)
        served = dict(cfg, spmd_serve={"format": EXPORT_FORMAT, "tp": tp, "dtype": dtype, "quant": None,
                                       "source": source, "rope_scaling": mc.rope_scaling,
                                       "attention_bias": mc.attention_bias,
                                       "tie_word_embeddings": mc.tie_word_embeddings})
        (tmp / "config.json").write_text(json.dumps(served, indent=1))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def ensure_demo_model(preset: str = "tiny", tp: int = 1, root: Path | None = None) -> Path:
    """The built-in demo model, exported once under ~/.cache/spmd_serve/ (CONTRACT §2 MODEL_DIR)."""
    root = root or Path(os.environ.get("SPMD_SERVE_CACHE", Path.home() / ".cache" / "spmd_serve"))
    out = root / f"demo-{preset}-tp{tp}"
    if not (out / "config.json").is_file():
        from spmd_serve.demo.checkpoint import write_demo_checkpoint

        with tempfile.TemporaryDirectory() as ckpt:
            write_demo_checkpoint(Path(ckpt), preset)
            export_checkpoint(Path(ckpt), out, tp)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="spmd_serve export", description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", type=Path,
                     help=f"HuggingFace or PaddleNLP checkpoint directory ({', '.join(SUPPORTED_ARCHS)})")
    src.add_argument("--demo", choices=("tiny", "small"), help="write and export a built-in demo model")
    ap.add_argument("--out", type=Path, required=True, help="served model directory to write")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (one rank_<i>/ per rank)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                    help="dtype of the served graphs (what this Paddle build cannot run is refused)")
    ap.add_argument("--quant", default=None, help="weight-only quantisation (not supported yet)")
    args = ap.parse_args(argv)
    try:
        if args.quant:
            raise ExportError(f"--quant {args.quant} is not supported yet")
        if args.demo:
            from spmd_serve.demo.checkpoint import write_demo_checkpoint

            with tempfile.TemporaryDirectory() as ckpt:
                write_demo_checkpoint(Path(ckpt), args.demo)
                export_checkpoint(Path(ckpt), args.out, args.tp, args.dtype)
        else:
            export_checkpoint(args.checkpoint, args.out, args.tp, args.dtype)
    except (ExportError, FileNotFoundError) as e:
        print(f"spmd_serve export: error: {e}", file=sys.stderr)
        return 2
    print(f"exported to {args.out} (tp={args.tp}, dtype={args.dtype})")
    return 0
