"""Which graph ops an export uses: our C++ Paddle ops (ops/paddle_ext.py) or Paddle's own only, and
which of ours a rank's saved graphs call (recorded in its manifest as `custom_ops`)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from spmd_serve.export.errors import ExportError

GRAPH_OPS = ("auto", "cpp", "paddle")


def resolve_graph_ops(choice: str) -> bool:
    """Whether the graphs use our C++ Paddle ops (ops/paddle_ext.py): the all-reduce inside the graph
    (tp > 1: one predictor run per step instead of 2 L + 2) and the fast kernels of every step.
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
    print(
        f"spmd_serve export: warning: C++ graph ops unavailable ({reason.splitlines()[0]}); exporting "
        "Paddle's own ops only (slower; at tp > 1 one graph per stage)",
        file=sys.stderr,
    )
    return False


def custom_ops_in(rank_dir: Path) -> tuple[str, ...]:
    """Our C++ ops a rank's saved graphs call (PIR JSON names custom ops "<dialect>.spmd_<name>"):
    the runtime must register the library before loading them."""
    found: set[str] = set()
    for graph in rank_dir.glob("*.json"):
        if graph.name != "manifest.json":
            found.update(re.findall(r'"\d+\.(spmd_[a-z0-9_]+)"', graph.read_text()))
    return tuple(sorted(found))
