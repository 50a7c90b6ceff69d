"""`python -m spmd_serve.launcher.rank_output LOG_DIR CMD...`: what mpirun runs for each rank when
`start_server` starts the job; sends this rank's stdout and stderr to its own log file, then execs
CMD (`spmd_serve`), so the rank keeps its pid and signals reach the server itself.

Why not mpirun's `--output-filename`: Open MPI 4.1 writes `<dir>/1/rank.<r>/stdout|stderr`, names
the contract does not use, and routes every line through mpirun's IO forwarding.  Here rank 0 writes
`server.log` (which mpirun's own messages also go to, both in append mode) and rank r > 0 writes
`workerlog.<r>`; `workerlog.0` is a link to `server.log` made by start_server.  Also what a
failed start shows of those logs (`report_failure`).

`--console` (OUTPUT_LOG_TO_CONSOLE=1): the rank's output goes to its file *and* to the stdout mpirun
gave it, which start_server then leaves as its own console: a forked copier reads the rank's
output from a pipe and writes it to both (the console only while it can be written: a closed
terminal never stops the rank or its log file).  The copier ignores SIGINT/SIGTERM and ends when
the rank and its children have closed the pipe.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from spmd_serve.launcher.settings import mpi_rank

TAIL_LINES = 40  # of server.log shown when a start fails (10 of each workerlog)


def log_name(rank: int) -> str:
    return "server.log" if rank == 0 else f"workerlog.{rank}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _copy(src: int, log: int, console: int) -> None:
    """The copier: everything from `src` to `log` and, while it can be written, to `console`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the rank decides when output ends (EOF)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while chunk := os.read(src, 1 << 16):
        _write_all(log, chunk)
        if console >= 0:
            try:
                _write_all(console, chunk)
            except OSError:  # the console went away: the log file goes on
                console = -1


def _tee(log: int) -> int:
    """A pipe whose reader copies to `log` and this process's stdout (forked); its write end."""
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(write)
        try:
            _copy(read, log, 1)
        finally:
            os._exit(0)
    os.close(read)
    return write


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    console = bool(argv) and argv[0] == "--console"
    argv = argv[console:]
    if len(argv) < 2:
        print("usage: python -m spmd_serve.launcher.rank_output [--console] LOG_DIR CMD [ARGS...]", file=sys.stderr)
        return 2
    log_dir, cmd = argv[0], argv[1:]
    rank = mpi_rank(os.environ)
    os.makedirs(log_dir, exist_ok=True)  # on another node the folder may not exist yet
    fd = os.open(os.path.join(log_dir, log_name(rank)), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    out = _tee(fd) if console else fd
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    if out != fd:
        os.close(fd)
    os.execvp(cmd[0], cmd)
    return 127  # not reached: execvp raises on failure


def _tail(path: Path, n: int) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
            return f.read().decode(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def report_failure(reason: str, log_dir: Path) -> None:
    print(f"start_server: error: {reason}", file=sys.stderr)
    logs = [(log_dir / "server.log", TAIL_LINES)] + [
        (p, 10) for p in sorted(log_dir.glob("workerlog.*")) if not p.is_symlink()
    ]
    for path, n in logs:
        lines = _tail(path, n)
        if lines:
            print(f"--- last lines of {path} ---", file=sys.stderr)
            print("\n".join(lines), file=sys.stderr)
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
