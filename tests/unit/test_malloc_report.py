"""worker/malloc.py's heap report, what benchmarks/soak.py reads to tell a leak from retention: a live
allocation counts as `in_use`, a freed one leaves it (it may stay mapped as `free_held`), and SIGUSR2
prints one `heap-report {json}` line without disturbing the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spmd_serve.worker.malloc import heap_stats, rss_bytes

pytestmark = pytest.mark.skipif(heap_stats() is None, reason="glibc < 2.33: no mallinfo2")


def test_in_use_follows_live_allocations():
    before = heap_stats()
    blocks = [bytearray(1 << 20) for _ in range(64)]  # 64 MiB live
    during = heap_stats()
    assert during["in_use"] - before["in_use"] >= 63 << 20
    del blocks
    after = heap_stats()
    assert after["in_use"] - before["in_use"] < 8 << 20  # freed: no longer in use, whatever glibc keeps
    assert rss_bytes() > 0


def test_sigusr2_prints_a_heap_report():
    code = (
        "import os, signal, sys, time\n"
        "from spmd_serve.worker.malloc import install_heap_report\n"
        "install_heap_report('http3')\n"
        "os.kill(os.getpid(), signal.SIGUSR2)\n"
        "time.sleep(0.2)\n"
        "print('alive')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ)
    assert done.returncode == 0 and done.stdout.strip() == "alive", done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("heap-report ")]
    report = json.loads(line.removeprefix("heap-report "))
    assert report["who"] == "http3" and report["py_blocks"] > 0 and report["rss"] > 0
    assert report["in_use"] > 0 and report["free_held"] >= 0
