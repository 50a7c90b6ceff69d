"""Liveness and readiness of rank 0's engine (CONTRACT.md §6) as pure functions of the
EngineClient, read without touching the engine thread; the HTTP health routes
(`frontend.server.health`) and the gRPC ServerLive/ServerReady/ModelReady answer from them.

live  = the engine loop beat recently, or a step is in progress (a long prefill is not a hang) and
        has not run longer than a generous bound (a step stuck in a collective is a hang), and
        no rank is known to have died (`client.failure`, set by the PeerWatch);
ready = every rank has loaded its model (`client.ready`), none has died, and the server is not
        draining.
"""

from __future__ import annotations

import time

from spmd_serve.engine.client import EngineClient

DEFAULT_LIVE_THRESHOLD_S = 10.0
# One step is at most SPMD_MAX_NUM_BATCHED_TOKENS tokens (chunked prefill), seconds even for a big
# model on CPU; a step this long means a rank is stuck (e.g. a peer hung inside a collective).
DEFAULT_STEP_LIMIT_S = 300.0


def is_live(
    client: EngineClient, threshold_s: float = DEFAULT_LIVE_THRESHOLD_S, step_limit_s: float = DEFAULT_STEP_LIMIT_S
) -> tuple[bool, str]:
    """(alive?, reason when not)."""
    if client.failure:
        return False, client.failure
    busy_since = client.busy_since  # read once: the engine thread clears it
    if busy_since is not None:  # inside a step: it beats again when the step ends
        busy = time.monotonic() - busy_since
        if busy < step_limit_s:
            return True, ""
        return False, (f"an engine step has been running for {busy:.0f} s (limit {step_limit_s:g} s): a rank is stuck")
    age = time.monotonic() - client.heartbeat
    if age < threshold_s:
        return True, ""
    return False, f"engine loop has not reported for {age:.1f} s (limit {threshold_s:g} s)"


def is_ready(client: EngineClient) -> tuple[bool, str]:
    """(ready?, reason when not)."""
    if client.failure:
        return False, client.failure
    if client.draining.is_set():
        return False, "server is shutting down"
    if not client.ready.is_set():
        return False, "model is not loaded yet"
    return True, ""
