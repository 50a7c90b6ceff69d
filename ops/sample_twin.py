"""The numpy twin of ops.sample: `sample_cpu` (the CPU path and the test oracle) and the exact
float32 helpers it shares bit for bit with the kernel (order-preserving keys, integer exp2 weights,
penalties), with the constants the CUDA source embeds.  Semantics: ops/sample.py's docstring.
"""
from __future__ import annotations

import math

import numpy as np

from .philox import philox_first_word

MAX_TOP_N = 64                 # num_logprobs limit (the kernel collects them in shared memory)
MAX_VOCAB = 1 << 22            # weights sum below 2**53: exact in float64 for top_p
_LN2_31 = 31 * math.log(2.0)   # ln(2**31), the same double in the kernel (printed with repr)

# exp2 polynomial: 2**f = sum_n (f ln 2)**n / n! on [0, 1), Taylor to degree 8 (error ~1e-7, below
# float32's), positive coefficients so Horner's rule is monotone in f, and P(1) < 2 so weights never
# decrease across a power of two.  Stored as float32 bit patterns shared with the CUDA source.
_COEF = [np.float32(math.log(2.0) ** n / math.factorial(n)) for n in range(9)]
_LOG2E = np.uint32(0x3FB8AA3B).view(np.float32)   # float32(log2(e))


# ----------------------------------------------------------------------------- exact helpers
def float_key(x: np.ndarray) -> np.ndarray:
    """Order-preserving uint32 of float32 values (larger float -> larger key; -0.0 as +0.0)."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).copy()
    b[b == 0x80000000] = 0
    return np.where(b & np.uint32(0x80000000), ~b, b | np.uint32(0x80000000)).astype(np.uint32)


def key_float(k: np.ndarray) -> np.ndarray:
    k = np.asarray(k, dtype=np.uint32)
    return np.where(k & np.uint32(0x80000000), k ^ np.uint32(0x80000000), ~k).astype(np.uint32).view(np.float32)


def exp2_weight(d: np.ndarray) -> np.ndarray:
    """uint32 weights ~ 2**31 * exp(d) for d = s - max s <= 0, with exactly the kernel's float32
    operations (each rounded, none fused): y = d*log2e; 0 if y < -33 or NaN; y = k + f;
    rint(P(f) * 2**(k + 31)).  Monotone non-decreasing in d; 2**31 at d = 0."""
    d = np.asarray(d, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        y = d * _LOG2E
        live = y >= np.float32(-33.0)
    y = np.where(live, y, np.float32(0.0))
    k = np.floor(y)
    f = y - k
    p = np.full_like(f, _COEF[8])
    for c in _COEF[7::-1]:
        p = p * f + c
    v = np.ldexp(p, (k + 31).astype(np.int32))
    return np.where(live, np.rint(v), np.float32(0.0)).astype(np.uint32)


def apply_penalties(logits: np.ndarray, rep_penalty, freq_penalty, pres_penalty, min_tokens,
                    num_generated, eos_ids, gen_token_ids) -> np.ndarray:
    """Step 1 of the module docstring on a float32 copy of [B, V] logits."""
    x = np.array(logits, dtype=np.float32)
    b_sz, v_sz = x.shape
    for b in range(b_sz):
        g = np.asarray(gen_token_ids[b]).astype(np.int64)
        g = g[(g >= 0) & (g < v_sz)]
        if g.size:
            ids, counts = np.unique(g, return_counts=True)
            v = x[b, ids]
            rep = np.float32(rep_penalty[b])
            if rep != 1:
                v = np.where(v > 0, v / rep, v * rep)
            x[b, ids] = (v - np.float32(freq_penalty[b]) * counts.astype(np.float32)) - np.float32(pres_penalty[b])
        if num_generated[b] < min_tokens[b]:
            e = np.asarray(eos_ids[b]).astype(np.int64)
            x[b, e[(e >= 0) & (e < v_sz)]] = -np.inf
    return x


def check_num_logprobs(num_logprobs: int) -> None:
    """Both paths return at most MAX_TOP_N top logprobs (the kernel collects them in shared memory)."""
    if not 0 <= num_logprobs <= MAX_TOP_N:
        raise ValueError(f"num_logprobs must be in [0, {MAX_TOP_N}], got {num_logprobs}")


def _ranked(keys: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
    """Token ids (of `ids`, default all) by key descending, id ascending."""
    ids = np.arange(keys.shape[0]) if ids is None else ids
    return ids[np.argsort(~keys[ids], kind="stable")]  # ids ascending + stable = ties by id


# ----------------------------------------------------------------------------- the numpy twin
def sample_cpu(logits: np.ndarray, temperature: np.ndarray, top_p: np.ndarray, top_k: np.ndarray,
               rep_penalty: np.ndarray, freq_penalty: np.ndarray, pres_penalty: np.ndarray,
               seeds: np.ndarray, counters: np.ndarray, min_tokens: np.ndarray, num_generated: np.ndarray,
               eos_ids: np.ndarray, gen_token_ids: np.ndarray, num_logprobs: int = 0
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """logits [B, V] (float32/float16; bf16 callers convert to float32, which is exact) ->
    (tokens [B] int32, logprobs [B] float32, top_ids [B, n] int32, top_logprobs [B, n] float32)."""
    logits = np.asarray(logits)
    b_sz, v_sz = logits.shape
    check_num_logprobs(num_logprobs)
    if v_sz >= MAX_VOCAB:
        raise ValueError(f"vocab {v_sz} too large (< {MAX_VOCAB})")
    temperature = np.asarray(temperature, np.float32)
    top_p, top_k = np.asarray(top_p, np.float32), np.asarray(top_k, np.int64)
    p = apply_penalties(logits, rep_penalty, freq_penalty, pres_penalty, min_tokens, num_generated,
                        np.asarray(eos_ids).reshape(b_sz, -1), np.asarray(gen_token_ids).reshape(b_sz, -1))
    x0 = philox_first_word(np.asarray(seeds, np.uint64), np.asarray(counters, np.int64))
    n = num_logprobs
    tokens = np.zeros(b_sz, np.int32)
    logprobs = np.zeros(b_sz, np.float32)
    top_ids = np.full((b_sz, n), -1, np.int32)
    top_lps = np.full((b_sz, n), -np.inf, np.float32)
    for b in range(b_sz):
        greedy = not temperature[b] > 0 or top_k[b] == 1 or not top_p[b] > 0
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            keys = float_key(p[b] if greedy else p[b] / temperature[b])
        s = key_float(keys)
        best = int(np.argmax(keys))  # first of the largest key = lowest id
        tokens[b] = best
        if greedy:
            mx = np.float64(s[best])
            with np.errstate(invalid="ignore", over="ignore"):
                lse = mx + np.log(np.sum(np.exp(s.astype(np.float64) - mx))) if np.isfinite(mx) else mx
                logprobs[b] = np.float32(np.float64(s[best]) - lse)
            if n:
                ids = _ranked(keys)[:n]
                top_ids[b, : len(ids)] = ids
                with np.errstate(invalid="ignore"):
                    top_lps[b, : len(ids)] = (s[ids].astype(np.float64) - lse).astype(np.float32)
            continue
        m = s[best]
        if not np.isfinite(m):
            logprobs[b] = np.nan
            continue
        d = s - m                              # float32, <= 0
        q = exp2_weight(d)
        order = _ranked(keys, np.flatnonzero(q))   # the positive-weight prefix of the ranking
        cum = np.cumsum(q[order].astype(np.uint64))
        k = len(order) if top_k[b] <= 0 else min(int(top_k[b]), len(order))
        kept = k
        if top_p[b] < 1:
            need = int(np.ceil(np.float64(top_p[b]) * np.float64(cum[k - 1])))
            kept = int(np.searchsorted(cum[:k], np.uint64(need), side="left")) + 1
        total = int(cum[kept - 1])
        t = (int(x0[b]) * total) >> 32          # floor(u * total), u = x0 / 2**32
        tok = int(order[int(np.searchsorted(cum, np.uint64(t), side="right"))])
        tokens[b] = tok
        ln_z = np.float32(np.log(np.float64(total)) - _LN2_31)
        logprobs[b] = d[tok] - ln_z
        if n:
            ids = order[: min(n, kept)]
            top_ids[b, : len(ids)] = ids
            top_lps[b, : len(ids)] = d[ids] - ln_z
    return tokens, logprobs, top_ids, top_lps
