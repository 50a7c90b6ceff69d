"""Test helper: run the operator commands (`start_server`, `stop_server`, `download_model`) as real
processes, and make sure a test never leaves a started server behind."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil

from tests.support.server_process import VENV_BIN, free_ports, mpi_env

MODULES = {
    "start_server": "spmd_serve.launcher.start",
    "stop_server": "spmd_serve.launcher.stop",
    "download_model": "spmd_serve.download",
}


def command(name: str) -> list[str]:
    """The console script from the venv when `pip install -e .` made it, else `python -m`."""
    script = VENV_BIN / name
    return [str(script)] if script.is_file() else [sys.executable, "-m", MODULES[name]]


def run(name: str, *args: str, env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*command(name), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


PORT_VARS = ("SERVICE_HTTP_PORT", "SERVICE_GRPC_PORT", "HEALTH_HTTP_PORT", "METRICS_HTTP_PORT", "INTER_PROC_PORT")


def launcher_env(log_dir: Path, **extra: str) -> dict[str, str]:
    """Loopback, free ports for all five, LOG_DIR in the test's tmp folder; none of the developer's
    own serving variables leak in."""
    ports = {v: str(p) for v, p in zip(PORT_VARS, free_ports(len(PORT_VARS)))}
    env = mpi_env(HOST="127.0.0.1", LOG_DIR=str(log_dir), **ports)
    for stray in (
        "MODEL_DIR",
        "model_name",
        "MP_NUM",
        "MODEL_BASE_URL",
        "tag",
        "FD_LOG_DIR",
        "OMPI_COMM_WORLD_SIZE",
        "PMIX_RANK",
        "PMI_RANK",
    ):
        env.pop(stray, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def processes_of(log_dir: Path) -> list[psutil.Process]:
    """Live processes of any job started with this LOG_DIR (found by environment, as stop_server
    finds them; zombies do not count)."""
    found = []
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if (
                env.get("SPMD_SERVE_RUN_ID")
                and env.get("LOG_DIR") == str(log_dir)
                and p.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(p)
        except psutil.Error:
            continue
    return found


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@contextlib.contextmanager
def always_stopped(env: dict[str, str], cwd: Path) -> Iterator[None]:
    """Whatever the test does, stop what it started: stop_server, then SIGKILL any leftover."""
    log_dir = Path(env["LOG_DIR"])
    try:
        yield
    finally:
        if processes_of(log_dir):
            with contextlib.suppress(subprocess.TimeoutExpired):
                run("stop_server", "20", env=env, cwd=cwd, timeout=60)
        for p in processes_of(log_dir):
            with contextlib.suppress(psutil.Error):
                p.kill()
