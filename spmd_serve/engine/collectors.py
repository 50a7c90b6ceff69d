"""The custom Prometheus collectors of the engine's registry (engine/metrics.py): the original tool's
`inference_server_metrics` family, whose series use different label names (a plain `Gauge` cannot
express it), and the step phases read from a `StepStats` at scrape time."""

from __future__ import annotations

from prometheus_client.metrics_core import CounterMetricFamily, Metric

from spmd_serve.engine.step_stats import StepStats

PREFIX = "spmd_serve:"


class OriginalGauges:
    """The original tool's `inference_server_metrics` family, series by series as it exposed them.

    A plain `Gauge` cannot express it (its series use different label names), so this is a custom
    collector.  The engine replaces the whole dict at once, so a scrape never sees half an update.
    """

    NAME = "inference_server_metrics"
    SERIES = ("batch_size", "block_num", "max_batch_size", "max_block_num", "available_resource")

    def __init__(self) -> None:
        self._values: dict[str, float] = dict.fromkeys(self.SERIES, 0.0)

    def set(self, values: dict[str, float]) -> None:
        self._values = {name: float(values[name]) for name in self.SERIES}

    def _family(self) -> Metric:
        return Metric(self.NAME, "Metrics for monitoring inference server status", "gauge")

    def describe(self) -> list[Metric]:
        return [self._family()]  # lets the registry reject a clashing name up front

    def collect(self) -> list[Metric]:
        family, values = self._family(), self._values
        for name in self.SERIES:
            family.add_sample(self.NAME, {name: name}, values[name])
        return [family]


class StepPhaseCollector:
    """Exposes a StepStats' cumulative sums; the engine thread never touches Prometheus for them."""

    def __init__(self, stats: StepStats) -> None:
        self.stats = stats

    def describe(self) -> list[Metric]:
        return [
            CounterMetricFamily(PREFIX + n, "") for n in ("step_phase_seconds", "io_handoffs", "step_sampled_tokens")
        ]

    def collect(self) -> list[Metric]:
        st = self.stats
        phases = CounterMetricFamily(
            PREFIX + "step_phase_seconds",
            "Seconds rank 0 spent in each phase of the engine step (summed).",
            labels=["phase"],
        )
        for phase, seconds in st.totals().items():
            phases.add_metric([phase], seconds)
        return [
            phases,
            CounterMetricFamily(PREFIX + "io_handoffs", "Output batches the front end delivered.", value=st.handoffs),
            CounterMetricFamily(PREFIX + "step_sampled_tokens", "Tokens sampled by engine steps.", value=st.sampled),
        ]
