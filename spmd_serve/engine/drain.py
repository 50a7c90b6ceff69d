"""How rank 0's engine stops after the first SIGTERM (`Engine.run`): nothing new is admitted, the
requests in flight run on until they finish or SPMD_DRAIN_TIMEOUT_S passes, or a second SIGTERM
aborts them at once.  `Drain` decides when the loop may end, logs what it waits for and what it
aborts, and words the error frame of a request the stop ended."""

from __future__ import annotations

import logging
import time

from spmd_serve.scheduler.scheduler import Scheduler

log = logging.getLogger("spmd_serve.engine")
DEFAULT_DRAIN_TIMEOUT_S = 60.0  # how long in-flight requests may take (SPMD_DRAIN_TIMEOUT_S)


def in_flight(scheduler: Scheduler, show: int = 4) -> str:
    """'N request(s) in flight (id: done of max tokens, ...)': what a drain waits for or aborts."""
    reqs = [*scheduler.running, *scheduler.waiting]
    each = ", ".join(f"{r.req_id}: {r.num_output_tokens} of {r.params.max_tokens} tokens" for r in reqs[:show])
    return f"{len(reqs)} request(s) in flight ({each}{', ...' if len(reqs) > show else ''})"


class Drain:
    def __init__(self, timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.deadline: float | None = None  # set by the first `done` call: the drain has begun

    def done(self, scheduler: Scheduler, abort: bool) -> bool:
        """May the loop end now?  Yes once nothing is in flight, the timeout has passed, or `abort`
        (a second signal asked for it); until then in-flight requests keep running."""
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.timeout_s
            if scheduler.has_unfinished():
                log.info(
                    "draining: %s may take up to %g s (a second SIGTERM aborts them now)",
                    in_flight(scheduler),
                    self.timeout_s,
                )
        if not scheduler.has_unfinished():
            return True
        if abort or now >= self.deadline:
            why = "abort requested" if abort else f"drain timeout of {self.timeout_s:g} s passed"
            log.warning("%s: aborting %s", why, in_flight(scheduler))
            return True
        return False

    def error_message(self) -> str:
        """The error frame's text for a request the stop ended."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "server is shutting down: the request did not finish within the drain timeout"
        return "server is shutting down"
