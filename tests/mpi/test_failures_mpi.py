"""How the job fails: bad configuration and broken model directories end every rank fast with one
clear line (no traceback, no hang); an exception on one rank ends the whole job; idle ranks sleep,
and so does a rank that waits for a slower one at start-up or exit (`dist/comm.meet`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from tests.support.failing_jobs import error_lines, run_job, run_with_busy_port
from tests.support.server_process import ServerProcess, mpi_env, mpirun

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize(
    "var,value,expect",
    [
        ("BATCH_SIZE", "0", "BATCH_SIZE=0"),
        ("BLOCK_RATIO", "1.5", "BLOCK_RATIO=1.5"),
        ("PUSH_MODE_HTTP_PORT", "http", "PUSH_MODE_HTTP_PORT=http"),  # legacy alias, named as given
        ("BLOCK_BS", "100000000", "largest BLOCK_BS that fits"),  # KV pool larger than memory
        ("USE_CACHE_KV_INT8", "2", "USE_CACHE_KV_INT8=2 is invalid"),
    ],
)
def test_bad_value_stops_every_rank_with_one_line(served_tp2, var, value, expect):
    t0 = time.monotonic()
    res = run_job(2, MODEL_DIR=str(served_tp2), MP_NUM="2", **{var: value})
    assert res.returncode != 0 and time.monotonic() - t0 < 60
    lines = error_lines(res)
    assert lines and all(expect in l for l in lines), res.stderr[-2000:]
    assert "Traceback" not in res.stdout + res.stderr


def test_world_size_must_match_mp_num(served_tp2):
    res = run_job(1, MODEL_DIR=str(served_tp2), MP_NUM="2")
    assert res.returncode != 0
    assert any("MP_NUM=2" in l and "world size is 1" in l for l in error_lines(res)), res.stderr[-2000:]


def test_missing_rank_folder_is_named(served_tp2, tmp_path):
    broken = tmp_path / "model"
    shutil.copytree(served_tp2, broken)
    shutil.rmtree(broken / "rank_1")
    res = run_job(2, MODEL_DIR=str(broken), MP_NUM="2")
    assert res.returncode != 0
    assert any("rank_1" in l for l in error_lines(res)), res.stderr[-2000:]
    assert "Traceback" not in res.stdout + res.stderr


def test_exception_on_one_rank_ends_the_job(served_tp2, tmp_path):
    broken = tmp_path / "model"
    shutil.copytree(served_tp2, broken)
    (broken / "rank_1" / "seg_0.json").write_text("{}")  # only rank 1 fails to load: Paddle raises
    t0 = time.monotonic()
    res = run_job(2, MODEL_DIR=str(broken), MP_NUM="2")
    assert res.returncode != 0 and time.monotonic() - t0 < 60
    assert "fatal error on rank 1" in res.stderr, res.stderr[-3000:]


def test_a_corrupt_parameter_file_on_one_rank_is_named(served_tp2, tmp_path):
    broken = tmp_path / "model"
    shutil.copytree(served_tp2, broken)
    (broken / "rank_1" / "seg_0.pdiparams").write_bytes(b"corrupt")
    t0 = time.monotonic()
    res = run_job(2, MODEL_DIR=str(broken), MP_NUM="2")
    assert res.returncode != 0 and time.monotonic() - t0 < 60
    lines = error_lines(res)
    want = "rank_1/seg_0.pdiparams: not a Paddle parameter file"
    assert any(want in line and "re-export the model (on ranks [1])" in line for line in lines), res.stderr[-2000:]
    assert "Traceback" not in res.stdout + res.stderr


def test_idle_ranks_do_not_spin(served_tp2, tmp_path):
    with ServerProcess(2, served_tp2, tmp_path / "server.log") as srv:
        procs = [psutil.Process(p) for p in srv.rank_pids()]
        for p in procs:
            p.cpu_percent(None)
        time.sleep(3)
        usage = [p.cpu_percent(None) for p in procs]
    assert len(usage) == 2 and max(usage) < 25, f"idle ranks use {usage} % CPU"


def test_busy_port_is_named(served_tp2):
    t0 = time.monotonic()
    res, port = run_with_busy_port(served_tp2, "SERVICE_HTTP_PORT")
    assert res.returncode != 0 and time.monotonic() - t0 < 60
    lines = error_lines(res)
    assert len(lines) == 1 and str(port) in lines[0] and "SERVICE_HTTP_PORT" in lines[0], res.stderr[-2000:]


# rank 0 arrives 2 s late; rank 1 reports the CPU seconds it used while waiting in `meet`
MEET_PROBE = """
import time
from mpi4py import MPI
from spmd_serve.dist.comm import meet
comm = MPI.COMM_WORLD
if comm.rank == 0:
    time.sleep(2.0)
t, cpu = time.monotonic(), time.process_time()
meet(comm)
if comm.rank == 1:
    print(f"waited {time.monotonic() - t:.2f} s using {time.process_time() - cpu:.3f} s CPU")
"""


def test_a_rank_waiting_for_a_slower_one_sleeps():
    """A blocking MPI barrier busy-polls: in its place rank 1 used 0.51 s of CPU in the 2 s even
    beside a hogged CI run on 2 cores (all of the 2 s alone); `meet` polls an Ibarrier with 2 ms
    sleeps: 0.01 s."""
    cmd = mpirun(2, sys.executable, "-c", MEET_PROBE)
    res = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    waited, cpu = map(float, re.findall(r"[\d.]+", res.stdout)[:2])
    assert waited >= 1.5 and cpu < 0.2, res.stdout


HUNG = """
import time
from mpi4py import MPI
def rank_waits_here(rank):
    time.sleep(600)
rank_waits_here(MPI.COMM_WORLD.Get_rank())
"""


def test_a_hung_test_job_fails_with_each_ranks_stack():
    """tests/support/mpi_job.run_mpi: a driver past its time fails the test with the line every
    rank was on (a hang in CI had said nothing but the command)."""
    from tests.support.mpi_job import run_mpi

    t = time.monotonic()
    with pytest.raises(AssertionError) as err:
        run_mpi(mpirun(2, sys.executable, "-c", HUNG), mpi_env(), timeout=8)
    assert time.monotonic() - t < 8 + 30  # the stacks, then the job ends (no 600-s sleep)
    assert str(err.value).count("in rank_waits_here") == 2, str(err.value)
