"""The step-level rule of speculative decoding: does this step speculate at all?

The per-request rule (engine/speculative.py) keeps drafting the requests whose drafts are
accepted, but acceptance alone does not say that drafting pays: a model proposer (draft_model,
mtp) runs draft plans whose cost on this CPU is close to a target step's whatever the batch, so
drafts that are mostly right still made a full batch 1.4-3x slower (benchmarks/RESULTS.md
"Speculative decoding": draft_model 0.77x, mtp 0.3x at batch 32), while at batch 1 the same drafts
pay or nearly do.  The issue's rule is that speculation must never make a full batch slower.

So the gate measures what matters, each mode's seconds per generated token on decode-only steps
(draft plans, verification and the proposer's follow-up included), as the median of its last
`WINDOW` steps per batch-size class (powers of two; a median, because one slow step — a graph's
first run, another process taking the core — once made plain decoding look 3x dearer than it is
for the rest of a request), and each step takes the cheaper mode; the other is tried again every
`EXPLORE_EVERY` steps at first, then twice as long after each try that changed nothing (up to
`EXPLORE_MAX`), so a batch whose text starts repeating wins speculation back.  A class
that has not measured both modes (`MIN_SAMPLES` steps each) follows the nearest class that has;
with none, speculation is tried first, then plain.  Steps with prompt chunks are not
measured (their cost is the prefill's) and use the current choice.  Steps of fewer than
`GATE_MIN_BATCH` sequences always speculate: there a few more query tokens cost the launch-bound
step almost nothing, n-gram drafts are free (2.4x at batch 1), and a model proposer is the user's
choice for the model and hardware at hand (here, on a CPU, it loses at every batch size: RESULTS);
it also keeps small batches, where the tests check speculation's mechanics, free of timing.  Outputs never depend on the
choice: a plain step is a step whose drafts are empty.
"""

from __future__ import annotations

import statistics
from collections import deque

GATE_MIN_BATCH = 8  # sequences: smaller steps always speculate (the request rule alone decides)
EXPLORE_EVERY = 16  # steps between two tries of the mode that is losing, at first
EXPLORE_MAX = 256  # ... doubled after each try that did not change the verdict, up to this
WINDOW = 8  # a mode's cost: the median of its last WINDOW steps in a batch-size class
MIN_SAMPLES = 3  # steps a mode is tried before it can lose


class StepGate:
    """Speculate or not, by which mode has been generating tokens faster at this batch size."""

    def __init__(self, explore_every: int = EXPLORE_EVERY) -> None:
        self.explore_every = explore_every
        self._costs: dict[tuple[int, bool], deque[float]] = {}  # (batch class, speculated) → s/token
        self._since = 0  # steps since the losing mode was last tried
        self._interval = explore_every
        self._last: bool | None = None  # the last verdict

    @staticmethod
    def batch_class(batch: int) -> int:
        """1, 2-3, 4-7, 8-15, ...: steps of one class cost about alike per token."""
        return max(batch, 1).bit_length()

    def record(self, batch: int, speculated: bool, seconds: float, tokens: int) -> None:
        """A decode-only step of `batch` sequences took `seconds` and gave `tokens` tokens."""
        if tokens <= 0 or seconds <= 0 or batch < GATE_MIN_BATCH:
            return
        key = (self.batch_class(batch), speculated)
        self._costs.setdefault(key, deque(maxlen=WINDOW)).append(seconds / tokens)

    def cost(self, batch: int, speculated: bool) -> float | None:
        """A mode's seconds per token at this batch size (None: fewer than MIN_SAMPLES steps)."""
        return self._class_cost(self.batch_class(batch), speculated)

    def decide(self, batch: int) -> bool:
        """Whether the next step of about `batch` decoding sequences speculates."""
        if batch < GATE_MIN_BATCH:
            return True
        better = self._verdict(self.batch_class(batch))
        if better is None:  # nothing measured yet at any size: speculation first, then plain
            return self.cost(batch, True) is None
        if better != self._last:  # the verdict changed: watch the other mode closely again
            self._last, self._interval, self._since = better, self.explore_every, 0
        self._since += 1
        if self._since < self._interval:
            return better
        # each try that leaves the verdict as it was doubles the wait: a mode that keeps losing
        # costs at most 1/EXPLORE_MAX of the steps (at 16 steps, a try 3x dearer cost 12 %)
        self._since, self._interval = 0, min(2 * self._interval, EXPLORE_MAX)
        return not better

    def _verdict(self, cls: int) -> bool | None:
        """Is speculating cheaper, in this batch-size class or else the nearest one that has
        measured both modes (a batch draining from 32 to 8 crosses three classes: learning each
        anew cost more than the gate saved in a 64-step run)?  None: no class has both yet."""
        classes = {c for c, _ in self._costs}
        for c in sorted(classes, key=lambda c: (abs(c - cls), c)):
            spec, plain = self._class_cost(c, True), self._class_cost(c, False)
            if spec is not None and plain is not None:
                return spec <= plain
        return None

    def _class_cost(self, cls: int, speculated: bool) -> float | None:
        costs = self._costs.get((cls, speculated), ())
        return statistics.median(costs) if len(costs) >= MIN_SAMPLES else None
