"""Test doubles for the IO side: a fake engine thread and a character-level fake tokenizer.

FakeEngine plays the engine side of a real EngineClient: it takes commands, "generates" one token per step (or
`tokens_per_step`, as a speculative engine does) by cycling through the prompt (BOS skipped), honours max/min
tokens and eos ids, and records every abort so tests can assert the IO side stopped the work.  FakeTokenizer
(tests/support/fake_tokenizer.py, re-exported) has one id per character.  Harness runs an IOServer + FakeEngine
on free ports; the helpers at the end talk to it.  FakeComm and FakeRunner stand in for the other ranks under
the real Engine loop.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import requests

from spmd_serve.engine.client import AbortCommand, AddCommand, ControlCommand, EngineClient, RequestOutput, VocabCommand
from tests.support.fake_tokenizer import BOS, EOS, OFFSET, FakeDetokenizer, FakeTokenizer  # noqa: F401 (re-exported)


# ---- the other ranks, for the real Engine loop ------------------------------------------------
class FakeComm:
    """Records the plans rank 0 broadcasts."""

    def __init__(self) -> None:
        self.plans: list = []

    def send_plan(self, plan) -> None:
        self.plans.append(plan)


class FakeRunner:
    """Logits favouring token 7 for every scheduled sequence; a step takes `step_s`."""

    timings = None  # no split of the execute phase

    def __init__(self, vocab: int = 32, step_s: float = 0.002) -> None:
        self.vocab, self.step_s = vocab, step_s

    def take_stats(self) -> dict:
        return {}  # a dense model: no per-step statistics

    def execute(self, plan) -> np.ndarray:
        time.sleep(self.step_s)
        logits = np.zeros((plan.num_seqs, self.vocab), np.float32)
        logits[:, 7] = 1.0
        return logits


@dataclass
class _Seq:
    cmd: AddCommand
    out: list[int] = field(default_factory=list)
    cached: int = 0  # prompt tokens "found" in the fake prefix cache


FAKE_CACHE_BLOCK = 4


def fake_cached_tokens(prompt: list[int], earlier: list[list[int]]) -> int:
    """The real engine's rule on whole earlier prompts: the longest common prefix, in full blocks of
    FAKE_CACHE_BLOCK, never the last token."""
    common = max((len(os.path.commonprefix([prompt, e])) for e in earlier), default=0)
    return min(common, len(prompt) - 1) // FAKE_CACHE_BLOCK * FAKE_CACHE_BLOCK


class FakeEngine:
    """Engine side of an EngineClient, one fake token per sequence every `step_s` seconds."""

    def __init__(self, client: EngineClient, step_s: float = 0.002) -> None:
        self.client = client
        self.step_s = step_s
        self.aborted: list[str] = []
        self.added: list[AddCommand] = []
        self.vocabs: list[tuple[int, list[bytes]]] = []  # (adds taken before it, the tokens' bytes)
        self.fail_after: dict[str, int] = {}  # req_id -> fail with error after this many tokens
        self.prefix_cache = False  # report cached prompt tokens as the real engine would
        self.tokens_per_step = 1  # > 1: a speculative engine's steps (several accepted tokens at once)
        self.controls: list[ControlCommand] = []  # an operator's commands, answered as the real engine does
        self._cache_from = 0  # the fake prefix cache holds the prompts of `added` from here (a reset moves it)
        self.paused = threading.Event()  # no steps and no heartbeat while set (`pause()` waits for it)
        self._paused_seen = threading.Event()
        self._stop = threading.Event()
        self._running: dict[str, _Seq] = {}
        self._thread = threading.Thread(target=self._run, name="fake-engine", daemon=True)

    def start(self, ready: bool = True) -> FakeEngine:
        self._thread.start()
        if ready:
            self.client.ready.set()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self.client.wake()
        self._thread.join(timeout)

    def pause(self, timeout: float = 10.0) -> None:
        """No more steps, commands taken or heartbeats: returns once the engine thread has seen the
        pause at the top of its loop (a step it was in, or commands it was taking, are done)."""
        self._paused_seen.clear()
        self.paused.set()
        assert self._paused_seen.wait(timeout), "the fake engine did not pause"

    def wait_aborted(self, req_id: str, timeout: float = 1.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if req_id in self.aborted:
                return True
            time.sleep(0.01)
        return req_id in self.aborted

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.paused.is_set():
                self._paused_seen.set()
                time.sleep(self.step_s)
                continue
            self.client.heartbeat = time.monotonic()
            if self._running:
                time.sleep(self.step_s)
            else:
                self.client.wait_for_work(0.05)
            for cmd in self.client.take_commands():
                if isinstance(cmd, AbortCommand):
                    self.aborted.append(cmd.req_id)
                    self._running.pop(cmd.req_id, None)
                elif isinstance(cmd, VocabCommand):  # (the fake masks no JSON answer: kept for the tests)
                    self.vocabs.append((len(self.added), cmd.token_bytes))
                elif isinstance(cmd, ControlCommand):
                    self._control(cmd)
                else:
                    earlier = [c.prompt_token_ids for c in self.added[self._cache_from :]] if self.prefix_cache else []
                    cached = fake_cached_tokens(cmd.prompt_token_ids, earlier)
                    self.added.append(cmd)
                    self._running[cmd.req_id] = _Seq(cmd, cached=cached)
            self.client.busy_since = time.monotonic()
            outputs = [self._step(seq) for seq in list(self._running.values())]
            self.client.busy_since = None
            self.client.publish(outputs)

    def _control(self, cmd: ControlCommand) -> None:
        """engine/control.py's operations on the fake's state."""
        self.controls.append(cmd)
        if cmd.op == "reset_prefix_cache":
            self._cache_from = len(self.added)
            return cmd.reply({"enabled": self.prefix_cache, "freed_blocks": 0, "in_use_blocks": 0})
        ids = list(self._running) if cmd.args.get("all") else [i for i in cmd.args["req_ids"] if i in self._running]
        seqs = [self._running.pop(i) for i in ids]
        self.client.publish([RequestOutput(s.cmd.req_id, [], True, "abort", 0, cmd.args["why"],
                                           len(s.cmd.prompt_token_ids)) for s in seqs])  # fmt: skip
        cmd.reply({"aborted": ids})

    def _step(self, seq: _Seq) -> RequestOutput:
        rid, params = seq.cmd.req_id, seq.cmd.params
        prompt = [i for i in seq.cmd.prompt_token_ids if i != BOS] or [OFFSET]
        if len(seq.out) >= self.fail_after.get(rid, 1 << 30):
            self._running.pop(rid)
            return RequestOutput(rid, [], True, "error", 500, "fake engine failure", len(seq.cmd.prompt_token_ids))
        eos = set(params.eos_token_ids) | set(params.stop_token_ids) | {EOS}
        new: list[int] = []
        reason = None
        while reason is None and len(new) < self.tokens_per_step:
            tok = prompt[len(seq.out) % len(prompt)]
            seq.out.append(tok)
            new.append(tok)
            if tok in eos and len(seq.out) >= params.min_tokens:
                reason = "stop"
            elif len(seq.out) >= params.max_tokens:
                reason = "length"
        if reason:
            self._running.pop(rid)
        # fake logprobs: the chosen token at -0.5, then ids counting down from it
        lps = (
            None
            if params.logprobs is None
            else [(-0.5, [(t - k, -0.5 - k) for k in range(params.logprobs)]) for t in new]
        )
        return RequestOutput(
            rid,
            new,
            reason is not None,
            reason,
            num_prompt_tokens=len(seq.cmd.prompt_token_ids),
            num_cached_tokens=seq.cached,
            logprobs=lps,
        )


class Harness:
    """A running IOServer + FakeEngine on free loopback ports, with URLs for requests."""

    def __init__(self, capacity: int = 16, step_s: float = 0.002, ready: bool = True, **settings) -> None:
        from spmd_serve.frontend.server.app import IOServer  # tornado only where a server is wanted

        self.client = EngineClient(capacity)
        self.tokenizer = FakeTokenizer()
        self.engine = FakeEngine(self.client, step_s)
        settings = {
            "host": "127.0.0.1",
            "http_port": 0,
            "health_port": 0,
            "max_seq_len": 256,
            "max_dec_len": 64,
            "model_max_len": 300,
            **settings,
        }
        self.server = IOServer(self.client, self.tokenizer, **settings)
        self.engine.start(ready)
        try:
            self.server.start(timeout=5)
        except BaseException:
            self.engine.stop()
            raise
        self.base = f"http://127.0.0.1:{self.server.http_port}"
        self.health = f"http://127.0.0.1:{self.server.health_port}"
        self.url = self.base + "/v1/chat/completions"

    def close(self) -> None:
        try:
            self.server.stop(timeout=5)
        finally:
            self.engine.stop()


# ---- request helpers shared by the HTTP tests ------------------------------------------------
def echo(prompt_ids: list[int], n: int) -> str:
    """What FakeEngine generates: the prompt (minus BOS) cycled, n tokens."""
    body = [i for i in prompt_ids if i >= OFFSET]
    return FakeTokenizer().decode([body[k % len(body)] for k in range(n)])


def stream_lines(url: str, data: dict, **kw) -> list[dict]:
    res = requests.post(url, json=data, stream=True, timeout=10, **kw)  # as the docs do it
    assert res.status_code == 200, res.text
    assert res.headers["Content-Type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in res.iter_lines()]


def wait_idle(h: Harness, timeout: float = 2.0) -> bool:
    """True once the IO side has no request in flight (all finished or aborted)."""
    end = time.monotonic() + timeout
    while h.client.num_in_flight and time.monotonic() < end:
        time.sleep(0.01)
    return h.client.num_in_flight == 0


def assert_healthy(h: Harness) -> None:
    r = requests.post(h.url, json={"text": "ok", "max_dec_len": 3}, timeout=10)
    assert r.status_code == 200 and r.json()["tokens_all_num"] == 3
    assert h.client.num_in_flight == 0


def check_stream(frames: list[dict], req_id: str) -> dict:
    assert all(f["req_id"] == req_id for f in frames)
    assert [f["send_idx"] for f in frames] == list(range(len(frames)))
    assert [f["is_end"] for f in frames] == [0] * (len(frames) - 1) + [1]
    last = frames[-1]
    assert "".join(f["token"] for f in frames) == last["tokens_all"]
    assert sum((f["token_ids"] for f in frames), []) == last["tokens_all_ids"]
    assert last["tokens_all_num"] == len(last["tokens_all_ids"])
    assert last["error_code"] == 0 and last["error_msg"] == ""
    return last
