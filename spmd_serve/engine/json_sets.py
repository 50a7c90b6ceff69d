"""An array of distinct values from a short list (JSON Schema's `uniqueItems` over enum, const or
boolean items: pydantic's `set[Literal[...]]`, `set[SomeEnum]`) as states of a JSON grammar
(engine/json_grammar.py's builder takes them in): ("uarr", node, exit, used) between items and
("uitem", ...) after a comma, `used` the bitmask of the values written so far (so at most
MAX_VALUES of them: each subset is states); an item is one of the values not used, read as
("ulit", node, exit, used, read).  Distinct as written, compactly: the values' JSON bytes.
"""

from __future__ import annotations

from typing import Any

from spmd_serve.engine.grammar_table import Edges, Name

MAX_VALUES = 6  # (2^6 subsets, each with its literals' states)


class SetStates:
    """The set states' edges, by the state's name; `_close` and `_after` are the builder's."""

    nodes: tuple[tuple[Any, ...], ...]

    def _close(self, exit_: Name) -> Name:
        raise NotImplementedError

    def _after(self, exit_: Name) -> Edges:
        raise NotImplementedError

    def _unique(self, kind: str, node: int, exit_: Name, used: int) -> Edges:
        """']' once minItems came, another value (not used yet) up to maxItems, after a comma but
        the first."""
        _, _, lo, hi = self.nodes[node]
        item = self._unique_literal(("ulit", node, exit_, used, b""))
        if kind == "uitem":
            return item
        count = bin(used).count("1")
        edges: Edges = {ord("]"): (self._close(exit_), None)} if count >= lo else {}
        if (hi is None or count < hi) and item:
            edges.update(item if count == 0 else {ord(","): (self._close(("uitem", node, exit_, used)), None)})
        return edges

    def _unique_literal(self, name: Name) -> Edges:
        """("ulit", node, exit, used, read): one of the values not in `used` being read; once `read`
        is one whole, the bytes after an item, with it used."""
        _, node, exit_, used, read = name
        values = self.nodes[node][1]
        assert isinstance(used, int) and isinstance(read, bytes) and isinstance(values, tuple)
        edges: Edges = {}
        for i, v in enumerate(values):
            if used >> i & 1:
                continue
            if v == read:
                edges.update(self._after(("uarr", node, exit_, used | 1 << i)))
            elif v.startswith(read):
                edges[v[len(read)]] = (("ulit", node, exit_, used, v[: len(read) + 1]), None)
        return edges
