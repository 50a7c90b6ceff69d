"""An operator's commands in the real Engine loop with fake ranks (engine/control.py): an abort by id
or of every request ends each with finish_reason "abort" and its tokens so far while the others go
on; a prefix-cache reset makes a repeated prompt find nothing, also while requests run; an unknown
operation or bad arguments are answered with an error and the engine goes on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from spmd_serve.engine.client import NotReadyError
from spmd_serve.engine.engine import Engine
from spmd_serve.sampling_params import SamplingParams
from tests.support.engine_rig import Rig, engine_rig

PROMPT = list(range(10, 30))  # five blocks of 4: four can be found again (never the last token's)


@pytest.fixture
def rig() -> Iterator[Rig]:
    yield from engine_rig(0.002, enable_prefix_caching=True)


def control(rig: Rig, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    _, client, io, _ = rig
    return asyncio.run_coroutine_threadsafe(client.control(op, args or {}, timeout=10), io.loop).result(15)


def add(rig: Rig, req_id: str, max_tokens: int, prompt: list[int] = PROMPT) -> asyncio.Queue:
    _, client, io, _ = rig
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return io.call(client.add_request, req_id, prompt, params)


def first_output(rig: Rig, stream: asyncio.Queue) -> Any:
    return asyncio.run_coroutine_threadsafe(asyncio.wait_for(stream.get(), 10), rig[2].loop).result(15)


def test_an_abort_ends_the_named_request_with_its_tokens_and_the_others_go_on(rig):
    start, client, io, _ = rig
    eng: Engine = start()
    long, other = add(rig, "long", 1000), add(rig, "other", 30, [5, 6, 7])
    assert first_output(rig, long).new_token_ids  # it is running
    assert control(rig, "abort", {"req_ids": ["long", "gone"], "why": "aborted by the test"}) == {"aborted": ["long"]}
    outs = io.read_all(long)
    last = outs[-1]
    assert (last.finished, last.finish_reason, last.error_msg, last.new_token_ids) == (
        True, "abort", "aborted by the test", []
    )  # fmt: skip
    assert last.num_prompt_tokens == len(PROMPT) and len(outs) < 999
    rest = io.read_all(other)
    assert rest[-1].finish_reason == "length" and sum(len(o.new_token_ids) for o in rest) == 30
    assert eng.scheduler.block_manager.num_free_blocks == eng.scheduler.block_manager.num_blocks
    assert control(rig, "abort", {"req_ids": ["long"], "why": "again"}) == {"aborted": []}  # (ended already)
    assert client.num_in_flight == 0


def test_abort_all_ends_every_request(rig):
    start, _, io, _ = rig
    start()
    streams = {f"r{i}": add(rig, f"r{i}", 1000, [i + 3]) for i in range(3)}
    for s in streams.values():
        first_output(rig, s)
    answer = control(rig, "abort", {"all": True, "why": "everyone"})
    assert sorted(answer["aborted"]) == sorted(streams)
    for s in streams.values():
        assert io.read_all(s)[-1].finish_reason == "abort"


def cached_tokens(rig: Rig, req_id: str, max_tokens: int = 2) -> int:
    outs = rig[2].read_all(add(rig, req_id, max_tokens))
    return outs[0].num_cached_tokens


def test_a_reset_forgets_the_cached_prefixes_also_while_a_request_runs(rig):
    start = rig[0]
    start()
    assert cached_tokens(rig, "a") == 0
    assert cached_tokens(rig, "b") == 16  # four full blocks found again
    running = add(rig, "running", 1000)  # holds the cached blocks while the cache is reset
    first_output(rig, running)
    answer = control(rig, "reset_prefix_cache")
    assert answer["enabled"] and answer["in_use_blocks"] == 4 and answer["freed_blocks"] >= 1
    assert cached_tokens(rig, "c") == 0  # nothing found: computed anew (and cached again)
    assert cached_tokens(rig, "d") == 16
    assert control(rig, "abort", {"req_ids": ["running"], "why": "done"}) == {"aborted": ["running"]}


def test_an_unknown_operation_or_bad_arguments_are_answered_with_an_error(rig):
    start, _, io, _ = rig
    start()
    assert "unknown control operation 'sleep'" in control(rig, "sleep")["error"]
    assert "malformed abort arguments" in control(rig, "abort", {"why": "no ids"})["error"]
    assert io.read_all(add(rig, "after", 3))[-1].finish_reason == "length"  # the engine went on


def test_a_client_not_ready_refuses_a_control(rig):
    _, client, io, _ = rig
    client.ready.clear()
    with pytest.raises(NotReadyError):
        control(rig, "reset_prefix_cache")
