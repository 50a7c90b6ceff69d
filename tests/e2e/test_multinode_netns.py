"""Two nodes on one machine (issue 4, "Must show"): two network namespaces joined by a veth pair,
a hostfile naming both addresses, and mpirun across them through a launch agent that runs
`ip netns exec` (tests/support/netns.py).  With MP_NUM=2, MP_NNODE=2, rank 0 runs in namespace A and rank 1
in namespace B, they talk over the veth pair only, and requests to rank 0's address (made from
inside namespace A) are answered with the same greedy tokens as a single-node `mpirun -n 2`.

Both ways in are covered: a hand-written hostfile with plain `mpirun ... spmd_serve`, and the
contract path, `start_server` building the hostfile from POD_IPS / POD_0_IP / MP_NNODE.
Skipped (with the reason) where network namespaces cannot be created."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.launcher_process import PORT_VARS, command, launcher_env, processes_of
from tests.support.netns import TwoNodes
from tests.support.server_process import VENV_BIN, ServerProcess, free_ports, kill_session, mpi_env

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(600)]

PROMPTS = [[1, 17, 300, 45], [1] + list(range(40, 70)), [1, 900, 901, 5, 6, 7, 8, 9, 10, 11, 12]]
NEW_TOKENS = 8

# Runs inside namespace A: waits for readiness, then asks for greedy tokens; prints JSON.
CLIENT = r"""
import json, os, sys, time, requests
host, http_port, health_port, prompts, n, timeout, watch_pid = json.loads(sys.argv[1])
deadline = time.monotonic() + timeout
while True:
    if watch_pid and not os.path.exists(f"/proc/{watch_pid}"):
        print(json.dumps({"error": "the server exited"})); sys.exit(0)
    try:
        if requests.get(f"http://{host}:{health_port}/v2/health/ready", timeout=1).status_code == 200:
            break
    except requests.RequestException:
        pass
    if time.monotonic() > deadline:
        print(json.dumps({"error": "not ready"})); sys.exit(0)
    time.sleep(0.3)
ids = []
for p in prompts:
    r = requests.post(f"http://{host}:{http_port}/v1/chat/completions", timeout=120,
                      json={"input_ids": p, "max_dec_len": n, "min_dec_len": n, "temperature": 0})
    ids.append(r.json()["tokens_all_ids"] if r.status_code == 200 else r.text)
print(json.dumps({"ids": ids}))
"""


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    with TwoNodes(tmp_path_factory.mktemp("netns")) as n:
        yield n


@pytest.fixture(scope="module")
def single_node_ids(served_tp2, tmp_path_factory) -> list[list[int]]:
    """The reference: the same prompts on a plain single-node `mpirun -n 2` (loopback)."""
    from tests.support.server_process import greedy_ids

    with ServerProcess(2, served_tp2, tmp_path_factory.mktemp("single") / "server.log") as srv:
        return [greedy_ids(srv.url, p, NEW_TOKENS) for p in PROMPTS]


def ask_from_node0(nodes: TwoNodes, http_port: int, health_port: int, timeout: float = 180, watch_pid: int = 0) -> dict:
    """Greedy tokens for PROMPTS from rank 0's address, asked from inside namespace A (where that
    address lives), once it is ready; gives up early when `watch_pid` (the job) has exited."""
    arg = json.dumps([nodes.ips[0], http_port, health_port, PROMPTS, NEW_TOKENS, timeout, watch_pid])
    res = subprocess.run(
        nodes.in_ns(0, [sys.executable, "-c", CLIENT, arg]), capture_output=True, text=True, timeout=timeout + 120
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def namespace_of(pid: int) -> str:
    return subprocess.run(
        ["ip", "netns", "identify", str(pid)], capture_output=True, text=True, timeout=10
    ).stdout.strip()


def rank_pids(log_dir_or_env_marker: str) -> dict[int, int]:
    """rank -> pid of the spmd_serve ranks whose environment holds the given KEY=VALUE marker."""
    import psutil

    key, value = log_dir_or_env_marker.split("=", 1)
    found = {}
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if env.get(key) == value and "OMPI_COMM_WORLD_RANK" in env and "spmd_serve" in " ".join(p.cmdline()):
                found[int(env["OMPI_COMM_WORLD_RANK"])] = p.pid
        except psutil.Error:
            continue
    return found


def test_mpirun_hostfile_across_two_namespaces(nodes, served_tp2, single_node_ids, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"# node A runs rank 0\n{nodes.ips[0]} slots=1\n{nodes.ips[1]} slots=1\n")
    ports = dict(zip(PORT_VARS, map(str, free_ports(len(PORT_VARS)))))
    marker = f"netns-{nodes.ns[0]}"
    env = mpi_env(
        MODEL_DIR=str(served_tp2),
        MP_NUM="2",
        MP_NNODE="2",
        HOST="0.0.0.0",
        POD_IPS=",".join(nodes.ips),
        POD_0_IP=nodes.ips[0],
        SPMD_TEST_MARK=marker,
        **ports,
    )
    forward = [
        "MODEL_DIR",
        "MP_NUM",
        "MP_NNODE",
        "HOST",
        "POD_IPS",
        "POD_0_IP",
        "SPMD_TEST_MARK",
        *PORT_VARS,
        "PATH",
        "PYTHONPATH",
        "GLOG_minloglevel",
        "PYTHONUNBUFFERED",
    ]
    xflags = [a for v in forward if v in env for a in ("-x", v)]
    cmd = nodes.in_ns(
        0,
        [
            "mpirun",
            "-hostfile",
            str(hostfile),
            "-n",
            "2",
            "--bind-to",
            "none",
            *nodes.mca_args(),
            *xflags,
            str(VENV_BIN / "spmd_serve"),
        ],
    )
    log = tmp_path / "mpirun.log"
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            got = ask_from_node0(
                nodes, int(ports["SERVICE_HTTP_PORT"]), int(ports["HEALTH_HTTP_PORT"]), watch_pid=proc.pid
            )
            assert "ids" in got, f"{got}\n{log.read_text(errors='replace')[-3000:]}"
            ranks = rank_pids(f"SPMD_TEST_MARK={marker}")
            assert sorted(ranks) == [0, 1]
            assert namespace_of(ranks[0]) == nodes.ns[0] and namespace_of(ranks[1]) == nodes.ns[1]
            assert got["ids"] == single_node_ids
            print(f"two-namespace mpirun: ready and answered in {time.monotonic() - t0:.1f} s")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    kill_session(proc.pid)
                    proc.wait(10)
            nodes.kill_all()


def test_start_server_builds_the_hostfile_from_pod_ips(nodes, served_tp2, single_node_ids, tmp_path):
    """The contract path: POD_IPS lists the master second; start_server puts POD_0_IP first, so
    rank 0 lands (and serves) in namespace A; the launch agent comes from OMPI_MCA_plm_rsh_agent."""
    log_dir = tmp_path / "log"
    env = launcher_env(
        log_dir,
        **dict(zip(PORT_VARS, map(str, free_ports(len(PORT_VARS))))),
        MODEL_DIR=str(served_tp2),
        MP_NUM="2",
        MP_NNODE="2",
        HOST="0.0.0.0",
        POD_IPS=f"{nodes.ips[1]},{nodes.ips[0]}",
        POD_0_IP=nodes.ips[0],
        **nodes.mca_environ(),
    )
    try:
        t0 = time.monotonic()
        res = subprocess.run(
            nodes.in_ns(0, [*command("start_server"), "--wait-timeout", "240"]),
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert res.returncode == 0, res.stderr[-3000:] + res.stdout
        assert f"http://{nodes.ips[0]}:{env['SERVICE_HTTP_PORT']}/v1/chat/completions" in res.stdout
        assert (log_dir / "hostfile").read_text().split("\n", 1)[
            1
        ] == f"{nodes.ips[0]} slots=1\n{nodes.ips[1]} slots=1\n"
        got = ask_from_node0(nodes, int(env["SERVICE_HTTP_PORT"]), int(env["HEALTH_HTTP_PORT"]), timeout=30)
        assert got.get("ids") == single_node_ids, got
        ranks = rank_pids(f"LOG_DIR={log_dir}")
        assert sorted(ranks) == [0, 1]
        assert namespace_of(ranks[0]) == nodes.ns[0] and namespace_of(ranks[1]) == nodes.ns[1]
        assert (log_dir / "workerlog.1").is_file()  # rank 1 logged (same disk here)
        print(f"start_server over two namespaces: ready and answered in {time.monotonic() - t0:.1f} s")
        stop = subprocess.run(
            nodes.in_ns(0, [*command("stop_server"), "30"]),
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert stop.returncode == 0, stop.stderr + stop.stdout
        assert not (log_dir / "server.pid").exists()
        deadline = time.monotonic() + 20
        while processes_of(Path(env["LOG_DIR"])) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_of(Path(env["LOG_DIR"])) == []
    finally:
        nodes.kill_all()
