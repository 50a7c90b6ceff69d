"""benchmarks/soak.py for a few seconds against `mpirun -n 2`: the mixed load runs without a failed
request, every rank and the HTTP worker answer the heap report (SIGUSR2, worker/malloc.py) while
they serve and stay up, and every KV block is free afterwards.  The 30-minute run's curve is in
benchmarks/RESULTS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server_process import mpi_env

pytestmark = pytest.mark.mpi
SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def test_short_soak_reports_every_ranks_heap(served_tp2, tmp_path):
    out = tmp_path / "soak.json"
    args = ["--minutes", "0.25", "--clients", "3", "--sample-s", "5", "--model-dir", str(served_tp2)]
    done = subprocess.run(
        [sys.executable, str(SOAK), *args, "--json", str(out), "--log", str(tmp_path / "server.log")],
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert result["all_blocks_free"] and len(rows) >= 2
    assert rows[-1]["requests"] > 0 and all(row["errors"] == 0 for row in rows)
    assert not [k for k in result["tally"] if k.endswith("_error")]
    for row in rows:  # -1 would mean a rank did not answer its SIGUSR2
        for who in ("rank0", "rank1", "http0"):
            assert row[f"{who}_in_use_mb"] > 0 and row[f"{who}_free_held_mb"] >= 0
            assert row[f"{who}_rss_mb"] > 0 and row[f"{who}_py_kblocks"] > 0
