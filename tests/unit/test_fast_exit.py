"""spmd_serve/fast_exit.py: a clean stop's exit keeps the exit code and every buffered log line,
and runs the finaliser (MPI's) before it, without the interpreter's teardown."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import atexit, logging, sys
from spmd_serve.fast_exit import flush_and_exit
logging.basicConfig(stream=sys.stderr, format="%(message)s", level="INFO")
atexit.register(lambda: print("teardown ran", flush=True))  # skipped: no interpreter teardown
sys.stdout.write("buffered stdout, no newline")  # still in the buffer when the exit comes
logging.getLogger("x").info("last log line")
flush_and_exit(3, finalize=lambda: sys.stderr.write("finalised\\n"))
"""


def test_flush_and_exit_keeps_the_code_and_the_output_and_skips_the_teardown():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert done.stdout == "buffered stdout, no newline"
    assert done.stderr.splitlines()[-2:] == ["last log line", "finalised"]
