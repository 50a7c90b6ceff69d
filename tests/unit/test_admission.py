"""A request held to a grammar waits outside the scheduler while the grammar compiles on a helper
thread (engine/admission.py), in the real Engine loop with fake ranks: the other requests keep
stepping meanwhile, the grammar made goes with the request (compiled once), a grammar refused is a
400, and an abort, a drain and a stop each treat a held request as in flight; the masks' vocabulary
is made on the same helper thread, and a held request waits for it too."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from spmd_serve.engine import admission, json_masks
from spmd_serve.engine.client import VocabCommand
from spmd_serve.engine.engine import Engine
from spmd_serve.sampling_params import SamplingParams
from tests.support.engine_rig import Rig, engine_rig
from tests.support.metrics_scrape import Samples

EOS = 0
VOCAB = [b"", b"a", b"b"] + [b"z"] * 29  # ids 1, 2 spell the answers; FakeRunner favours 7 ("z")


@pytest.fixture
def rig() -> Iterator[Rig]:
    yield from engine_rig(0.005)


class Gate:
    """json_masks.grammar_of held until `open()`; counts the compiles asked for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.event, self.calls, real = threading.Event(), 0, json_masks.grammar_of

        def held(params: Any) -> Any:
            self.calls += 1
            assert self.event.wait(20), "the test never opened the gate"
            return real(params)

        monkeypatch.setattr(json_masks, "grammar_of", held)

    def open(self) -> None:
        self.event.set()


def regex(pattern: str) -> SamplingParams:
    return SamplingParams(max_tokens=8, min_tokens=0, temperature=0.0, regex=pattern, eos_token_ids=(EOS,))


def plain(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0)


def start_with_vocab(rig: Rig, vocab: list[bytes] = VOCAB, **kw: Any) -> Engine:
    start, client, _, _ = rig
    eng = start(**kw)
    with client._cv:  # (what provide_vocabulary queues, from token bytes given here)
        client._commands.append(VocabCommand(vocab))
    return eng


def output_tokens(eng: Engine, req_id: str) -> int:
    return sum(r.num_output_tokens for r in list(eng.scheduler.running) if r.req_id == req_id)


def wait_until(cond: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_compiling_grammar_holds_only_its_request(rig, monkeypatch):
    gate = Gate(monkeypatch)
    eng = start_with_vocab(rig)
    _, client, io, _ = rig
    io.call(client.add_request, "plain", [3, 4], plain(400))
    wait_until(lambda: output_tokens(eng, "plain") > 0)
    held_q = io.call(client.add_request, "json", [3], regex("ab"))
    wait_until(lambda: "json" in eng.admission.held)
    before = output_tokens(eng, "plain")
    wait_until(lambda: output_tokens(eng, "plain") >= before + 10)  # steps go on while it compiles
    assert all(r.req_id != "json" for r in [*eng.scheduler.running, *eng.scheduler.waiting])
    assert Samples.of(eng.metrics.registry).get("num_requests_waiting") == 1  # (it waits, as /metrics says)
    gate.open()
    outs = io.read_all(held_q)
    assert [t for o in outs for t in o.new_token_ids] == [1, 2, EOS] and outs[-1].finish_reason == "stop"
    assert gate.calls == 1  # the grammar made went with the request: the sampler did not make it again


def test_a_grammar_refused_by_its_compile_is_a_400(rig):
    eng = start_with_vocab(rig)
    _, client, io, _ = rig
    outs = io.read_all(io.call(client.add_request, "bad", [3], regex(r"(a)\1")))
    assert len(outs) == 1 and outs[0].error_code == 400 and "backreference" in outs[0].error_msg
    assert not eng.admission.held and not eng.scheduler.has_unfinished()


def test_an_abort_while_held_drops_the_request(rig, monkeypatch):
    gate = Gate(monkeypatch)
    eng = start_with_vocab(rig)
    _, client, io, _ = rig
    io.call(client.add_request, "json", [3], regex("ab"))
    wait_until(lambda: "json" in eng.admission.held)
    io.call(client.abort, "json")
    wait_until(lambda: "json" not in eng.admission.held)
    gate.open()
    time.sleep(0.05)  # the compile ends: nothing of the request comes back
    assert not eng.scheduler.has_unfinished() and not eng.admission.held
    queue = io.call(client.add_request, "json", [3], regex("ab"))  # its id is free again
    assert [t for o in io.read_all(queue) for t in o.new_token_ids] == [1, 2, EOS]


def test_a_drain_waits_for_a_held_request(rig, monkeypatch):
    gate = Gate(monkeypatch)
    eng = start_with_vocab(rig)
    _, client, io, _ = rig
    queue = io.call(client.add_request, "json", [3], regex("ab"))
    wait_until(lambda: "json" in eng.admission.held)
    client.draining.set(), eng.stop_event.set(), client.wake()
    time.sleep(0.1)
    assert "json" in eng.admission.held  # still waited for: the loop has not ended
    gate.open()
    outs = io.read_all(queue)
    assert [t for o in outs for t in o.new_token_ids] == [1, 2, EOS] and outs[-1].error_code == 0


def test_a_stop_past_the_drain_answers_a_held_request_503(rig, monkeypatch):
    gate = Gate(monkeypatch)
    eng = start_with_vocab(rig, drain_timeout_s=0.05)
    _, client, io, _ = rig
    queue = io.call(client.add_request, "json", [3], regex("ab"))
    wait_until(lambda: "json" in eng.admission.held)
    client.draining.set(), eng.stop_event.set(), client.wake()
    outs = io.read_all(queue)
    gate.open()
    assert len(outs) == 1 and outs[0].error_code == 503 and "drain timeout" in outs[0].error_msg


def test_the_vocabulary_is_made_on_the_helper_thread_before_a_held_request_goes_on(rig, monkeypatch):
    gate, made_on, real = threading.Event(), [], admission.JsonVocab

    def held_vocab(token_bytes: list[bytes]) -> Any:
        made_on.append(threading.current_thread().name)
        assert gate.wait(20), "the test never opened the gate"
        return real(token_bytes)

    monkeypatch.setattr(admission, "JsonVocab", held_vocab)
    eng = start_with_vocab(rig)
    _, client, io, _ = rig
    io.call(client.add_request, "plain", [3, 4], plain(400))
    queue = io.call(client.add_request, "json", [3], regex("ab"))
    wait_until(lambda: "json" in eng.admission.held and made_on)
    before = output_tokens(eng, "plain")
    wait_until(lambda: output_tokens(eng, "plain") >= before + 10)  # (the engine thread steps on)
    assert "json" in eng.admission.held and eng.sampler.json_vocab is None  # (it waits for the vocabulary)
    gate.set()
    assert [t for o in io.read_all(queue) for t in o.new_token_ids] == [1, 2, EOS]
    assert made_on and made_on[0].startswith("spmd-grammar")


def test_a_thinking_budget_waits_for_the_vocabulary_and_closes_the_block_in_its_pieces(rig, monkeypatch):
    """Its tags are read off the tokens' bytes (ids 3-5 spell `</think>`): admitted before the vocabulary
    is made, it would count its first tokens blind."""
    gate, real = threading.Event(), admission.JsonVocab
    monkeypatch.setattr(admission, "JsonVocab", lambda token_bytes: gate.wait(20) and real(token_bytes))
    eng = start_with_vocab(rig, [b"", b"a", b"</think>", b"</", b"think", b">"] + [b"z"] * 26)
    _, client, io, _ = rig
    params = SamplingParams(max_tokens=8, min_tokens=8, temperature=0.0, think_budget=2, think_inside=True)
    params = dataclasses.replace(params, think_open=(1,), think_close=(3, 4, 5))
    io.call(client.add_request, "plain", [3, 4], plain(400))
    queue = io.call(client.add_request, "thinks", [3], params)
    wait_until(lambda: "thinks" in eng.admission.held)
    before = output_tokens(eng, "plain")
    wait_until(lambda: output_tokens(eng, "plain") >= before + 10)  # (the engine thread steps on)
    assert "thinks" in eng.admission.held and eng.sampler.json_vocab is None
    gate.set()
    assert [t for o in io.read_all(queue) for t in o.new_token_ids] == [7, 7, 3, 4, 5, 7, 7, 7]
    # a close tag of one token (its bytes whole): forced at once
    forced = dataclasses.replace(params, think_close=(2,), think_budget=3)
    assert [t for o in io.read_all(io.call(client.add_request, "early", [3], forced)) for t in o.new_token_ids][3] == 2


def test_a_vocabulary_that_fails_fails_the_held_requests_only(rig, monkeypatch):
    def broken(token_bytes: list[bytes]) -> Any:
        raise MemoryError("no room")

    monkeypatch.setattr(admission, "JsonVocab", broken)
    start_with_vocab(rig)
    _, client, io, _ = rig
    outs = io.read_all(io.call(client.add_request, "json", [3], regex("ab")))
    assert len(outs) == 1 and outs[0].error_code == 500 and "no room" in outs[0].error_msg
    assert len(io.read_all(io.call(client.add_request, "plain", [3], plain(3)))) == 3  # the engine serves on
