"""Prometheus metrics of the engine (CONTRACT.md §6), recorded by rank 0's engine thread.

This module owns `EngineMetrics`: a private `CollectorRegistry` (never the global one, so several
engines in one test process cannot clash) and the hooks the engine loop calls.  Only the engine
thread writes, and renders the registry between two steps when an HTTP worker forwards a scrape
of `/metrics` (`render`; FrontendHub).

When each metric changes (times are `time.monotonic()`; "arrival" is `Request.arrival_time`, the
moment the front end handed the request to its EngineClient, on the host's monotonic clock,
which every process shares):
* gauges (`update_gauges`, once per engine-loop turn, so a scrape is current even when idle; one
  snapshot, so a scrape never mixes two turns):
  `spmd_serve:num_requests_running` = len(scheduler.running), `..._waiting` = len(waiting)
  (preempted requests included), `kv_cache_usage_perc` = used / total blocks (0..1, as vLLM);
  `inference_server_metrics` as the original PaddleNLP/Triton backend exposed it: one gauge family
  whose series each carry a label named after itself, `{batch_size="batch_size"}` = running
  sequences, `block_num` = FREE blocks, `max_batch_size` = BATCH_SIZE, `max_block_num` = total
  blocks, `available_resource` = free / total blocks.
* at a request's first scheduling (`on_schedule`; a recompute after preemption is not a first):
  `prompt_tokens_total` += its prompt length, `request_queue_time_seconds` observes now − arrival.
  Every non-empty schedule adds its preemptions to `num_preemptions_total`, and (prefix caching
  on) at every admission, a re-admission after preemption included, `prefix_cache_queries_total`
  += the request's tokens and `prefix_cache_hits_total` += those found cached (vLLM's definitions).
* per sampled token (`on_update`): `generation_tokens_total` += 1 (a speculative step may give a
  request several); the request's first token
  observes `time_to_first_token_seconds` (now − arrival), each later one
  `inter_token_latency_seconds` (now − its previous token).  A request finished by the engine
  counts in `request_success_total{finished_reason="stop"|"length"}` and observes
  `e2e_request_latency_seconds` (now − arrival).  `engine_steps_total` += 1 per executed step.
* per abort the engine applies (`on_abort`: client gone, deadline, stop string found by the front
  end): `request_success_total{finished_reason="abort"}` += 1 — or "stop" (with its e2e latency)
  when the abort came from a stop string, which the client sees as a normal end — and
  `abort_to_free_steps` observes
  how many engine steps completed between the abort being requested and the request's KV blocks
  returning to the free pool (the loop applies aborts before every step, so 0 or 1).
* speculative decoding (`on_spec`, engine/spec_metrics.py): drafts verified and accepted per method.
* per executed step (`on_model_stats`, the runner's `take_stats()`): MoE models add the tokens
  routed to each expert to `moe_expert_tokens_total{layer, expert}` (warm-up included); an int8 KV
  pool (USE_CACHE_KV_INT8) adds the entries its writes clipped to ±127 to
  `kv_cache_int8_clipped_total{tensor="k"|"v"}` (rank 0's shard of the KV heads; 0 while every
  value is within the export's calibrated scales and their margin).
Warm-up traffic (`paused()`) is not user traffic and is not counted.

Step phases (`watch_steps`, read from the engine's StepStats at scrape time, so recording costs the
step nothing beyond its perf_counter laps; warm-up steps included): counter
`step_phase_seconds_total{phase}` for schedule, broadcast, execute (and its parts segment_<i>,
allreduce, gather_logits, kv_write, host_io: the copies into and out of the graphs, execute_other),
sample, update, io_handoff; histogram
`step_duration_seconds` (one observation per executed step: its `_count` is the step count);
`io_handoffs_total` (batches the front end delivered: divide io_handoff by it);
`step_sampled_tokens_total`.  Mean ms per step of a phase over a window =
rate(step_phase_seconds_total[w]) / rate(step_duration_seconds_count[w]).
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector

from spmd_serve.engine.collectors import PREFIX, SchedulerGauges, StepPhaseCollector
from spmd_serve.engine.spec_metrics import SpecMetrics
from spmd_serve.engine.step_stats import StepStats
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import Scheduler, SchedulerOutput

FINISH_REASONS = ("stop", "length", "abort")  # vLLM's FinishReason values
# vLLM's buckets; inter-token latency gains 1 ms and 5 ms because a CPU decode step can be that fast.
# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# fmt: on
ABORT_STEP_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64)
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_RECENT_STEPS = ABORT_STEP_BUCKETS[-1]  # step end times kept: the abort delay saturates here


class EngineMetrics:
    """Every engine metric in one private registry; see the module docstring for definitions."""

    def __init__(self, registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._clock = clock
        self._paused = False
        # req_id -> (arrival, time of its latest token or None): requests scheduled at least once
        # and not finished yet.  Presence marks "already counted its prompt and queue time".
        self._live: dict[str, tuple[float, float | None]] = {}
        self._step_ends: collections.deque[float] = collections.deque(maxlen=_RECENT_STEPS)
        r, p = self.registry, PREFIX
        self.gauges = SchedulerGauges()  # running, waiting, KV usage, the original family: one snapshot
        r.register(self.gauges)
        self.prompt_tokens = Counter(
            p + "prompt_tokens",
            "Number of prefill tokens processed (once per request, at its first scheduling).",
            registry=r,
        )
        self.generation_tokens = Counter(p + "generation_tokens", "Number of generation tokens processed.", registry=r)
        success = Counter(
            p + "request_success", "Count of successfully processed requests.", ["finished_reason"], registry=r
        )
        # Created up front so every reason reads 0 before it first happens (rate() needs a start).
        self.success = {reason: success.labels(reason) for reason in FINISH_REASONS}
        self.preemptions = Counter(
            p + "num_preemptions", "Cumulative number of preemption from the engine.", registry=r
        )
        self.prefix_queries = Counter(p + "prefix_cache_queries", "Prefix cache queries, in tokens.", registry=r)
        self.prefix_hits = Counter(p + "prefix_cache_hits", "Prefix cache hits, in tokens.", registry=r)
        self.steps = Counter(p + "engine_steps", "Engine steps executed (model runs on every rank).", registry=r)
        moe = Counter(p + "moe_expert_tokens", "Tokens routed to each MoE expert.", ["layer", "expert"], registry=r)
        self.stat_counters = {"moe_expert_tokens": moe}  # Runner.take_stats names → counters (layer, index)
        clipped = Counter(
            p + "kv_cache_int8_clipped",
            "Int8 KV cache entries clipped to +-127 on write (beyond the export's calibrated scales), "
            "per cache tensor; rank 0's KV heads (all of them at TP=1).",
            ["tensor"],
            registry=r,
        )
        self.stat_totals = {"kv_cache_int8_clipped": clipped}  # take_stats names → counters (label)
        self.ttft = Histogram(
            p + "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            p + "inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            p + "e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            p + "request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.abort_steps = Histogram(
            p + "abort_to_free_steps",
            "Engine steps completed between an abort being requested and the "
            "request's KV blocks returning to the free pool.",
            buckets=ABORT_STEP_BUCKETS,
            registry=r,
        )
        self.step_duration = Histogram(
            p + "step_duration_seconds",
            "Wall time of one engine step (schedule to update).",
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.spec = SpecMetrics(r)
        self._steps_watched: StepPhaseCollector | None = None
        ProcessCollector(registry=r)  # rank 0's memory, CPU time and open files, as usual

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Steps inside (the warm-up request) are not user traffic: record nothing for them."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def watch_steps(self, stats: StepStats) -> None:
        """Export `stats` (the engine's StepStats) as the step-phase metrics; a later engine on the
        same metrics replaces the earlier one's."""
        stats.on_step = self.step_duration.observe
        if self._steps_watched is None:
            self._steps_watched = StepPhaseCollector(stats)
            self.registry.register(self._steps_watched)
        self._steps_watched.stats = stats

    # ---- engine-loop hooks ----------------------------------------------------------------
    def update_gauges(self, scheduler: Scheduler, held: int = 0) -> None:
        """`held`: requests waiting outside the scheduler (engine/admission.py: a grammar compiling)."""
        bm = scheduler.block_manager
        self.gauges.set(
            len(scheduler.running),
            len(scheduler.waiting) + held,
            bm.num_free_blocks,
            bm.num_blocks,
            scheduler.config.max_num_seqs,
        )

    def on_schedule(self, out: SchedulerOutput) -> None:
        """After a non-empty `scheduler.schedule()`, before the step runs."""
        if self._paused:
            return
        now = self._clock()
        self.preemptions.inc(len(out.preempted))
        self.prefix_queries.inc(out.prefix_queries)
        self.prefix_hits.inc(out.prefix_hits)
        for seq in out.seqs:
            req = seq.request
            if req.req_id not in self._live:  # first scheduling; a preempted one is still live
                self._live[req.req_id] = (req.arrival_time, None)
                self.prompt_tokens.inc(req.num_prompt_tokens)
                self.queue_time.observe(now - req.arrival_time)

    def on_model_stats(self, stats: Mapping[str, Any]) -> None:
        """A step's `Runner.take_stats()`: `<metric>:<layer>` → a count per index (e.g. expert), or
        `<metric>:<label>` → one count (e.g. int8 KV entries clipped, per cache tensor)."""
        for name, values in stats.items():
            metric, layer = name.split(":")
            if metric in self.stat_totals:
                self.stat_totals[metric].labels(layer).inc(int(values.sum()))
                continue
            for index, n in enumerate(values.tolist()):
                self.stat_counters[metric].labels(layer, str(index)).inc(n)

    def on_update(self, got_token: list[Request]) -> None:
        """After `scheduler.update()`: each request in `got_token` has one new token."""
        if self._paused:
            return
        now = self._clock()
        self.steps.inc()
        self._step_ends.append(now)
        self.generation_tokens.inc(sum(req.num_new_tokens for req in got_token))
        for req in got_token:
            arrival, last = self._live.get(req.req_id, (req.arrival_time, None))
            if last is None:
                self.ttft.observe(now - arrival)
            else:
                self.itl.observe(now - last)
            if req.is_finished:
                self.success[req.finish_reason or "stop"].inc()
                self.e2e.observe(now - arrival)
                self._live.pop(req.req_id, None)
            else:
                self._live[req.req_id] = (arrival, now)

    def on_spec(self, method: str, num_seqs: int, num_draft: int, num_accepted: int) -> None:
        """After a step's update: draft tokens verified and accepted by `num_seqs` sequences."""
        if not self._paused:
            self.spec.on_step(method, num_seqs, num_draft, num_accepted)

    def on_abort(self, req: Request | None, requested_at: float, reason: str = "abort") -> None:
        """After `scheduler.abort_request()`, given its result (None: already gone, nothing freed),
        the time the abort was asked for, and why: "stop" when the front end found a stop
        string (the client sees a normal end, so it counts as a success with its latency)."""
        if req is None or self._paused:
            return
        arrival, _ = self._live.pop(req.req_id, (req.arrival_time, None))
        self.success[reason if reason in FINISH_REASONS else "abort"].inc()
        if reason == "stop":
            self.e2e.observe(self._clock() - arrival)
        self.abort_steps.observe(sum(1 for t in self._step_ends if t > requested_at))


def render(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    """The registry as the scraper asked for it (its Accept header): (body, content type)."""
    encode, content_type = choose_encoder(accept)
    return encode(registry), content_type
