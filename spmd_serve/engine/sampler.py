"""Rank 0's sampling adapter: the requests whose chunk completes this step → ops.sample's per-row
arrays → one token per request, in one batched call; plus the OpenAI logprobs of the chosen tokens.
`Sampler.sample` returns both as one `SampledStep`.  A request that verifies speculative drafts
has a row per position and gets its accepted drafts plus one token (engine/verify.py); one that
scores its prompt has a row per position of its chunk, whose entries come back too
(engine/prompt_logprobs.py).

A request's allowed_token_ids, logit_bias and min_p act on a copy of its rows first
(engine/logits_adjust.py; the logprobs stay the raw model's).
The sampling itself (penalties over the tokens the request generated, EOS masking until
min_tokens, greedy arg-max or temperature → top-k → top-p → a Philox draw) is ops.sample's, whose
docstring states it exactly.  `ops.sample` dispatches on the logits: numpy (the CPU runner today)
takes the numpy twin, device arrays the CUDA kernel; both pick the same token bit for bit.  The
draw is keyed by (seed, output index), so a seeded request gets the same tokens whatever else
shares its batch, and preemption/recompute cannot change them.  Unseeded requests get a random
seed at admission (Engine._admit); a request that never passed admission (the warm-up) uses 0.

One request's failure stays that request's: should the batched call raise (parameters that
escaped validation), the rows are sampled one by one; each failing request, and each whose token
came back outside the vocabulary or its allowed_token_ids (all masked: EOS ids before min_tokens),
is reported in `SampledStep.failed` for the engine to end with an error, while every other request
gets its token as usual.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

import ops.sample
from ops import sample_native
from spmd_serve.engine import logits_adjust, prompt_logprobs
from spmd_serve.engine.json_masks import JsonVocab
from spmd_serve.engine.logits_adjust import SampledRequest
from spmd_serve.engine.outputs import PromptLogprobs, TokenLogprobs
from spmd_serve.engine.prompt_logprobs import logits_rows
from spmd_serve.engine.verify import accept_matching, position_rows, rejection_sample, target_probs
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import SchedulerOutput

log = logging.getLogger(__name__)


def _padded(rows: list[list[int]]) -> npt.NDArray[np.int32]:
    """Ragged id lists → [len(rows), longest] int32, -1 padded (ops.sample ignores -1)."""
    out = np.full((len(rows), max(map(len, rows), default=0)), -1, np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def eos_masking(r: SampledRequest) -> tuple[int, list[int]]:
    """(min_tokens, the ids masked until then): ignore_eos unmasks the eos ids (they stop nothing)
    but not the request's stop_token_ids, which still stop it."""
    p = r.params
    if p.ignore_eos:
        return (p.min_tokens, sorted(p.stop_token_ids)) if p.stop_token_ids else (0, sorted(r.eos_token_ids))
    return p.min_tokens, sorted(r.eos_token_ids)


def _penalised(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or bool(p.frequency_penalty) or bool(p.presence_penalty)


def sample_arrays(requests: Sequence[SampledRequest]) -> dict[str, npt.NDArray[Any]]:
    """The per-row parameters of ops.sample (its names and dtypes) from the requests' fields."""
    ps = [r.params for r in requests]
    masking = [eos_masking(r) for r in requests]
    n_out = np.array([len(r.output_token_ids) for r in requests], np.int64)
    return dict(
        # SamplingParams.greedy also covers temperatures below SAMPLING_EPS, which ops.sample
        # would divide by: pass 0 for every greedy row
        temperature=np.array([0.0 if p.greedy else p.temperature for p in ps], np.float32),
        top_p=np.array([p.top_p for p in ps], np.float32),
        top_k=np.array([p.top_k for p in ps], np.int32),
        rep_penalty=np.array([p.repetition_penalty for p in ps], np.float32),
        freq_penalty=np.array([p.frequency_penalty for p in ps], np.float32),
        pres_penalty=np.array([p.presence_penalty for p in ps], np.float32),
        seeds=np.array([p.seed or 0 for p in ps], np.uint64),
        counters=n_out,  # the Philox counter: the output index
        min_tokens=np.array([m for m, _ in masking], np.int32),
        num_generated=n_out.astype(np.int32),
        eos_ids=_padded([ids for _, ids in masking]),
        # neutral penalties leave a row exactly as it is, so only penalised rows list their tokens
        gen_token_ids=_padded([r.output_token_ids if _penalised(r.params) else [] for r in requests]),
    )


def _plain_greedy(r: SampledRequest) -> bool:
    """Greedy, unpenalised, and no EOS id masked this step: ops.sample's token is the row's argmax."""
    p = r.params
    if not p.greedy or _penalised(p):
        return False
    min_tokens, masked = eos_masking(r)
    return not masked or len(r.output_token_ids) >= min_tokens


def sample(logits: Any, requests: Sequence[SampledRequest]) -> list[int]:
    """logits [N, V] (numpy float32/float16, or a device array) → one token per request."""
    if not len(requests):
        return []
    if isinstance(logits, np.ndarray) and all(map(_plain_greedy, requests)):
        # the twin's own greedy rule without building its parameters: ~0.3 ms a batch-1 step less
        # (measured), as this runs right after the graph has pushed everything out of the caches
        return ops.sample.greedy_tokens(logits if logits.dtype == np.float32 else logits.astype(np.float32))
    # the logprobs reported are token_logprobs' (raw logits), not ops.sample's: skip them on the CPU
    native = sample_native.kernels()  # the draws in C where the rank loaded the op library (the same bits)
    tokens = ops.sample.sample(logits, **sample_arrays(requests), with_logprobs=False, native=native)[0]
    return [int(t) for t in np.asarray(tokens)]


def token_logprobs(logits: npt.NDArray[np.floating[Any]], token: int, top_n: int) -> TokenLogprobs:
    """Log-probabilities from the model's own distribution (the raw logits, before penalties,
    temperature and truncation, as vLLM reports by default): the chosen token's and the top n.
    (ops.sample's own logprobs are those of the processed distribution the token was drawn from.)"""
    x = logits.astype(np.float64)
    lse = x.max() + np.log(np.exp(x - x.max()).sum())
    top: list[tuple[int, float]] = []
    if top_n:
        idx = np.argpartition(-x, top_n - 1)[:top_n]
        idx = idx[np.lexsort((idx, -x[idx]))]  # best first, ties by token id
        top = [(int(i), float(x[i] - lse)) for i in idx]
    return float(x[token] - lse), top


@dataclass(frozen=True)
class SampledStep:
    """One step's sampling result: the tokens of every request whose chunk completed its known
    tokens (one, or its accepted drafts plus one), in plan order, and the logprobs of those that
    asked for them (one entry per token); `failed` names the requests whose own sampling failed
    this step (req_id -> why), which got no token.  `num_draft` / `num_accepted`: drafts verified
    and accepted this step."""

    requests: list[Request] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)  # by req_id
    failed: dict[str, str] = field(default_factory=dict)  # by req_id
    num_draft: int = 0
    num_accepted: int = 0
    num_verifying: int = 0  # requests that verified drafts
    prompt_logprobs: dict[str, list[PromptLogprobs]] = field(default_factory=dict)  # by req_id: this step's

    def token_by_request(self) -> dict[str, list[int]]:
        return {r.req_id: t for r, t in zip(self.requests, self.tokens)}


def _why(e: Exception) -> str:
    return f"sampling failed for this request: {type(e).__name__}: {e}"[:300]


# One request to verify: the request, its rows of logits, its drafts.
_Job = tuple[Request, list[int], list[int]]


class Sampler:
    """Rank 0's step sampler.  A subclass may observe the logits of every sampled row
    (`observe`: the offline engine's capture for the parity tests) without the engine knowing.
    `draft_probs`: the proposer's distributions of a request's drafts when they were sampled
    (None: deterministic drafts)."""

    draft_probs: Callable[[Request], Any] | None = None
    json_vocab: JsonVocab | None = None  # every token's bytes (the HTTP workers' hello), for JSON schemas

    def sample(self, out: SchedulerOutput, logits: npt.NDArray[np.float32]) -> SampledStep:
        """logits [R, V]: `logits_rows` per scheduled sequence (1; 1 + its drafts when it verifies
        drafts; its chunk's scored positions when it scores its prompt), in plan order."""
        usual = self._plain_step(out, logits)
        if usual is not None:
            return usual
        jobs: list[_Job] = []
        prompt_lps: dict[str, list[PromptLogprobs]] = {}
        row = 0
        for s in out.seqs:
            n = logits_rows(s)
            if s.request.params.prompt_logprobs is not None:  # (engine/prompt_logprobs.py; a 1-token chunk too)
                prompt_lps[s.request.req_id] = prompt_logprobs.score(s, logits[row : row + n], token_logprobs)
            if s.samples:  # its last rows: the next token's (after its drafts')
                drafts = s.request.draft_token_ids[: s.num_draft]
                jobs.append((s.request, list(range(row + n - 1 - s.num_draft, row + n)), drafts))
            row += n
        if not jobs:
            return SampledStep(prompt_logprobs=prompt_lps)
        failed: dict[str, str] = {}
        try:
            tokens = self._verify(logits, jobs)
        except Exception:  # some row's parameters: find which, sample the others
            log.exception("batched sampling failed; sampling the %d requests one by one", len(jobs))
            tokens = []
            for job in jobs:
                try:
                    tokens.append(self._verify(logits, [job])[0])
                except Exception as e:
                    failed[job[0].req_id] = _why(e)
                    tokens.append([])
        for (r, _, _), ts in zip(jobs, tokens):
            why = None if r.req_id in failed else logits_adjust.off_limits(r, ts, logits.shape[-1], self.json_vocab)
            if why:
                failed[r.req_id] = why
        logprobs: dict[str, list[TokenLogprobs]] = {}
        for (r, rows, _), ts in zip(jobs, tokens):
            if r.params.logprobs is not None and r.req_id not in failed:
                try:
                    logprobs[r.req_id] = [token_logprobs(logits[i], t, r.params.logprobs) for i, t in zip(rows, ts)]
                except Exception as e:
                    failed[r.req_id] = _why(e)
        kept = [k for k, (r, _, _) in enumerate(jobs) if r.req_id not in failed]
        self.observe(
            [jobs[k][0] for k in kept for _ in tokens[k]],
            logits,
            [i for k in kept for i in jobs[k][1][: len(tokens[k])]],
        )
        return SampledStep(
            [jobs[k][0] for k in kept],
            [tokens[k] for k in kept],
            logprobs,
            failed,
            num_draft=sum(len(jobs[k][2]) for k in kept),
            num_accepted=sum(len(tokens[k]) - 1 for k in kept),
            num_verifying=sum(1 for k in kept if jobs[k][2]),
            prompt_logprobs=prompt_lps,
        )

    def _plain_step(self, out: SchedulerOutput, logits: npt.NDArray[np.float32]) -> SampledStep | None:
        """The usual step in the fewest Python and numpy calls (it runs on the caches the graph
        step has just left cold: 63 -> ~25 us a batch-1 step, measured): every sequence samples one
        token, verifies no drafts, asks for no logprobs and no adjustment, so its token is
        `sample`'s alone.  None for any other step, and for one where `sample` fails or returns a
        token outside the vocabulary: the general path then finds which request it was."""
        reqs: list[Request] = []
        for s in out.seqs:
            if not s.samples or s.num_draft or s.request.params.logprobs is not None:
                return None
            reqs.append(s.request)
        if len(reqs) != len(logits) or logits_adjust.wanted(reqs, self.json_vocab):
            return None
        try:
            tokens = sample(logits, reqs)
        except Exception:
            return None
        vocab = logits.shape[-1]
        if not all(0 <= t < vocab for t in tokens):
            return None
        self.observe(reqs, logits, list(range(len(reqs))))
        return SampledStep(reqs, [[t] for t in tokens])

    def _verify(self, logits: npt.NDArray[np.float32], jobs: list[_Job]) -> list[list[int]]:
        """Every job's tokens: one batched draw over all their rows, then each job's verdict."""
        rows: list[int] = []
        views: list[SampledRequest] = []
        for r, idx, drafts in jobs:
            rows += idx
            if drafts:
                views += position_rows(r.params, r.output_token_ids, r.eos_token_ids, drafts, r)
            else:
                views.append(r)
        if logits_adjust.wanted(views, self.json_vocab):  # allowed ids, bias, min_p: a copy, for the verdicts too
            logits = logits_adjust.adjusted(logits, rows, views, sample_arrays, self.json_vocab)
        # every row, the usual case: no copy of the logits (they are cold after the graph)
        targets = sample(logits if rows == list(range(len(logits))) else logits[rows], views)
        out: list[list[int]] = []
        k = 0
        for r, idx, drafts in jobs:
            q = self.draft_probs(r) if drafts and self.draft_probs is not None and not r.params.greedy else None
            if q is None:
                out.append(accept_matching(drafts, targets[k : k + len(idx)]))
            else:
                pos = views[k : k + len(idx)]
                p = target_probs(logits[idx], [v.params for v in pos], sample_arrays(pos))
                out.append(rejection_sample(p, q, drafts, r.params.seed or 0, len(r.output_token_ids)))
            k += len(idx)
        return out

    def observe(self, requests: list[Request], logits: npt.NDArray[np.float32], rows: list[int]) -> None:
        """Called each step with the step's logits [R, V] and, per sampled token, its request and
        its row (a request that got several tokens is listed once per token); nothing by default."""
