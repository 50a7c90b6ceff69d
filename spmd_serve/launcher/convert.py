"""`start_server`'s one-time conversion of a static inference model into the directory it serves.

What `download_model` fetches is the original tool's static inference model (export/static_model.py),
which the ranks cannot run.  `served_model_dir` converts it with `spmd_serve export` (keeping its
weight-only quantisation) into a sibling directory, `<folder>.spmd_serve-tp<N>-v<format>`, written
atomically; the next start finds it there and serves it at once, unless the static model changed
since (its config.json and .pdiparams files' sizes and times are recorded next to the conversion).
A directory `spmd_serve export` wrote, or anything else, is served as it is.  Several ranks of one
node may ask together (`mpirun start_server`): a lock file makes one of them convert.  Conversions
an earlier version left (another export format) are never read again; each start names them and
their size, so that an upgrade does not double the disk a model takes unnoticed.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from spmd_serve.manifest import MANIFEST_VERSION, other_format_dirs, stale_dir_note

STAMP = "converted_from.json"  # in the converted directory: the static model it was made from


class ConversionError(Exception):
    """The static model could not be converted; the message says why (one line)."""


def _say(msg: str) -> None:
    print(f"start_server: {msg}", file=sys.stderr, flush=True)


def converted_path(folder: Path, tp: int) -> Path:
    return folder.with_name(f"{folder.name}.spmd_serve-tp{tp}-v{MANIFEST_VERSION}")


def stale_conversions(folder: Path) -> list[Path]:
    """`folder`'s conversions in another export format than this version's (which it never reads)."""
    return other_format_dirs(folder.parent, f"{glob.escape(folder.name)}.spmd_serve-tp*")


def _name_stale(folder: Path) -> None:
    for old in stale_conversions(folder):
        _say(stale_dir_note(old, "conversion"))


def fingerprint(folder: Path) -> dict[str, list[int]]:
    """What identifies this version of the static model: each weight file's and config.json's size and time."""
    files = [folder / "config.json", *sorted(folder.glob("**/*.pdiparams"))]
    return {str(p.relative_to(folder)): [p.stat().st_size, p.stat().st_mtime_ns] for p in files if p.is_file()}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _is_current(out: Path, folder: Path) -> bool:
    try:
        stamp = json.loads((out / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return (out / "config.json").is_file() and stamp.get("fingerprint") == fingerprint(folder)


def served_model_dir(folder: Path, tp: int, nnodes: int = 1) -> Path:
    """The directory to serve for `folder` at `tp` ranks: itself, or its conversion (made first when
    missing or stale).  ConversionError (one line) when the static model cannot be converted."""
    from spmd_serve.export.static_files import is_static_export

    if not is_static_export(folder):
        return folder
    if nnodes > 1:
        raise ConversionError(
            f"{folder} is a static inference model split over {nnodes} nodes, which one node cannot convert: "
            f"run `spmd_serve export --checkpoint <dir with every rank_<i>/> --out <dir> --tp {tp}` on one "
            "machine and serve that directory with MODEL_DIR"
        )
    out = converted_path(folder, tp)
    _name_stale(folder)
    with _locked(out.with_name(out.name + ".lock")):
        if _is_current(out, folder):
            _say(f"serving {out}, converted earlier from the static inference model {folder}")
            return out
        from spmd_serve.export import ExportError, export_checkpoint
        from spmd_serve.export.pipeline import SOURCE_QUANT

        _say(f"converting the static inference model {folder} for {tp} rank(s) into {out} (once; reused later)")
        t0 = time.monotonic()
        try:
            export_checkpoint(folder, out, tp=tp, quant=SOURCE_QUANT)
        except ExportError as e:
            raise ConversionError(f"cannot convert {folder}: {e}") from None
        (out / STAMP).write_text(json.dumps({"source": str(folder), "fingerprint": fingerprint(folder)}, indent=1))
        _say(f"converted in {time.monotonic() - t0:.1f} s: serving {out}")
    return out
