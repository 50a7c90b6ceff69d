"""`run_mpi`: a bounded `mpirun` job for a test, which says where its ranks were when it hangs.

A job past its time used to end as a bare `subprocess.TimeoutExpired` naming only the command (CI,
session 26: a speculative-decoding driver at TP 2 ran 300 s where it takes 20-50 s, and nothing
said where).  Here every rank runs with Python's faulthandler on; at the deadline each rank gets
SIGABRT, so it prints every thread's stack before it ends, and the test fails with those stacks.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Sequence

from tests.support.server_process import kill_session

STACKS_WAIT_S = 15  # for the ranks to print their stacks and mpirun to pass them on
TAG = re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>:")  # mpirun --tag-output's prefix of a rank's chunk


def by_rank(text: str) -> dict[str, str]:
    """`--tag-output` text as each rank's own ("rank R"; mpirun's lines: "mpirun"): faulthandler
    writes a stack in many small pieces, which the ranks' streams interleave."""
    parts = TAG.split(text)  # [untagged, rank, chunk, rank, chunk, ...]
    out = {"mpirun": parts[0]}
    for rank, chunk in zip(parts[1::2], parts[2::2]):
        out[f"rank {rank}"] = out.get(f"rank {rank}", "") + chunk
    return dict(sorted(out.items()))


def untagged(text: str) -> str:
    return "".join(by_rank(text).values())


def session_pids(sid: int) -> list[int]:
    """The processes of session `sid` but its leader (mpirun): Open MPI puts each rank in a process
    group of its own, but they stay in mpirun's session."""
    out = subprocess.run(["pgrep", "-s", str(sid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if int(p) != sid]


def run_mpi(
    cmd: Sequence[str], env: dict[str, str], timeout: float, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` (an `mpirun ...` line) to its end, like `subprocess.run(capture_output=True,
    text=True)`; past `timeout` seconds, an AssertionError with each rank's stacks."""
    cmd = [cmd[0], "--tag-output", *cmd[1:]]  # each line says its rank: the stacks print at once
    proc = subprocess.Popen(
        cmd,
        env={**env, "PYTHONFAULTHANDLER": "1"},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the ranks too: killed as one session if they outlive the stacks
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in session_pids(proc.pid):  # the ranks (and whatever they started)
            try:
                os.kill(pid, signal.SIGABRT)
            except ProcessLookupError:
                pass
        try:
            out, err = proc.communicate(timeout=STACKS_WAIT_S)
        except subprocess.TimeoutExpired:
            kill_session(proc.pid)
            out, err = proc.communicate()
        stacks = "".join(f"--- {who} ---\n{text[-6000:]}\n" for who, text in by_rank(err).items())
        raise AssertionError(
            f"{' '.join(cmd)} still ran after {timeout:.0f} s; each rank's stacks at that moment:\n"
            f"{stacks}--- stdout ---\n{untagged(out)[-2000:]}"
        ) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, untagged(out), untagged(err))
