"""The front end's layering, read from the source (no import): text <- common <- protocols <- server,
no protocol imports another except triton -> native (Triton carries native requests), anthropic ->
openai (the Messages API is served as the chat request it asks for) and sglang -> openai (/generate
is served as the completions request it asks for), no import
cycle between modules, every module under 300 lines, and no read of tornado's private handler
state (`_finished`, `_reason`, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import spmd_serve.frontend
from tests.support.import_graph import ImportGraph

ROOT = Path(spmd_serve.frontend.__file__).parent
PREFIX = "spmd_serve.frontend"
# package -> the front-end packages it may import from (itself included)
ALLOWED = {
    "text": {"text"},
    "common": {"common", "text"},
    "native": {"native", "common", "text"},
    "openai": {"openai", "common", "text"},
    "triton": {"triton", "native", "common", "text"},
    "anthropic": {"anthropic", "openai", "common", "text"},
    "sglang": {"sglang", "openai", "common", "text"},
    "server": {"server", "native", "openai", "triton", "anthropic", "sglang", "common", "text"},
}
TORNADO_PRIVATE = {
    "_finished",
    "_reason",
    "_headers_written",
    "_status_code",
    "_write_buffer",
    "_transforms",
    "_auto_finish",
}


GRAPH_OF = ImportGraph.of(ROOT, PREFIX)
MODULES, GRAPH = GRAPH_OF.modules, GRAPH_OF.edges


def _layer(module: str) -> str:
    return module[len(PREFIX) + 1 :].split(".")[0]


def test_the_expected_packages_exist() -> None:
    assert {_layer(m) for m in MODULES if m != PREFIX} == set(ALLOWED)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_from_the_layers_below(package: str) -> None:
    wrong = sorted(
        (m, dep)
        for m, deps in GRAPH.items()
        if m != PREFIX and _layer(m) == package
        for dep in deps
        if dep == PREFIX or _layer(dep) not in ALLOWED[package]
    )
    assert wrong == []


def test_no_import_cycle() -> None:
    assert GRAPH_OF.cycles() == []


def test_modules_stay_under_300_lines() -> None:
    assert GRAPH_OF.long_modules() == {}


def test_no_read_of_tornado_private_handler_state() -> None:
    reads = sorted(
        (name, node.attr, node.lineno)
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in TORNADO_PRIVATE
    )
    assert reads == []
