"""What the engine needs of the MPI layer, of a model runner and of the front end's hand-off, as
structural types.

The engine is written against these, not against `dist.comm.Comm` and `worker.ModelRunner`
themselves, so that the scheduler-driven loop runs with a fake runner in unit tests and so that
another runner (the GPU one of docs/gpu.md) only has to provide the same methods.  Neither
`dist/` nor `worker/` imports this module: they match it by shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np
import numpy.typing as npt

from spmd_serve.engine.client import Command
from spmd_serve.engine.outputs import RequestOutput
from spmd_serve.protocol import StepPlan
from spmd_serve.timing import PhaseTimer


class PlanComm(Protocol):
    """Rank 0 sends each step's plan; the other ranks receive it (dist/comm.py)."""

    def send_plan(self, plan: StepPlan) -> None: ...

    def recv_plan(self) -> StepPlan: ...


class Runner(Protocol):
    """Runs a plan on this rank's shard: [B, V] float32 logits on rank 0, None on the others."""

    @property
    def timings(self) -> PhaseTimer | None:
        """Its split of the `execute` phase, if it keeps one (engine/step_stats.py reads it)."""

    def execute(self, plan: StepPlan) -> npt.NDArray[np.float32] | None: ...

    def take_stats(self) -> Mapping[str, npt.NDArray[np.int64]]:
        """Per-step model statistics since the last call, `<metric>:<layer>` → values (e.g. tokens
        routed to each expert of a MoE layer, int8 KV entries clipped per cache tensor), for
        /metrics; cleared on read."""
        ...


class FrontEnd(Protocol):
    """The engine thread's side of the hand-off with the front end: the in-process EngineClient
    (tests, the offline engine) or rank 0's FrontendHub, which talks to the HTTP worker processes."""

    heartbeat: float  # set every loop turn: health's liveness
    busy_since: float | None  # set while a step executes (a long prefill is no hang)
    on_handoff: Callable[[float, int], None] | None  # (seconds, batches) publish → delivered

    def take_commands(self) -> list[Command]: ...

    def publish(self, outputs: list[RequestOutput]) -> None: ...

    def wait_for_work(self, timeout: float) -> None: ...

    def wake(self) -> None:
        """From any thread: end a `wait_for_work` now."""
