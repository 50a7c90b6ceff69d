"""EngineClient: a req_id reused right after an abort never receives the aborted request's
outputs that were still on their way from the engine thread."""

import asyncio

from spmd_serve.engine.client import AbortCommand, AddCommand, EngineClient, RequestOutput
from spmd_serve.sampling_params import SamplingParams


def test_reused_req_id_gets_only_its_own_outputs():
    async def scenario() -> None:
        client = EngineClient(capacity=4)
        client.ready.set()
        client.attach_loop(asyncio.get_running_loop())
        params = SamplingParams(max_tokens=8)
        old = client.add_request("x", [1, 2], params)
        assert [type(c) for c in client.take_commands()] == [AddCommand]  # engine: epoch 1
        client.publish([RequestOutput("x", [10])])
        await asyncio.sleep(0)
        assert old.get_nowait().new_token_ids == [10]
        client.publish([RequestOutput("x", [11])])  # computed before the engine saw the abort
        client.abort("x")  # ... which the IO side sends meanwhile,
        new = client.add_request("x", [3, 4], params)  # and the client reuses the id at once
        await asyncio.sleep(0)  # the stale output arrives now: dropped
        client.publish([RequestOutput("x", [12])])  # still the old sequence's (same epoch)
        await asyncio.sleep(0)
        assert new.empty() and old.empty()
        cmds = client.take_commands()  # engine: epoch 2, abort then add
        assert [type(c) for c in cmds] == [AbortCommand, AddCommand]
        client.publish([RequestOutput("x", [20], True, "length")])
        await asyncio.sleep(0)
        assert new.get_nowait().new_token_ids == [20] and client.num_in_flight == 0

    asyncio.run(scenario())


def test_outputs_of_an_add_taken_in_the_same_batch_are_delivered():
    async def scenario() -> None:
        client = EngineClient(capacity=4)
        client.ready.set()
        client.attach_loop(asyncio.get_running_loop())
        q = client.add_request("y", [1], SamplingParams(max_tokens=1))
        client.take_commands()
        client.publish([RequestOutput("y", [], True, "error", 400, "refused")])  # admission
        await asyncio.sleep(0)
        assert q.get_nowait().error_code == 400 and client.num_in_flight == 0

    asyncio.run(scenario())


def test_publish_returns_once_the_io_loop_has_handed_the_outputs_on():
    """The engine thread waits (up to HANDOFF_WAIT_S) until the tasks woken by its outputs have
    run, so tokens are not left queued while the next Paddle step holds the GIL."""
    import threading
    import time

    from spmd_serve.engine.client import HANDOFF_WAIT_S

    client = EngineClient(capacity=4)
    client.ready.set()
    loop = asyncio.new_event_loop()
    got: list[int] = []
    started = threading.Event()

    async def reader() -> None:
        client.attach_loop(asyncio.get_running_loop())
        queue = client.add_request("r", [1], SamplingParams(max_tokens=50))
        started.set()
        while True:
            out = await queue.get()
            got.extend(out.new_token_ids)
            if out.finished:
                return

    io = threading.Thread(target=loop.run_until_complete, args=(reader(),))
    io.start()
    try:
        assert started.wait(5)
        client.take_commands()
        early = 0
        for i in range(20):
            t0 = time.perf_counter()
            client.publish([RequestOutput("r", [i], i == 19, "length" if i == 19 else None)])
            if time.perf_counter() - t0 < HANDOFF_WAIT_S:  # handed on, not timed out ...
                early += 1
                assert got[-1] == i  # ... so the reader already has it
        assert early >= 10 and got == list(range(20))
    finally:
        io.join(5)
        loop.close()
