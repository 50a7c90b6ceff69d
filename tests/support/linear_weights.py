"""Random operands of the linear ops (ops/cpu_kernels/linear.cc) in every weight form, with the
float64 weight each stands for: shared by the GEMM and the fused norm + linear op tests."""

from __future__ import annotations

import numpy as np

from spmd_serve.export.panels import to_panels
from spmd_serve.export.quant import QuantWeight, bf16_bits, dequantize, from_bf16_bits


def to_bf16(x: np.ndarray) -> np.ndarray:
    """x (float32) rounded to bfloat16, to nearest even, as float32; denormals to (signed) zero: what
    vcvtneps2bf16 makes of it (ops/cpu_kernels/gemm_bf16.h)."""
    x = np.ascontiguousarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    r = np.where(np.isnan(x), x, r)
    return np.where(np.abs(x) < np.float32(2.0**-126), np.copysign(np.float32(0), x), r).astype(np.float32)


def int8_input(x: np.ndarray) -> np.ndarray:
    """x as the int8 GEMM takes it on this CPU: rounded to bf16 where it runs on bf16 dot products
    (paddle_ext.int8_bf16()), else as it is."""
    from ops import paddle_ext

    return to_bf16(x) if paddle_ext.int8_bf16() else x


def bf16_int8(method: str | None) -> bool:
    """Whether linears of weights `method` take their input in bf16 here: int8 where the ops compute
    it with bf16 dot products (paddle_ext.int8_bf16()). Each input element is then rounded, 2^-9 of
    it, so a comparison with an fp32 twin needs ~1e-2 of the largest element."""
    from ops import paddle_ext

    return method is not None and method.endswith("int8") and paddle_ext.int8_bf16()


def twin_tolerance(method: str | None, want: np.ndarray, rtol: float, atol: float) -> dict[str, float]:
    """assert_allclose's rtol and atol against an fp32 twin: these, or 1e-2 (of the largest element)
    where the linears of weights `method` take their input in bf16 (bf16_int8)."""
    if bf16_int8(method):
        return {"rtol": 1e-2, "atol": 1e-2 * float(np.abs(want).max())}
    return {"rtol": rtol, "atol": atol}


def weights(k: int, n: int, seed: int, group: int = 8) -> dict[str, tuple]:
    """The op's arguments and the float64 [K, N] weight they stand for, per op."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n), np.float32)
    q8 = rng.integers(-128, 128, (k, n), dtype=np.int8)  # the full range, -128 included
    s8 = (rng.random(n, np.float32) + 0.5) / 127
    b16 = bf16_bits(w)
    ops = {
        "spmd_linear": ((w,), w.astype(np.float64)),
        "spmd_linear_bf16": ((to_panels(b16),), from_bf16_bits(b16).astype(np.float64)),
        "spmd_linear_f16": ((to_panels(w.astype(np.float16)),), w.astype(np.float16).astype(np.float64)),
        "spmd_linear_panels": ((to_panels(w),), w.astype(np.float64)),
        "spmd_linear_int8": ((q8, s8), q8.astype(np.float64) * s8),
    }
    if k % group:  # int4 needs whole groups
        return ops
    q4 = rng.integers(-8, 8, (k, n), dtype=np.int8)  # nibbles, -8 included
    packed = ((q4[0::2].astype(np.uint8) & 0x0F) | (q4[1::2].astype(np.uint8) << 4)).view(np.int8)
    s4 = (rng.random((k // group, n), np.float32) + 0.5) / 7
    w4 = dequantize(QuantWeight("weight_only_int4", packed, s4, group))  # quant.py's reading of the nibbles
    assert (w4 == np.repeat(s4, group, axis=0) * q4).all()
    return {**ops, "spmd_linear_int4": ((packed, s4), w4.astype(np.float64))}
