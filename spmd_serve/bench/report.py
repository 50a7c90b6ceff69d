"""Presenting a sweep: a table on stdout, a JSON file, PNG plots.

The plots use matplotlib's non-interactive Agg backend (no display on a server), imported only
when `--plot-dir` is given so the table and JSON work without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spmd_serve.bench.runner import RunResult

_DISTS = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2E", "e2el_ms"))


def table(runs: list[RunResult]) -> str:
    """One row per concurrency level; latencies in ms as mean / median / p99."""
    head = ["conc", "ok", "fail", "req/s", "out tok/s"] + [f"{n} mean/med/p99 ms" for n, _ in _DISTS]
    rows = []
    for r in runs:
        m = r.metrics
        rows.append(
            [
                str(r.concurrency),
                str(m.completed),
                str(m.failed),
                f"{m.request_throughput:.2f}",
                f"{m.output_throughput:.1f}",
            ]
            + [_triple(getattr(m, key)) for _, key in _DISTS]
        )
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in runs:
        for err in r.metrics.errors:
            lines.append(f"concurrency {r.concurrency}: failed: {err}")
        if r.server_phases:
            p = r.server_phases
            split = " ".join(f"{k}={v:.3f}" for k, v in p["ms_per_step"].items() if v >= 0.0005)
            lines.append(
                f"concurrency {r.concurrency}: server ms/step (batch {p['mean_batch']:.1f}, "
                f"{p['steps']} steps): {split}"
            )
    return "\n".join(lines)


def _triple(s: dict[str, float]) -> str:
    return f"{s['mean']:.1f}/{s['median']:.1f}/{s['p99']:.1f}"


def write_json(path: str | Path, config: dict[str, Any], runs: list[RunResult]) -> None:
    Path(path).write_text(json.dumps({"config": config, "runs": [r.as_dict() for r in runs]}, indent=2))


def plot(plot_dir: str | Path, runs: list[RunResult], title: str = "") -> list[Path]:
    """throughput.png and latency.png against concurrency; ttft_hist.png and itl_hist.png
    (one histogram per concurrency level).  Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(plot_dir)
    out.mkdir(parents=True, exist_ok=True)
    conc = [r.concurrency for r in runs]
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(conc, [r.metrics.output_throughput for r in runs], "o-", label="output tokens/s")
    ax2 = ax.twinx()
    ax2.plot(conc, [r.metrics.request_throughput for r in runs], "s--", color="tab:orange", label="requests/s")
    ax.set(xlabel="concurrency", ylabel="output tokens/s", title=f"Throughput {title}".strip())
    ax2.set_ylabel("requests/s")
    fig.legend(loc="upper left")
    written.append(_save(fig, out / "throughput.png"))

    fig, axes = plt.subplots(1, len(_DISTS), figsize=(4 * len(_DISTS), 3.5))
    for ax, (name, key) in zip(axes, _DISTS):
        for stat, style in (("median", "o-"), ("p99", "s--")):
            ax.plot(conc, [getattr(r.metrics, key)[stat] for r in runs], style, label=stat)
        ax.set(xlabel="concurrency", ylabel="ms", title=name)
        ax.legend()
    fig.suptitle(f"Latency {title}".strip())
    written.append(_save(fig, out / "latency.png"))

    for name, values in (
        ("ttft", lambda r: [x.ttft for x in r.results if x.success]),
        ("itl", lambda r: [g for x in r.results if x.success for g in x.itl]),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in runs:
            data = [1e3 * v for v in values(r)]
            if data:
                ax.hist(data, bins=40, alpha=0.5, label=f"concurrency {r.concurrency}")
        ax.set(xlabel="ms", ylabel="count", title=f"{name.upper()} distribution {title}".strip())
        ax.legend()
        written.append(_save(fig, out / f"{name}_hist.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
