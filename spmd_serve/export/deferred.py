"""A row-shard linear's output left for the op that consumes it to compute, so that a layer's o_proj
(or down), its all-reduce at TP > 1 and the residual add + RMSNorm + linear after it run as one
C++ op, `spmd_linear_norm_linear*` (ops/cpu_kernels/linear_norm_linear.cc).

Every op costs Paddle's executor a few us at batch 1: with this a Llama layer runs 3 ops instead of
5 (7 with the all-reduces at TP = 2); TP = 2 batch 1 1.06x, TP = 1 level (RESULTS.md "Session 48").

The protocol: a stage returns `defer(linear, x, variant)` as its output; the segment marks it
`reduced` where it would all-reduce a tensor, and hands it on as it is only to a stage that says it
takes one (`Stage.takes_deferred`, whose `norm_linear` fuses it); everything else gets
`materialize(delta)`: the linear and the all-reduce as separate ops, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import paddle

from ops import paddle_ext
from spmd_serve.export.variant import GraphVariant


class Linear(Protocol):
    """What this needs of export/layers.py's `Linear` (which imports this module)."""

    def __call__(self, x: paddle.Tensor, variant: GraphVariant | None = None) -> paddle.Tensor: ...

    def cpp_op(self) -> tuple[str, list[paddle.Tensor]]: ...


@dataclass(frozen=True)
class Deferred:
    """`linear(x)`, summed over the ranks when `reduce`, not yet in the graph."""

    linear: Linear
    x: paddle.Tensor  # [T, K]
    reduce: bool = False


def defer(linear: Linear, x: paddle.Tensor, variant: GraphVariant) -> Deferred | paddle.Tensor:
    """`linear(x)`, left for its consumer with the C++ ops (the only ones that fuse it)."""
    return Deferred(linear, x) if variant.cpp_ops else linear(x, variant)


def reduced(delta: Deferred | paddle.Tensor) -> Deferred | paddle.Tensor:
    """The sum of `delta` over the ranks (the in-graph all-reduce, deferred with its linear)."""
    return replace(delta, reduce=True) if isinstance(delta, Deferred) else paddle_ext.allreduce(delta)


def materialize(delta: Deferred | paddle.Tensor | None, variant: GraphVariant) -> paddle.Tensor | None:
    """`delta` as a tensor in the graph (its linear and all-reduce as separate ops if deferred)."""
    if not isinstance(delta, Deferred):
        return delta
    out = delta.linear(delta.x, variant)
    return paddle_ext.allreduce(out) if delta.reduce else out


def linear_norm_linear(h, delta: Deferred, norm_w: paddle.Tensor, eps: float, linear: Linear, swiglu_out: bool):
    """(linear(RMSNorm(h + delta)) [SwiGLU'd], h + delta) as one op, or None when `delta`'s weight form
    is not `linear`'s (the op takes one form for both)."""
    first, w1 = delta.linear.cpp_op()
    name, w2 = linear.cpp_op()
    if first != name:
        return None
    fused = name.replace("spmd_linear", "spmd_linear_norm_linear")
    out, h = paddle_ext.run_op(fused, delta.x, *w1, h, norm_w, *w2, eps, swiglu_out, delta.reduce)
    return out, h
