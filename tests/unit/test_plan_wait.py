"""A worker rank's wait for the next step's plan (dist/comm.py `recv_plan`): it tests the pending
header broadcast without sleeping for PLAN_SPIN_S (a plan that follows the last step closely is
taken at once, not up to a sleep late) and only then sleep-polls (an idle worker does not keep its
core busy).  The MPI communicator here is a stand-in that completes the broadcast at a set time."""

from __future__ import annotations

import time

import numpy as np
import pytest

from spmd_serve.dist import comm as comm_module
from spmd_serve.protocol import SHUTDOWN, StepPlan


class _Pending:
    """The header Ibcast: complete (the header written) once `ready_at` has passed."""

    def __init__(self, buf: np.ndarray, header: np.ndarray, ready_at: float) -> None:
        self.buf, self.header, self.ready_at = buf, header, ready_at

    def Test(self) -> bool:  # noqa: N802 (mpi4py's name)
        if time.monotonic() < self.ready_at:
            return False
        self.buf[:] = self.header
        return True


class _Comm:
    """Rank 1 of 2; rank 0 sends `plan` `delay_s` after the worker starts waiting."""

    def __init__(self, plan: StepPlan, delay_s: float) -> None:
        self.plan, self.delay_s = plan, delay_s

    def Get_rank(self) -> int:  # noqa: N802
        return 1

    def Get_size(self) -> int:  # noqa: N802
        return 2

    def Ibcast(self, buf: np.ndarray, root: int) -> _Pending:  # noqa: N802
        return _Pending(buf, self.plan.header(), time.monotonic() + self.delay_s)

    def Bcast(self, buf: np.ndarray, root: int) -> None:  # noqa: N802
        buf[:] = self.plan.payload()


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When each sleep of recv_plan began (time.monotonic())."""
    began: list[float] = []
    real = time.sleep

    def sleep(seconds: float) -> None:
        began.append(time.monotonic())
        real(seconds)

    monkeypatch.setattr(comm_module.time, "sleep", sleep)
    return began


def test_a_plan_within_the_spin_window_is_taken_without_sleeping(sleeps: list[float]) -> None:
    start = time.monotonic()
    got = comm_module.Comm(_Comm(StepPlan.shutdown(7), comm_module.PLAN_SPIN_S / 3)).recv_plan()
    assert (got.kind, got.step_id) == (SHUTDOWN, 7)
    # none inside the window (a sleep after it only if this process was descheduled that long)
    assert all(t >= start + comm_module.PLAN_SPIN_S for t in sleeps), [t - start for t in sleeps]


def test_a_late_plan_is_sleep_polled_after_the_window(sleeps: list[float]) -> None:
    delay = comm_module.PLAN_SPIN_S + 0.3
    start = time.monotonic()
    got = comm_module.Comm(_Comm(StepPlan.shutdown(8), delay)).recv_plan()
    assert got.step_id == 8 and time.monotonic() - start >= delay
    assert len(sleeps) >= 2  # 0.3 s past the window: an idle worker sleeps between its tests
    assert all(t >= start + comm_module.PLAN_SPIN_S for t in sleeps)
