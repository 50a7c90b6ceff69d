"""How a process of the server ends after a clean stop: without the interpreter's teardown.

Python's finalisation runs every module's and object's teardown, and Paddle's (imported by every
rank, and through the tokenizer by every HTTP worker) takes seconds: `python -c "import paddle"`
spends 2-4 s after its last line on the 2-core development machine beside two CPU hogs.  A drained
stop (SIGTERM, SPMD_DRAIN_TIMEOUT_S) waited for that twice in a row: the HTTP worker's teardown
while rank 0 waited for it to exit, then rank 0's own, so the job outlived its drain timeout by
~6 s (a fresh-clone CI run failed tests/mpi/test_drain_mpi.py on it).  Nothing the server holds
needs a teardown once it has stopped: its answers are sent, its files written and flushed, and
the kernel frees its memory and sockets.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import NoReturn


def flush_and_exit(code: int, finalize: Callable[[], object] | None = None) -> NoReturn:
    """logging's handlers and the std streams flushed, `finalize` run (MPI's), then os._exit(code)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if finalize is not None:
        finalize()
    os._exit(code)
