"""The HTTP front end alone, for benchmarks/goals.py's `frontend` goal: an IOServer over the test
suite's FakeEngine (tests/support/fakes.py) with `step_s=0`, i.e. a new token for every stream as fast as
the engine thread can publish.  Prints the native chat URL, then serves until killed.

    python benchmarks/frontend_server.py [CAPACITY]
"""

from __future__ import annotations

import signal
import sys
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


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 64)
