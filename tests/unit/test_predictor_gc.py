"""worker/predictor.py's batch_paddle_gc: Paddle's executor frees garbage in batches (not one
spinning-thread task per tensor), unless the user set the flag (each case in a fresh interpreter:
the flag is process-wide)."""

from __future__ import annotations

import os
import subprocess
import sys

from spmd_serve.worker.predictor import GC_BATCH_GB

PROBE = (
    "import paddle\n"
    "from spmd_serve.worker.predictor import batch_paddle_gc\n"
    "batch_paddle_gc()\n"
    "print(paddle.get_flags(['FLAGS_eager_delete_tensor_gb'])['FLAGS_eager_delete_tensor_gb'])\n"
)


def _flag_after(env_value: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if k != "FLAGS_eager_delete_tensor_gb"}
    if env_value is not None:
        env["FLAGS_eager_delete_tensor_gb"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def test_predictors_free_paddle_garbage_in_batches() -> None:
    assert GC_BATCH_GB > 0  # 0 is Paddle's one-task-per-tensor default; < 0 would never free
    assert _flag_after(None) == GC_BATCH_GB


def test_a_value_the_user_set_is_kept() -> None:
    assert _flag_after("0") == 0.0
