"""Speculative decoding on rank 0: the proposer interface, the n-gram proposer, and the per-step
rule that decides whether a step speculates at all.

Each step, before scheduling, a `Proposer` offers up to k draft tokens for every running request
that decodes (`Request.draft_token_ids`); the scheduler feeds them after the request's last known
token (scheduler/speculation.py), the target scores every position in the same forward pass, and
`engine/verify.py` keeps the accepted prefix plus one token of the target's own.

Proposers:
* `NgramProposer` (`inference_with_reference`, alias `ngram`): the longest suffix of the request's
  tokens (at most `max_ngram` long) that occurred before in its prompt or output; the tokens that
  followed that earlier occurrence (its latest) are the drafts.  Deterministic drafts (a one-hot
  draft distribution).  An index of every n-gram's latest end is kept per request and extended
  with the new tokens only, so a proposal costs O(max_ngram) dict look-ups, not a scan.
* `DraftModelProposer` (`draft_model`, engine/draft_model.py): a small model of the same tokenizer
  run on every rank (draft plans, engine/draft_plans.py), made where that model is loaded and
  passed to `make_speculator`.  `MtpProposer` (`mtp`, engine/mtp_proposer.py) likewise, over the
  DeepSeek export's MTP layer; it also follows every target step (`on_step`).  A proposer whose
  drafts are sampled from a distribution q of their own returns it (`draft_probs`) for rejection
  sampling.

The per-step rule: drafts cost query tokens in the step whether they are accepted or not.  At
batch 1 that is nearly free (the step is launch- and weight-bound), but in a full batch drafts that
are mostly rejected make every step slower for nothing, while drafts that are mostly accepted pay
at any batch size (measured: benchmarks/RESULTS.md "Speculative decoding").  So each request keeps
a running acceptance rate of its drafts (an exponential average); a request whose rate is below
`min_acceptance` gets no drafts, except a single draft every `PROBE_EVERY` steps, which earns it
full drafts again when accepted (its text started repeating).  A request starts as if it had
failed: its first decode step probes, so text that never repeats pays one draft token now and
then, not k of them in its first step (at batch 32 that first step alone cost ~10 %).  Above that
rule, the step gate (engine/spec_gate.py) decides whether a step speculates at all, by measured
seconds per generated token of each mode: a model proposer's drafts can be right and still cost
more than they save.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from spmd_serve.engine.spec_gate import GATE_MIN_BATCH, StepGate
from spmd_serve.envs import BY_FIELD
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import SchedulerOutput

NGRAM = "ngram"  # canonical name of inference_with_reference
METHODS = {"inference_with_reference": NGRAM, NGRAM: NGRAM, "draft_model": "draft_model", "mtp": "mtp"}
# Below this running acceptance rate a request stops drafting (benchmarks/RESULTS.md "Speculative
# decoding": at batch 32 drafts accepted ~7 % of the time cost 24 %, ~87 % gained 84 %; even ~25 %).
DEFAULT_MIN_ACCEPTANCE: float = BY_FIELD["speculate_min_acceptance"].default  # SPMD_SPECULATE_MIN_ACCEPTANCE
PROBE_EVERY = 16  # decode steps between two probes of a request that is not drafting
MAX_DRAFT_TOKENS = 8  # SPECULATE_MAX_DRAFT_TOKEN_NUM's upper bound


@dataclass(frozen=True)
class SpecConfig:
    """SPECULATE_METHOD (canonical name), SPECULATE_MAX_DRAFT_TOKEN_NUM, SPECULATE_MAX_NGRAM_SIZE and
    the per-step rule's acceptance threshold (0: always draft)."""

    method: str
    num_draft: int = 1
    max_ngram: int = 3
    min_acceptance: float = DEFAULT_MIN_ACCEPTANCE

    def __post_init__(self) -> None:
        if not 1 <= self.num_draft <= MAX_DRAFT_TOKENS:
            raise ValueError(f"SPECULATE_MAX_DRAFT_TOKEN_NUM must be 1..{MAX_DRAFT_TOKENS}, got {self.num_draft}")
        if not 1 <= self.max_ngram <= 8:
            raise ValueError(f"SPECULATE_MAX_NGRAM_SIZE must be 1..8, got {self.max_ngram}")


class Proposer(Protocol):
    """Offers draft tokens; `propose` writes them into each request's `draft_token_ids`."""

    method: str  # the metrics' label
    free_drafts: bool  # proposing costs next to nothing (n-gram), not a draft plan (a model)

    def propose(self, requests: Sequence[Request], k: int) -> None:
        """Up to `k` drafts for each of `requests` (all decoding: one known token left to feed)."""

    def draft_probs(self, request: Request) -> Any | None:
        """The distributions the request's drafts were sampled from ([d, V]), or None for
        deterministic drafts (a one-hot distribution: the verifier needs no array)."""


class _NgramIndex:
    """Latest end position of every n-gram (n = 1..max_ngram) of one request's tokens, over the
    tokens [0, upto): extended incrementally as tokens are appended (they never change)."""

    def __init__(self, max_ngram: int) -> None:
        self.max_ngram = max_ngram
        self.latest: dict[tuple[int, ...], int] = {}
        self.upto = 0

    def extend(self, tokens: list[int], upto: int) -> None:
        for end in range(self.upto, upto):  # n-grams ending at `end` (inclusive)
            for n in range(1, min(self.max_ngram, end + 1) + 1):
                self.latest[tuple(tokens[end - n + 1 : end + 1])] = end
        self.upto = max(self.upto, upto)


class NgramProposer:
    """inference_with_reference: drafts copied from an earlier occurrence of the current suffix."""

    method = NGRAM
    free_drafts = True

    def __init__(self, max_ngram: int) -> None:
        self.max_ngram = max_ngram
        # per request, dropped with it (preemption keeps its tokens, so the index stays valid)
        self._index: weakref.WeakKeyDictionary[Request, _NgramIndex] = weakref.WeakKeyDictionary()

    def propose(self, requests: Sequence[Request], k: int) -> None:
        for request in requests:
            request.draft_token_ids = self.lookup(request, k)

    def lookup(self, request: Request, k: int) -> list[int]:
        tokens = request.all_token_ids
        index = self._index.get(request)
        if index is None:
            index = self._index[request] = _NgramIndex(self.max_ngram)
        # n-grams ending before the last token: an earlier occurrence has a token after it
        index.extend(tokens, len(tokens) - 1)
        last = len(tokens) - 1
        for n in range(min(self.max_ngram, last), 0, -1):  # the longest match first
            end = index.latest.get(tuple(tokens[last - n + 1 :]))
            if end is not None:
                return tokens[end + 1 : end + 1 + k]
        return []

    def draft_probs(self, request: Request) -> None:
        return None


def canonical_method(method: str) -> str:
    """SPECULATE_METHOD → its canonical name ("none" stays "none")."""
    if method == "none":
        return method
    if method not in METHODS:
        raise ValueError(f"SPECULATE_METHOD={method!r}: choose none, {', '.join(METHODS)}")
    return METHODS[method]


def make_proposer(cfg: SpecConfig) -> Proposer:
    """The proposer of `cfg.method` (those that need a model are made where the model is loaded)."""
    if cfg.method == NGRAM:
        return NgramProposer(cfg.max_ngram)
    raise ValueError(f"SPECULATE_METHOD={cfg.method}: its proposer is made where its model is loaded")


@dataclass
class _Record:
    """One request's drafting record: the running acceptance rate and steps since it drafted."""

    rate: float = 0.0
    idle: int = PROBE_EVERY - 1  # the first decode step probes


class Speculator:
    """The engine's speculation: whether a step speculates at all (engine/spec_gate.py), which
    requests get drafts (the per-request rule), from its proposer, and what the verdicts and the
    step's time teach both rules."""

    def __init__(
        self, cfg: SpecConfig, proposer: Proposer | None = None, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.cfg = cfg
        self.proposer = proposer if proposer is not None else make_proposer(cfg)
        self._records: weakref.WeakKeyDictionary[Request, _Record] = weakref.WeakKeyDictionary()
        # min_acceptance 0 means "always draft" (benchmarks' forced runs): no gate then
        # free drafts are gated from GATE_MIN_BATCH sequences up; a model's draft plans at every size
        min_batch = GATE_MIN_BATCH if self.proposer.free_drafts else 1
        self.gate = StepGate(min_batch=min_batch) if cfg.min_acceptance > 0 else None
        self.clock = clock
        self._next: bool | None = None  # the gate's choice for the next step (None: not asked yet)
        self._started: float | None = None  # when this step's propose began
        self._carry = 0.0  # the proposer's follow-up after the last step, paid for this step's drafts
        self._accepted = 0  # drafts accepted this step
        self._speculating = False  # whether the last step speculated

    @property
    def method(self) -> str:
        return self.proposer.method

    def propose(self, running: Sequence[Request]) -> None:
        """Drafts for the running requests that decode and whose drafts have been paying, when
        the gate lets this step speculate."""
        self._started, self._accepted = self.clock(), 0
        if self._next is None:  # the first step: the gate's choice for this batch
            self._next = self.gate is None or self.gate.decide(len(running))
        chosen, probes = [], []
        for r in running:
            r.draft_token_ids = []
            if not self._next:
                continue
            if r.num_tokens - r.num_computed_tokens != 1:
                continue
            rec = self._records.get(r)
            if rec is None:
                rec = self._records[r] = _Record()
            rec.idle += 1
            if rec.rate >= self.cfg.min_acceptance:
                rec.idle = 0
                chosen.append(r)
            elif rec.idle >= PROBE_EVERY:
                rec.idle = 0
                probes.append(r)
        # One proposer call a step: a model proposer runs k draft plans per call, so a second call
        # for the probes would cost one plan more; the probes' drafts are cut to one instead (the
        # draft K/V past a verdict is the proposer's to discard anyway, and q rows past the drafts
        # are never read)
        if chosen:
            self.proposer.propose(chosen + probes, self.cfg.num_draft)
            for r in probes:
                del r.draft_token_ids[1:]
        elif probes:
            self.proposer.propose(probes, 1)

    def on_step(self, out: SchedulerOutput) -> None:
        """After every target step's update: the step's cost per token to the gate (decode-only
        steps), the gate's choice for the next step, then the proposer's `on_step` if it has one
        (mtp feeds its layer the positions the step made final) — skipped after a decode-only step
        when the next one will not speculate (prompt chunks are always followed: their positions
        are the context of every later draft); its time is charged to the next step."""
        decoding = bool(out.seqs) and all(s.samples and s.num_new_tokens - s.num_draft == 1 for s in out.seqs)
        speculated = any(s.num_draft for s in out.seqs)
        # the first speculative step after plain ones carries the proposer's catch-up: the gate takes
        # it as the cost of a try, not as a sample of speculation's cost per token
        switched = speculated and not self._speculating
        self._speculating = speculated
        if self.gate is not None and decoding and self._started is not None:
            seconds = self._carry + self.clock() - self._started
            self.gate.record(len(out.seqs), speculated, seconds, len(out.seqs) + self._accepted, switched)
        self._next = self.gate is None or self.gate.decide(len(out.seqs))
        self._carry = 0.0
        follow = getattr(self.proposer, "on_step", None)
        if follow is not None and (self._next or not decoding):
            began = self.clock()
            follow(out)
            self._carry = self.clock() - began if decoding else 0.0

    def on_verdicts(self, verdicts: Sequence[tuple[Request, int, int]]) -> None:
        """(request, drafts verified, drafts accepted) of this step's verifying requests."""
        for r, drafted, accepted in verdicts:
            self._accepted += accepted
            rec = self._records.get(r)
            if rec is not None and drafted:
                rec.rate = 0.5 * rec.rate + 0.5 * accepted / drafted


def make_speculator(
    method: str,
    num_draft: int,
    max_ngram: int,
    min_acceptance: float = DEFAULT_MIN_ACCEPTANCE,
    proposer: Proposer | None = None,
) -> Speculator | None:
    """The engine's Speculator for SPECULATE_METHOD and its sizes; None for "none".  `proposer`:
    the one of a method that needs a model (made where the model is loaded)."""
    method = canonical_method(method)
    if method == "none":
        return None
    return Speculator(SpecConfig(method, num_draft, max_ngram, min_acceptance), proposer)
