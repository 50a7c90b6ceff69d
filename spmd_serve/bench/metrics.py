"""Benchmark metrics with vLLM's definitions (vllm/benchmarks/serve.py, `calculate_metrics`).

Per request the client records when it was sent, when each streamed chunk carrying output arrived
and how many tokens it carried.  From that, over the *successful* requests only:
* TTFT  = first output chunk − send time;
* E2E   = last byte − send time (the request's latency);
* TPOT  = (E2E − TTFT) / (output tokens − 1), one value per request with > 1 output token;
* ITL   = the gaps between consecutive output chunks.  vLLM records one gap per chunk; a chunk
  carrying k > 1 tokens here contributes k gaps of gap / k, so ITL stays per token whatever the
  server's chunking (the two agree when every chunk carries one token, as ours does);
* request throughput = successes / duration, output throughput = output tokens / duration,
  total token throughput = (prompt + output tokens) / duration, duration = first send → last end.
Each distribution is summarised as mean, median, std and p99 (numpy's linear percentile), in ms.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

PERCENTILES = (99.0,)


@dataclass
class RequestResult:
    """What one request did, in seconds of `time.perf_counter()` relative to its send time."""

    success: bool = False
    prompt_len: int = 0  # prompt tokens (the server's count when it reports one)
    output_tokens: int = 0  # generated tokens (the server's count when it reports one)
    ttft: float = 0.0
    latency: float = 0.0  # end to end
    itl: list[float] = field(default_factory=list)  # per-token gaps after the first chunk
    error: str = ""

    def add_chunk(self, elapsed: float, tokens: int = 1) -> None:
        """Record an output chunk of `tokens` tokens arriving `elapsed` s after the send."""
        if tokens <= 0:
            return
        if self.output_tokens == 0:
            self.ttft = elapsed
        else:
            gap = (elapsed - self._last) / tokens
            self.itl.extend([gap] * tokens)
        self._last = elapsed
        self.output_tokens += tokens

    _last: float = field(default=0.0, repr=False)


def summarize(values_s: list[float]) -> dict[str, float]:
    """mean / median / std / p99 of a list of seconds, in milliseconds (zeros when empty, as vLLM)."""
    a = np.asarray(values_s or [0.0], dtype=np.float64) * 1e3
    out = {"mean": float(a.mean()), "median": float(np.median(a)), "std": float(a.std())}
    for p in PERCENTILES:
        out[f"p{p:g}"] = float(np.percentile(a, p))
    return out


@dataclass
class BenchmarkMetrics:
    """One run's aggregate figures (one concurrency level of a sweep)."""

    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # successful requests / s
    output_throughput: float  # output tokens / s
    total_token_throughput: float  # (prompt + output) tokens / s
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2el_ms: dict[str, float]
    errors: list[str]  # the first few distinct error messages

    def as_dict(self) -> dict:
        return asdict(self)


def calculate_metrics(results: list[RequestResult], duration_s: float, max_errors: int = 5) -> BenchmarkMetrics:
    ok = [r for r in results if r.success]
    ttfts = [r.ttft for r in ok]
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itls = [gap for r in ok for gap in r.itl]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    errors: list[str] = []
    for r in results:  # distinct messages, in the order they happened to be collected
        if not r.success and r.error not in errors and len(errors) < max_errors:
            errors.append(r.error)
    dur = max(duration_s, 1e-9)
    return BenchmarkMetrics(
        completed=len(ok),
        failed=len(results) - len(ok),
        duration_s=duration_s,
        total_input_tokens=in_tokens,
        total_output_tokens=out_tokens,
        request_throughput=len(ok) / dur,
        output_throughput=out_tokens / dur,
        total_token_throughput=(in_tokens + out_tokens) / dur,
        ttft_ms=summarize(ttfts),
        tpot_ms=summarize(tpots),
        itl_ms=summarize(itls),
        e2el_ms=summarize([r.latency for r in ok]),
        errors=errors,
    )
