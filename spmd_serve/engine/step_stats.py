"""Per-step timing of the engine loop (schedule, broadcast, execute, sample, update), summed over
steps so a regression can be located without a profiler; logged every N steps when asked."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger("spmd_serve.engine")
PHASES = ("schedule", "broadcast", "execute", "sample", "update")


@dataclass
class StepStats:
    log_every: int = 0                       # 0: never log
    steps: int = 0
    tokens: int = 0                          # scheduled tokens (prefill + decode)
    sampled: int = 0                         # generated tokens
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    _t: float = 0.0

    def start(self) -> None:
        self._t = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] += now - self._t
        self._t = now

    def end_step(self, num_tokens: int, num_sampled: int) -> None:
        self.steps += 1
        self.tokens += num_tokens
        self.sampled += num_sampled
        if self.log_every and self.steps % self.log_every == 0:
            log.info("%s", self.summary())

    def summary(self) -> str:
        n = max(self.steps, 1)
        parts = " ".join(f"{p}={1e3 * s / n:.3f}ms" for p, s in self.seconds.items())
        return f"steps={self.steps} tokens={self.tokens} sampled={self.sampled} per-step: {parts}"

    def as_dict(self) -> dict:
        return {"steps": self.steps, "tokens": self.tokens, "sampled": self.sampled,
                "ms_per_step": {p: 1e3 * s / max(self.steps, 1) for p, s in self.seconds.items()}}
