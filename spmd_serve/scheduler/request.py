"""One generation request as the scheduler sees it: its tokens, its cache blocks, its lifecycle.

This module owns `RequestStatus` and `Request`.  A `Request` is mutable bookkeeping shared by the
scheduler (which advances `num_computed_tokens`, appends sampled tokens, sets the status) and the
block manager (which owns the contents of `block_ids`).  It holds no tensors: the K/V themselves
live on the workers, addressed through `block_ids`.
"""

from __future__ import annotations

import enum
from typing import Any

from spmd_serve.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = enum.auto()  # queued, owns no blocks
    RUNNING = enum.auto()  # admitted; owns blocks for its computed tokens (+ this step's)
    PREEMPTED = enum.auto()  # evicted under block pressure; back in waiting, will recompute
    FINISHED_STOPPED = enum.auto()  # sampled an eos id (after min_tokens)
    FINISHED_LENGTH = enum.auto()  # hit max_tokens or max_model_len
    FINISHED_ABORTED = enum.auto()  # cancelled by the client / front end

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI-style reason string for a finished status, None otherwise."""
        return _FINISH_REASON.get(self)


_FINISHED = frozenset({RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED})
_FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class Request:
    """Token history plus scheduling state of one sequence.

    The invariant the scheduler relies on: positions [0, num_computed_tokens) of `all_token_ids`
    have their K/V in the cache slots named by `block_ids`; the rest (at least the last sampled
    token while running) still has to be fed to the model.
    """

    def __init__(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        eos_token_ids: frozenset[int] = frozenset(),
        arrival_time: float = 0.0,
    ) -> None:
        self.req_id = req_id
        # Copy so a caller reusing its list cannot change what we have already scheduled.
        self.prompt_token_ids: list[int] = list(prompt_token_ids)
        self.params = params
        # The caller passes model eos ∪ params.eos_token_ids; frozenset for O(1) stop checks.
        self.eos_token_ids: frozenset[int] = frozenset(eos_token_ids)
        self.arrival_time = arrival_time
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.block_ids: list[int] = []
        # Prefix caching (owned by the BlockManager): the chained hashes of the leading full blocks
        # of all_token_ids computed so far (tokens only ever append, so they stay valid across
        # preemption), and how many leading block_ids are already offered to the cache.
        self.block_hashes: list[bytes] = []
        self.num_committed_blocks = 0
        # Prompt tokens whose K/V came from the prefix cache at the first admission (None before it).
        self.num_cached_tokens: int | None = None
        # Speculative decoding: the draft tokens a proposer offers for the next step (verified by
        # it, then cleared: they are never part of all_token_ids), and how many tokens the last
        # update appended (1 + accepted drafts; a frame may carry several).
        self.draft_token_ids: list[int] = []
        # params.json_schema: (its grammar, output tokens read, the parse state after them): engine/json_masks.py
        self.json_progress: tuple[Any, int, Any] | None = None
        # params.think_budget: (output tokens read, the think block's state after them): engine/think_budget.py
        self.think_progress: tuple[int, Any] | None = None
        self.num_new_tokens = 0
        # params.prompt_logprobs: the entries of prompt tokens 1, 2, ... computed so far (kept across a
        # preemption: a recomputed chunk does not score them again), and whether an output carried them
        self.prompt_logprobs: list[tuple[float, list[tuple[int, float]], int]] = []  # (outputs.PromptLogprobs)
        self.prompt_logprobs_sent = False
        self.status = RequestStatus.WAITING
        self.finish_reason: str | None = None
        self.num_preemptions = 0

    @property
    def all_token_ids(self) -> list[int]:
        # A fresh list each call: callers slice it to build model inputs and must not alias ours.
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_between(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] without building all of it (a decode step wants one token)."""
        n = len(self.prompt_token_ids)
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        if end <= n:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def finish(self, status: RequestStatus) -> None:
        """Enter a terminal status; the reason string is derived so the two never disagree."""
        if not status.is_finished:
            raise ValueError(f"{status} is not a finished status")
        self.status = status
        self.finish_reason = status.finish_reason

    def __repr__(self) -> str:
        return (
            f"Request({self.req_id!r}, status={self.status.name}, "
            f"prompt={self.num_prompt_tokens}, output={self.num_output_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_ids)})"
        )
