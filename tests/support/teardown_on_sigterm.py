"""A pytest plugin (tests/conftest.py imports its hook): SIGTERM becomes KeyboardInterrupt.

SIGTERM (a CI timeout, `pkill pytest`) would end pytest at once, without a single teardown,
leaving every running test server behind (both cores busy and its ports held while the next run
starts).  As KeyboardInterrupt, pytest stops the session, the teardowns run and then atexit, where
tests/support/server_process.py kills whatever server is still up.  `python -m pytest -p
tests.support.teardown_on_sigterm` loads it alone (tests/mpi/test_server_teardown_mpi.py)."""

from __future__ import annotations

import signal

import pytest


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    signal.signal(signal.SIGTERM, _interrupt)
