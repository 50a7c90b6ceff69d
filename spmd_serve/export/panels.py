"""The panel layout of a linear weight (ops/cpu_kernels/weights.h: `F32P` for float32, `F16P` for
float16, `B16P` for bfloat16 held as its uint16 bits): numpy both ways.

A [K, N] weight keeps its shape and dtype; only the order of its elements changes.  Per block of
KC = 128 input rows (the last block K % 128), the block's columns are cut into panels of 16 (the last
one N % 16 when that is not 0), each panel stored whole before the next with the block's rows in the
kernels' chain order (gemm_blocked.h, `chain_row`: eight interleaved runs of kb // 8 rows, then the
kb % 8 rows past them).  A GEMM task's share of a block is then one contiguous run of memory, where
in [K, N] its rows lay N floats apart (benchmarks/RESULTS.md "Session 33"); the sums, and so the
outputs, are bit for bit those of the [K, N] weight.
"""

from __future__ import annotations

import numpy as np

KC = 128  # rows per block: gemm_blocked.h's kKC
PANEL = 16  # columns per panel: weights.h's F32P::kPanel
CHAIN_STREAMS = 8  # gemm_blocked.h's kChainStreams


def chain_order(kb: int) -> np.ndarray:
    """The rows of a block of kb rows in the chain's order (chain_row(kb, p) for p = 0 .. kb - 1)."""
    run = kb // CHAIN_STREAMS
    p = np.arange(kb)
    return np.where(p >= run * CHAIN_STREAMS, p, p % CHAIN_STREAMS * run + p // CHAIN_STREAMS)


def _blocks(k: int) -> list[tuple[int, int]]:
    return [(k0, min(KC, k - k0)) for k0 in range(0, k, KC)]


def to_panels(w: np.ndarray) -> np.ndarray:
    """A [K, N] float32 (or bfloat16 bits, uint16) weight → the same [K, N] array's elements in the panel
    layout."""
    if w.ndim != 2 or w.dtype not in (np.float32, np.float16, np.uint16):
        raise ValueError(f"the panel layout is for 2-D float32, float16 or bfloat16 weights, got {w.ndim}-D {w.dtype}")
    k, n = w.shape
    full = n // PANEL * PANEL
    out = np.empty(k * n, w.dtype)
    for k0, kb in _blocks(k):
        rows = w[k0 + chain_order(kb)]  # [kb, N], the chain's order
        # [kb, full] → [full / 16 panels][kb][16], then the last partial panel [kb][N % 16]
        body = rows[:, :full].reshape(kb, full // PANEL, PANEL).transpose(1, 0, 2).reshape(-1)
        start = k0 * n
        out[start : start + body.size] = body
        out[start + body.size : start + kb * n] = rows[:, full:].reshape(-1)
    return out.reshape(k, n)


def from_panels(p: np.ndarray) -> np.ndarray:
    """to_panels' inverse: the panel layout's [K, N] array → the [K, N] weight."""
    k, n = p.shape
    full = n // PANEL * PANEL
    flat = np.ascontiguousarray(p).reshape(-1)
    w = np.empty((k, n), p.dtype)
    for k0, kb in _blocks(k):
        start = k0 * n
        body = flat[start : start + kb * full].reshape(full // PANEL, kb, PANEL).transpose(1, 0, 2)
        tail = flat[start + kb * full : start + kb * n].reshape(kb, n - full)
        rows = np.concatenate([body.reshape(kb, full), tail], 1)
        w[k0 + chain_order(kb)] = rows
    return w
