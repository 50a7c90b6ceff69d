"""What rank 0's hub tells every HTTP worker about the engine, unasked: readiness, draining, a
failure (`state` messages, sent when they change) and the engine loop's heartbeat (`beat`
messages: at most every BEAT_S while it turns, and at once when a step starts after an idle beat).

`EngineStateMirror` is `FrontendHub`'s base: it holds the engine-side attributes the engine loop
and the start-up code set (`ready`, `draining`, `failure`, `heartbeat`, `busy_since`) and sends
them on through the hub's `_broadcast`, so a worker's health answers read the engine's own state.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from spmd_serve.engine.wire import Message

BEAT_S = 0.25  # at most this often a heartbeat goes to the workers (and on every busy edge)


class EngineStateMirror:
    """The engine's state as the workers see it; `_broadcast` is the hub's."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.draining = threading.Event()
        self.failure = ""
        self._sent_state: tuple[bool, bool, str] | None = None
        self._heartbeat = time.monotonic()
        self._busy_since: float | None = None
        self._beat_at, self._beat_busy = 0.0, False

    def _broadcast(self, msg: Message) -> None:
        raise NotImplementedError

    # ---- the engine's heartbeat ---------------------------------------------------------------
    @property
    def heartbeat(self) -> float:
        return self._heartbeat

    @heartbeat.setter
    def heartbeat(self, now: float) -> None:
        self._heartbeat = now
        if now - self._beat_at >= BEAT_S:
            self._beat(False, now)

    @property
    def busy_since(self) -> float | None:
        return self._busy_since

    @busy_since.setter
    def busy_since(self, since: float | None) -> None:
        """A step starts (a time) or ends (None).  The start is told at once when the last beat
        said idle, so a long step never reads as a silent engine."""
        self._busy_since = since
        if since is not None and (not self._beat_busy or since - self._beat_at >= BEAT_S):
            self._beat(True, since)

    def _beat(self, busy: bool, now: float) -> None:
        self._beat_at, self._beat_busy = now, busy
        self._broadcast({"t": "beat", "busy": busy})

    # ---- ready, draining, failed ------------------------------------------------------------
    def worker_state(self) -> dict[str, Any]:
        """What a worker started now begins from (its state message's fields)."""
        return {k: v for k, v in self._state_msg(self._state()).items() if k != "t"}

    def _state(self) -> tuple[bool, bool, str]:
        return self.ready.is_set(), self.draining.is_set(), self.failure

    @staticmethod
    def _state_msg(state: tuple[bool, bool, str]) -> Message:
        return {"t": "state", "ready": state[0], "draining": state[1], "failure": state[2]}

    def _sync_state(self) -> None:
        """Ready and draining are set by other code (start-up, the signal handler): send changes."""
        state = self._state()
        if state != self._sent_state:
            self._sent_state = state
            self._broadcast(self._state_msg(state))
