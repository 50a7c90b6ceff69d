"""How rank 0's engine stops after the first SIGTERM (`Engine.run`): nothing new is admitted, the
requests in flight run on until they finish or SPMD_DRAIN_TIMEOUT_S passes, or a second SIGTERM
aborts them at once.  `Drain` decides when the loop may end, logs what it waits for and what it
aborts, and words the error frame of a request the stop ended."""

from __future__ import annotations

import logging
import time

from spmd_serve.scheduler.request import Request

log = logging.getLogger("spmd_serve.engine")
DEFAULT_DRAIN_TIMEOUT_S = 60.0  # how long in-flight requests may take (SPMD_DRAIN_TIMEOUT_S)


def in_flight(reqs: list[Request], show: int = 4) -> str:
    """'N request(s) in flight (id: done of max tokens, ...)': what a drain waits for or aborts."""
    each = ", ".join(f"{r.req_id}: {r.num_output_tokens} of {r.params.max_tokens} tokens" for r in reqs[:show])
    return f"{len(reqs)} request(s) in flight ({each}{', ...' if len(reqs) > show else ''})"


class Drain:
    def __init__(self, timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.deadline: float | None = None  # set by the first `done` call: the drain has begun

    def done(self, reqs: list[Request], abort: bool) -> bool:
        """May the loop end now (`reqs`: the requests in flight)?  Yes once there are none, the
        timeout has passed, or `abort` (a second signal asked for it); until then they keep running."""
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.timeout_s
            if reqs:
                log.info(
                    "draining: %s may take up to %g s (a second SIGTERM aborts them now)",
                    in_flight(reqs),
                    self.timeout_s,
                )
        if not reqs:
            return True
        if abort or now >= self.deadline:
            why = "abort requested" if abort else f"drain timeout of {self.timeout_s:g} s passed"
            log.warning("%s: aborting %s", why, in_flight(reqs))
            return True
        return False

    def error_message(self) -> str:
        """The error frame's text for a request the stop ended."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "server is shutting down: the request did not finish within the drain timeout"
        return "server is shutting down"
