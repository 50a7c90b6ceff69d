"""Verifying a speculative step's drafts against the target's logits: which drafts are accepted,
and the target's own token after them.

A request that verified d drafts has 1 + d rows of logits: row j scores position j of the step
(its last known token, then the drafts), i.e. the distribution of output token n + j, where n is
its output count before the step.  Every row is processed exactly as plain decoding would process
it at that point (penalties over the output *including* the earlier drafts, EOS masking while
n + j < min_tokens, temperature, top-k, top-p; `position_rows`).

* Deterministic drafts (n-gram, or any proposer without draft distributions: q one-hot on the
  draft), greedy and sampled requests alike (`accept_matching`): the target's token t_j is drawn
  at every position with the sampler's own keyed draw (Philox key = the seed, counter = the output
  index n + j), the drafts are accepted while d_j == t_j, and the first mismatch (or, all accepted,
  the last row's draw) is the target's token.  This *is* rejection sampling for a one-hot q:
  acceptance happens with probability p_j(d_j) = min(1, p/q), and on rejection t_j is distributed
  as p_j without d_j, renormalised — the residual norm(max(0, p - q)).  Because it uses the same
  draws as plain decoding, a request's tokens are the same with and without speculation (greedy:
  the arg-max; seeded: the same draws), and never depend on what else shares the batch.
* Drafts sampled from a distribution q on streams of the proposer's own (`rejection_sample`; the
  draft_model proposer instead draws on the target's own draws, so its drafts are matched):
  the standard rule.  Draft j is accepted when u_j * q_j(d_j) < p_j(d_j), u_j uniform from Philox
  keyed (seed, n + j) on its own counter stream; the first rejected one is replaced by a draw from
  norm(max(0, p_j - q_j)); if every draft is accepted a bonus token is drawn from the last row.
  The output is distributed as the target's (p is the sampler's processed distribution in
  float64: `target_probs`), and a seeded request is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ops.philox import philox_uniform
from ops.sample_twin import apply_penalties
from spmd_serve.sampling_params import SamplingParams

F64 = npt.NDArray[np.float64]
# Counter streams of the rejection rule's uniforms (plain draws use the output index itself, < 2**40).
ACCEPT_STREAM, RESIDUAL_STREAM = 1 << 40, 2 << 40


@dataclass(frozen=True)
class PositionRow:
    """One position of a speculative step seen as a sampler row (engine/logits_adjust.SampledRequest):
    the request's parameters and its output as it stands *before* that position's token."""

    params: SamplingParams
    output_token_ids: list[int]
    eos_token_ids: frozenset[int]
    holder: Any = None  # the request whose output this extends (its JSON parse state: engine/json_masks.py)


def position_rows(
    params: SamplingParams, output: list[int], eos: frozenset[int], drafts: Sequence[int], holder: Any = None
) -> list[PositionRow]:
    """The 1 + len(drafts) rows of a step that verifies `drafts` after a request's `output`."""
    return [PositionRow(params, output + list(drafts[:j]), eos, holder) for j in range(len(drafts) + 1)]


def accept_matching(drafts: Sequence[int], targets: Sequence[int]) -> list[int]:
    """Deterministic drafts: the drafts up to the first that differs from the target's token at
    its position, then the target's token there (len(targets) = len(drafts) + 1)."""
    a = 0
    while a < len(drafts) and drafts[a] == targets[a]:
        a += 1
    return [*drafts[:a], targets[a]]


def target_probs(
    logits: npt.NDArray[np.float32], params: Sequence[SamplingParams], a: dict[str, npt.NDArray[Any]]
) -> F64:
    """[R, V] float64: the distribution ops.sample draws each row's token from (penalties, EOS
    masking, temperature, top-k, top-p; one-hot at the arg-max for greedy rows), up to ops.sample's
    own integer weights' rounding (~2**-31 relative).  `params`: each row's; `a`: the rows'
    ops.sample parameter arrays (engine/sampler.sample_arrays)."""
    x = apply_penalties(
        logits,
        a["rep_penalty"],
        a["freq_penalty"],
        a["pres_penalty"],
        a["min_tokens"],
        a["num_generated"],
        a["eos_ids"],
        a["gen_token_ids"],
    ).astype(np.float64)
    out = np.zeros(x.shape, np.float64)
    for i, p in enumerate(params):
        if a["temperature"][i] <= 0 or p.top_k == 1 or p.top_p <= 0:
            out[i, int(np.argmax(x[i]))] = 1.0
            continue
        s = x[i] / np.float64(a["temperature"][i])
        order = np.lexsort((np.arange(s.size), -s))  # rank: value descending, ties by id
        w = np.exp(s[order] - s[order[0]])
        keep = w.size if p.top_k <= 0 else min(p.top_k, w.size)
        if p.top_p < 1:
            cum = np.cumsum(w[:keep])
            keep = int(np.searchsorted(cum, p.top_p * cum[-1], side="left")) + 1
        out[i, order[:keep]] = w[:keep] / w[:keep].sum()
    return out


def _draw(probs: F64, u: float) -> int:
    """Inverse CDF: the first token whose cumulative probability exceeds u (u in [0, 1))."""
    cum = np.cumsum(probs)
    return int(min(np.searchsorted(cum, u * cum[-1], side="right"), probs.size - 1))


def rejection_sample(p: F64, q: F64, drafts: Sequence[int], seed: int, first_index: int) -> list[int]:
    """p [d + 1, V] the target's distributions, q [d, V] those the drafts were sampled from:
    the accepted drafts then one token (see the module docstring); uniforms keyed by (seed,
    output index) on their own counter streams."""
    seeds = np.full(1, seed, np.uint64)

    def uniform(stream: int, j: int) -> float:
        return float(philox_uniform(seeds, np.array([stream + first_index + j], np.int64))[0])

    for j, d in enumerate(drafts):
        if uniform(ACCEPT_STREAM, j) * q[j, d] < p[j, d]:
            continue
        residual = np.maximum(p[j] - q[j], 0.0)
        if residual.sum() <= 0:  # p == q: any rejection is a rounding artefact; draw from p
            residual = p[j]
        return [*drafts[:j], _draw(residual, uniform(RESIDUAL_STREAM, j))]
    k = len(drafts)
    return [*drafts, _draw(p[k], uniform(RESIDUAL_STREAM, k))]
