"""The front end's layering, read from the source (no import): text <- common <- protocols <- server,
no protocol imports another except triton -> native (Triton carries native requests), no import
cycle between modules, every module under 300 lines, and no read of tornado's private handler
state (`_finished`, `_reason`, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import spmd_serve.frontend

ROOT = Path(spmd_serve.frontend.__file__).parent
PREFIX = "spmd_serve.frontend"
# package -> the front-end packages it may import from (itself included)
ALLOWED = {
    "text": {"text"},
    "common": {"common", "text"},
    "native": {"native", "common", "text"},
    "openai": {"openai", "common", "text"},
    "triton": {"triton", "native", "common", "text"},
    "server": {"server", "native", "openai", "triton", "common", "text"},
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


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PREFIX, *parts))


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """Front-end modules `name` imports anywhere in its body (lazy imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # `from pkg import mod` names the module itself when there is one
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names)
    return {m for m in found if m == PREFIX or m.startswith(PREFIX + ".")}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


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
    done: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str, stack: list[str]) -> None:
        if module in stack:
            cycles.append(stack[stack.index(module) :] + [module])
            return
        if module in done:
            return
        for dep in sorted(GRAPH.get(module, ())):
            visit(dep, stack + [module])
        done.add(module)

    for module in sorted(GRAPH):
        visit(module, [])
    assert cycles == []


def test_modules_stay_under_300_lines() -> None:
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) >= 300}
    assert long == {}


def test_no_read_of_tornado_private_handler_state() -> None:
    reads = sorted(
        (name, node.attr, node.lineno)
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in TORNADO_PRIVATE
    )
    assert reads == []
