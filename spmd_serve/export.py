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
import re
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from spmd_serve.models.arch import SUPPORTED_ARCHS, ModelConfig, UnsupportedModel, check_dtype_runnable
from spmd_serve.models.checkpoint import CheckpointError, load_checkpoint
from spmd_serve.models.quant import QUANT_METHODS, QuantError, choose_group, quant_record, quantize_shard
from spmd_serve.models.sharding import ShardDims, ShardingError, linear_slices, shard_dims, shard_weights

EXPORT_FORMAT = 1
GRAPH_OPS = ("auto", "cpp", "paddle")
# int8 KV scales are max|K|, max|V| of a calibration pass widened by this factor (room for
# activations larger than the calibration's before they clip).
KV_SCALE_MARGIN = 1.0
# Copied verbatim from the checkpoint when present (tokenizer + generation defaults).
AUX_FILES = ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
             "tokenizer.model", "sentencepiece.bpe.model", "tokenizer.json", "added_tokens.json",
             "vocab.json", "merges.txt")


class ExportError(Exception):
    """The checkpoint cannot be exported; the message says why."""


def rank_shard(mc: ModelConfig, weights: dict[str, np.ndarray], dims: ShardDims, rank: int,
               quant: str | None = None, group: int | None = None) -> dict:
    """This rank's weights as the stages take them (linear weights quantised with `quant`)."""
    shard = shard_weights(weights, mc, dims, rank)
    return quantize_shard(shard, weights, mc, dims, rank, quant, group) if quant else shard


def calibrate_kv_scales(mc: ModelConfig, weights: dict[str, np.ndarray], quant: str | None = None,
                        group: int | None = None, num_seqs: int = 4, seq_len: int = 64, seed: int = 0
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Static int8 KV scales: run the served (TP=1, quantised as exported) model eagerly on
    `num_seqs` random-token prompts and take, per layer and KV head, max |K| (after RoPE) and
    max |V| over tokens and head_dim, divided by 127 and widened by `KV_SCALE_MARGIN` (values past
    it are clipped on write).  Returns k, v [num_layers, kv_heads] float32."""
    import paddle

    from spmd_serve.models.segment import build_segments
    from spmd_serve.models.step_tables import step_feeds

    dims = shard_dims(mc, 1)
    seg = build_segments(rank_shard(mc, weights, dims, 0, quant, group), dims, 0)[0]
    seg.eval()
    ids = np.random.default_rng(seed).integers(0, mc.vocab, (num_seqs, seq_len))
    block = 16
    cache = np.zeros((1, block, dims.kv_heads, dims.head_dim), np.float32)
    plan = SimpleNamespace(input_ids=ids.reshape(-1), positions=np.tile(np.arange(seq_len), num_seqs),
                           query_lens=np.full(num_seqs, seq_len), ctx_lens=np.zeros(num_seqs, np.int64),
                           block_tables=np.zeros((num_seqs, 1), np.int64))   # no past: one masked block
    env = step_feeds(plan, dims, mc.inv_freq(), block, seg.spec.inputs)
    args = [paddle.to_tensor(cache if n.startswith(("k_cache", "v_cache")) else env[n]) for n in seg.spec.inputs]
    with paddle.no_grad():
        outs = dict(zip(seg.spec.outputs, seg(args)))
    amax = {kind: np.stack([np.abs(outs[f"{kind}_new_{layer}"].numpy()).max(axis=(0, 2))
                            for layer in range(mc.num_layers)]) for kind in ("k", "v")}
    return tuple((np.maximum(amax[kind], 1e-6) * KV_SCALE_MARGIN / 127).astype(np.float32) for kind in ("k", "v"))


def _save_variant(seg, dims: ShardDims, rank_dir: Path, kv_int8: bool, decode: bool) -> dict:
    """Trace a variant of an attention segment next to its base graph (int8 KV pool and/or the
    decode graph, see Segment.set_variant); it has the same parameters, so its .pdiparams is
    dropped when byte-identical and the base graph's is loaded."""
    from spmd_serve.models.segment import save_segment

    seg.set_variant(kv_int8, decode)
    try:
        save_segment(seg, dims, str(rank_dir / seg.spec.name))
        spec = asdict(seg.spec)
    finally:
        seg.set_variant()
    own, twin = rank_dir / f"{spec['name']}.pdiparams", rank_dir / f"{spec['params']}.pdiparams"
    if own.read_bytes() == twin.read_bytes():
        own.unlink()
    else:
        spec["params"] = None
    return spec


def export_rank(cfg: dict | ModelConfig, weights: dict[str, np.ndarray], dims: ShardDims, rank: int, out: Path,
                quant: str | None = None, group: int | None = None,
                kv_scales: tuple[np.ndarray, np.ndarray] | None = None, cpp_ops: bool = False) -> None:
    """`cpp_ops`: resolve_graph_ops's answer (tp > 1: one segment with in-graph all-reduces)."""
    from spmd_serve.models.segment import build_segments, save_segment

    mc = cfg if isinstance(cfg, ModelConfig) else ModelConfig.from_hf(cfg)
    rank_dir = out / f"rank_{rank}"
    rank_dir.mkdir(parents=True, exist_ok=True)
    segments = build_segments(rank_shard(mc, weights, dims, rank, quant, group), dims, rank, cpp_ops=cpp_ops)
    specs, kv8_specs = [], []
    for seg in segments:
        save_segment(seg, dims, str(rank_dir / seg.spec.name))
        specs.append(asdict(seg.spec))
        if seg.has_kv:   # the decode graph the runner uses for steps of a few single-token queries
            specs[-1]["decode"] = _save_variant(seg, dims, rank_dir, kv_int8=False, decode=True)
        if kv_scales is not None and seg.has_kv:
            kv8_specs.append(_save_variant(seg, dims, rank_dir, kv_int8=True, decode=False))
            kv8_specs[-1]["decode"] = _save_variant(seg, dims, rank_dir, kv_int8=True, decode=True)
        else:
            kv8_specs.append(specs[-1])
    manifest = {"format": EXPORT_FORMAT, "rank": rank, "dims": asdict(dims), "segments": specs,
                "collectives": "none" if dims.tp == 1 else "graph" if cpp_ops else "segments",
                "custom_ops": custom_ops_in(rank_dir),
                "quant": quant_record(quant, group),
                "inv_freq": mc.inv_freq().astype(np.float32).tolist()}   # RoPE tables are built by the runner
    if kv_scales is not None:
        heads = linear_slices(mc, dims, rank)["kv"]
        heads = slice(heads.start // dims.head_dim, heads.stop // dims.head_dim)
        manifest["segments_kv_int8"] = kv8_specs
        manifest["kv_scales"] = {kind: sc[:, heads].tolist() for kind, sc in zip(("k", "v"), kv_scales)}
    (rank_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))


def resolve_graph_ops(choice: str) -> bool:
    """Whether the graphs use our C++ Paddle ops (ops/paddle_ext.py): the all-reduce inside the graph
    (tp > 1: one predictor run per step instead of 2 L + 2) and the fused decode attention.
    "paddle": Paddle's own ops only (any Paddle can load the export; tp > 1 runs a graph per stage
    with mpi4py between them); "cpp": ours, an error if they cannot be built here; "auto": ours
    when they build."""
    if choice not in GRAPH_OPS:
        raise ExportError(f"--graph-ops {choice!r} is not one of {', '.join(GRAPH_OPS)}")
    if choice == "paddle":
        return False
    from ops import paddle_ext

    reason = paddle_ext.unavailable()
    if reason is None:
        return True
    if choice == "cpp":
        raise ExportError(f"--graph-ops cpp: the C++ op library is unavailable: {reason}")
    print(f"spmd_serve export: warning: C++ graph ops unavailable ({reason.splitlines()[0]}); exporting "
          "Paddle's own ops only (slower; at tp > 1 one graph per stage)", file=sys.stderr)
    return False


def custom_ops_in(rank_dir: Path) -> list[str]:
    """Our C++ ops a rank's saved graphs call (PIR JSON names custom ops "<dialect>.spmd_<name>"):
    the runtime must register the library before loading them."""
    found = set()
    for graph in rank_dir.glob("*.json"):
        found.update(re.findall(r'"\d+\.(spmd_[a-z0-9_]+)"', graph.read_text()))
    return sorted(found)


def export_checkpoint(ckpt: Path, out: Path, tp: int = 1, dtype: str = "float32", quant: str | None = None,
                      quant_group: int | None = None, kv_int8: bool = True, graph_ops: str = "auto") -> Path:
    """Export into `out` atomically (a temp dir renamed at the end), so a crash leaves nothing half-made.
    `quant`: weight-only quantisation (models/quant.py); `kv_int8`: also write the int8-KV graph
    variants and their calibrated scales, so the export serves USE_CACHE_KV_INT8=1 too;
    `graph_ops`: see resolve_graph_ops."""
    ckpt = Path(ckpt)
    try:
        check_dtype_runnable(dtype)
        if quant is not None and quant not in QUANT_METHODS:
            raise QuantError(f"--quant {quant!r} is not one of {', '.join(QUANT_METHODS)}")
        cfg, mc, weights, source = load_checkpoint(ckpt)
        dims = shard_dims(mc, tp)
        group = choose_group(dims, quant_group) if quant == "weight_only_int4" else None
        cpp_ops = resolve_graph_ops(graph_ops)
    except (CheckpointError, UnsupportedModel, ShardingError, QuantError) as e:
        raise ExportError(str(e)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name in AUX_FILES:
            if (ckpt / name).is_file():
                shutil.copy2(ckpt / name, tmp / name)
        kv_scales = calibrate_kv_scales(mc, weights, quant, group) if kv_int8 else None
        for rank in range(tp):
            export_rank(mc, weights, dims, rank, tmp, quant, group, kv_scales, cpp_ops)
        served = dict(cfg, spmd_serve={"format": EXPORT_FORMAT, "tp": tp, "dtype": dtype,
                                       "quant": quant_record(quant, group), "kv_int8": kv_int8,
                                       "graph_ops": "cpp" if cpp_ops else "paddle",
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
    ap.add_argument("--quant", default=None, choices=QUANT_METHODS,
                    help="weight-only quantisation of q/k/v/o/gate/up/down (int8 per output channel; "
                         "int4 per output channel and input group)")
    ap.add_argument("--quant-group", type=int, default=None,
                    help="int4 group size (input units per scale; default: the largest of 64..8 that divides "
                         "every per-rank input size)")
    ap.add_argument("--graph-ops", default="auto", choices=GRAPH_OPS,
                    help="cpp: our C++ ops in the graphs (all-reduce inside one graph per rank, fused decode "
                         "attention; built with g++ and the MPI headers); paddle: Paddle's own ops only "
                         "(tp > 1: a graph per stage); auto: cpp when it builds here")
    args = ap.parse_args(argv)
    try:
        opts = dict(tp=args.tp, dtype=args.dtype, quant=args.quant, quant_group=args.quant_group,
                    graph_ops=args.graph_ops)
        if args.demo:
            from spmd_serve.demo.checkpoint import write_demo_checkpoint

            with tempfile.TemporaryDirectory() as ckpt:
                write_demo_checkpoint(Path(ckpt), args.demo)
                export_checkpoint(Path(ckpt), args.out, **opts)
        else:
            export_checkpoint(args.checkpoint, args.out, **opts)
    except (ExportError, FileNotFoundError) as e:
        print(f"spmd_serve export: error: {e}", file=sys.stderr)
        return 2
    print(f"exported to {args.out} (tp={args.tp}, dtype={args.dtype}, quant={args.quant})")
    return 0
