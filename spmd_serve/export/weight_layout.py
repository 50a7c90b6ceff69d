"""Undoing `paddle.nn.quant.weight_quantize`: the int8 / int4 weights of a PaddleNLP static model → integers.

The original tool's weight-only models store each linear as `weight_quantize(w, algo)`'s output: w is
the [K, N] (input × output) fp16/bf16 weight, quantised symmetrically per output channel (or per group
of input rows) with q = round(w / scale) in [-127, 127] (int8) or [-7, 7] (int4), then laid out for the
GPU's mixed-precision GEMM of the `arch` it was built for.  Two layouts exist (Paddle 3's CPU kernel
paddle/phi/kernels/cpu/weight_quantize_kernel.cc, whose SM80 output equals the GPU kernel's):

* SM70: q row-major [K, N], +128 (int8) / +8 (int4) so it reads unsigned, and interleaved inside each
  32-bit register (int8: elements 0 2 1 3; int4 nibbles: 0 2 4 6 1 3 5 7);
* SM75/80/86/89/90: rows permuted inside each block of 16 (int8) / 32 (int4) rows, transposed to
  [N, K], 32-bit units of K interleaved between 2 (int8) / 4 (int4) neighbouring columns in tiles of
  64 rows, then the same bias and register interleave.

`unpack` inverts one of them with reshapes and transposes (never an index array: a 70B model's
matrices have ~10^8 elements).  Which one a model used is not recorded anywhere, so `detect_layout`
tells them apart by the quantiser's own invariant: every output channel (or group) of a correctly
unpacked weight holds its ±qmax (its absmax became exactly qmax); the wrong layout mixes channels.
"""

from __future__ import annotations

import numpy as np

from spmd_serve.export.errors import CheckpointError

LAYOUTS = ("sm80", "sm70")  # SM75+ share one layout; tried in this order
QMAX = {8: 127, 4: 7}
_REGISTER_ORDER = {8: np.array([0, 2, 1, 3]), 4: np.array([0, 2, 4, 6, 1, 3, 5, 7])}  # stored slot → element


def _elements(stored: np.ndarray, bits: int) -> np.ndarray:
    """The stored bytes as signed element values in storage order (bias removed), int8."""
    raw = np.ascontiguousarray(stored).view(np.uint8).reshape(-1)
    if bits == 8:
        return (raw.astype(np.int16) - 128).astype(np.int8)
    nib = np.empty(raw.size * 2, np.int8)  # element 2i in the low nibble of byte i, 2i+1 in the high one
    nib[0::2], nib[1::2] = raw & 0x0F, raw >> 4
    return nib - np.int8(8)


def unpack(stored: np.ndarray, k: int, n: int, bits: int, layout: str) -> np.ndarray:
    """`weight_quantize`'s stored output for a [k, n] weight → the signed integers q [k, n] (int8)."""
    if bits not in QMAX or layout not in LAYOUTS:
        raise ValueError(f"unknown weight-only form: {bits} bits, layout {layout!r}")
    per_reg = 32 // bits
    e = _elements(stored, bits)
    if e.size != k * n or e.size % per_reg:
        raise ValueError(f"{e.size} stored elements cannot be a [{k}, {n}] weight")
    # undo the register interleave: slot s holds element order[s]
    e = e.reshape(-1, per_reg)[:, np.argsort(_REGISTER_ORDER[bits])].reshape(-1)
    if layout == "sm70":
        return e.reshape(k, n)
    inter, rows_per_tile, rows_per_mma = 1024 // bits // 64, 64, 8 * (16 // bits)
    if k % rows_per_tile or n % inter:
        raise ValueError(f"a [{k}, {n}] weight cannot have the SM75+ layout (K % 64, N % {inter})")
    # undo the column interleave: [N/inter, K/64, inter, 64] ← [N/inter, inter, K/64, 64], i.e. [N, K]
    t = e.reshape(n // inter, k // rows_per_tile, inter, rows_per_tile).transpose(0, 2, 1, 3).reshape(n, k)
    # undo the transpose, then the row permutation inside each MMA block (stored row r = row read[r])
    t = t.T
    r = np.arange(rows_per_mma)
    read = 8 * ((r % per_reg) // 2) + r % 2 + 2 * (r // per_reg)
    perm = (np.arange(k) // rows_per_mma) * rows_per_mma + read[np.arange(k) % rows_per_mma]
    out = np.empty((k, n), np.int8)
    out[perm] = t
    return out


def scale_groups(scale: np.ndarray, k: int, n: int) -> int | None:
    """The quantisation group of a [k, n] weight from its scale's shape: None per channel ([n])."""
    if scale.shape == (n,):
        return None
    if scale.ndim == 2 and scale.shape[1] == n and scale.shape[0] > 0 and k % scale.shape[0] == 0:
        return k // scale.shape[0]
    raise ValueError(f"scale of shape {list(scale.shape)} fits neither [{n}] nor [K/group, {n}] for K={k}")


def holds_qmax(q: np.ndarray, scale: np.ndarray, bits: int, group: int | None) -> bool:
    """The quantiser's invariant: every output channel (per group) with a non-zero scale reaches ±qmax."""
    a = np.abs(q.astype(np.int16))
    amax = a.max(axis=0)[None] if group is None else a.reshape(-1, group, q.shape[1]).max(axis=1)
    live = np.broadcast_to(scale.reshape(amax.shape[0] if group else 1, -1), amax.shape) != 0
    return bool(np.all(amax[live] == QMAX[bits]))


def dequantize(q: np.ndarray, scale: np.ndarray, group: int | None) -> np.ndarray:
    """q [k, n] with its scale ([n] or [k/group, n]) → the float32 weight [k, n] it stands for."""
    s = np.asarray(scale, np.float32)
    full = s[None, :] if group is None else np.repeat(s, group, axis=0)
    return q.astype(np.float32) * full


def detect_layout(name: str, stored: np.ndarray, scale: np.ndarray, k: int, n: int, bits: int) -> str:
    """The layout under which `stored` unpacks to integers that satisfy `holds_qmax`; CheckpointError
    naming the parameter when none does."""
    group = _group(name, scale, k, n)
    for layout in LAYOUTS:
        try:
            if holds_qmax(unpack(stored, k, n, bits, layout), scale, bits, group):
                return layout
        except ValueError:
            continue
    raise CheckpointError(
        f"{name}: its int{bits} weight-only layout is not one this converter knows (Paddle's weight_quantize "
        f"for SM70 or SM75+): under neither does every output channel reach ±{QMAX[bits]} at its stored scale"
    )


def _group(name: str, scale: np.ndarray, k: int, n: int) -> int | None:
    try:
        return scale_groups(scale, k, n)
    except ValueError as e:
        raise CheckpointError(f"{name}_scale: {e}") from None


def weight_only_to_float(
    name: str, stored: np.ndarray, scale: np.ndarray, k: int, n: int, bits: int, layout: str
) -> np.ndarray:
    """A stored weight-only linear → its float32 [k, n] weight; CheckpointError naming the parameter
    when it does not unpack under `layout` (the model's, found by `detect_layout` on its first linear)."""
    group = _group(name, scale, k, n)
    try:
        q = unpack(stored, k, n, bits, layout)
    except ValueError as e:
        raise CheckpointError(f"{name}: {e}") from None
    if not holds_qmax(q, scale, bits, group):
        raise CheckpointError(
            f"{name}: does not unpack under the {layout} layout the model's other weights use "
            f"(an output channel misses ±{QMAX[bits]})"
        )
    return dequantize(q, scale, group)
