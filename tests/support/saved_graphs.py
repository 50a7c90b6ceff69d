"""What a saved Paddle graph (PIR .json) is made of: its operator names, with counts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path


def op_counts(graph: str | Path) -> Counter[str]:
    """How often each operator occurs in a saved PIR graph: its "<dialect id>.<name>" entries under "#"."""
    counts: Counter[str] = Counter()

    def walk(node) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("#"), str) and "." in node["#"]:
                counts[node["#"].split(".", 1)[1]] += 1
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    with open(graph) as f:
        walk(json.load(f))
    return counts


def op_names(graph: str | Path) -> set[str]:
    """The operator names of a saved PIR graph."""
    return set(op_counts(graph))
