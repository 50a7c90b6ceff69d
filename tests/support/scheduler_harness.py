"""Shared scheduler test harness: request factories, a sequential reference, and a fake model
that simulates the paged KV cache (deterministic in (prompt, position)), so any schedule -
chunked, preempted, recomputed - must reproduce the reference token stream exactly."""

from __future__ import annotations

from collections.abc import Callable

from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import ScheduledSeq, Scheduler, SchedulerConfig, SchedulerOutput

EOS = 1
TokenFn = Callable[[tuple[int, ...], int], int]


def default_fn(prompt: tuple[int, ...], position: int) -> int:
    """Never EOS: tokens live in [100, 1100)."""
    return 100 + (sum(prompt) * 31 + len(prompt) * 7 + position * 17) % 1000


def make_scheduler(**kw) -> Scheduler:
    cfg = dict(
        max_num_seqs=8,
        num_blocks=64,
        block_size=4,
        block_ratio=1.0,
        max_waiting=64,
        max_num_batched_tokens=64,
        max_model_len=256,
    )
    cfg.update(kw)
    return Scheduler(SchedulerConfig(**cfg))


def make_request(req_id: str, prompt_len: int = 4, max_tokens: int = 4, **params) -> Request:
    base = sum(map(ord, req_id))  # distinct prompts per id => distinct streams
    prompt = [100 + (base + i) % 50 for i in range(prompt_len)]
    return Request(req_id, prompt, SamplingParams(max_tokens=max_tokens, **params), eos_token_ids=frozenset({EOS}))


def reference(req: Request, max_model_len: int, fn: TokenFn = default_fn) -> tuple[list[int], str]:
    """What the request must produce: sample one token per position, no scheduling at all."""
    prompt, p = tuple(req.prompt_token_ids), req.params
    out: list[int] = []
    while True:
        tok = fn(prompt, len(prompt) + len(out))
        out.append(tok)
        if tok in req.eos_token_ids and not p.ignore_eos and len(out) >= p.min_tokens:
            return out, "stop"
        if len(out) >= p.max_tokens or len(prompt) + len(out) >= max_model_len:
            return out, "length"


class FakeModel:
    """Writes what each slot's K/V stand for and checks every read.  Without prefix caching a slot
    holds (req_id, position, token): a block handed to two requests shows up.  With it, blocks are
    shared on purpose, so a slot holds the whole token prefix up to its position (what real K/V
    depend on): a cached block matched by any other prefix shows up."""

    def __init__(self, sched: Scheduler, fn: TokenFn = default_fn) -> None:
        self.sched, self.fn = sched, fn
        self.kv: dict[int, tuple] = {}
        self.shared = sched.config.enable_prefix_caching

    def _content(self, r: Request, p: int, toks: list[int]) -> tuple:
        return tuple(toks[: p + 1]) if self.shared else (r.req_id, p, toks[p])

    def attend(self, s: ScheduledSeq, toks: list[int]) -> None:
        """One sequence's step: write the fed positions' K/V, then check every position it reads
        (`toks`: the tokens the model sees, known ones then any drafts)."""
        r, bm = s.request, self.sched.block_manager
        assert s.token_ids == toks[s.start : s.start + s.num_new_tokens]
        for p in range(s.start, s.start + s.num_new_tokens):
            # never written while someone else reads it: only the writer holds a block it fills
            assert bm.ref_count(r.block_ids[p // bm.block_size]) == 1, (r, p)
            self.kv[bm.slot(r, p)] = self._content(r, p, toks)
        for p in range(s.start + s.num_new_tokens):  # attention reads the whole prefix
            assert self.kv[bm.slot(r, p)] == self._content(r, p, toks), (r, p)

    def step(self, out: SchedulerOutput) -> dict[str, int]:
        cfg = self.sched.config
        assert out.num_tokens <= cfg.max_num_batched_tokens
        assert len({id(s.request) for s in out.seqs}) == len(out.seqs), "scheduled twice"
        assert not {id(r) for r in out.preempted} & {id(s.request) for s in out.seqs}
        sampled = {}
        for s in out.seqs:
            r = s.request
            assert s.num_new_tokens >= 1 and s.start == r.num_computed_tokens
            self.attend(s, r.all_token_ids)
            assert s.samples == (s.start + s.num_new_tokens == r.num_tokens)
            if s.samples:
                sampled[r.req_id] = self.fn(tuple(r.prompt_token_ids), r.num_tokens)
        return sampled


def run(
    sched: Scheduler,
    arrivals: dict[int, list[Request]] | None = None,
    fn: TokenFn = default_fn,
    aborts: dict[int, list[str]] | None = None,
    max_steps: int = 10_000,
    resets: frozenset[int] = frozenset(),
) -> list[SchedulerOutput]:
    """Drive to completion; arrivals/aborts happen before schedule() of the given step, and at
    the steps in `resets` the prefix cache is reset (after them: nothing cached, no block freed)."""
    arrivals, aborts = dict(arrivals or {}), dict(aborts or {})
    model, trace, step = FakeModel(sched, fn), [], 0
    while sched.has_unfinished() or any(k >= step for k in arrivals):
        assert step < max_steps, "no progress"
        for r in arrivals.get(step, []):
            sched.add_request(r)
        for rid in aborts.get(step, []):
            sched.abort_request(rid)
        if step in resets:
            bm = sched.block_manager
            free = bm.num_free_blocks
            bm.reset_prefix_cache()
            assert bm.cache is not None and bm.cache.num_cached == 0 and bm.num_free_blocks == free
            sched.check_invariants()
        out = sched.schedule()
        sampled = model.step(out)
        sched.update(out, sampled)
        sched.check_invariants()
        trace.append(out)
        step += 1
    assert sched.block_manager.num_free_blocks == sched.config.num_blocks
    return trace


def ids(out: SchedulerOutput) -> list[str]:
    return [s.request.req_id for s in out.seqs]
