"""Where the CPU goes while spmd_serve serves (issue 16): `mpirun -n 1 spmd_serve` on an export (as
benchmarks/peers/ starts it), `spmd_serve bench` at one concurrency against it, and the CPU time of
every process and thread of the server (rank 0's engine thread and its op pool's workers, the HTTP
workers) and of the bench client, per output token.  On a machine whose cores the ranks' threads
fill, every millisecond another process runs is taken from a step: the table says whose it is.

    python benchmarks/served_cpu.py MODEL_DIR [--threads 2] [--concurrency 1] [--num-prompts 24]
                                    [--sched] [--worker-policy other]

--sched records `perf sched` over a window of the run (root, or perf_event_paranoid <= 1) and adds
each server thread's time off its core: "waiting" (runnable but another task ran: preempted or
queued) and "sleeping" (blocked: a futex, the socket), and how long each core idled — the numbers
of RESULTS.md "Session 75".  --worker-policy other runs the HTTP workers under SCHED_OTHER again
(they run under SCHED_BATCH, engine/http_workers.py): the before of that change, in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.peers import servers

Times = dict[tuple[int, int], tuple[str, float]]  # (pid, tid) -> (name, CPU seconds)


def thread_times(root: int) -> Times:
    """CPU seconds of every thread of `root`'s descendants (the ranks and the HTTP workers)."""
    out: Times = {}
    for p in psutil.Process(root).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(p.cmdline())
            name = "http worker" if "http_worker" in cmd else ("rank" if "spmd_serve" in cmd else p.name())
            for i, t in enumerate(p.threads()):
                label = f"{name} {p.pid}" + (" main thread" if t.id == p.pid else f" thread {i}")
                out[(p.pid, t.id)] = (label, t.user_time + t.system_time)
    return out


def set_worker_policy(root: int, policy: int) -> None:
    for p in psutil.Process(root).children(recursive=True):
        if "http_worker" in " ".join(p.cmdline()):
            for t in p.threads():
                os.sched_setscheduler(t.id, policy, os.sched_param(0))


def perf_sched(seconds: float, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        ["perf", "sched", "record", "-o", str(out), "sleep", str(seconds)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def sched_summary(data: Path, pids: set[int]) -> list[str]:
    """Per thread of `pids`: run, waiting-to-run and sleeping ms from `perf sched timehist`
    (wait time = off its core; sch delay = the runnable part of it), and the cores' idle time."""

    def timehist(*flags: str) -> str:
        return subprocess.run(
            ["perf", "sched", "timehist", "-i", str(data), *flags], capture_output=True, text=True
        ).stdout

    rows: dict[str, list[float]] = {}
    for ln in timehist().splitlines():  # one line a switch: the task's time off its core before it, then on it
        m = re.match(r"\s*[\d.]+\s+\[\d+\]\s+(\S+)\[(\d+)(?:/(\d+))?\]\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", ln)
        if m and int(m[3] or m[2]) in pids:
            r = rows.setdefault(f"{m[1]}[{m[2]}]", [0.0, 0.0, 0.0])
            wait, delay, run = float(m[4]), float(m[5]), float(m[6])
            r[0] += run
            r[1] += delay
            r[2] += wait - delay
    lines = [
        f"  {k:32s} run {v[0]:8.1f} ms  waiting to run {v[1]:7.1f} ms  sleeping {v[2]:8.1f} ms" for k, v in rows.items()
    ]
    idle = [f"  {ln.strip()}" for ln in timehist("-s").splitlines() if re.match(r"\s*CPU\s+\d+ idle for", ln)]
    return lines + idle


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--sched", action="store_true", help="perf sched over 6 s of the run")
    ap.add_argument("--worker-policy", choices=("batch", "other"), default="batch")
    args = ap.parse_args(argv)
    batch = max(32, args.concurrency)
    srv = servers.spmd_serve("ours", args.model_dir.resolve(), 1, args.threads, batch, 512)
    tmp = Path(tempfile.mkdtemp(prefix="served_cpu-"))
    with servers.running(srv, tmp / "server.log") as s:
        assert s.pid is not None
        if args.worker_policy == "other":
            set_worker_policy(s.pid, os.SCHED_OTHER)
        bench = [sys.executable, "-m", "spmd_serve.cli", "bench", "--base-url", s.base_url, "--tokenizer"]
        bench += [str(args.model_dir), "--input-len", str(args.input_len), "--output-len", str(args.output_len)]
        bench += ["--num-prompts", str(args.num_prompts), "--concurrency", str(args.concurrency), "--warmup", "0"]
        bench += ["--no-progress", "--metrics-url", str(s.metrics_url)]
        before, t0 = thread_times(s.pid), time.monotonic()
        client = subprocess.Popen(bench, stdout=subprocess.PIPE, text=True, env=srv.env)
        if args.sched:
            time.sleep(3)  # past the first prompts
            perf_sched(6, tmp / "sched.data").wait()
        assert client.stdout is not None
        report = client.stdout.read()
        _, _, usage = os.wait4(client.pid, 0)  # the client's own CPU time (not perf's)
        client.returncode = 0
        wall, after = time.monotonic() - t0, thread_times(s.pid)
        server_pids = {pid for pid, _ in after}
    tokens = args.num_prompts * args.output_len
    print(report.rstrip())
    print(f"\nCPU per output token ({tokens} tokens in {wall:.1f} s, {1e3 * wall / tokens:.3f} ms of wall each):")
    for key, (label, cpu) in sorted(after.items()):
        used = cpu - before.get(key, ("", 0.0))[1]
        if used > 0.01:
            print(f"  {label:34s} {1e3 * used / tokens:7.3f} ms")
    client_cpu = usage.ru_utime + usage.ru_stime  # its start-up (imports, the tokenizer) included
    print(f"  {'bench client':34s} {1e3 * client_cpu / tokens:7.3f} ms")
    if args.sched:
        print("perf sched, 6 s:")
        print("\n".join(sched_summary(tmp / "sched.data", server_pids)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
