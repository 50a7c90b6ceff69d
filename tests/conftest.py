"""Shared fixtures: the demo checkpoint and its TP=1 / TP=2 exports, made once per test session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("GLOG_minloglevel", "2")


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
def served_tp2_segments(demo_checkpoint, tmp_path_factory) -> Path:
    """TP=2 with Paddle's own ops only: a graph per stage, mpi4py all-reduces between them."""
    from spmd_serve.export import export_checkpoint

    return export_checkpoint(demo_checkpoint, tmp_path_factory.mktemp("served") / "tp2s", tp=2,
                             graph_ops="paddle")


@pytest.fixture
def make_server():
    """IOServer + FakeEngine harnesses (tests/fakes.py) on free ports, closed after the test."""
    from tests.fakes import Harness

    made: list = []
    yield lambda **kw: made.append(Harness(**kw)) or made[-1]
    for h in made:
        h.close()


@pytest.fixture
def srv(make_server):
    return make_server()
