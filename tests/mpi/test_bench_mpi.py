"""`spmd_serve bench` end to end against a real `mpirun -n 2` server (demo-tiny TP=2): every
backend, a tiny load, the JSON fields and counts, the PNGs; and the step-phase metrics in
/metrics growing with the requests."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import requests

from tests.support.metrics_scrape import Samples
from tests.support.server_process import ServerProcess, mpi_env

pytestmark = pytest.mark.mpi
BACKENDS = ("openai-completions", "openai-chat", "native", "grpc")


@pytest.fixture(scope="module")
def server(served_tp2, tmp_path_factory):
    with ServerProcess(2, str(served_tp2), tmp_path_factory.mktemp("log") / "server.log") as s:
        yield s


def _metrics(server: ServerProcess) -> Samples:
    return Samples(requests.get(f"http://127.0.0.1:{server.env['METRICS_HTTP_PORT']}/metrics", timeout=10).text)


def test_every_backend_end_to_end(server, served_tp2, tmp_path):
    metrics_url = f"http://127.0.0.1:{server.env['METRICS_HTTP_PORT']}/metrics"
    for backend in BACKENDS:
        base = (
            f"127.0.0.1:{server.env['SERVICE_GRPC_PORT']}"
            if backend == "grpc"
            else f"http://127.0.0.1:{server.http_port}"
        )
        out, plots = tmp_path / f"{backend}.json", tmp_path / backend
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "spmd_serve",
                "bench",
                "--backend",
                backend,
                "--base-url",
                base,
                "--tokenizer",
                str(served_tp2),
                "--input-len",
                "12",
                "--output-len",
                "5",
                "--num-prompts",
                "4",
                "--concurrency",
                "1,2",
                "--json",
                str(out),
                "--metrics-url",
                metrics_url,
                # the plots do not depend on the backend: drawn once (matplotlib is seconds a run)
                *(["--plot-dir", str(plots)] if backend == BACKENDS[0] else []),
            ],
            env=mpi_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc = json.loads(out.read_text())
        assert doc["config"]["backend"] == backend
        assert [r["concurrency"] for r in doc["runs"]] == [1, 2]
        for run in doc["runs"]:
            assert (run["completed"], run["failed"], run["errors"]) == (4, 0, []), run
            assert run["total_output_tokens"] == 20
            if backend != "openai-chat":
                assert run["total_input_tokens"] == 48
            for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
                assert set(run[key]) == {"mean", "median", "std", "p99"} and run[key]["median"] > 0
            assert run["request_throughput"] > 0 and run["output_throughput"] > 0
            phases = run["server_step_phases"]
            assert phases["steps"] >= 5 and {
                "schedule",
                "execute",
                "allreduce",
                "gather_logits",
                "segment_0",
                "io_handoff",
            } <= set(phases["ms_per_step"])
        assert "out tok/s" in proc.stdout
    plots = tmp_path / BACKENDS[0]
    assert sorted(p.name for p in plots.iterdir()) == ["itl_hist.png", "latency.png", "throughput.png", "ttft_hist.png"]
    assert all(p.stat().st_size > 1000 for p in plots.iterdir())


def test_step_phase_metrics_grow(server):
    before = _metrics(server)
    phases = {dict(k[1]).get("phase") for k in before.values if k[0] == "spmd_serve:step_phase_seconds_total"}
    assert {
        "schedule",
        "broadcast",
        "execute",
        "sample",
        "update",
        "allreduce",
        "gather_logits",
        "kv_write",
        "host_io",
        "execute_other",
        "io_handoff",
        "segment_0",
    } <= phases
    r = requests.post(server.url, json={"text": "hi", "max_dec_len": 6, "min_dec_len": 6}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens_all_num"] == 6
    after = _metrics(server)
    assert after.delta(before, "step_duration_seconds_count") >= 6
    assert after.delta(before, "io_handoffs_total") >= 6
    assert after.delta(before, "step_sampled_tokens_total") >= 6
    for phase in ("execute", "allreduce", "segment_0", "host_io", "sample", "io_handoff"):
        assert after.delta(before, "step_phase_seconds_total", phase=phase) > 0
