"""The layers of spmd_serve, read from the source (DESIGN §6, issue 13): arrows point down.

    server / cli / launcher / bench / download      composition roots: may import anything
    frontend  → engine (client, outputs), sampling params, text
    engine    → scheduler, protocol, timing, dist and worker (the offline engine), sampling params
    worker    → manifest, protocol, timing, config (its errors), ops          never engine / frontend
    export    → manifest, protocol, worker's host step tables, ops             never the serving side
    scheduler → sampling params only: no Paddle, MPI or tornado, so its tests run in milliseconds
The runtime never imports the build-time package `export`.  Also: no import cycle in the whole
package, every module under 300 lines, and `Engine.step()` short enough to read aloud.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import ops
import spmd_serve
from spmd_serve.engine.engine import Engine
from tests.support.import_graph import ImportGraph

GRAPH = ImportGraph.of(Path(spmd_serve.__file__).parent, "spmd_serve")
RUNTIME = ("scheduler", "engine", "worker", "frontend", "dist")


def _package(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def _edges_from(package: str) -> set[tuple[str, str]]:
    return {(m, d) for m, deps in GRAPH.edges.items() if _package(m) == package for d in deps}


@pytest.mark.parametrize(
    "package,forbidden",
    [
        ("worker", {"engine", "frontend", "export", "server", "launcher", "bench"}),
        ("scheduler", {"engine", "worker", "frontend", "export", "dist", "config", "server", "protocol"}),
        ("export", {"engine", "frontend", "scheduler", "dist", "server", "launcher", "bench"}),
        ("dist", {"engine", "worker", "frontend", "export", "scheduler"}),
        ("engine", {"frontend", "export", "server", "launcher", "bench"}),
        ("frontend", {"export", "worker", "dist", "server", "launcher", "bench"}),
    ],
)
def test_no_import_upwards(package: str, forbidden: set[str]) -> None:
    wrong = sorted((m, d) for m, d in _edges_from(package) if _package(d) in forbidden)
    assert wrong == []


@pytest.mark.parametrize("package", RUNTIME)
def test_the_runtime_never_imports_the_build_time_package(package: str) -> None:
    assert sorted((m, d) for m, d in _edges_from(package) if _package(d) == "export") == []


def test_the_scheduler_is_pure_python() -> None:
    heavy = {"paddle", "paddlenlp", "mpi4py", "tornado", "grpc", "numpy"}
    found = {m: GRAPH.external[m] & heavy for m in GRAPH.modules if _package(m) == "scheduler"}
    assert {m: s for m, s in found.items() if s} == {}


def test_rank_start_up_imports_no_paddle_before_the_http_workers_start() -> None:
    """server._load imports these before rank 0 starts its HTTP workers; Paddle (~1 s) waits for
    make_runner, so the workers' own imports run beside it (spmd_serve.export pulled Paddle in
    through deepseek/batched.py until session 57)."""
    code = (
        "import sys, spmd_serve.export, spmd_serve.model_dir, spmd_serve.worker.capacity, "
        "spmd_serve.worker.model_runner, spmd_serve.worker.runners, spmd_serve.rank0_frontend, "
        "spmd_serve.engine.draft_model; print(sorted(m for m in sys.modules if m.split('.')[0] == 'paddle')[:3])"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_worker_only_knows_the_manifest_of_an_export() -> None:
    """The runtime reads what export wrote through manifest.py, never through the export code."""
    readers = {m for m, deps in GRAPH.edges.items() if "spmd_serve.manifest" in deps}
    assert any(_package(m) == "worker" for m in readers) and any(_package(m) == "export" for m in readers)


def test_no_import_cycle() -> None:
    assert GRAPH.cycles() == []


def test_every_module_under_300_lines() -> None:
    repo = Path(spmd_serve.__file__).parents[1]
    long = {**GRAPH.long_modules(), **ImportGraph.of(Path(ops.__file__).parent, "ops").long_modules()}
    for tree in ("tests", "benchmarks"):
        long.update(ImportGraph.of(repo / tree, tree).long_modules())
    assert long == {}


def test_engine_step_reads_aloud() -> None:
    """schedule → broadcast → execute → sample → update → publish, in at most 15 lines of body."""
    lines = inspect.getsource(Engine.step).splitlines()
    body = [line for line in lines[1:] if line.strip() and not line.strip().startswith(('"""', "#"))]
    assert len(body) <= 15, "\n".join(lines)
    order = [p for p in ("schedule", "broadcast", "execute", "sample", "update", "publish") if p in "".join(lines)]
    assert order == ["schedule", "broadcast", "execute", "sample", "update", "publish"]


def test_no_test_module_imports_another() -> None:
    """Shared test helpers live in tests/support/, so each test module stands alone."""
    tests = ImportGraph.of(Path(spmd_serve.__file__).parents[1] / "tests", "tests")
    wrong = sorted((m, d) for m, deps in tests.edges.items() for d in deps if d.rpartition(".")[2].startswith("test_"))
    assert wrong == []
