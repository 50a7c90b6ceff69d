"""spmd_serve/dist/comm.py, how a rank waits: inside MPI it yields its core (Open MPI's
`mpi_yield_when_idle`), set before MPI starts, and a value the user set is kept; polling for the
next plan, its sleeps end on time (the polling thread's timer slack cut, no other thread's)."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import os
import spmd_serve.dist.comm as comm
assert comm.MPI.Is_initialized()  # the setting was in place before MPI read its parameters
print(os.environ["OMPI_MCA_mpi_yield_when_idle"])
"""


def _yield_setting(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMPI_MCA_mpi_yield_when_idle"}
    if env_value is not None:
        env["OMPI_MCA_mpi_yield_when_idle"] = env_value
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_waiting_ranks_yield_by_default() -> None:
    assert _yield_setting(None) == "1"


def test_the_users_setting_wins() -> None:
    assert _yield_setting("0") == "0"


SLACK_SCRIPT = """
import ctypes, threading
from mpi4py import MPI
import spmd_serve.dist.comm as comm
get = lambda: ctypes.CDLL(None).prctl(30, 0, 0, 0, 0)  # PR_GET_TIMERSLACK: this thread's, in ns
seen = {}
def poll():
    seen["before"] = get()
    comm.Comm(MPI.COMM_SELF).recv_plan()  # one rank: the header is its own, at once
    seen["after"] = get()
worker = threading.Thread(target=poll)
worker.start()
worker.join()
print(seen["before"], seen["after"], get(), comm.PLAN_TIMER_SLACK_NS)
"""


def test_the_plan_poll_cuts_its_own_threads_timer_slack() -> None:
    out = subprocess.run([sys.executable, "-c", SLACK_SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after, main_thread, wanted = map(int, out.stdout.split()[-4:])
    assert after == wanted < before  # Linux's default is 50 us
    assert main_thread == before  # per thread: the process's other threads keep theirs
