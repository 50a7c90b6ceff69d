"""What a saved Paddle graph (PIR .json) is made of: its operator names, with counts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np


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


def save_tensors(out: Path, tensors: dict[str, np.ndarray]) -> Path:
    """A graph saved by `paddle.jit.save` whose persistable tensors are `tensors` (a float one as a
    parameter, the others as buffers, as Paddle names them), all read by its one output; returns
    the `.pdiparams` path (the graph is the `.json` beside it)."""
    import paddle

    class Holder(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            for name, value in tensors.items():
                self.register_buffer(name, paddle.to_tensor(value), persistable=True)

        def forward(self, x):
            return x + sum(getattr(self, n).astype("float32").sum() for n in tensors)

    layer = Holder()
    layer.eval()
    static = paddle.jit.to_static(layer, input_spec=[paddle.static.InputSpec([1], "float32")], full_graph=True)
    paddle.jit.save(static, str(out / "holder"))
    return out / "holder.pdiparams"
