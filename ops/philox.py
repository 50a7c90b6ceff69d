"""Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the Random123
reference constants), in numpy and as a CUDA device function that give bit-identical words.

The sampler keys one generator per sequence by its 64-bit seed and uses the index of the token
being generated as the counter, so a draw depends only on (seed, index): not on the batch, its
order, or the device.  Layout (documented contract, shared by ops/sample.py's kernel and twin):

    key     = (seed & 0xffffffff, seed >> 32)
    counter = (index & 0xffffffff, index >> 32, 0, 0)   # = (index, 0, 0, 0) for index < 2**32
    x0      = first output word;  u = x0 * 2**-32 in [0, 1)

numpy: uint64 arrays hold uint32 values so `M * c` (two < 2**32 operands) is exact and gives both
the high and low words of the 64-bit product (Random123's mulhilo32).
"""

from __future__ import annotations

import numpy as np

from .nvrtc import kernel_source

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers (PHILOX_M4x32_0/1)
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key bumps (golden ratio, sqrt(3) - 1)
_MASK = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


def philox4x32_10(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """counter [..., 4] and key [..., 2] (uint32 values) -> the 4 output words [..., 4] uint32."""
    ctr = np.asarray(counter, dtype=np.uint64) & _MASK
    k = np.asarray(key, dtype=np.uint64) & _MASK
    c0, c1, c2, c3 = (ctr[..., i] for i in range(4))
    k0, k1 = k[..., 0], k[..., 1]
    m0, m1 = np.uint64(PHILOX_M0), np.uint64(PHILOX_M1)
    for r in range(10):
        if r:  # the key is bumped before every round but the first
            k0 = (k0 + np.uint64(PHILOX_W0)) & _MASK
            k1 = (k1 + np.uint64(PHILOX_W1)) & _MASK
        p0, p1 = m0 * c0, m1 * c2  # exact: both factors < 2**32
        c0, c1, c2, c3 = ((p1 >> _SHIFT) ^ c1 ^ k0, p1 & _MASK, (p0 >> _SHIFT) ^ c3 ^ k1, p0 & _MASK)
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def _first_word_scalar(seed: int, index: int) -> int:
    """philox4x32_10's x0 for one (seed, index) on Python ints: the same rounds, ~30x faster than
    numpy on 0-d arrays (one draw per request and step: the speculative verifier's call)."""
    m32 = 0xFFFFFFFF
    c0, c1, c2, c3 = index & m32, (index >> 32) & m32, 0, 0
    k0, k1 = seed & m32, (seed >> 32) & m32
    for r in range(10):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & m32, (k1 + PHILOX_W1) & m32
        p0, p1 = PHILOX_M0 * c0, PHILOX_M1 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & m32, (p0 >> 32) ^ c3 ^ k1, p0 & m32
    return c0


def philox_first_word(seeds: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """The x0 word for each (seed uint64, token index int64) pair, vectorised -> uint32."""
    s = np.asarray(seeds).astype(np.uint64)
    i = np.asarray(indices).astype(np.int64).astype(np.uint64)  # two's complement, as the kernel
    if s.size == 1 and i.size == 1:  # one draw: Python ints (numpy's per-call cost is 10 rounds x ~10 ops)
        shape = np.broadcast_shapes(s.shape, i.shape)
        return np.full(shape, _first_word_scalar(int(s.reshape(-1)[0]), int(i.reshape(-1)[0])), np.uint32)
    zero = np.zeros_like(s)
    ctr = np.stack([i & _MASK, i >> _SHIFT, zero, zero], axis=-1)
    key = np.stack([s & _MASK, s >> _SHIFT], axis=-1)
    return philox4x32_10(ctr, key)[..., 0]


def philox_uniform(seeds: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """u = x0 * 2**-32 in [0, 1) as float64 (exact).  The sampler itself never rounds through a
    float: it draws the integer floor(x0 * total_mass / 2**32) (see ops/sample.py)."""
    return philox_first_word(seeds, indices).astype(np.float64) * 2.0**-32


# CUDA (ops/kernels/philox.cuh): the same rounds, with __umulhi / the 32-bit product as Random123's
# mulhilo32, and `philox_first_word(seed, index)` with the layout above.
CUDA_SOURCE = kernel_source("philox.cuh")

# A tiny kernel for the GPU known-answer test: n (counter, key) rows -> n output rows.
KAT_KERNEL = "philox4x32_10_kat"
KAT_SOURCE = kernel_source("philox.cuh", "philox_kat.cu")
