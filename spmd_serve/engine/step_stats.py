"""Per-step timing of the engine loop, so a regression can be located without a profiler.

Phases of one step (DESIGN §2), each timed by rank 0's engine thread with `with stats.phase(p):`
(timing.py's `PhaseTimer`): `schedule` (and within it `draft`: the speculative proposer, with a
draft model's own plans on every rank; 0 without speculation), `broadcast` (building the StepPlan and sending it),
`execute`, `sample`, `update` (the scheduler's update and the metrics).  `execute` is split further
by the ModelRunner into its own `PhaseTimer` (every graph segment, the allreduce / logits gather
collectives, the KV-cache writes, `host_io`: the copies into and out of the graphs);
`execute_other` is what is left of `execute` (feed building, the grid split).  A step ends once
its metrics are recorded; only then are its outputs published, so a client that holds its answer
also finds the step in /metrics.  `io_handoff` is measured where the
outputs arrive: from the engine publishing a batch to the front end's loop delivering it into the
requests' queues (an HTTP worker reports its sums to rank 0 every 0.2 s and before answering a
scrape) — it grows when a worker's loop is the bottleneck.

The sums are plain floats (a phase costs ~0.3 µs); Prometheus reads them at scrape time through
`EngineMetrics.watch_steps`, and the optional log line (SPMD_LOG_STEP_EVERY=N) prints the
average of the last N steps, so a change shows up in the next line rather than being diluted by
the whole run's history.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from spmd_serve.timing import PhaseTimer

log = logging.getLogger("spmd_serve.engine")
PHASES = ("schedule", "draft", "broadcast", "execute", "sample", "update")


@dataclass
class StepStats:
    log_every: int = 0  # 0: never log
    steps: int = 0
    tokens: int = 0  # scheduled tokens (prefill + decode)
    sampled: int = 0  # generated tokens
    drafts: int = 0  # speculative draft tokens verified
    accepted: int = 0  # ... and accepted
    timer: PhaseTimer = field(default_factory=lambda: PhaseTimer(PHASES))
    runner: PhaseTimer | None = None  # the model runner's split of `execute`, if it has one
    handoff_seconds: float = 0.0  # publish → delivered on the front end's loop, summed over batches
    handoffs: int = 0  # batches delivered
    on_step: Callable[[float], None] | None = None  # observes each step's wall time (metrics)
    _t0: float = 0.0
    _last: dict[str, float] = field(default_factory=dict)  # totals at the previous log line
    _lock: threading.Lock = field(default_factory=threading.Lock)  # handoff: from an IO thread too

    def start(self) -> StepStats:
        """A step begins (its wall time, for `on_step`, runs from here to `end_step`)."""
        self._t0 = time.perf_counter()
        return self

    def phase(self, name: str) -> AbstractContextManager[None]:
        """`with stats.phase("execute"): ...` (one of PHASES)."""
        return self.timer.phase(name)

    def record_handoff(self, seconds: float, batches: int = 1) -> None:
        """`batches` published batches were delivered `seconds` (summed) after their publication:
        called on the IO thread, or by the hub with a worker process's report."""
        with self._lock:
            self.handoff_seconds += seconds
            self.handoffs += batches

    def end_step(self, num_tokens: int, num_sampled: int, num_drafts: int = 0, num_accepted: int = 0) -> None:
        self.steps += 1
        self.tokens += num_tokens
        self.sampled += num_sampled
        self.drafts += num_drafts
        self.accepted += num_accepted
        if self.on_step is not None:
            self.on_step(time.perf_counter() - self._t0)
        if self.log_every and self.steps % self.log_every == 0:
            log.info("%s", self.window_summary())

    def totals(self) -> dict[str, float]:
        """Cumulative seconds by phase, the runner's parts and `execute_other` included."""
        out = self.timer.snapshot()
        if self.runner is not None:
            parts = self.runner.snapshot()
            out.update(parts)
            out["execute_other"] = max(out["execute"] - sum(parts.values()), 0.0)
        out["io_handoff"] = self.handoff_seconds
        return out

    def _counts(self) -> dict[str, float]:
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "sampled": self.sampled,
            "handoffs": self.handoffs,
            "drafts": self.drafts,
            "accepted": self.accepted,
        }

    def window_summary(self) -> str:
        """Averages over the steps since the previous call (the log line)."""
        now = {**self.totals(), **{f"n_{k}": v for k, v in self._counts().items()}}
        last, self._last = self._last, now
        d = {k: v - last.get(k, 0.0) for k, v in now.items()}
        return self._format(
            d["n_steps"],
            d["n_tokens"],
            d["n_sampled"],
            d["n_handoffs"],
            {k: v for k, v in d.items() if not k.startswith("n_")},
            (d["n_drafts"], d["n_accepted"]),
        )

    def summary(self) -> str:
        """Averages over the whole run (the shutdown line)."""
        spec = (float(self.drafts), float(self.accepted))
        return self._format(self.steps, self.tokens, self.sampled, self.handoffs, self.totals(), spec)

    @staticmethod
    def _format(
        steps: float,
        tokens: float,
        sampled: float,
        handoffs: float,
        seconds: dict[str, float],
        spec: tuple[float, float] = (0.0, 0.0),
    ) -> str:
        """`batch` is generated tokens per step; with speculation also the drafts verified and
        accepted (per step)."""
        n = max(steps, 1)
        parts = " ".join(
            f"{p}={1e3 * s / (max(handoffs, 1) if p == 'io_handoff' else n):.3f}ms" for p, s in seconds.items()
        )
        drafts = f" drafts={spec[0] / n:.2f} accepted={spec[1] / n:.2f}" if spec[0] else ""
        line = f"steps={steps:.0f} tokens={tokens:.0f} sampled={sampled:.0f} batch={sampled / n:.1f}{drafts}"
        return f"{line} per-step: {parts}"

    def as_dict(self) -> dict[str, Any]:
        n = max(self.steps, 1)
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "sampled": self.sampled,
            "drafts": self.drafts,
            "accepted": self.accepted,
            "ms_per_step": {p: 1e3 * s / n for p, s in self.totals().items()},
        }
