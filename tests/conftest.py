"""Shared fixtures (the demo checkpoint and its TP=1 / TP=2 exports, made once per test session)
and the tiers: every test is marked with the folder it lives in, so `pytest -m unit` or
`pytest tests/unit` runs the fast ones and `-m "not mpi"` leaves out every test that starts MPI
ranks.

    unit/     pure Python and in-process numpy/Paddle helpers: no sockets, no subprocesses
    http/     real servers on loopback with a fake engine (real clients: requests, openai, tritonclient)
    graphs/   real Paddle graphs exported and run in-process
    kernels/  ops/: CUDA kernels (their numpy twins here; `gpu`-marked tests on a GPU) and the C++ graph ops
    mpi/      real `mpirun -n 1|2 spmd_serve` jobs and offline engines under mpirun
    e2e/      what an operator runs: start_server / stop_server, download_model, Docker files, two nodes
    support/  shared helpers and fixtures, no tests
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.teardown_on_sigterm import pytest_configure  # noqa: F401  (a hook)

os.environ.setdefault("GLOG_minloglevel", "2")

TIERS = ("unit", "http", "graphs", "kernels", "mpi", "e2e")
STARTS_MPI = ("mpi", "e2e")  # these tiers' tests launch mpirun (so they also get the `mpi` marker)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        tier = Path(item.fspath).relative_to(root).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in one of the tier folders {TIERS}")
        item.add_marker(tier)
        if tier in STARTS_MPI:
            item.add_marker("mpi")


@pytest.fixture(scope="session")
def demo_checkpoint(tmp_path_factory) -> Path:
    from spmd_serve.export.demo.checkpoint import write_demo_checkpoint

    return write_demo_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", "tiny")


@pytest.fixture(scope="session")
def served_tp1(demo_checkpoint, tmp_path_factory) -> Path:
    from spmd_serve.export import export_checkpoint

    return export_checkpoint(demo_checkpoint, tmp_path_factory.mktemp("served") / "tp1", tp=1, graph_ops="cpp")


@pytest.fixture(scope="session")
def served_tp2(demo_checkpoint, tmp_path_factory) -> Path:
    from spmd_serve.export import export_checkpoint

    # in-graph all-reduces (ops/paddle_ext.py), as `auto` picks where the C++ ops build: CI must build them
    return export_checkpoint(demo_checkpoint, tmp_path_factory.mktemp("served") / "tp2", tp=2, graph_ops="cpp")


@pytest.fixture(scope="session")
def served_tp2_long(demo_checkpoint, tmp_path_factory) -> Path:
    """served_tp2's weights with a context of tests/support/long_model.CONTEXT positions."""
    from spmd_serve.export import export_checkpoint
    from tests.support.long_model import write_long_checkpoint

    ckpt = write_long_checkpoint(demo_checkpoint, tmp_path_factory.mktemp("ckpt") / "tiny-long")
    return export_checkpoint(ckpt, tmp_path_factory.mktemp("served") / "tp2-long", tp=2, graph_ops="cpp")


@pytest.fixture(scope="session")
def served_tp2_segments(demo_checkpoint, tmp_path_factory) -> Path:
    """TP=2 with Paddle's own ops only: a graph per stage, mpi4py all-reduces between them."""
    from spmd_serve.export import export_checkpoint

    return export_checkpoint(demo_checkpoint, tmp_path_factory.mktemp("served") / "tp2s", tp=2, graph_ops="paddle")


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory) -> Path:
    """tests/support/trained_model.py's tiny Qwen2 trained on corpus lines (its committed weights)."""
    from tests.support.trained_model import write_trained_checkpoint

    return write_trained_checkpoint(tmp_path_factory.mktemp("trained") / "ckpt")


@pytest.fixture
def make_server():
    """IOServer + FakeEngine harnesses (tests/support/fakes.py) on free ports, closed after the test."""
    from tests.support.fakes import Harness

    made: list = []
    yield lambda **kw: made.append(Harness(**kw)) or made[-1]
    for h in made:
        h.close()


@pytest.fixture
def srv(make_server):
    return make_server()
