"""The HTTP front end alone, for benchmarks/goals.py's `frontend` goal: an IOServer over the test
suite's FakeEngine (tests/support/fakes.py) with `step_s=0`, i.e. a new token for every stream as fast as
the engine thread can publish.  Prints the native chat URL, then serves until killed.

    python benchmarks/frontend_server.py [CAPACITY]

`frontend_frames_per_s` is the client side: it starts this file and measures its frames/s.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root: tests.support


def main(capacity: int) -> None:
    from tests.support.fakes import Harness

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # for sigwait, all threads
    h = Harness(capacity=capacity + 8, step_s=0.0, max_dec_len=4096, model_max_len=8192, max_seq_len=8192)
    print(h.url, flush=True)
    try:
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
    finally:
        h.close()


def frontend_frames_per_s(streams: int, tokens: int, env: dict[str, str]) -> float:
    """Frames/s of the native NDJSON stream from IOServer over FakeEngine(step_s=0): this file as the
    server in a subprocess (environment `env`), `streams` concurrent clients here (aiohttp), `tokens`
    frames each."""
    server = subprocess.Popen([sys.executable, __file__, str(streams)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        return asyncio_streams(url, streams, tokens)
    finally:
        server.terminate()
        server.wait(10)


def asyncio_streams(url: str, streams: int, tokens: int) -> float:
    import asyncio

    import aiohttp

    async def one(session: aiohttp.ClientSession, i: int) -> int:
        body = {"text": f"hello {i} world", "max_dec_len": tokens, "min_dec_len": tokens, "stream": True}
        n = 0
        async with session.post(url, json=body) as res:
            async for _ in res.content:
                n += 1
        return n

    async def main() -> float:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await one(session, -1)
            t = time.perf_counter()
            frames = sum(await asyncio.gather(*(one(session, i) for i in range(streams))))
            return frames / (time.perf_counter() - t)

    return asyncio.run(main())


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 64)
