"""`mpirun ... spmd_serve` jobs that are expected to stop at start-up, and how they report it.

Shared by the failure tests of every protocol: a job is run to completion (bounded), its
`spmd_serve: error:` lines are the one-line reasons the contract promises, and a busy port is
made by holding a listening socket on it while every other port is free.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from tests.support.server_process import VENV_BIN, free_ports, mpi_env, mpirun

PORT_VARS = ("SERVICE_HTTP_PORT", "HEALTH_HTTP_PORT", "METRICS_HTTP_PORT", "SERVICE_GRPC_PORT")


def run_job(n: int, timeout: float = 90, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        mpirun(n, str(VENV_BIN / "spmd_serve")), env=mpi_env(**env), capture_output=True, text=True, timeout=timeout
    )


def error_lines(res: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (res.stdout + res.stderr).splitlines() if line.startswith("spmd_serve: error:")]


def run_with_busy_port(model_dir: str | Path, busy_var: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """Start `mpirun -n 2` with every port free except `busy_var`, which another socket holds."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        others = [v for v in PORT_VARS if v != busy_var]
        ports = {v: str(p) for v, p in zip(others, free_ports(len(others)))}
        res = run_job(2, MODEL_DIR=str(model_dir), MP_NUM="2", HOST="127.0.0.1", **ports, **{busy_var: str(port)})
    return res, port
