"""Continuous-batching scheduler: who runs this step, on how many tokens, and when they stop.

This module owns `SchedulerConfig`, `ScheduledSeq`, `SchedulerOutput`, `Scheduler` and
`QueueFullError`.  It follows the vLLM-v1 scheme: every request carries `num_computed_tokens`, and
each step hands it `num_tokens - num_computed_tokens` more tokens (capped by a per-step budget).
That single rule covers prefill, chunked prefill, decode (one token: the last sampled one) and
recompute after preemption, so there is no separate prefill/decode phase to keep in sync.

Prefix caching (`enable_prefix_caching`): a request's admission starts after the longest prefix
whose full blocks are cached (its own, after a preemption, or another request's); the rest is the
same rule.  For the admission watermark (`BLOCK_RATIO`) a cached block nobody uses counts as free
(the pool can take it back at any time), and taking one on a hit counts as using a new block.

Speculative decoding (scheduler/speculation.py): a decode also feeds its draft tokens, within the
budget; a step's drafts never preempt anyone (they are dropped first when the pool is short).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from spmd_serve.scheduler.block_manager import BlockManager
from spmd_serve.scheduler.request import Request, RequestStatus
from spmd_serve.scheduler.speculation import apply_verdict, num_drafts_to_verify


class QueueFullError(Exception):
    """The waiting queue already holds `max_waiting` requests (the front end answers 429)."""


@dataclass
class SchedulerConfig:
    max_num_seqs: int  # BATCH_SIZE: most sequences running at once
    num_blocks: int  # KV-cache blocks in the pool
    block_size: int  # token slots per block
    block_ratio: float  # BLOCK_RATIO: admit only while used blocks stay under this share
    max_waiting: int  # MAX_CACHED_TASK_NUM: waiting-queue capacity
    max_num_batched_tokens: int  # tokens fed to the model per step; prefill is chunked to fit
    max_model_len: int  # prompt + generated tokens never exceed this
    enable_prefix_caching: bool = False  # ENABLE_PREFIX_CACHING: share full blocks of equal prefixes
    cache_salt: str = ""  # what else decides a block's K/V (model, KV format): part of every block hash

    def __post_init__(self) -> None:
        for name in (
            "max_num_seqs",
            "num_blocks",
            "block_size",
            "max_waiting",
            "max_num_batched_tokens",
            "max_model_len",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not self.block_ratio > 0:
            raise ValueError(f"block_ratio must be > 0, got {self.block_ratio!r}")


@dataclass
class ScheduledSeq:
    request: Request
    start: int  # num_computed_tokens before this step = position of the first new token
    num_new_tokens: int  # fed to the model this step, the drafts included
    samples: bool  # chunk reaches the end of the known tokens, so one token is sampled
    num_draft: int = 0  # speculative: the request's draft tokens verified this step (they follow the known ones)

    @property
    def token_ids(self) -> list[int]:
        """The tokens to feed the model for this chunk: known tokens, then the drafts."""
        known = self.request.token_ids_between(self.start, self.start + self.num_new_tokens - self.num_draft)
        return known + self.request.draft_token_ids[: self.num_draft]


@dataclass
class SchedulerOutput:
    seqs: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)  # evicted this step; caches are stale
    # Prefix caching, over this step's admissions: tokens looked up and tokens found cached.
    prefix_queries: int = 0
    prefix_hits: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.seqs)


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.block_manager = BlockManager(
            config.num_blocks, config.block_size, config.enable_prefix_caching, config.cache_salt
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the tail is preempted first
        self._live: dict[str, Request] = {}  # req_id -> unfinished request, for abort and dedup

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add_request(self, request: Request) -> None:
        """Queue a request; reject it now if it could never complete, or if the queue is full."""
        cfg = self.config
        # Checked first: a request that can never run is the client's error whatever the load.
        total = request.num_prompt_tokens + request.params.max_tokens
        if request.num_prompt_tokens < 1:
            raise ValueError(f"request {request.req_id!r} has an empty prompt")
        if total > cfg.max_model_len:
            raise ValueError(
                f"prompt({request.num_prompt_tokens}) + max_dec_len({request.params.max_tokens})"
                f" = {total} tokens exceeds max_model_len({cfg.max_model_len})"
            )
        need = self.block_manager.blocks_for(total)
        if need > cfg.num_blocks:
            # Admitting it could deadlock: even alone in the pool it would preempt itself forever.
            raise ValueError(
                f"prompt({request.num_prompt_tokens}) + max_dec_len({request.params.max_tokens})"
                f" = {total} tokens needs {need} blocks of {cfg.block_size}, more than the "
                f"whole pool of {cfg.num_blocks}"
            )
        if request.req_id in self._live:
            raise ValueError(f"request {request.req_id!r} is already queued or running")
        if len(self.waiting) >= cfg.max_waiting:
            raise QueueFullError(f"waiting queue is full ({len(self.waiting)} >= max_waiting {cfg.max_waiting})")
        request.status = RequestStatus.WAITING
        self.waiting.append(request)
        self._live[request.req_id] = request

    def abort_request(self, req_id: str) -> Request | None:
        """Cancel an unfinished request; None if it is unknown or already finished."""
        request = self._live.pop(req_id, None)
        if request is None:
            return None
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self.block_manager.free(request)
        request.finish(RequestStatus.FINISHED_ABORTED)
        return request

    def _preempt(self, request: Request) -> None:
        # Recompute preemption: drop the K/V, keep the tokens; re-admission replays them all.
        self.block_manager.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.draft_token_ids.clear()
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def schedule(self) -> SchedulerOutput:
        cfg, bm = self.config, self.block_manager
        out = SchedulerOutput()
        budget = cfg.max_num_batched_tokens

        # 1) Running requests first, oldest first, so admitted work keeps making progress.
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            d = num_drafts_to_verify(request, n, budget - n, cfg.max_model_len)
            while not bm.allocate(request, request.num_computed_tokens + n + d):
                if d:  # speculation never preempts anyone: without the drafts first
                    d = 0
                    request.draft_token_ids.clear()
                    continue
                # Evict the youngest: it has the least sunk work.  It sits after index i, so it
                # has not been scheduled this step; if it is `request` itself the loop ends.
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    break
            else:
                out.seqs.append(self._seq(request, n, d))
                budget -= n + d
                i += 1
        # Each victim went to the front of waiting youngest-first, so the oldest ends up first.

        # 2) Admit from the front of waiting.  Skipped after a preemption: the pool just proved
        #    too small, and re-admitting a victim in the same step would only thrash.
        limit = cfg.block_ratio * cfg.num_blocks
        while not out.preempted and self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            request = self.waiting[0]
            request.draft_token_ids.clear()  # drafts only for requests that decode
            cached = bm.match_prefix(request)  # waiting requests own no blocks and computed nothing
            computed = len(cached) * cfg.block_size
            n = min(request.num_tokens - computed, budget)
            # blocks this admission turns from free to used: new ones and free cached ones it hits
            taken = bm.blocks_for(computed + n) - len(cached) + bm.num_reclaimed(cached)
            # Watermark leaves room for running sequences to grow; waived when nothing runs so
            # a small block_ratio can never stall the server.
            if self.running and bm.num_used_blocks + taken > limit:
                break
            if not bm.allocate(request, computed + n, cached):
                break  # strict FCFS: never let a smaller request overtake the head
            self.waiting.popleft()
            request.num_computed_tokens = computed
            if request.num_cached_tokens is None:  # the first admission's hit is what usage reports
                request.num_cached_tokens = computed
            if bm.cache is not None:
                out.prefix_queries += request.num_tokens
                out.prefix_hits += computed
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.seqs.append(self._seq(request, n))
            budget -= n
        return out

    @staticmethod
    def _seq(request: Request, n: int, d: int = 0) -> ScheduledSeq:
        start = request.num_computed_tokens
        return ScheduledSeq(request, start, n + d, samples=start + n == request.num_tokens, num_draft=d)

    def update(self, out: SchedulerOutput, sampled: Mapping[str, int | Sequence[int]]) -> list[Request]:
        """Apply one step's results; return the requests that got tokens (finished included).

        `sampled`: per sampling request its token, or for a speculative one its tokens: the
        accepted drafts then the target's own token.  Rejected drafts are rolled back: their K/V
        slots count as not computed and the blocks only they reached are freed, so the request
        holds exactly what one-token-at-a-time decoding would have left it."""
        got_token: list[Request] = []
        finished: set[int] = set()
        for seq in out.seqs:
            request = seq.request
            if request.is_finished:
                continue  # aborted between schedule() and update(); its blocks are already gone
            request.num_computed_tokens += seq.num_new_tokens - seq.num_draft
            tokens: Sequence[int] = ()
            if seq.samples:
                if request.req_id not in sampled:
                    raise KeyError(f"no sampled token for {request.req_id!r}, which sampled this step")
                got = sampled[request.req_id]
                tokens = [got] if isinstance(got, int) else got
                apply_verdict(self.block_manager, request, seq.num_draft, tokens)
            status: RequestStatus | None = None
            request.num_new_tokens = 0
            for token in tokens:
                request.output_token_ids.append(token)
                request.num_new_tokens += 1
                status = self._stop_status(request, token)
                if status is not None:  # the tokens after a stop are dropped, as if never sampled
                    break
            # (a stop inside the accepted drafts leaves K/V computed past the kept tokens)
            request.num_computed_tokens = min(request.num_computed_tokens, request.num_tokens)
            self.block_manager.commit(request)  # its blocks completed this step become shareable
            if not tokens:
                continue
            got_token.append(request)
            if status is not None:
                request.finish(status)
                self.block_manager.free(request)
                del self._live[request.req_id]
                finished.add(id(request))
        if finished:
            self.running = [r for r in self.running if id(r) not in finished]
        return got_token

    def _stop_status(self, request: Request, token: int) -> RequestStatus | None:
        params = request.params
        # Stop before length: an eos that is also the last allowed token reports "stop".  ignore_eos
        # ignores the eos ids, not the stop_token_ids a request asked for (vLLM's rule).
        if (
            token in request.eos_token_ids
            and (not params.ignore_eos or token in params.stop_token_ids)
            and request.num_output_tokens >= params.min_tokens
        ):
            return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= params.max_tokens or request.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def check_invariants(self) -> None:
        """Test hook: block ownership is consistent and every queue holds what its name says."""
        assert len(self.running) <= self.config.max_num_seqs
        assert all(r.status is RequestStatus.RUNNING for r in self.running)
        assert all(
            r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            and not r.block_ids
            and r.num_computed_tokens == 0
            for r in self.waiting
        )
        assert len(self._live) == len(self.running) + len(self.waiting)
        self.block_manager.check_invariants([*self.running, *self.waiting])
