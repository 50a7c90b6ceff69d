"""The custom Prometheus collectors of the engine's registry (engine/metrics.py): the scheduler's
gauges from one snapshot (vLLM's and the original tool's `inference_server_metrics` family, whose
series use different label names) and the step phases read from a `StepStats` at scrape time."""

from __future__ import annotations

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from spmd_serve.engine.step_stats import StepStats

PREFIX = "spmd_serve:"


class SchedulerGauges:
    """The scheduler's gauges: vLLM's running / waiting / KV usage and the original tool's
    `inference_server_metrics` family (whose series each carry a label named after itself, which a
    plain `Gauge` cannot express).

    One collector for all of them because a scrape may run on the front end's IO thread while the
    engine thread updates: with separate `Gauge`s a scrape could read `num_requests_running` from
    before an abort and `kv_cache_usage_perc` from after it.  The engine replaces the whole
    snapshot in one assignment, so a scrape sees every gauge of the same engine-loop turn.
    """

    NAME = "inference_server_metrics"
    SERIES = ("batch_size", "block_num", "max_batch_size", "max_block_num", "available_resource")
    _VLLM = (  # (name, help, snapshot key)
        ("num_requests_running", "Number of requests in model execution batches.", "running"),
        ("num_requests_waiting", "Number of requests waiting to be processed (preempted ones included).", "waiting"),
        ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_usage"),
    )

    def __init__(self) -> None:
        self._values: dict[str, float] = dict.fromkeys(self.SERIES + ("running", "waiting", "kv_usage"), 0.0)

    def set(self, running: int, waiting: int, free_blocks: int, total_blocks: int, max_seqs: int) -> None:
        self._values = {
            "running": float(running),
            "waiting": float(waiting),
            "kv_usage": (total_blocks - free_blocks) / total_blocks,
            "batch_size": float(running),
            "block_num": float(free_blocks),  # FREE blocks, as the original exposed it
            "max_batch_size": float(max_seqs),
            "max_block_num": float(total_blocks),
            "available_resource": free_blocks / total_blocks,
        }

    def _original(self) -> Metric:
        return Metric(self.NAME, "Metrics for monitoring inference server status", "gauge")

    def describe(self) -> list[Metric]:  # lets the registry reject a clashing name up front
        return [GaugeMetricFamily(PREFIX + name, doc) for name, doc, _ in self._VLLM] + [self._original()]

    def collect(self) -> list[Metric]:
        values = self._values  # one snapshot for every family
        vllm: list[Metric] = [GaugeMetricFamily(PREFIX + n, doc, value=values[key]) for n, doc, key in self._VLLM]
        original = self._original()
        for name in self.SERIES:
            original.add_sample(self.NAME, {name: name}, values[name])
        return vllm + [original]


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
