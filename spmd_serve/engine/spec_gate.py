"""The step-level rule of speculative decoding: does this step speculate at all?

The per-request rule (engine/speculative.py) keeps drafting the requests whose drafts are
accepted, but acceptance alone does not say that drafting pays: a model proposer (draft_model,
mtp) runs draft plans whose cost on this CPU is close to a target step's whatever the batch, so
drafts that are mostly right still made a full batch 1.4-3x slower (benchmarks/RESULTS.md
"Speculative decoding": draft_model 0.77x, mtp 0.3x at batch 32).  The issue's rule is that
speculation must never make a full batch slower.

So the gate measures what matters, each mode's seconds per generated token on decode-only steps
(draft plans, verification and the proposer's follow-up included), as the median of its last
`WINDOW` steps per batch-size class (powers of two; a median, because one slow step — a graph's
first run, another process taking the core — once made plain decoding look 3x dearer than it is
for the rest of a request), and each step takes the cheaper mode — speculation only when it is
cheaper by `SPEC_MARGIN`: the two medians come from steps far apart in time on a machine whose
step time drifts by 10-20 % between seconds (a shared VM: RESULTS.md "The step gate, third
version"), and with no margin drafts that paid nothing were chosen on a lucky median, then lost,
then tried again every 16 steps (13-30 % of a held-out batch's steps speculated, 0.8x plain); the
rule is that speculation never makes a full batch slower, so a tie goes to plain.

Learning is what a short run pays, so it is kept small (RESULTS.md "The step gate"): plain decoding
is measured first (`MIN_SAMPLES` steps: it costs nothing extra), then speculation, which loses at
once when even its fastest step so far is `CLEAR_LOSS` times dearer per token than plain's median
(mtp on this CPU: ~3x), else after `MIN_SAMPLES` steps like plain.  The losing mode is tried again
after `EXPLORE_EVERY` steps, twice as long after each try that changed nothing (up to
`EXPLORE_MAX`), and never sooner than a try costs `TRY_BUDGET` of the steps between tries (a mode
3x dearer waits ~200 steps), so a batch whose text starts repeating wins speculation back.  A try
lasts `TRY_STEPS` steps, and the first speculative step after plain ones is no sample of
speculation's cost (the Speculator passes it as `switched`; it sets how long tries wait): it
carries the proposer's catch-up (a draft model's K/V of every token since it last ran, the whole
prompt at first: 5-10x a step at batch 32), a cost of switching, not of speculating, which made a
draft model that pays 1.8x look 3x dearer and lose at once.  A
class that has no verdict yet follows the nearest class that has.  Steps with prompt chunks are
not measured (their cost is the prefill's) and use the current choice.

`min_batch`: steps of fewer sequences always speculate.  For n-gram drafts (free to propose) it is
`GATE_MIN_BATCH`: there a few more query tokens cost the launch-bound step almost nothing (2.4x at
batch 1), and it keeps the small batches where the tests check speculation's mechanics free of
timing.  A model proposer's drafts cost a plan whatever the batch, so it is gated at every size.
Outputs never depend on the choice: a plain step is a step whose drafts are empty.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

GATE_MIN_BATCH = 8  # sequences: smaller steps of a free proposer always speculate
EXPLORE_EVERY = 16  # steps between two tries of the mode that is losing, at first
EXPLORE_MAX = 256  # ... doubled after each try that did not change the verdict, up to this
MAX_WAIT = 4096  # steps: the longest wait between tries, where a try's catch-up is dear
WINDOW = 8  # a mode's cost: the median of its last WINDOW steps in a batch-size class
MIN_SAMPLES = 3  # steps a mode is measured before the medians decide
CLEAR_LOSS = 1.25  # a mode whose every step cost this much more per token loses without more tries
TRY_BUDGET = 0.02  # a try of the losing mode may cost this share of the steps between tries
TRY_STEPS = 2  # steps of one try: the first speculative step after plain ones is not measured
SPEC_MARGIN = 1.1  # speculation is chosen only when its cost per token times this is at most plain's


class StepGate:
    """Speculate or not, by which mode has been generating tokens faster at this batch size."""

    def __init__(self, explore_every: int = EXPLORE_EVERY, min_batch: int = GATE_MIN_BATCH) -> None:
        self.explore_every, self.min_batch = explore_every, min_batch
        self._costs: dict[tuple[int, bool], deque[float]] = {}  # (batch class, speculated) → s/token
        self._since = 0  # steps since the losing mode was last tried
        self._interval = explore_every
        self._last: bool | None = None  # the last verdict
        self._trying = 0  # steps of the current try still to go
        self._switch_excess: float | None = None  # the last try's first step: plain steps it cost beyond plain

    @staticmethod
    def batch_class(batch: int) -> int:
        """1, 2-3, 4-7, 8-15, ...: steps of one class cost about alike per token."""
        return max(batch, 1).bit_length()

    def record(self, batch: int, speculated: bool, seconds: float, tokens: int, switched: bool = False) -> None:
        """A decode-only step of `batch` sequences took `seconds` and gave `tokens` tokens;
        `switched`: the first speculative step after plain ones (its proposer's catch-up included),
        which is no sample of speculation's cost but says what a try of it costs."""
        if tokens <= 0 or seconds <= 0 or batch < self.min_batch:
            return
        cls = self.batch_class(batch)
        if switched:
            plain = self._median(cls, False)
            if plain is not None:  # seconds beyond plain's for these tokens, in plain steps
                self._switch_excess = max(0.0, (seconds - plain * tokens) / (plain * batch))
            return
        self._costs.setdefault((cls, speculated), deque(maxlen=WINDOW)).append(seconds / tokens)

    def cost(self, batch: int, speculated: bool) -> float | None:
        """A mode's seconds per token at this batch size (None: fewer than MIN_SAMPLES steps)."""
        return self._median(self.batch_class(batch), speculated)

    def decide(self, batch: int) -> bool:
        """Whether the next step of about `batch` decoding sequences speculates."""
        if batch < self.min_batch:
            return True
        verdict = self._verdict(self.batch_class(batch))
        if verdict is None:  # nothing decided at any size: measure plain first, then speculation
            return self.cost(batch, False) is not None
        better, ratio = verdict
        if better != self._last:  # the verdict changed: watch the other mode closely again
            self._last, self._interval, self._since, self._trying = better, self.explore_every, 0, 0
        if self._trying:
            self._trying -= 1
            return not better
        self._since += 1
        if self._since < max(self._interval, self._affordable(ratio, spec_wins=better)):
            return better
        # each try that leaves the verdict as it was doubles the wait: a mode that keeps losing
        # costs at most 1/EXPLORE_MAX of the steps (at 16 steps, a try 3x dearer cost 12 %)
        self._since, self._interval, self._trying = 0, min(2 * self._interval, EXPLORE_MAX), TRY_STEPS - 1
        return not better

    def _affordable(self, ratio: float, spec_wins: bool) -> int:
        """Steps between tries for a try to cost TRY_BUDGET of them (`ratio`: the loser's cost
        per token over the winner's).  A try is TRY_STEPS steps of about ratio - 1 steps more each,
        except that a try of speculation starts with the proposer's catch-up, whose cost the last
        try measured: a draft model feeds every token decoded since it last ran, 32 per skipped
        step at batch 32, so that step's cost grows with the wait and may exceed EXPLORE_MAX steps'
        budget (then tries get as rare as they must, up to MAX_WAIT; without this, a held-out batch
        of 32 ran at 0.81x plain with draft_model: RESULTS.md "The step gate, third version").
        `spec_wins`: the tries are plain steps, which catch nothing up."""
        if ratio == math.inf:
            return EXPLORE_MAX
        first = ratio - 1.0 if spec_wins or self._switch_excess is None else self._switch_excess
        return min(MAX_WAIT, math.ceil(((TRY_STEPS - 1) * (ratio - 1.0) + first) / TRY_BUDGET))

    def _verdict(self, cls: int) -> tuple[bool, float] | None:
        """(is speculating cheaper, the loser's cost over the winner's) in this batch-size class or
        else the nearest one that has a verdict (a batch draining from 32 to 8 crosses three
        classes: learning each anew cost more than the gate saved in a 64-step run).  None: no
        class has one yet."""
        classes = {c for c, _ in self._costs}
        for c in sorted(classes, key=lambda c: (abs(c - cls), c)):
            spec, plain = self._median(c, True), self._median(c, False)
            if spec is not None and plain is not None:
                return (spec * SPEC_MARGIN <= plain, max(spec, plain) / min(spec, plain))
            for settled, fast, tried in ((plain, False, True), (spec, True, False)):
                # one mode measured, the other's every try so far clearly dearer: it lost
                costs = self._costs.get((c, tried), ())
                if settled is not None and costs and min(costs) > CLEAR_LOSS * settled:
                    return (fast, min(costs) / settled)
        return None

    def _median(self, cls: int, speculated: bool) -> float | None:
        costs = self._costs.get((cls, speculated), ())
        return statistics.median(costs) if len(costs) >= MIN_SAMPLES else None
