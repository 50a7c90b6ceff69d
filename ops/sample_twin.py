"""The numpy twin of ops.sample: `sample_cpu` (the CPU path and the test oracle) and the exact
float32 helpers it shares bit for bit with the kernel (order-preserving keys, integer exp2 weights,
penalties), with the constants the CUDA source embeds.  Semantics: ops/sample.py's docstring.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .philox import philox_first_word

MAX_TOP_N = 64  # num_logprobs limit (the kernel collects them in shared memory)
MAX_VOCAB = 1 << 22  # weights sum below 2**53: exact in float64 for top_p
_LN2_31 = 31 * math.log(2.0)  # ln(2**31), the same double in the kernel (printed with repr)

# exp2 polynomial: 2**f = sum_n (f ln 2)**n / n! on [0, 1), Taylor to degree 8 (error ~1e-7, below
# float32's), positive coefficients so Horner's rule is monotone in f, and P(1) < 2 so weights never
# decrease across a power of two.  Stored as float32 bit patterns shared with the CUDA source.
_COEF = [np.float32(math.log(2.0) ** n / math.factorial(n)) for n in range(9)]
_LOG2E = np.uint32(0x3FB8AA3B).view(np.float32)  # float32(log2(e))


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
    rint(P(f) * 2**(k + 31)).  Monotone non-decreasing in d; 2**31 at d = 0.  (Computed in place:
    each step is one rounded float32 operation either way.)"""
    shape = np.shape(d)
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.multiply(np.asarray(d, dtype=np.float32).reshape(-1), _LOG2E)
        dead = ~(y >= np.float32(-33.0))
    y[dead] = 0
    k = np.floor(y)
    f = np.subtract(y, k, out=y)
    p = np.multiply(f, _COEF[8])
    for c in _COEF[7::-1]:
        np.add(p, c, out=p)
        if c is not _COEF[0]:
            np.multiply(p, f, out=p)
    k += 31
    v = np.rint(np.ldexp(p, k.astype(np.int32), out=p), out=p)
    v[dead] = 0
    return v.astype(np.uint32).reshape(shape)


def apply_penalties(
    logits: np.ndarray, rep_penalty, freq_penalty, pres_penalty, min_tokens, num_generated, eos_ids, gen_token_ids
) -> np.ndarray:
    """Step 1 of the module docstring on a float32 copy of [B, V] logits, all rows at once (each
    (row, token) pair is penalised once, with its count: the same float32 operations per element)."""
    x = np.array(logits, dtype=np.float32)
    b_sz, v_sz = x.shape
    g = np.asarray(gen_token_ids).astype(np.int64).reshape(b_sz, -1)
    row = np.broadcast_to(np.arange(b_sz)[:, None], g.shape)
    ok = (g >= 0) & (g < v_sz)
    if ok.any():
        flat, counts = np.unique(row[ok] * v_sz + g[ok], return_counts=True)  # one per (row, token)
        r, ids = flat // v_sz, flat % v_sz
        v = x[r, ids]
        rep = np.asarray(rep_penalty, np.float32)[r]
        v = np.where(rep != 1, np.where(v > 0, v / rep, v * rep), v)
        x[r, ids] = (v - np.asarray(freq_penalty, np.float32)[r] * counts.astype(np.float32)) - np.asarray(
            pres_penalty, np.float32
        )[r]
    e = np.asarray(eos_ids).astype(np.int64).reshape(b_sz, -1)
    masked = (np.asarray(num_generated) < np.asarray(min_tokens))[:, None] & (e >= 0) & (e < v_sz)
    x[np.broadcast_to(np.arange(b_sz)[:, None], e.shape)[masked], e[masked]] = -np.inf
    return x


def check_num_logprobs(num_logprobs: int) -> None:
    """Both paths return at most MAX_TOP_N top logprobs (the kernel collects them in shared memory)."""
    if not 0 <= num_logprobs <= MAX_TOP_N:
        raise ValueError(f"num_logprobs must be in [0, {MAX_TOP_N}], got {num_logprobs}")


def _values_and_argmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows x [R, V] float32 -> (s = key_float(float_key(x)): the values as ranked, -0.0 as +0.0;
    the arg-max of the key per row, lowest id on ties).  Without NaN that is x + 0 and argmax (the same
    bits, fewer passes); a row whose argmax meets a NaN takes the keys, where NaNs rank by their bits."""
    s = x + np.float32(0)
    best = np.argmax(s, axis=1)
    nan_rows, keys = _rank_nan_rows(x, best)
    if nan_rows.size:
        s[nan_rows] = key_float(keys)
    return s, best


def _rank_nan_rows(x: np.ndarray, best: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """best = np.argmax(x, axis=1) (a row with a NaN gives its first NaN's index) -> the rows whose
    arg-max met a NaN get the arg-max of their keys instead, where NaNs rank by their bits; returns
    (those rows, their keys)."""
    nan_rows = np.flatnonzero(np.isnan(x[np.arange(len(x)), best]))
    if not nan_rows.size:  # the usual step: no keys to build
        return nan_rows, np.empty((0, x.shape[1]), np.uint32)
    keys = float_key(x[nan_rows])
    best[nan_rows] = np.argmax(keys, axis=1)
    return nan_rows, keys


def _ranking(s: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """uint64 (~key << 32 | id) of tokens `ids` of a row of values s: ascending = rank order (key
    descending, ties by id) and all distinct, so a partition at m holds exactly the first m ranks."""
    return (~float_key(s[ids])).astype(np.uint64) << np.uint64(32) | ids.astype(np.uint64)


def _first_ranks(ranking: np.ndarray, m: int) -> np.ndarray:
    """Token ids of the first m (<= len) ranks, best first: a partition, then a sort of m values."""
    if m < ranking.shape[0]:
        ranking = np.partition(ranking, m - 1)[:m]
    return (np.sort(ranking) & np.uint64(0xFFFFFFFF)).astype(np.int64)


def _prefix_len(q: np.ndarray, target: int) -> int:
    """A number of first ranks whose weight reaches `target` (<= the total of q, positive weights):
    whole buckets of the weights' float32 exponent, which is monotone in the weight, so the top
    buckets are a prefix of the ranking.  Bucket masses are float64 sums of integers < 2**53: exact."""
    e = (q.astype(np.float32).view(np.uint32) >> np.uint32(23)).astype(np.intp)
    mass, count = np.bincount(e, weights=q)[::-1], np.bincount(e)[::-1]  # heaviest bucket first
    i = min(int(np.searchsorted(np.cumsum(mass), target)), len(count) - 1)
    return int(np.cumsum(count)[i])


def _draw(
    s: np.ndarray, q: np.ndarray, top_k: int, top_p: np.float32, x0: int, n: int
) -> tuple[np.ndarray, int, int, int]:
    """Step 3's top-k / top-p / draw on one row (values s, weights q) -> (the first ranks' ids, at
    least min(n, kept) of them; the drawn token; the kept weight Q; the kept count).  The positive
    weights are a prefix of the ranking; only the part of it that the steps read is sorted: top_k
    ranks, or the ranks holding top_p's mass, or those up to the draw (doubled if ever short)."""
    pos = np.flatnonzero(q)
    n_pos, qp = len(pos), q[pos]
    q_all = int(qp.sum(dtype=np.uint64))
    k = n_pos if top_k <= 0 else min(top_k, n_pos)
    if k < n_pos:
        m = k
    elif top_p < 1:
        m = _prefix_len(qp, int(np.ceil(np.float64(top_p) * np.float64(q_all))))
    else:
        m = _prefix_len(qp, ((x0 * q_all) >> 32) + 1)
    m = min(n_pos, max(m, n))
    ranking = _ranking(s, pos)
    while True:
        ids = _first_ranks(ranking, m)
        cum = np.cumsum(q[ids].astype(np.uint64))
        q_k = int(cum[k - 1]) if k <= m else q_all  # k > m only when k = n_pos (all weights)
        kept = k
        if top_p < 1:
            need = int(np.ceil(np.float64(top_p) * np.float64(q_k)))
            kept = int(np.searchsorted(cum[:k], np.uint64(need), side="left")) + 1
            if kept > m:  # the boundary lies beyond the prefix
                m = min(n_pos, 2 * m)
                continue
        total = int(cum[kept - 1]) if kept <= m else q_k
        t = (x0 * total) >> 32  # floor(u * total), u = x0 / 2**32
        if int(cum[-1]) <= t:  # the draw lies beyond the prefix
            m = min(n_pos, 2 * m)
            continue
        return ids, int(ids[int(np.searchsorted(cum, np.uint64(t), side="right"))]), total, kept


def greedy_tokens(x: np.ndarray) -> list[int]:
    """Rows x [R, V] float32 -> sample_cpu's tokens where every row is greedy with no penalty and
    no masked id (its step 2 alone: the arg-max, lowest id on ties, NaNs ranked by their bits).
    _values_and_argmax's arg-max without its copy x + 0: -0.0 and +0.0 compare equal, so the first
    of them wins either way.  It runs at every step on logits the graph has just left cold, with
    numpy's code cold too, so it makes the fewest numpy calls (array methods, not the np.*
    wrappers; the NaN test on each chosen entry in Python): 86 -> 18 us at batch 1, measured."""
    best: list[int] = x.argmax(axis=1).tolist()
    if any((v := x.item(i, t)) != v for i, t in enumerate(best)):  # a NaN met: rank them by bits
        arr = np.asarray(best, np.int64)
        _rank_nan_rows(x, arr)
        best = arr.tolist()
    return best


def _greedy_rows(p: np.ndarray, n: int, with_logprobs: bool) -> tuple[np.ndarray, ...]:
    """Step 2 and the greedy logprobs of step 4 for rows p [G, V] -> the four outputs' rows."""
    s, best = _values_and_argmax(p)
    mx = s[np.arange(len(s)), best].astype(np.float64)
    top_ids = np.full((len(s), n), -1, np.int32)
    top_lps = np.full((len(s), n), -np.inf, np.float32)
    if not (with_logprobs or n):  # the log-sum-exp over the row is most of a greedy row's cost
        return best, np.full(len(s), np.nan, np.float32), top_ids, top_lps
    with np.errstate(invalid="ignore", over="ignore"):
        lse = mx + np.log(np.sum(np.exp(s.astype(np.float64) - mx[:, None]), axis=1))
        lse = np.where(np.isfinite(mx), lse, mx)
        for g in range(len(s) if n else 0):
            ids = _first_ranks(_ranking(s[g], np.arange(s.shape[1])), min(n, s.shape[1]))
            top_ids[g, : len(ids)] = ids
            top_lps[g, : len(ids)] = (s[g, ids].astype(np.float64) - lse[g]).astype(np.float32)
    return best, (mx - lse).astype(np.float32), top_ids, top_lps


# ----------------------------------------------------------------------------- the numpy twin
def sample_cpu(
    logits: np.ndarray,
    temperature: np.ndarray,
    top_p: np.ndarray,
    top_k: np.ndarray,
    rep_penalty: np.ndarray,
    freq_penalty: np.ndarray,
    pres_penalty: np.ndarray,
    seeds: np.ndarray,
    counters: np.ndarray,
    min_tokens: np.ndarray,
    num_generated: np.ndarray,
    eos_ids: np.ndarray,
    gen_token_ids: np.ndarray,
    num_logprobs: int = 0,
    *,
    with_logprobs: bool = True,
    native: Any = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """logits [B, V] (float32/float16; bf16 callers convert to float32, which is exact) ->
    (tokens [B] int32, logprobs [B] float32, top_ids [B, n] int32, top_logprobs [B, n] float32).
    with_logprobs=False (the CPU path only: a caller that ignores `logprobs`) skips the greedy rows'
    log-sum-exp and returns NaN there; tokens and every other output are unchanged.
    Element-wise steps run over all greedy / all sampled rows at once; the ranking per sampled row
    sorts only the prefix its steps read (`_draw`).  `native` (ops.sample_native.kernels()): the
    weights and the draws in C, the same bits."""
    logits = np.asarray(logits)
    b_sz, v_sz = logits.shape
    check_num_logprobs(num_logprobs)
    if v_sz >= MAX_VOCAB:
        raise ValueError(f"vocab {v_sz} too large (< {MAX_VOCAB})")
    temperature = np.asarray(temperature, np.float32)
    top_p, top_k = np.asarray(top_p, np.float32), np.asarray(top_k, np.int64)
    p = apply_penalties(
        logits, rep_penalty, freq_penalty, pres_penalty, min_tokens, num_generated, eos_ids, gen_token_ids
    )
    n = num_logprobs
    tokens = np.zeros(b_sz, np.int32)
    logprobs = np.zeros(b_sz, np.float32)
    top_ids = np.full((b_sz, n), -1, np.int32)
    top_lps = np.full((b_sz, n), -np.inf, np.float32)
    greedy = ~(temperature > 0) | (top_k == 1) | ~(top_p > 0)
    g = np.flatnonzero(greedy)
    if g.size:
        tokens[g], logprobs[g], top_ids[g], top_lps[g] = _greedy_rows(p if g.size == b_sz else p[g], n, with_logprobs)
    rows = np.flatnonzero(~greedy)
    if not rows.size:
        return tokens, logprobs, top_ids, top_lps
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        s, best = _values_and_argmax(p[rows] / temperature[rows, None])
    tokens[rows] = best
    x0 = philox_first_word(np.asarray(seeds, np.uint64)[rows], np.asarray(counters, np.int64)[rows])
    m = s[np.arange(rows.size), best]
    finite = np.isfinite(m)
    logprobs[rows[~finite]] = np.nan
    d = s - np.where(finite, m, np.float32(0))[:, None]  # float32, <= 0 on finite rows
    q = (native.exp2_weight if native is not None else exp2_weight)(d)
    draw = native.draw if native is not None else _draw
    for i in np.flatnonzero(finite):
        b = rows[i]
        ids, tok, total, kept = draw(s[i], q[i], int(top_k[b]), top_p[b], int(x0[i]), n)
        tokens[b] = tok
        ln_z = np.float32(np.log(np.float64(total)) - _LN2_31)
        logprobs[b] = d[i, tok] - ln_z
        if n:
            kept_ids = ids[: min(n, kept)]
            top_ids[b, : len(kept_ids)] = kept_ids
            top_lps[b, : len(kept_ids)] = d[i, kept_ids] - ln_z
    return tokens, logprobs, top_ids, top_lps
