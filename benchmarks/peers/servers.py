"""The two servers under comparison, each started on free 127.0.0.1 ports and always stopped.

This module owns how a server of the comparison is launched and torn down: `mpirun -n N spmd_serve`
(env vars of CONTRACT §2, threads through `SPMD_NUM_THREADS`) and llama.cpp's `llama-server`
(`-t T -tb T -np SLOTS -c CTX`).  Each runs in its own process group (start_new_session) and
`running()` is a context manager whose exit sends SIGTERM to the whole group, then SIGKILL after a
bounded wait, whatever happened inside — a benchmark that crashes must not leave a server on one
of the machine's two cores.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.server_process import free_ports  # the project's free-loopback-ports helper

ROOT = Path(__file__).resolve().parents[2]


def spmd_serve_cmd() -> list[str]:
    """Our console script in this interpreter's environment (PYTHONPATH picks the checkout)."""
    script = Path(sys.executable).parent / "spmd_serve"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "spmd_serve"]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(
        os.environ,
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        GLOG_minloglevel="2",
        OMPI_MCA_btl_vader_single_copy_mechanism="none",
        PYTHONUNBUFFERED="1",
    )
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


@dataclass
class Server:
    """A command to run, the URL the benchmark talks to and the URL that answers 200 once ready."""

    name: str
    cmd: list[str]
    env: dict[str, str]
    base_url: str
    ready_url: str
    metrics_url: str | None = None
    info: dict = field(default_factory=dict)  # what the report records about this server
    pid: int | None = None  # set while running (the process group's leader)
    ready_s: float | None = None  # set while running: seconds from the start to the first 200


def spmd_serve(
    name: str,
    model_dir: Path,
    ranks: int,
    threads: int,
    batch: int,
    max_len: int,
    mpirun_args: tuple[str, ...] = ("--bind-to", "none"),
    log_dir: Path | None = None,
) -> Server:
    """`mpirun -n ranks spmd_serve` serving `model_dir` (exported with --tp ranks)."""
    http, health, metrics, grpc, inter = free_ports(5)
    seq = max_len
    env = dict(
        MODEL_DIR=str(model_dir),
        MP_NUM=str(ranks),
        HOST="127.0.0.1",
        SERVICE_HTTP_PORT=str(http),
        HEALTH_HTTP_PORT=str(health),
        METRICS_HTTP_PORT=str(metrics),
        SERVICE_GRPC_PORT=str(grpc),
        INTER_PROC_PORT=str(inter),
        BATCH_SIZE=str(batch),
        MAX_SEQ_LEN=str(seq),
        MAX_DEC_LEN=str(seq),
        BLOCK_BS=str(batch + 8),
        SPMD_NUM_THREADS=str(threads),
    )
    if log_dir is not None:
        env["LOG_DIR"] = str(log_dir)
    cmd = ["mpirun", "-n", str(ranks), "--oversubscribe", *mpirun_args, *spmd_serve_cmd()]
    info = {
        "server": "spmd_serve",
        "ranks": ranks,
        "threads_per_rank": threads,
        "model_dir": str(model_dir),
        "command": " ".join(f"{k}={v}" for k, v in env.items() if not k.endswith("_PORT")) + " " + " ".join(cmd),
    }
    return Server(
        name,
        cmd,
        child_env(**env),
        f"http://127.0.0.1:{http}",
        f"http://127.0.0.1:{health}/v2/health/ready",
        f"http://127.0.0.1:{metrics}/metrics",
        info,
    )


def llama_server(name: str, binary: Path, gguf: Path, threads: int, slots: int, ctx: int) -> Server:
    """llama.cpp's server on one GGUF: `slots` parallel sequences sharing `ctx` tokens of KV."""
    (port,) = free_ports(1)
    args = [
        "-m",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-np",
        str(slots),
        "-c",
        str(ctx),
        "--alias",
        "default",
        "--no-webui",
    ]
    info = {
        "server": "llama-server",
        "threads": threads,
        "slots": slots,
        "ctx": ctx,
        "gguf": str(gguf),
        "command": " ".join([binary.name, *args]),
    }
    return Server(
        name,
        [str(binary), *args],
        child_env(),
        f"http://127.0.0.1:{port}",
        f"http://127.0.0.1:{port}/health",
        None,
        info,
    )


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code  # llama-server answers 503 while it loads
    except (urllib.error.URLError, OSError):
        return None


def stop(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM to the process group, SIGKILL if it is still there after `timeout_s`."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def running(server: Server, log_path: Path, timeout_s: float = 600.0) -> Iterator[Server]:
    """Start `server`, wait (bounded) until its ready URL answers 200, yield it; always stop it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            server.cmd, env=server.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        server.pid, started = proc.pid, time.monotonic()
        try:
            deadline = started + timeout_s
            while _status(server.ready_url) != 200:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{server.name} exited with {proc.returncode} before it was ready; "
                        f"log {log_path}:\n{log_path.read_text(errors='replace')[-3000:]}"
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{server.name} not ready after {timeout_s:.0f} s; log {log_path}")
                time.sleep(0.1)
            server.ready_s = time.monotonic() - started
            yield server
        finally:
            stop(proc)
