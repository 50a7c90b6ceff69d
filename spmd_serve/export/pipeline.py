"""`export_checkpoint`: a HuggingFace or PaddleNLP checkpoint → the served model directory.

Writes CONTRACT §7's layout: the checkpoint's config/tokenizer files, plus one `rank_<i>/` per
tensor-parallel rank holding that rank's graph segments (`seg_<k>.json` + `.pdiparams`) and a
`manifest.json` (spmd_serve/manifest.py) that tells the runtime how to feed and join them.  Which
checkpoints are read is export/checkpoint.py's business; what each architecture is, its family's
(export/families.py).
"""

from __future__ import annotations

import filecmp
import gc
import glob
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from spmd_serve.export.calibrate import KV_SCALE_MARGIN, calibrate_kv_scales
from spmd_serve.export.calibration_text import calibration_windows
from spmd_serve.export.checkpoint import load_checkpoint
from spmd_serve.export.errors import REFUSALS, ExportError, QuantError
from spmd_serve.export.families import family_of
from spmd_serve.export.family import ArchConfig, ModelFamily
from spmd_serve.export.graph_ops import custom_ops_in, resolve_graph_ops
from spmd_serve.export.lazy import LazyMap
from spmd_serve.export.quant import bf16_valued, f16_valued
from spmd_serve.export.variant import GraphVariant
from spmd_serve.manifest import (
    MANIFEST_VERSION,
    QUANT_METHODS,
    Manifest,
    ManifestError,
    SegmentSpec,
    ShardDims,
    other_format_dirs,
    stale_dir_note,
    write_manifest,
)
from spmd_serve.served_config import AUTO_DTYPE, ServedConfig, check_dtype_runnable

log = logging.getLogger(__name__)

SOURCE_QUANT = "source"  # export_checkpoint(quant=SOURCE_QUANT): quantised as the checkpoint itself is

# Copied verbatim from the checkpoint when present (tokenizer + generation defaults).
AUX_FILES = (
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "sentencepiece.bpe.model",
    "tokenizer.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
)


def _save_variant(seg, dims: ShardDims, rank_dir: Path, variant: GraphVariant) -> SegmentSpec:
    """Trace a variant of an attention segment next to its base graph (an int8 KV pool or a decode
    graph, see export/variant.py); it has the same parameters, so its .pdiparams is dropped when byte-identical
    and the base graph's is loaded."""
    from spmd_serve.export.segment import save_segment

    spec = save_segment(seg.with_variant(variant), dims, rank_dir)
    own, twin = rank_dir / f"{spec.name}.pdiparams", rank_dir / f"{spec.params}.pdiparams"
    if filecmp.cmp(own, twin, shallow=False):  # in chunks: a rank's params may be most of the memory
        own.unlink()
        return spec
    return replace(spec, params=None)


def export_rank(
    family: ModelFamily[Any],
    mc: ArchConfig,
    weights: Mapping[str, np.ndarray],
    dims: ShardDims,
    rank: int,
    out: Path,
    quant: str | None = None,
    group: int | None = None,
    kv_scales: Mapping[str, np.ndarray] | None = None,
    cpp_ops: bool = False,
    dtype: str = "float32",
) -> Manifest:
    """Trace and save rank `rank`'s segments (with `kv_scales`, each attention segment again for an
    int8 pool; for a family with `decode_graphs`, also as its decode graph) and write its manifest.
    `cpp_ops`: resolve_graph_ops's answer (the C++ ops in every graph; tp > 1: one segment with
    in-graph all-reduces); `dtype`: the dense linears' weights (layers.dense_weights)."""
    from spmd_serve.export.layers import dense_weights
    from spmd_serve.export.segment import build_segments, save_segment

    rank_dir = out / f"rank_{rank}"
    rank_dir.mkdir(parents=True, exist_ok=True)
    with dense_weights(cpp_ops, dtype):  # the C++ ops read dense weights in panels (export/panels.py)
        stages = family.build_stages(family.rank_weights(mc, weights, dims, rank, quant, group), dims, rank)
    specs: list[SegmentSpec] = []
    kv8_specs: list[SegmentSpec] = []
    for seg in build_segments(stages, dims, cpp_ops=cpp_ops):
        spec = save_segment(seg, dims, rank_dir)
        if family.decode_graphs and seg.has_kv:  # the runner's graph for steps that are all decodes
            spec = replace(spec, decode=_save_variant(seg, dims, rank_dir, replace(seg.variant, decode=True)))
        specs.append(spec)
        if kv_scales is not None and seg.has_kv:
            kv8_specs.append(_save_variant(seg, dims, rank_dir, replace(seg.variant, kv_int8=True)))
        else:
            kv8_specs.append(spec)
    rank_scales = None if kv_scales is None else family.rank_kv_scales(mc, dims, rank, kv_scales)
    manifest = Manifest(
        rank=rank,
        dims=dims,
        kv_cache=family.kv_layout(mc, dims),
        segments=tuple(specs),
        collectives="none" if dims.tp == 1 else "graph" if cpp_ops else "segments",
        custom_ops=custom_ops_in(rank_dir),
        quant=family.quant_record(quant, group),
        inv_freq=tuple(mc.inv_freq().astype(np.float32).tolist()),  # RoPE tables: built by the runner
        segments_kv_int8=None if kv_scales is None else tuple(kv8_specs),
        kv_scales=rank_scales,
    )
    write_manifest(rank_dir, manifest)
    return manifest


def _export_model(
    family: ModelFamily[Any],
    mc: ArchConfig,
    weights: Mapping[str, np.ndarray],
    dims: ShardDims,
    out: Path,
    cfg: dict,
    served: ServedConfig,
    quant: str | None,
    group: int | None,
    kv_scales: Mapping[str, np.ndarray] | None,
    cpp_ops: bool,
) -> None:
    """Every rank's folder and config.json (`cfg` with the `spmd_serve` key) of one model in `out`."""
    for rank in range(dims.tp):
        export_rank(family, mc, weights, dims, rank, out, quant, group, kv_scales, cpp_ops, served.dtype)
        gc.collect()  # the rank's layers (Paddle's hold cycles) before the next rank's: one rank's params at a time
    (out / "config.json").write_text(json.dumps(dict(cfg, spmd_serve=served.to_json()), indent=1))


F16_MAX = 65504.0


def export_dtype(dtype: str, weights: Mapping[str, np.ndarray]) -> str:
    """The dtype an export holds its weights in: `dtype`, or for AUTO_DTYPE bfloat16 (else float16)
    where every weight is a value of it (a bf16 or fp16 checkpoint: served so, its outputs are the
    float32 export's bit for bit, at half the memory), else float32.  float16 asked for weights beyond
    its range (65504) is refused: they would become inf."""
    if dtype == AUTO_DTYPE:
        # a checkpoint stored in bfloat16 (export/lazy.py knows it): no weight need be read to tell
        if (isinstance(weights, LazyMap) and weights.all_bfloat16()) or bf16_valued(weights.values()):
            return "bfloat16"
        return "float16" if f16_valued(weights.values()) else "float32"
    if dtype == "float16":
        big = next((k for k, w in weights.items() if np.abs(w).max(initial=0) > F16_MAX), None)
        if big is not None:
            raise ExportError(f"{big} has values beyond float16's range ({F16_MAX:g}); use --dtype bfloat16")
    return dtype


def export_checkpoint(
    ckpt: Path,
    out: Path,
    tp: int = 1,
    dtype: str = AUTO_DTYPE,
    quant: str | None = None,
    quant_group: int | None = None,
    kv_int8: bool = True,
    graph_ops: str = "auto",
) -> Path:
    """Export into `out` atomically (a temp dir renamed at the end), so a crash leaves nothing half-made.
    `quant`: weight-only quantisation (export/quant.py), or SOURCE_QUANT: the checkpoint's own (a static
    model's weight-only form, its int4 group too; none for others); `kv_int8`: also write the int8-KV graph
    variants and their calibrated scales, so the export serves USE_CACHE_KV_INT8=1 too;
    `graph_ops`: see resolve_graph_ops; `dtype`: see export_dtype."""
    ckpt = Path(ckpt)
    try:
        if dtype != AUTO_DTYPE:
            check_dtype_runnable(dtype)
        if quant is not None and quant not in (*QUANT_METHODS, SOURCE_QUANT):
            raise QuantError(f"--quant {quant!r} is not one of {', '.join(QUANT_METHODS)}")
        cfg, mc, weights, source = load_checkpoint(ckpt)
        if quant == SOURCE_QUANT:
            quant, quant_group = source.get("quant"), quant_group or source.get("quant_group")
        family = family_of(mc.architecture)
        dtype = export_dtype(dtype, weights)
        dims = family.shard_dims(mc, tp)
        group = family.quant_group(mc, dims, quant_group) if quant == "weight_only_int4" else None
        cpp_ops = resolve_graph_ops(graph_ops)
        kv_int8 = kv_int8 and family.kv_int8
        companions = [(c, c.family.shard_dims(c.config, tp)) for c in family.companions(mc, weights, cfg)]
    except (*REFUSALS, ManifestError) as e:
        raise ExportError(str(e)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name in AUX_FILES:
            if (ckpt / name).is_file():
                shutil.copy2(ckpt / name, tmp / name)
        kv_scales, options = None, dict(family.served_options(mc))
        if kv_int8:
            context = int(cfg.get("max_position_embeddings") or 2048)
            windows, text = calibration_windows(ckpt, mc.vocab, context)
            from spmd_serve.export.layers import dense_weights  # (Paddle: not at the package's import)

            with dense_weights(cpp_ops, dtype):  # the scales of the weights the graphs will hold
                kv_scales = calibrate_kv_scales(family, mc, weights, windows, quant, group, cpp_ops=cpp_ops)
            spans = [[w.start, w.start + len(w.ids) - 1] for w in windows]  # first and last position of each
            options["kv_int8_calibration"] = {"text": text, "positions": spans, "margin": KV_SCALE_MARGIN}
        served = ServedConfig(
            tp=tp,
            dtype=dtype,
            quant=family.quant_record(quant, group),
            kv_int8=kv_int8,
            graph_ops="cpp" if cpp_ops else "paddle",
            source=source,
            options=options,
        )
        _export_model(family, mc, weights, dims, tmp, cfg, served, quant, group, kv_scales, cpp_ops)
        for comp, comp_dims in companions:
            comp_served = replace(served, kv_int8=False, options=comp.family.served_options(comp.config))
            args = (comp.weights, comp_dims, tmp / comp.folder, comp.hf_config, comp_served, quant, group)
            _export_model(comp.family, comp.config, *args, None, cpp_ops)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except (*REFUSALS, ManifestError) as e:  # a tensor is read when used: it may be the one that is wrong
        raise ExportError(str(e)) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


DEMO_PRESET = "chat"  # the trained demo model (export/demo/train.py): it answers in English


def ensure_demo_model(preset: str = DEMO_PRESET, tp: int = 1, root: Path | None = None) -> Path:
    """The built-in demo model, exported once under ~/.cache/spmd_serve/ (CONTRACT §2 MODEL_DIR); the
    directory is named with the export format, so versions that write different ones do not share it."""
    root = root or Path(os.environ.get("SPMD_SERVE_CACHE", Path.home() / ".cache" / "spmd_serve"))
    out = root / f"demo-{preset}-tp{tp}-v{MANIFEST_VERSION}"
    for old in other_format_dirs(root, f"demo-{glob.escape(preset)}-tp*"):
        log.warning("%s", stale_dir_note(old, "demo model"))
    if not (out / "config.json").is_file():
        from spmd_serve.export.demo.checkpoint import write_demo_checkpoint

        with tempfile.TemporaryDirectory() as ckpt:
            write_demo_checkpoint(Path(ckpt), preset)
            export_checkpoint(Path(ckpt), out, tp)
    return out
