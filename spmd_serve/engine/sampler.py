"""Token sampling on rank 0, one row of full-vocab logits per sequence that completes this step.

Order per row: repetition/frequency/presence penalties over the tokens the request generated
(as the original tool), EOS masking until min_tokens, then greedy argmax or temperature → top-k →
top-p → a draw.  The draw uses a counter-based generator keyed by (seed, output index), so a
seeded request gets the same tokens whatever else shares its batch, and preemption/recompute
cannot change them.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from spmd_serve.sampling_params import SamplingParams


class SampledRequest(Protocol):
    params: SamplingParams
    output_token_ids: list[int]
    eos_token_ids: frozenset[int]


def apply_penalties(x: np.ndarray, p: SamplingParams, generated: Sequence[int]) -> np.ndarray:
    if not generated or (p.repetition_penalty == 1.0 and not p.frequency_penalty and not p.presence_penalty):
        return x
    counts = np.bincount(np.asarray(generated, np.int64), minlength=x.shape[0])[: x.shape[0]]
    seen = counts > 0
    if p.repetition_penalty != 1.0:
        x = np.where(seen, np.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty), x)
    return x - p.frequency_penalty * counts - p.presence_penalty * seen


def mask_eos(x: np.ndarray, p: SamplingParams, eos: frozenset[int], num_generated: int) -> np.ndarray:
    """EOS cannot be chosen before min_tokens outputs exist (min_dec_len)."""
    if eos and not p.ignore_eos and num_generated < p.min_tokens:
        x = x.copy()
        x[[e for e in eos if e < x.shape[0]]] = -np.inf
    return x


def draw(x: np.ndarray, p: SamplingParams, u: float) -> int:
    """Temperature → top-k → top-p on logits `x`, then the token at uniform `u` of the kept mass."""
    x = x / p.temperature
    order = np.argsort(-x, kind="stable")            # descending, ties by token id
    if p.top_k:
        order = order[: p.top_k]
    probs = np.exp(x[order] - x[order[0]])
    probs /= probs.sum()
    # smallest prefix whose mass reaches top_p; rounding can leave the total just below a top_p
    # near 1, so never keep more than exists
    keep = len(order)
    if p.top_p < 1:
        keep = min(int(np.searchsorted(np.cumsum(probs), p.top_p, side="left")) + 1, keep)
    kept = probs[:keep] / probs[:keep].sum()
    return int(order[min(int(np.searchsorted(np.cumsum(kept), u, side="right")), keep - 1)])


def uniform(seed: int, index: int) -> float:
    """The counter-based draw for output token `index` of a request seeded with `seed`."""
    return float(np.random.default_rng([seed, index]).random())


# (logprob of the chosen token, [(token id, logprob)] of the top n, best first)
TokenLogprobs = tuple[float, list[tuple[int, float]]]


def token_logprobs(logits: np.ndarray, token: int, top_n: int) -> TokenLogprobs:
    """Log-probabilities from the model's own distribution (the raw logits, before penalties,
    temperature and truncation, as vLLM reports by default): the chosen token's and the top n."""
    x = logits.astype(np.float64)
    lse = x.max() + np.log(np.exp(x - x.max()).sum())
    top: list[tuple[int, float]] = []
    if top_n:
        idx = np.argpartition(-x, top_n - 1)[:top_n]
        idx = idx[np.lexsort((idx, -x[idx]))]         # best first, ties by token id
        top = [(int(i), float(x[i] - lse)) for i in idx]
    return float(x[token] - lse), top


def sample(logits: np.ndarray, requests: Sequence[SampledRequest]) -> list[int]:
    """logits [N, V] float32 → one token per request."""
    tokens = []
    for row, req in zip(logits, requests):
        p, n = req.params, len(req.output_token_ids)
        x = mask_eos(apply_penalties(row.astype(np.float64), p, req.output_token_ids), p, req.eos_token_ids, n)
        if p.greedy:
            tokens.append(int(np.argmax(x)))
        else:
            tokens.append(draw(x, p, uniform(p.seed or 0, n)))
    return tokens
