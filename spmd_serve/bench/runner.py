"""The load generator: send the prompts with a concurrency cap and Poisson arrivals, collect
`RequestResult`s, and (optionally) read the server's step-phase metrics around each run.

As vLLM's benchmark: request i is *released* at the i-th arrival of a Poisson process of
`request_rate` per second (`inf`: all at time 0), then waits for one of `concurrency` slots; the
measured duration runs from the first release to the last response.  One session (HTTP
keep-alive) or one gRPC channel serves the whole run, as a real client would.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from spmd_serve.bench.backends import RequestFn, Target, request_fn
from spmd_serve.bench.metrics import BenchmarkMetrics, RequestResult, calculate_metrics
from spmd_serve.bench.prompts import Prompt


@dataclass
class RunResult:
    """One concurrency level: the settings, the metrics, the raw samples (for the plots)."""

    concurrency: int
    request_rate: float
    metrics: BenchmarkMetrics
    results: list[RequestResult] = field(repr=False, default_factory=list)
    server_phases: dict[str, Any] | None = None  # per-step split read from /metrics, if asked

    def as_dict(self) -> dict:
        out = {
            "concurrency": self.concurrency,
            "request_rate": None if math.isinf(self.request_rate) else self.request_rate,
            **self.metrics.as_dict(),
        }
        if self.server_phases is not None:
            out["server_step_phases"] = self.server_phases
        return out


def arrival_times(n: int, request_rate: float, seed: int) -> list[float]:
    """Release offsets (s) of n requests: cumulative exponential gaps of mean 1/rate."""
    if math.isinf(request_rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed).exponential(1.0 / request_rate, n)
    gaps[0] = 0.0  # the first request goes at once
    return np.cumsum(gaps).tolist()


class _Progress:
    """tqdm on stderr when it is there and wanted; silent otherwise."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, file=sys.stderr, unit="req", leave=False)

    def update(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


async def _open(target: Target) -> Any:
    if target.backend == "grpc":
        import tritonclient.grpc.aio as tga

        return tga.InferenceServerClient(target.base_url.removeprefix("grpc://"))
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))  # the semaphore limits


async def _safe(fn: RequestFn, conn: Any, target: Target, prompt: Prompt) -> RequestResult:
    try:
        return await fn(conn, target, prompt)
    except Exception as e:  # a backend bug must not end the run: count it as a failure
        return RequestResult(success=False, error=f"{e.__class__.__name__}: {e}")


async def run_once(
    target: Target,
    prompts: list[Prompt],
    concurrency: int,
    request_rate: float = math.inf,
    seed: int = 0,
    progress: bool = False,
    fn: RequestFn | None = None,
) -> tuple[list[RequestResult], float]:
    """Send every prompt; returns (results in prompt order, duration in seconds)."""
    fn = fn or request_fn(target.backend)
    conn = await _open(target)
    try:
        slots = asyncio.Semaphore(max(concurrency, 1))
        bar = _Progress(len(prompts), f"concurrency {concurrency}", progress)
        start = time.perf_counter()

        async def one(prompt: Prompt, release_at: float) -> RequestResult:
            await asyncio.sleep(max(0.0, start + release_at - time.perf_counter()))
            async with slots:
                res = await _safe(fn, conn, target, prompt)
            bar.update()
            return res

        results = await asyncio.gather(
            *(one(p, t) for p, t in zip(prompts, arrival_times(len(prompts), request_rate, seed)))
        )
        duration = time.perf_counter() - start
        bar.close()
        return list(results), duration
    finally:
        await conn.close()


# ---- the server's own view: step phases from /metrics ------------------------------------------
async def scrape_step_phases(metrics_url: str) -> dict[str, float]:
    """{"phase:<name>": seconds, "steps", "handoffs", "sampled"} from a spmd_serve /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as s:
        async with s.get(metrics_url, timeout=aiohttp.ClientTimeout(total=10)) as r:
            text = await r.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == "spmd_serve:step_phase_seconds_total":
                out["phase:" + smp.labels["phase"]] = smp.value
            elif smp.name == "spmd_serve:step_duration_seconds_count":
                out["steps"] = smp.value
            elif smp.name == "spmd_serve:io_handoffs_total":
                out["handoffs"] = smp.value
            elif smp.name == "spmd_serve:step_sampled_tokens_total":
                out["sampled"] = smp.value
    return out


def phase_split(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Mean ms per step of each phase between two scrapes, and the mean batch (tokens sampled
    per step); io_handoff is per delivered batch."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    steps, handoffs = max(d.get("steps", 0.0), 1.0), max(d.get("handoffs", 0.0), 1.0)
    ms = {
        k.removeprefix("phase:"): 1e3 * v / (handoffs if k == "phase:io_handoff" else steps)
        for k, v in d.items()
        if k.startswith("phase:")
    }
    return {"steps": int(d.get("steps", 0)), "mean_batch": d.get("sampled", 0.0) / steps, "ms_per_step": ms}


async def sweep(
    target: Target,
    prompts: list[Prompt],
    concurrencies: list[int],
    request_rate: float,
    seed: int = 0,
    progress: bool = False,
    warmup: int = 1,
    metrics_url: str | None = None,
    fn: RequestFn | None = None,
) -> list[RunResult]:
    """One `run_once` per concurrency level, in the order given, each on prompts of its own.

    `prompts` holds len(concurrencies) equal slices, one per level: a slice's first `warmup`
    prompts go one at a time, uncounted (they wake a cold server and show a misconfiguration before
    the measured run), the rest are the level's measured requests.  No prompt is sent twice: a
    server with a prompt cache (ours, llama-server's slots) would otherwise answer a repeated
    prompt from it and its TTFT would measure the cache, not the prefill."""
    per = len(prompts) // max(len(concurrencies), 1)
    if per <= warmup or per * len(concurrencies) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts do not split into {len(concurrencies)} levels of {warmup} + n")
    runs = []
    for i, c in enumerate(concurrencies):
        level = prompts[i * per : (i + 1) * per]
        if warmup:
            warm, _ = await run_once(target, level[:warmup], 1, math.inf, seed, False, fn)
            for w in warm:
                if not w.success:
                    print(f"warning: warm-up request failed: {w.error}", file=sys.stderr)
        before = await scrape_step_phases(metrics_url) if metrics_url else None
        results, duration = await run_once(target, level[warmup:], c, request_rate, seed, progress, fn)
        run = RunResult(c, request_rate, calculate_metrics(results, duration), results)
        if metrics_url and before is not None:
            run.server_phases = phase_split(before, await scrape_step_phases(metrics_url))
        runs.append(run)
    return runs
