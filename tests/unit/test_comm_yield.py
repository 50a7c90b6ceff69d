"""spmd_serve/dist/comm.py: a rank waiting inside MPI yields its core (Open MPI's
`mpi_yield_when_idle`), set before MPI starts; a value the user set is kept."""

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
