"""The op library's thread pool (ops/cpu_kernels/thread_pool.cc): its workers are made once by
set_num_threads and reused by every op, sleep when idle, and survive being resized any number of
times while ops run in between (a deadlock there is caught by a subprocess with a deadline)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def ext():
    from ops import paddle_ext

    paddle_ext.load()
    yield paddle_ext
    paddle_ext.set_num_threads(1)


def thread_ids() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def some_ops(ext, n: int = 20) -> None:
    import paddle

    x, w = paddle.ones([64, 96]), paddle.ones([96, 2000])
    for _ in range(n):
        y = ext.run_op("spmd_linear", x, w)
    assert float(y[0, 0]) == 96.0


def test_workers_are_made_once_and_reused(ext):
    before = thread_ids()
    ext.set_num_threads(3)
    assert ext.num_threads() == 3
    workers = thread_ids() - before
    assert len(workers) == 2  # the caller is the third
    some_ops(ext)
    assert thread_ids() - before == workers  # no thread made (or lost) by the ops
    ext.set_num_threads(1)
    # joined: pthread_join returns once the kernel clears the thread's tid, a little before it
    # reaps the task and drops it from /proc/self/task (seen once in CI: one worker still listed)
    deadline = time.monotonic() + 10
    while thread_ids() & workers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not thread_ids() & workers


def test_idle_workers_sleep(ext):
    ext.set_num_threads(2)
    some_ops(ext)
    time.sleep(0.05)  # past the spin (0.2 ms): asleep on the futex
    cpu = time.process_time()
    time.sleep(0.5)
    assert time.process_time() - cpu < 0.1  # a spinning worker would burn ~0.5 s here


def test_resizing_between_ops_never_hangs():
    script = textwrap.dedent("""
        import paddle
        from ops import paddle_ext
        x, w = paddle.ones([20, 64]), paddle.ones([64, 700])
        for i in range(600):
            paddle_ext.set_num_threads(1 + i % 3)
            if i % 2:
                assert float(paddle_ext.run_op("spmd_linear", x, w)[19, 699]) == 64.0
            if i % 5 == 0:
                paddle_ext.set_num_threads(1 + i % 4)      # twice in a row, before the workers ran
        print("done")
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.strip().endswith("done"), out.stderr[-2000:]


def test_ops_called_from_several_python_threads_at_once(ext):
    """A second caller while the pool is busy runs its tasks inline: both get correct results."""
    import threading

    import paddle

    ext.set_num_threads(2)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((40, 128), np.float32) for _ in range(4)]
    w = rng.standard_normal((128, 520), np.float32)
    want = [x.astype(np.float64) @ w for x in xs]
    errors: list[str] = []

    def worker(i: int) -> None:
        for _ in range(20):
            y = ext.run_op("spmd_linear", paddle.to_tensor(xs[i]), paddle.to_tensor(w)).numpy()
            if not np.allclose(y, want[i], rtol=1e-4, atol=1e-3):
                errors.append(f"thread {i}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)


def test_the_worker_is_handed_the_next_linears_weights(ext):
    """gemm_ahead.h: once decode-sized linears ran in the same order twice, each hands the pool's
    first worker the weights of the one that follows it, their first 2 x L2 bytes; a linear whose
    successor just changed hands over nothing."""
    import paddle

    ext.set_num_threads(2)
    x = paddle.ones([1, 256])
    ws = [paddle.ones([256, n]) for n in (512, 640, 4096)]
    # glibc's figure, as cache_size.h reads it (Python's os.sysconf does not know the name)
    l2 = int(subprocess.run(["getconf", "LEVEL2_CACHE_SIZE"], capture_output=True, text=True).stdout or 0) or 512 << 10
    hint = ext.load().spmd_prefetch_hint

    def run(*order: int) -> tuple[int, int]:
        for i in order:
            assert float(ext.run_op("spmd_linear", x, ws[i])[0, 0]) == 256.0  # one job opened a call
        h = hint()
        return h & ((1 << 48) - 1), h >> 48  # the address, the lines

    run(0, 1, 2, 0, 1, 2)
    assert run(0) == (ws[1].data_ptr(), 256 * 640 * 4 // 64)
    assert run(1) == (ws[2].data_ptr(), min(256 * 4096 * 4, 2 * l2) // 64)
    # 0 now follows 1 (once): 1 hands over nothing, and the worker keeps 0's hint, 1's weights
    assert run(0, 1) == (ws[1].data_ptr(), 256 * 640 * 4 // 64)
