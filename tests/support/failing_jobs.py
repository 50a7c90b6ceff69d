"""`mpirun ... spmd_serve` jobs that are expected to stop at start-up, and how they report it.

Shared by the failure tests of every protocol: a job is run to completion (bounded), its
`spmd_serve: error:` lines are the one-line reasons the contract promises, and a busy port is
made by holding a listening socket on it while every other port is free.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from spmd_serve.envs import BY_NAME
from tests.support.server_process import VENV_BIN, free_ports, mpi_env, mpirun

PORT_VARS = ("SERVICE_HTTP_PORT", "HEALTH_HTTP_PORT", "METRICS_HTTP_PORT", "SERVICE_GRPC_PORT", "INTER_PROC_PORT")


def run_job(n: int, timeout: float = 90, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the job to its end; ports not given are free ones (never the defaults another job holds)."""
    unset = [v for v in PORT_VARS if not {v, *BY_NAME[v].aliases} & set(env)]  # a legacy name counts
    env = {**dict(zip(unset, map(str, free_ports(len(unset))))), "HOST": "127.0.0.1", **env}
    return subprocess.run(
        mpirun(n, str(VENV_BIN / "spmd_serve")), env=mpi_env(**env), capture_output=True, text=True, timeout=timeout
    )


def error_lines(res: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (res.stdout + res.stderr).splitlines() if line.startswith("spmd_serve: error:")]


def run_with_busy_port(
    model_dir: str | Path, busy_var: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], int]:
    """Start `mpirun -n 2` with every port free except `busy_var`, which another socket holds."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = run_job(2, MODEL_DIR=str(model_dir), MP_NUM="2", **env, **{busy_var: str(port)})
    return res, port
