"""What a request asks of its own rows of logits before ops.sample draws from them, in this order:
vLLM's `allowed_token_ids` (every other token masked), OpenAI's `logit_bias` (added to the named
tokens' logits), vLLM's `bad_words` (a banned sequence's last token masked where the output so far
ends with the rest of it, as vLLM's `apply_bad_words`), vLLM's `guided_choice` (only the tokens that
keep the answer on one of its token sequences, and the eos ids once it is one whole: `guided_next`),
a JSON answer (OpenAI's `response_format`, vLLM's `guided_json`: only the tokens that keep the
answer on its schema's grammar, and the eos ids once it is whole: engine/json_masks.py), a thinking
budget spent (every token but the close tag's next one masked: engine/think_budget.py) and vLLM's
`min_p` (tokens whose probability, after the penalties and the temperature, is below min_p x that of
the row's most likely token are dropped). All act on a copy — the raw logits stay for the logprobs
(the model's own, as vLLM reports) and for `Sampler.observe` — and only when some request in the
step asks; ops.sample (and its CUDA twin) stay as they are.

Masks are -inf: the penalties leave -inf where it is, so ops.sample then draws from the kept tokens,
renormalised, with its own top-k / top-p on top. min_p's threshold is taken on the penalised logits
p in float32 as ops.sample computes them (its `apply_penalties`): token i stays iff (p_i / T - max_j
p_j / T) >= ln(min_p), in float64 — vLLM's p_i >= min_p * p_max.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

import ops.sample
from spmd_serve.engine import json_masks, think_budget
from spmd_serve.engine.json_masks import JsonVocab
from spmd_serve.sampling_params import SamplingParams


class SampledRequest(Protocol):
    """One row's request as the sampler reads it (a request, or a draft position's view: verify.py)."""

    @property
    def params(self) -> SamplingParams: ...

    @property
    def output_token_ids(self) -> list[int]: ...

    @property
    def eos_token_ids(self) -> frozenset[int]: ...


def guided_next(params: SamplingParams, output: Sequence[int], eos: frozenset[int]) -> set[int]:
    """The ids that keep `output` on one of params.guided_sequences: each sequence's next id where the
    output is a prefix of it, and the eos ids where it is one whole (empty: the output left them)."""
    n, so_far = len(output), tuple(output)
    nxt = {s[n] for s in params.guided_sequences if len(s) > n and s[:n] == so_far}
    return nxt | eos if so_far in params.guided_sequences else nxt


def on_choice(request: SampledRequest, tokens: list[int]) -> bool:
    """Whether each of a step's `tokens` after the request's output kept its answer on a guided_choice one."""
    out, p, eos = request.output_token_ids, request.params, request.eos_token_ids
    return all(t in guided_next(p, out + tokens[:j], eos) for j, t in enumerate(tokens))


def json_keep(vocab: JsonVocab | None, view: SampledRequest, width: int) -> npt.NDArray[np.bool_]:
    """[width] the tokens that keep `view`'s answer on its JSON schema's grammar (engine/json_masks.py),
    and its eos ids once it is whole."""
    if vocab is None:
        raise ValueError(
            "a JSON, guided_regex or guided_grammar answer needs the vocabulary's bytes, which no HTTP worker sent"
        )
    holder = getattr(view, "holder", None)
    grammar, state = vocab.state_of(holder or view, view.output_token_ids)
    keep = np.zeros(width, bool)
    n = min(width, len(vocab))
    keep[:n] = vocab.allowed(grammar, state)[:n]
    keep[[e for e in view.eos_token_ids if e < width]] = grammar.may_end(state)
    return keep


def off_limits(request: SampledRequest, tokens: list[int], width: int, vocab: JsonVocab | None) -> str | None:
    """Why a request's drawn `tokens` cannot stand, or None.  A token outside the vocabulary would
    fail every rank's next graph; one its own masks forbid was drawn from a row they left all -inf."""
    bad = [t for t in tokens if not 0 <= t < width]
    p = request.params
    if bad:
        return f"sampling failed for this request: token {bad[0]} is outside the vocabulary ({width})"
    if p.guided_sequences and not on_choice(request, tokens):
        return (
            "no token of guided_choice's answers can be drawn at this step: each is masked (allowed_token_ids, "
            "bad_words, or an EOS id until min_tokens)"
        )
    if p.grammar and not json_masks.keeps_json(vocab, request, tokens):
        return (
            "no token that keeps the answer on its JSON schema can be drawn at this step: each is masked "
            "(allowed_token_ids, bad_words or logit_bias), or no token of the vocabulary writes what must come next"
        )
    # (a spent thinking budget's close tag is the model's whatever allowed_token_ids says, as vLLM forces it)
    if p.allowed_token_ids and not set(tokens) <= {*p.allowed_token_ids, *p.think_close}:
        return (
            "no token of allowed_token_ids can be drawn at this step: each is an EOS or stop id, "
            "masked until min_tokens are generated, or ends one of bad_words"
        )
    return None


def _min_p_rows(views: Sequence[SampledRequest]) -> list[int]:
    return [i for i, v in enumerate(views) if v.params.min_p > 0 and not v.params.greedy]


def wanted(views: Sequence[SampledRequest], vocab: JsonVocab | None = None) -> bool:
    """Whether any row asks for an adjustment (the usual step: none, and no copy is made); a thinking
    budget only at the steps it forces a token."""
    return any(
        v.params.logit_bias
        or v.params.allowed_token_ids
        or v.params.bad_words
        or v.params.guided_sequences
        or v.params.grammar
        or (v.params.think_budget >= 0 and think_budget.forced(v, vocab) is not None)
        for v in views
    ) or bool(_min_p_rows(views))


def adjusted(
    logits: Any, rows: Sequence[int], views: Sequence[SampledRequest], arrays: Any, vocab: JsonVocab | None = None
) -> Any:
    """logits [R, V] → a float32 copy where row rows[i] carries views[i]'s adjustments (above).
    `arrays(views)`: sampler.sample_arrays (the penalties' per-row parameters, as ops.sample gets
    them).  Each row is listed once (`rows` distinct).  `vocab`: the tokens' bytes, for JSON answers."""
    out = logits.astype(np.float32)  # a copy (float16 logits too: a bias of 100 is exact in float32)
    for r, v in zip(rows, views):
        if v.params.allowed_token_ids:  # every other token masked, before the bias (which cannot revive it)
            keep = out[r, list(v.params.allowed_token_ids)]
            out[r] = -np.inf
            out[r, list(v.params.allowed_token_ids)] = keep
        if v.params.logit_bias:
            ids, bias = zip(*v.params.logit_bias)
            out[r, list(ids)] += np.asarray(bias, np.float32)
        for *before, last in v.params.bad_words:  # a view's output: before this row's token
            if not before or v.output_token_ids[-len(before) :] == before:
                out[r, last] = -np.inf
        if v.params.guided_sequences:  # the rest masked (an eos id past the vocabulary is no row's)
            keep = [t for t in guided_next(v.params, v.output_token_ids, v.eos_token_ids) if t < out.shape[1]]
            kept = out[r, keep]
            out[r] = -np.inf
            out[r, keep] = kept
        if v.params.grammar:
            out[r, ~json_keep(vocab, v, out.shape[1])] = -np.inf
        forced = think_budget.forced(v, vocab) if v.params.think_budget >= 0 else None
        if forced is not None and forced < out.shape[1]:  # (over every mask above: the block must close)
            out[r] = -np.inf
            out[r, forced] = 0.0
    pick = _min_p_rows(views)
    if pick:
        at = [rows[i] for i in pick]
        a = arrays([views[i] for i in pick])
        p = ops.sample.apply_penalties(  # [len(pick), V] float32, the sampler's own step 1
            out[at], a["rep_penalty"], a["freq_penalty"], a["pres_penalty"], a["min_tokens"],
            a["num_generated"], a["eos_ids"], a["gen_token_ids"],
        )  # fmt: skip
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            s = p / a["temperature"][:, None]
            top = s.max(axis=1)
            floor = np.log(np.array([views[i].params.min_p for i in pick], np.float64))
            drop = (s.astype(np.float64) - top[:, None].astype(np.float64)) < floor[:, None]
        drop &= np.isfinite(top)[:, None]  # a row of NaN or +inf: left to ops.sample's own rule
        for j, r in enumerate(at):
            out[r, drop[j]] = -np.inf
    return out
