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
        assert [type(c) for c in client.take_commands()] == [AddCommand]     # engine: epoch 1
        client.publish([RequestOutput("x", [10])])
        await asyncio.sleep(0)
        assert old.get_nowait().new_token_ids == [10]
        client.publish([RequestOutput("x", [11])])   # computed before the engine saw the abort
        client.abort("x")                            # ... which the IO side sends meanwhile,
        new = client.add_request("x", [3, 4], params)   # and the client reuses the id at once
        await asyncio.sleep(0)                       # the stale output arrives now: dropped
        client.publish([RequestOutput("x", [12])])   # still the old sequence's (same epoch)
        await asyncio.sleep(0)
        assert new.empty() and old.empty()
        cmds = client.take_commands()                # engine: epoch 2, abort then add
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
        client.publish([RequestOutput("y", [], True, "error", 400, "refused")])   # admission
        await asyncio.sleep(0)
        assert q.get_nowait().error_code == 400 and client.num_in_flight == 0

    asyncio.run(scenario())
