"""The models both servers serve, made once per demo size: the demo HF checkpoint, our exports of
it (`spmd_serve export --checkpoint`: f32, int8, TP=2) and its GGUF conversions (F32 / F16 / Q8_0)."""

from __future__ import annotations

import argparse
import importlib
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.peers import gguf_convert, servers
from benchmarks.peers.build_llama import LlamaCpp

if TYPE_CHECKING:
    from benchmarks.peers.compare import Row

# The module that writes the demo HF checkpoints.
DEMO_WRITER = "spmd_serve.export.demo.checkpoint"

EXPORT_ARGS = {
    "f32-tp1": [],
    "bf16-tp1": ["--dtype", "bfloat16"],
    "int8-tp1": ["--quant", "weight_only_int8"],
    "f32-tp2": ["--tp", "2"],
}


def demo_writer():
    """The module that writes demo checkpoints."""
    return importlib.import_module(DEMO_WRITER)


def write_checkpoint(size: str, out: Path) -> Path:
    if (out / "config.json").is_file():  # written once (also by another checkout, which may know more sizes)
        return out
    mod = demo_writer()
    presets = getattr(mod, "PRESETS", {})
    if size not in presets:
        raise SystemExit(
            f"compare: --demo {size}: spmd_serve has no demo model {size!r} yet "
            f"({mod.__name__} offers {', '.join(sorted(presets))})"
        )
    if not (out / "config.json").is_file():
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        mod.write_demo_checkpoint(tmp, size)
        tmp.rename(out)
    return out


def export(ckpt: Path, out: Path, extra: list[str]) -> Path:
    """`spmd_serve export --checkpoint` (the CLI; the export is atomic, so config.json means done)."""
    if not (out / "config.json").is_file():
        cmd = [*servers.spmd_serve_cmd(), "export", "--checkpoint", str(ckpt), "--out", str(out), *extra]
        print("+", " ".join(cmd), flush=True)
        done = subprocess.run(cmd, env=servers.child_env())
        if done.returncode:
            raise SystemExit(f"compare: spmd_serve export refused ({done.returncode}): {' '.join(cmd)}")
    return out


def prepare(args: argparse.Namespace, rows: list[Row], lc: LlamaCpp, work: Path) -> dict[str, Path]:
    """Every model file the chosen rows serve, made if missing: {row.model: path}."""
    ckpt = write_checkpoint(args.demo, work / "hf")
    paths: dict[str, Path] = {}
    for row in rows:
        if row.model in paths:
            continue
        if row.kind == "ours":  # named with this checkout's export format: checkouts of other formats make their own
            from spmd_serve.manifest import MANIFEST_VERSION

            paths[row.model] = export(ckpt, work / f"ours-{row.model}-v{MANIFEST_VERSION}", EXPORT_ARGS[row.model])
        else:
            out = work / f"model-{row.model}.gguf"
            if not out.is_file():
                print(f"+ gguf_convert {ckpt} {out} --outtype {row.model}", flush=True)
                gguf_convert.convert(ckpt, out, row.model, lc.gguf_py)
            paths[row.model] = out
    return paths
