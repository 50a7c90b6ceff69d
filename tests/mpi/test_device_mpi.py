"""`SPMD_DEVICE` at start-up under `mpirun -n 2`: asking for the GPU runner on this CPU Paddle stops
every rank with one line, after the front end started (rank 0 starts its HTTP workers before the shard
loads) and without leaving an HTTP worker holding the public port; `SPMD_DEVICE=cpu` serves as today."""

from __future__ import annotations

import socket

import pytest

from tests.support.failing_jobs import error_lines, run_job
from tests.support.server_process import ServerProcess, free_ports, greedy_ids

pytestmark = pytest.mark.mpi


def test_gpu_runner_on_a_cpu_paddle_is_one_line_and_leaves_nothing(served_tp2):
    (http_port,) = free_ports(1)
    res = run_job(2, 300, MP_NUM="2", MODEL_DIR=str(served_tp2), SPMD_DEVICE="gpu", SERVICE_HTTP_PORT=str(http_port))
    assert res.returncode != 0
    assert error_lines(res) == [
        "spmd_serve: error: SPMD_DEVICE=gpu: this Paddle is built without CUDA; install paddlepaddle-gpu"
    ], res.stdout + res.stderr
    with socket.socket() as s:  # no HTTP worker outlived the job on its port
        s.bind(("127.0.0.1", http_port))


def test_cpu_runner_serves(served_tp2, tmp_path):
    with ServerProcess(2, served_tp2, tmp_path / "server.log", SPMD_DEVICE="cpu") as srv:
        assert len(greedy_ids(srv.url, [1, 5, 9], 4)) == 4
