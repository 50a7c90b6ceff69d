"""`start_server [model_name]`: start `mpirun -n MP_NUM spmd_serve` in the background (CONTRACT §1).

Reads the environment (legacy names too, through `spmd_serve.config`), downloads `model_name` into
`$MODEL_DIR/<model_name>` (MODEL_DIR defaulting to /models then) unless it is already there, converts
it once if it is the original tool's static inference model (launcher/convert.py), checks
that the five ports are free, starts the job in its own session with logs in LOG_DIR and a pid file,
waits for `/v2/health/ready` with visible progress, and prints the endpoints.  A failed start ends
the job, prints the last log lines and exits 1; configuration errors exit 2.

Started under mpirun (`mpirun -hostfile hosts -n N start_server`, as the original tool documents),
every rank resolves (and if needed downloads) the model and then execs `spmd_serve` in the
foreground instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

from spmd_serve.config import ConfigError, ServeConfig, load_config
from spmd_serve.download import DownloadError, download_model, is_complete
from spmd_serve.envs import BY_FIELD
from spmd_serve.launcher import jobs
from spmd_serve.launcher.convert import ConversionError, served_model_dir
from spmd_serve.launcher.hostfile import check_master_is_local, node_order, write_hostfile
from spmd_serve.launcher.rank_output import log_name, report_failure
from spmd_serve.launcher.settings import job_environ, mpi_rank, spmd_serve_command, under_mpi

PORTS = ("http_port", "grpc_port", "health_port", "metrics_port", "inter_proc_port")
DEFAULT_MODELS_ROOT = "/models"  # where `start_server <model_name>` downloads when MODEL_DIR is unset


class StartError(Exception):
    """The server could not be started; the message says why (one line)."""


def resolve_model(cfg: ServeConfig, mode: str = "master") -> ServeConfig:
    """With model_name: $MODEL_DIR/<model_name>, downloaded first unless complete; without: MODEL_DIR
    as an absolute path (the ranks may run elsewhere), or unset for the built-in demo model.  A static
    inference model (what download_model fetches) is served from its conversion, made once."""
    if cfg.model_name:
        root = Path(cfg.model_dir or DEFAULT_MODELS_ROOT)
        folder = root / cfg.model_name.strip("/")
        if not is_complete(folder):
            print(f"start_server: downloading {cfg.model_name} into {folder}", file=sys.stderr, flush=True)
            download_model(cfg.model_name, root, nnodes=cfg.mp_nnode, mode=mode)
    elif cfg.model_dir:
        folder = Path(cfg.model_dir)
    else:
        return cfg
    served = served_model_dir(folder.resolve(), cfg.mp_num, cfg.mp_nnode) if folder.is_dir() else folder.resolve()
    return dataclasses.replace(cfg, model_dir=str(served))


def busy_ports(cfg: ServeConfig) -> list[str]:
    """One phrase per configured port that cannot be bound, naming its variable."""
    problems = []
    for name in PORTS:
        port, var = getattr(cfg, name), BY_FIELD[name]
        if port == var.disable_value:
            continue
        host = "127.0.0.1" if name == "inter_proc_port" else cfg.host  # the internal port is loopback
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            # SO_REUSEADDR as the server sets it: a just-stopped server's TIME_WAIT is no conflict,
            # a listening socket still is.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                problems.append(f"{var.name}={port} cannot be bound on {host} ({e.strerror})")
    return problems


def _prepare_log_dir(log_dir: Path) -> None:
    """Keep the previous run's logs in LOG_DIR/prev/ (a restart after a crash must not erase the
    crash), start fresh ones, and link workerlog.0 to server.log (rank 0 writes server.log)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    prev = log_dir / "prev"
    old = [p for p in log_dir.iterdir() if p.name == "server.log" or p.name.startswith("workerlog.")]
    if old:
        prev.mkdir(exist_ok=True)
        for p in old:
            if p.is_symlink():
                p.unlink()
            else:
                os.replace(p, prev / p.name)
    (log_dir / "workerlog.0").symlink_to(log_name(0))


def _mpirun_command(cfg: ServeConfig, env: dict[str, str], log_dir: Path) -> list[str]:
    mpirun = shutil.which("mpirun", path=env.get("PATH"))
    if mpirun is None:
        raise StartError("mpirun not found on PATH (install Open MPI, e.g. apt-get install openmpi-bin)")
    # -x forwards variables to ranks on other nodes (local ranks inherit the environment anyway).
    forward = [
        *cfg.to_environ(),
        jobs.RUN_ID_VAR,
        "PATH",
        "PYTHONPATH",
        "LD_LIBRARY_PATH",
        "VIRTUAL_ENV",
        "GLOG_minloglevel",
        "PYTHONUNBUFFERED",
    ]
    xflags = [a for name in dict.fromkeys(forward) if name in env for a in ("-x", name)]
    # Several nodes: a hostfile from POD_IPS, master first; mpirun reaches the others with ssh or
    # with the agent the operator names in OMPI_MCA_plm_rsh_agent (read by mpirun from env).
    hosts = ["-hostfile", str(write_hostfile(cfg, log_dir))] if cfg.mp_nnode > 1 else []
    return [
        mpirun,
        "-n",
        str(cfg.mp_num),
        *hosts,
        "--oversubscribe",
        "--bind-to",
        "none",
        *xflags,
        sys.executable,
        "-m",
        "spmd_serve.launcher.rank_output",
        *(["--console"] if cfg.output_log_to_console else []),
        str(log_dir),
        *spmd_serve_command(),
    ]


def launch(cfg: ServeConfig, base_env: dict[str, str], log_dir: Path) -> tuple[subprocess.Popen, jobs.Job]:
    """Start mpirun in a session of its own (a Ctrl-C in the operator's shell does not reach it)."""
    run_id = jobs.Job.new_run_id()
    env = job_environ(base_env)
    env.update(cfg.to_environ())  # canonical names with resolved values (MODEL_DIR, LOG_DIR)
    env[jobs.RUN_ID_VAR] = run_id
    cmd = _mpirun_command(cfg, env, log_dir)
    _prepare_log_dir(log_dir)
    fd = os.open(log_dir / log_name(0), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    # OUTPUT_LOG_TO_CONSOLE=1: mpirun keeps this console (the ranks copy their logs to it and to
    # their files, launcher/rank_output.py); else mpirun's own messages go to server.log too
    out = None if cfg.output_log_to_console else fd
    try:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    finally:
        os.close(fd)
    job = jobs.Job(proc.pid, run_id)
    jobs.write_pid_file(log_dir, job)
    return proc, job


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def wait_ready(proc: subprocess.Popen, url: str, timeout: float) -> str | None:
    """Poll `url` until 200; None when ready, else why not.  A dot a second, the elapsed seconds
    every ten, on stderr."""
    print(f"start_server: waiting for {url} ", end="", file=sys.stderr, flush=True)
    t0, shown = time.monotonic(), 0
    reason: str | None
    while True:
        rc = proc.poll()
        if rc is not None:
            reason = f"the server exited with status {rc} before it was ready"
            break
        try:
            if requests.get(url, timeout=1).status_code == 200:
                reason = None
                break
        except requests.RequestException:
            pass
        elapsed = time.monotonic() - t0
        if elapsed > timeout:
            reason = f"the server was not ready after {timeout:g} s"
            break
        while shown < int(elapsed):
            shown += 1
            print(f"{shown}s" if shown % 10 == 0 else ".", end="", file=sys.stderr, flush=True)
        time.sleep(0.3)
    print(
        f" {'ready' if reason is None else 'failed'} after {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True
    )
    return reason


def print_endpoints(cfg: ServeConfig, job: jobs.Job, log_dir: Path) -> None:
    h = _client_host(cfg.host)
    if cfg.mp_nnode > 1 and h != cfg.host:
        h = node_order(cfg)[0]  # several nodes: clients elsewhere reach the master's address
    where = " (listening on all interfaces)" if h != cfg.host else ""
    lines = [f"spmd_serve is ready: {cfg.mp_num} rank(s), model {cfg.model_dir or 'built-in demo'}{where}"]
    if cfg.http_port != -1:
        lines += [
            f"  native HTTP:  POST http://{h}:{cfg.http_port}/v1/chat/completions",
            f"  OpenAI:       base_url=http://{h}:{cfg.http_port}/v1",
        ]
    if cfg.grpc_port != -1:
        lines.append(f"  gRPC:         {h}:{cfg.grpc_port} (model 'model')")
    lines += [
        f"  health:       http://{h}:{cfg.health_port}/v2/health/ready",
        f"  metrics:      http://{h}:{cfg.metrics_port}/metrics",
        f"  logs:         {log_dir}/server.log, workerlog.<rank>; pid file {jobs.pid_path(log_dir)} "
        f"(mpirun pid {job.pid})",
        "  stop with:    stop_server [timeout_s]",
    ]
    print("\n".join(lines), flush=True)


def start_background(env: dict[str, str], wait_timeout: float) -> int:
    cfg = load_config([], env)
    if cfg.mp_nnode > 1:
        check_master_is_local(cfg)  # validates POD_IPS / POD_0_IP too
    log_dir = Path(cfg.log_dir).resolve()
    running = jobs.read_pid_file(log_dir)
    if running is not None:
        if jobs.job_processes(running):
            raise StartError(
                f"a server started from LOG_DIR={log_dir} is already running (mpirun pid "
                f"{running.pid}); stop it with stop_server or use another LOG_DIR"
            )
        jobs.remove_pid_file(log_dir)  # stale: its job is gone
    problems = busy_ports(cfg)
    if problems:
        raise StartError("; ".join(problems) + " (another server running? choose free ports)")
    cfg = dataclasses.replace(resolve_model(cfg), log_dir=str(log_dir))
    proc, job = launch(cfg, env, log_dir)
    try:
        url = f"http://{_client_host(cfg.host)}:{cfg.health_port}/v2/health/ready"
        reason = wait_ready(proc, url, wait_timeout)
    except KeyboardInterrupt:
        reason = "interrupted"
    if reason is None:
        print_endpoints(cfg, job, log_dir)
        return 0
    jobs.stop_job(job, 10.0)
    proc.wait(15)
    jobs.remove_pid_file(log_dir)
    report_failure(reason, log_dir)
    return 1


def start_foreground(env: dict[str, str]) -> int:
    """Under mpirun: this process becomes one rank of the server."""
    cfg = load_config([], env)
    node = mpi_rank(env) // cfg.ranks_per_node  # ranks fill nodes in order (mpirun's default)
    cfg = resolve_model(cfg, mode="master" if node == 0 else "slave")
    if cfg.model_dir:
        env["MODEL_DIR"] = cfg.model_dir
    cmd = spmd_serve_command()
    os.execvpe(cmd[0], cmd, env)
    return 127  # not reached


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="start_server",
        description=__doc__.splitlines()[0],
        epilog="Configuration: the environment variables of CONTRACT §2 (see `spmd_serve --help`).",
    )
    ap.add_argument("model_name", nargs="?", help="download (if needed) and serve $MODEL_DIR/<model_name>")
    ap.add_argument(
        "--wait-timeout", type=float, default=1800.0, help="seconds to wait for /v2/health/ready (default 1800)"
    )
    args = ap.parse_args(argv)
    env = dict(os.environ)
    if args.model_name:
        env["model_name"] = args.model_name
    try:
        return start_foreground(env) if under_mpi(env) else start_background(env, args.wait_timeout)
    except ConfigError as e:
        print(f"start_server: error: {e}", file=sys.stderr)
        return 2
    except (StartError, DownloadError, ConversionError) as e:
        print(f"start_server: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
