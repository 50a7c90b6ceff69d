"""The GPU runner's skeleton (docs/gpu.md): NOT BUILT YET.  It selects the rank's device, then stops
start-up with one line saying so and how to serve on the CPU instead (`SPMD_DEVICE=cpu`).

What exists and is tested without a GPU: the device choice (worker/device.py) and the device KV pool's
pointer/stream plumbing into the ops/ kernels (worker/device_kv.py, run on the kernels' CPU emulation).
What docs/gpu.md lists as still to build: paddlepaddle-gpu predictors on the chosen device sharing one
exec stream, the pool allocated in device memory, the step's inputs uploaded once per step, NCCL
collectives, logits sampled on the device.  The methods below are the `Runner` interface
(engine/interfaces.py) it will fill; none runs today.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from spmd_serve.config import ConfigError
from spmd_serve.protocol import StepPlan
from spmd_serve.timing import PhaseTimer
from spmd_serve.worker.device import DeviceChoice, rank_device

NOT_BUILT = (
    "rank {rank}: this Paddle is built with CUDA ({device} found), but the GPU runner is not built yet "
    "(docs/gpu.md): every rank would run on the CPU. Set SPMD_DEVICE=cpu to serve on the CPU with this "
    "paddlepaddle-gpu install, or install the CPU paddlepaddle wheel"
)


class GpuModelRunner:
    """The `Runner` of a rank on its GPU.  Refuses at construction (after the device check), so a
    paddlepaddle-gpu install never silently serves on the CPU while the docs say GPU."""

    def __init__(self, model_dir: str | Path, rank: int, comm, num_blocks: int, block_size: int, *_a, **_kw) -> None:
        self.device: DeviceChoice = rank_device(os.environ)  # a missing device is the first error
        raise ConfigError(NOT_BUILT.format(rank=rank, device=self.device))

    @property
    def timings(self) -> PhaseTimer | None:
        raise NotImplementedError("GPU runner: docs/gpu.md")

    def execute(self, plan: StepPlan) -> np.ndarray | None:
        raise NotImplementedError("GPU runner: docs/gpu.md")

    def take_stats(self) -> Mapping[str, np.ndarray]:
        raise NotImplementedError("GPU runner: docs/gpu.md")
