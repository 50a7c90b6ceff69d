"""The import graph of a package, read from the source without importing anything.

Every `import` / `from ... import` anywhere in a module counts, lazy ones inside functions
included: a lazy import is still a dependency (it only moves the moment it is paid).  Used by the
layering tests (tests/unit/test_layers.py, test_frontend_layers.py).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


def module_name(root: Path, prefix: str, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((prefix, *parts))


@dataclass(frozen=True)
class ImportGraph:
    prefix: str  # e.g. "spmd_serve"
    modules: dict[str, Path]  # module name -> its file
    edges: dict[str, set[str]]  # module -> the modules of `prefix` it imports
    external: dict[str, set[str]]  # module -> top-level names of other packages it imports

    @classmethod
    def of(cls, root: Path, prefix: str) -> ImportGraph:
        modules = {module_name(root, prefix, p): p for p in sorted(root.rglob("*.py"))}
        edges: dict[str, set[str]] = {}
        external: dict[str, set[str]] = {}
        for name, path in modules.items():
            found = _imports(name, path, modules)
            edges[name] = {m for m in found if m == prefix or m.startswith(prefix + ".")}
            external[name] = {m.split(".")[0] for m in found} - {prefix}
        return cls(prefix, modules, edges, external)

    def cycles(self) -> list[list[str]]:
        """Every import cycle found by a depth-first walk (empty when the graph is a DAG)."""
        done: set[str] = set()
        found: list[list[str]] = []

        def visit(module: str, stack: list[str]) -> None:
            if module in stack:
                found.append(stack[stack.index(module) :] + [module])
                return
            if module in done:
                return
            for dep in sorted(self.edges.get(module, ())):
                visit(dep, stack + [module])
            done.add(module)

        for module in sorted(self.edges):
            visit(module, [])
        return found

    def long_modules(self, limit: int = 300) -> dict[str, int]:
        """Modules of `limit` lines or more."""
        return {n: k for n, p in self.modules.items() if (k := len(p.read_text().splitlines())) >= limit}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
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
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    return found
