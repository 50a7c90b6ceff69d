"""What start_server and stop_server read from the environment beyond `ServeConfig`: the log
folder (readable even when some unrelated variable is invalid, so stop_server always works),
whether we run under mpirun, and the environment the MPI job is given."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from spmd_serve.envs import BY_NAME

# Set by Open MPI (OMPI_*), PMIx launchers (PMIX_RANK) and MPICH/Hydra (PMI_RANK) in every rank.
_MPI_MARKERS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK")


def log_dir_from_env(environ: Mapping[str, str] | None = None) -> Path:
    """LOG_DIR (legacy FD_LOG_DIR), default ./log, as an absolute path."""
    env = os.environ if environ is None else environ
    var = BY_NAME["LOG_DIR"]
    raw = next((env[n] for n in (var.name, *var.aliases) if env.get(n, "").strip()), var.default)
    return Path(os.path.expanduser(raw.strip())).resolve()


def under_mpi(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return any(env.get(m) for m in _MPI_MARKERS)


def mpi_rank(environ: Mapping[str, str]) -> int:
    return int(
        next((environ[m] for m in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK") if environ.get(m, "").isdigit()), 0)
    )


def spmd_serve_command() -> list[str]:
    """The `spmd_serve` console script of this installation, or `python -m spmd_serve` before
    `pip install` made the script."""
    script = Path(sys.executable).parent / "spmd_serve"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "spmd_serve"]


def job_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of the MPI job, with the defaults a plain `start_server` needs."""
    env = dict(environ)
    if os.geteuid() == 0:  # containers run as root; Open MPI refuses that unless told
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    # Cross-memory attach needs ptrace rights that containers often lack; the ranks move only
    # small messages, so copying through shared memory costs nothing measurable.
    env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
    env.setdefault("GLOG_minloglevel", "2")  # Paddle's C++ INFO lines drown the log
    env.setdefault("PYTHONUNBUFFERED", "1")  # log lines reach the files as they happen
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env
