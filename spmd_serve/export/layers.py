"""Graph building blocks shared by the architecture families: parameters, the linear layers (dense and
weight-only quantised, one class each), RMSNorm, the fused residual-add + RMSNorm and SwiGLU.

Quantised weights (`quant.QuantWeight`) stay int8 in the graph's params (persistable buffers).
`make_linear` picks the class from the weight's type.  With the C++ ops (`GraphVariant.cpp_ops`)
every linear is its weight type's op (ops/cpu_kernels/linear.cc: `spmd_linear`, `spmd_linear_int8`,
`spmd_linear_int4`), for every number of rows: one pass over W for decode steps, a packed
micro-kernel for prefill chunks, int8/int4 dequantised in registers (int8 on a CPU with AMX: exact
integer sums instead, ops/cpu_kernels/int8_exact.h), on the op library's threads; an fp32 weight
built inside `dense_weights(panels=True)` (the export with the C++ ops) is stored in the panel layout
(export/panels.py) and runs `spmd_linear_panels`; inside `dense_weights(..., "bfloat16")` (`--dtype
bfloat16` or `float16`) it is held so (`spmd_linear_bf16` / `_f16`: widened exactly in the GEMM, computing
in fp32);

the norms and SwiGLU are `spmd_rms_norm`, `spmd_add_rms_norm`, `spmd_swiglu`, and a residual add +
RMSNorm with the linear it feeds (and the SwiGLU after it) is one op, `spmd_norm_linear*`
(`norm_linear`), which also takes the row-shard linear before it when that is deferred
(export/deferred.py: `spmd_linear_norm_linear*`).  Nothing is chosen by the model's size.
Without them (`--graph-ops paddle`), Paddle's ops: quantised weights are dequantised to fp32 right
before its matmul (on GPU, `paddle.nn.quant.weight_only_linear` would take the same buffers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from typing import Any

import numpy as np
import paddle
from paddle import nn

from ops import paddle_ext
from spmd_serve.export.deferred import Deferred, linear_norm_linear, materialize
from spmd_serve.export.panels import to_panels
from spmd_serve.export.quant import QuantWeight, bf16_bits
from spmd_serve.export.variant import GENERAL, GraphVariant

# How DenseLinear stores its weight: (panel layout, dtype).  Only a graph that runs the C++ ops can
# read panels, so the export sets them with the graph ops it chose (pipeline.export_rank); the dtype
# is the export's --dtype (float32, or bfloat16: the weights only, the graph computes in fp32)
_DENSE: ContextVar[tuple[bool, str]] = ContextVar("dense_weights", default=(False, "float32"))
# the 16-bit forms: the numpy array a float32 value is held as (bfloat16 as its bits), and the ops
_HALF = {"bfloat16": (bf16_bits, "spmd_linear_bf16"), "float16": (lambda v: v.astype(np.float16), "spmd_linear_f16")}
DENSE_DTYPES = ("float32", *_HALF)


@contextmanager
def dense_weights(panels: bool, dtype: str = "float32") -> Iterator[None]:
    """Dense linears built inside hold their weights in the panel layout (export/panels.py) when
    `panels`, as `dtype` (one of DENSE_DTYPES)."""
    if dtype not in DENSE_DTYPES:
        raise ValueError(f"dense weights are {' or '.join(DENSE_DTYPES)}, not {dtype}")
    token = _DENSE.set((panels, dtype))
    try:
        yield
    finally:
        _DENSE.reset(token)


def dense_form() -> tuple[bool, str]:
    """(panel layout, dtype) of the dense weights built now (dense_weights)."""
    return _DENSE.get()


@contextmanager
def float32_dense() -> Iterator[None]:
    """Dense linears built inside hold float32 weights whatever the export's dtype (in the panel layout
    as set): for weights the export folds a factor into (DeepSeek's query scaled by the softmax scale).
    A 16-bit checkpoint's values times the factor are no longer 16-bit values, and rounding them again
    would move the outputs off the float32 export's; such weights are a small part of a model."""
    with dense_weights(_DENSE.get()[0]):
        yield


def hold_dense(layer: nn.Layer, value: np.ndarray) -> paddle.Tensor:
    """`layer.weight`: an fp32 parameter holding `value`, or inside `dense_weights(..., "bfloat16" or
    "float16")` `value` rounded to it (a persistable buffer of that Paddle dtype, so the saved params
    hold 2 bytes an element; the graph widens it)."""
    half = _HALF.get(_DENSE.get()[1])
    if half is None:
        layer.weight = make_param(layer, value)
    else:
        layer.register_buffer("weight", paddle.to_tensor(half[0](np.asarray(value, np.float32))), persistable=True)
    return layer.weight


def make_param(layer: nn.Layer, value: np.ndarray) -> paddle.Tensor:
    """An fp32 parameter of `layer` holding `value` (named after the layer, e.g. `linear_3.w_0`).
    Filled by a copy, not by `nn.initializer.Assign`: that one turns the array into a Python list of
    floats first (~32 bytes and ~0.1 µs an element: a 1B model's embedding table alone was 8 GB of
    list, and 5 of a 33M model's 19 s calibration)."""
    value = np.ascontiguousarray(value, np.float32)
    param = layer.create_parameter(list(value.shape), dtype="float32", default_initializer=nn.initializer.Constant(0.0))
    param.set_value(value)
    return param


def hold_quantised(layer: nn.Layer, qw: QuantWeight) -> None:
    """Give `layer` a `QuantWeight`'s int8 values (a persistable buffer, so they stay int8 in the
    saved params) and its fp32 `scale`."""
    layer.register_buffer("qweight", paddle.to_tensor(qw.q), persistable=True)
    layer.scale = make_param(layer, qw.scale)
    layer.method, layer.group, (layer.fan_in, layer.fan_out) = qw.method, qw.group, qw.shape


def unpack_int4(q: paddle.Tensor, fan_in: int, group: int) -> paddle.Tensor:
    """Packed int4 [..., in/2, m] int8 (row 2i low nibble, 2i+1 high) → fp32 [..., in/group, group, m]
    (leading dims: a stack of weights, e.g. experts)."""
    four = paddle.full([1], 4, dtype="int8")
    lo = paddle.bitwise_right_shift(paddle.bitwise_left_shift(q, four), four)  # sign-extended
    hi = paddle.bitwise_right_shift(q, four)  # arithmetic
    pairs = paddle.stack([lo, hi], axis=-2).astype("float32")  # [..., in/2, 2, m]
    return pairs.reshape([*q.shape[:-2], fan_in // group, group, -1])  # [..., G, g, m]


class Linear(nn.Layer):
    """x @ W for one weight form; `forward(x, variant)`.  Every form's parameters are named
    `linear_<n>.*` (the name scope), as the graphs have always named them."""

    def __init__(self) -> None:
        super().__init__(name_scope="linear")

    def forward(self, x: paddle.Tensor, variant: GraphVariant | None = None) -> paddle.Tensor:
        """`variant` None: the general graph's (GENERAL; a default value would not survive dy2static's
        rewrite of the method)."""
        raise NotImplementedError

    def cpp_op(self) -> tuple[str, list[paddle.Tensor]]:
        """The C++ op of this weight form (ops/cpu_kernels/linear.cc) and its weight inputs."""
        raise NotImplementedError


class DenseLinear(Linear):
    """An fp32 [in, out] weight, as `dense_weights` says: fp32 or rounded to a 16-bit float
    (`hold_dense`), as it is or in the panel layout, which only the C++ ops read (rounding is per
    element, so the panels of the rounded weight are the rounded panels)."""

    def __init__(self, w: np.ndarray) -> None:
        super().__init__()
        self.panels, self.dtype = _DENSE.get()
        w = np.asarray(w, np.float32)
        hold_dense(self, to_panels(w) if self.panels else w)

    def forward(self, x: paddle.Tensor, variant: GraphVariant | None = None) -> paddle.Tensor:
        variant = variant or GENERAL
        if variant.cpp_ops:
            return paddle_ext.run_op(self.cpp_op()[0], x, self.weight)
        if self.panels:
            raise ValueError("a weight in the panel layout has only the C++ op (GraphVariant.cpp_ops)")
        return paddle.matmul(x, self.weight if self.dtype == "float32" else self.weight.astype("float32"))

    def cpp_op(self) -> tuple[str, list[paddle.Tensor]]:
        if self.dtype in _HALF:
            if not self.panels:
                raise ValueError(
                    f"{self.dtype} weights have C++ ops in the panel layout only (dense_weights(True, ...))"
                )
            return _HALF[self.dtype][1], [self.weight]
        return ("spmd_linear_panels" if self.panels else "spmd_linear"), [self.weight]


class Int8Linear(Linear):
    """weight_only_int8: (x @ q) * scale[out]."""

    def __init__(self, qw: QuantWeight) -> None:
        super().__init__()
        hold_quantised(self, qw)

    def forward(self, x: paddle.Tensor, variant: GraphVariant | None = None) -> paddle.Tensor:
        variant = variant or GENERAL
        if variant.cpp_ops:
            return paddle_ext.run_op("spmd_linear_int8", x, self.qweight, self.scale)
        return paddle.matmul(x, self.qweight.astype("float32")) * self.scale

    def cpp_op(self) -> tuple[str, list[paddle.Tensor]]:
        return "spmd_linear_int8", [self.qweight, self.scale]


class Int4Linear(Linear):
    """weight_only_int4: x @ dequant(q, scale) with scales per output channel and input group.  Paddle's
    form: nibbles unpacked with bit shifts, then per input group (x_g @ q_g) * scale_g summed, so no
    weight-sized multiply."""

    def __init__(self, qw: QuantWeight) -> None:
        super().__init__()
        hold_quantised(self, qw)

    def forward(self, x: paddle.Tensor, variant: GraphVariant | None = None) -> paddle.Tensor:
        variant = variant or GENERAL
        if variant.cpp_ops:  # the packed layout of export/quant.py, scale [in / group, out]
            return paddle_ext.run_op("spmd_linear_int4", x, self.qweight, self.scale)
        w = unpack_int4(self.qweight, self.fan_in, self.group)  # [G, g, out]
        n_groups = self.fan_in // self.group
        xg = x.reshape([-1, n_groups, self.group]).transpose([1, 0, 2])  # [G, T, g]
        return (paddle.matmul(xg, w) * self.scale.unsqueeze(1)).sum(axis=0)  # [T, out]

    def cpp_op(self) -> tuple[str, list[paddle.Tensor]]:
        return "spmd_linear_int4", [self.qweight, self.scale]


_BY_METHOD: dict[str | None, Callable[[Any], Linear]] = {
    None: DenseLinear,
    "weight_only_int8": Int8Linear,
    "weight_only_int4": Int4Linear,
}


def make_linear(w: np.ndarray | QuantWeight) -> Linear:
    """The linear layer for an fp32 [in, out] array or a `QuantWeight`."""
    return _BY_METHOD[getattr(w, "method", None)](w)


def fuse_columns(ws: list):
    """Concatenate column-parallel weights of one rank along their output dim: [in, out_1 + out_2 ...].
    A `QuantWeight`'s scales are per output channel ([out] or [in/group, out]), so its integers and
    scales concatenate the same way: the fused weight quantises exactly like the parts."""
    if isinstance(ws[0], np.ndarray):
        return np.concatenate(ws, axis=1)
    return replace(
        ws[0], q=np.concatenate([w.q for w in ws], axis=1), scale=np.concatenate([w.scale for w in ws], axis=-1)
    )


def rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float, variant: GraphVariant | None = None):
    """RMSNorm over the last axis.  Paddle's own ops are the elementwise ones, never
    `fused_rms_norm`: its CPU kernel (phi::fusion::RmsNormAvxKernel) is built with AVX-512
    instructions and kills the process with SIGILL on a CPU without them (AMD Zen 3 and older,
    most desktop Intel), and a graph saved with it would carry that to every machine serving it."""
    if variant is not None and variant.cpp_ops:
        return paddle_ext.run_op("spmd_rms_norm", x, weight, eps)
    # Same order of operations as PaddleNLP's LlamaRMSNorm (fp32), so logits match to 1e-6.
    variance = x.pow(2).mean(-1, keepdim=True)
    return paddle.rsqrt(variance + eps) * x * weight


def add_rms_norm(h, delta, weight: paddle.Tensor, eps: float, variant: GraphVariant | None = None):
    """(RMSNorm(h + delta), h + delta), one op with the C++ ops; `h` None starts the residual stream at
    `delta` (Paddle's ops: a copy, as a graph whose output is one of its inputs unchanged is
    rejected; the C++ ops' graphs are one segment, where `delta` is never an input)."""
    cpp = variant is not None and variant.cpp_ops
    if h is None and cpp:
        return rms_norm(delta, weight, eps, variant), delta
    if cpp:
        out, h = paddle_ext.run_op("spmd_add_rms_norm", h, delta, weight, eps)
        return out, h
    h = paddle.assign(delta) if h is None else h + delta
    return rms_norm(h, weight, eps), h


def norm_linear(h, delta, weight: paddle.Tensor, eps: float, linear: Linear, variant: GraphVariant, swiglu_out: bool):
    """(linear(RMSNorm(h + delta)), h + delta), then SwiGLU on the linear's output when `swiglu_out`:
    one op with the C++ ops (ops/cpu_kernels/norm_linear.cc: Paddle's per-op cost is most of a
    small op's time at batch 1), else add_rms_norm, the linear and swiglu.  A `Deferred` delta (the
    previous row-shard linear, export/deferred.py) joins that op when its weight form is the same."""
    if variant.cpp_ops and h is not None and isinstance(delta, Deferred):
        fused = linear_norm_linear(h, delta, weight, eps, linear, swiglu_out)
        if fused is not None:
            return fused
    delta = materialize(delta, variant)
    if variant.cpp_ops and h is not None:
        name, weights = linear.cpp_op()
        fused = name.replace("spmd_linear", "spmd_norm_linear")
        out, h = paddle_ext.run_op(fused, h, delta, weight, *weights, eps, swiglu_out)
        return out, h
    x, h = add_rms_norm(h, delta, weight, eps, variant)
    out = linear(x, variant)
    return (swiglu(out, variant) if swiglu_out else out), h


def swiglu(x: paddle.Tensor, variant: GraphVariant) -> paddle.Tensor:
    """silu(x[..., :I]) * x[..., I:] of the fused gate|up output [..., 2I]."""
    if variant.cpp_ops:
        return paddle_ext.run_op("spmd_swiglu", x)
    return nn.functional.swiglu(x)
