"""Rank 0's admission of new requests (`Engine._apply_commands`): a command's parameters validated
once more, its `Request` made (the seed fixed, the EOS ids joined) and handed to the scheduler, or
refused with the error output its client gets (400, 429).

A request held to a grammar (a JSON schema, a guided_regex) waits here, outside the scheduler, until
its grammar is compiled on a helper thread.  A compile takes up to a few hundred ms (a schema of
dozens of properties: thousands of states), and made at the request's first sampling, on the engine
thread, it stalled every other stream that long (benchmarks/grammar_stall.py).  The helper thread
shares the GIL with the engine thread, which so loses a switch interval (5 ms) now and then instead
of the whole compile at once.  The grammar made goes with the request (`json_progress`), so its
first sampling finds it whatever the grammar caches dropped meanwhile.  The masks' vocabulary (every
token's bytes, sent once ahead of the first such request) is arranged on the same thread; a request
with a thinking budget (engine/think_budget.py, which reads the tags off those bytes) waits for it too.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from spmd_serve.engine import json_masks
from spmd_serve.engine.client import AddCommand
from spmd_serve.engine.grammar_table import Grammar
from spmd_serve.engine.json_masks import JsonVocab
from spmd_serve.engine.outputs import RequestOutput
from spmd_serve.engine.sampler import eos_masking
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request, RequestStatus
from spmd_serve.scheduler.scheduler import QueueFullError, Scheduler

log = logging.getLogger("spmd_serve.engine")
T = TypeVar("T")
HELD_WAIT_S = 0.005  # the engine's longest idle wait while a grammar compiles (its end also wakes it)


class Admission:
    """New requests into `scheduler`, each held first while its grammar compiles; `wake` is called
    (from the helper thread) when one is made, to end the engine's idle wait."""

    def __init__(self, scheduler: Scheduler, eos_token_ids: frozenset[int], wake: Callable[[], None]) -> None:
        self.scheduler, self.eos, self._wake = scheduler, eos_token_ids, wake
        self.held: dict[str, tuple[Request, Future[Grammar | None]]] = {}  # in arrival order (None: no grammar)
        self._pool: ThreadPoolExecutor | None = None  # (made with the first grammar)
        self._vocab: Future[JsonVocab] | None = None  # the masks' vocabulary, made on the same thread

    def admit(self, cmd: AddCommand) -> RequestOutput | None:
        """Take one new request: None, or the error output that refuses it."""
        params = cmd.params
        try:  # whatever sent it: a request that passed cannot overflow the sampler's arrays
            params.validate()
        except ValueError as e:
            return RequestOutput.error(cmd.req_id, 400, str(e))
        if params.seed is None:  # fix the seed at admission so preemption/recompute can't change tokens
            params = dataclasses.replace(params, seed=random.getrandbits(63))
        eos = self.eos | frozenset(params.eos_token_ids) | frozenset(params.stop_token_ids)
        req = Request(cmd.req_id, cmd.prompt_token_ids, params, eos_token_ids=eos, arrival_time=cmd.arrival_time)
        min_tokens, masked = eos_masking(req)
        if min_tokens > 0 and params.allowed_token_ids and set(params.allowed_token_ids) <= set(masked):
            msg = f"allowed_token_ids are all EOS or stop ids, which are masked until min_tokens({min_tokens})"
            return RequestOutput.error(cmd.req_id, 400, msg)
        if not params.needs_vocabulary:
            return self._schedule(req)
        # (a thinking budget reads its tags off the vocabulary's bytes: held for it too, with no grammar to make)
        make: Callable[[SamplingParams], Grammar | None] = json_masks.grammar_of if params.grammar else _no_grammar
        self.held[req.req_id] = (req, self._submit(make, params))
        return None

    def read_vocabulary(self, token_bytes: list[bytes]) -> None:
        """Arrange every token's bytes for the masks (json_masks.JsonVocab: ~0.1 s at 150k tokens) on
        the helper thread; the first of them counts (each HTTP worker sends the same)."""
        if self._vocab is None:
            self._vocab = self._submit(JsonVocab, token_bytes)

    def vocabulary(self) -> JsonVocab | None:
        """The masks' vocabulary once made (None before, or if making it failed)."""
        if self._vocab is None or not self._vocab.done() or self._vocab.exception() is not None:
            return None
        return self._vocab.result()

    def _submit(self, fn: Callable[..., T], *args: object) -> Future[T]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="spmd-grammar")
        future = self._pool.submit(fn, *args)
        future.add_done_callback(lambda _: self._wake())
        return future

    def release(self) -> list[RequestOutput]:
        """Hand every held request whose grammar is made to the scheduler (one made sooner may pass
        one still compiling); the error outputs of those refused."""
        errors: list[RequestOutput] = []
        for req_id, (req, future) in list(self.held.items()):
            if not future.done() or self._vocab is not None and not self._vocab.done():
                continue  # (its masks need the vocabulary too, sent ahead of it)
            del self.held[req_id]
            try:
                if self._vocab is not None and self._vocab.exception() is not None:
                    raise RuntimeError(f"the vocabulary failed: {self._vocab.exception()!r}")
                grammar = future.result()
            except (ValueError, RecursionError) as e:  # (the front end compiled it too: another sender's)
                errors.append(RequestOutput.error(req_id, 400, str(e) or type(e).__name__))
                continue
            except Exception as e:  # a bug in a compile fails its request only
                log.exception("request %s: its grammar or the vocabulary failed", req_id)
                errors.append(RequestOutput.error(req_id, 500, f"grammar compile failed: {e}"))
                continue
            if grammar is not None:
                req.json_progress = (grammar, 0, grammar.start)
            if (err := self._schedule(req)) is not None:
                errors.append(err)
        return errors

    def _schedule(self, req: Request) -> RequestOutput | None:
        try:
            self.scheduler.add_request(req)
        except QueueFullError as e:
            return RequestOutput.error(req.req_id, 429, str(e))
        except ValueError as e:
            return RequestOutput.error(req.req_id, 400, str(e))
        return None

    def abort(self, req_id: str) -> Request | None:
        """Cancel a request, held or scheduled; None if it is unknown or already finished."""
        held = self.held.pop(req_id, None)
        if held is None:
            return self.scheduler.abort_request(req_id)
        held[1].cancel()  # (a compile already begun runs on: its result goes to the cache)
        held[0].finish(RequestStatus.FINISHED_ABORTED)
        return held[0]

    def in_flight(self) -> list[Request]:
        """Every unfinished request: running, waiting, then held."""
        return [*self.scheduler.running, *self.scheduler.waiting, *(req for req, _ in self.held.values())]

    def close(self) -> None:
        """Stop the helper thread (a compile under way is left to end alone)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _no_grammar(params: SamplingParams) -> None:
    """A request held for the vocabulary alone (a thinking budget's) has no grammar to make."""
