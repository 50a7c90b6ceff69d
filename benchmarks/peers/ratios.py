"""The comparison's tables: per-server figures from `spmd_serve bench --json` files, and the ratios
of issue 16's Goals (output tok/s ÷ the peer's, TTFT p99 ÷ the peer's) per concurrency.

Pure functions over the bench JSON (`{"config": ..., "runs": [{"concurrency", "output_throughput",
"ttft_ms": {"mean", "median", "p99"}, "tpot_ms": ..., "completed", "failed", ...}]}`), so the
table logic is tested without any server.
"""

from __future__ import annotations

from collections.abc import Iterable


def level_stats(bench_jsons: Iterable[dict]) -> dict[int, dict]:
    """{concurrency: figures} over one server's bench runs (several files may hold different levels)."""
    out: dict[int, dict] = {}
    for doc in bench_jsons:
        for run in doc["runs"]:
            ok = run["completed"]
            out[int(run["concurrency"])] = {
                "output_tok_s": run["output_throughput"],
                "tpot_median_ms": run["tpot_ms"]["median"],
                "ttft_median_ms": run["ttft_ms"]["median"],
                "ttft_p99_ms": run["ttft_ms"]["p99"],
                "completed": ok,
                "failed": run["failed"],
                "prompt_tokens_per_request": run["total_input_tokens"] / ok if ok else 0.0,
                "output_tokens_per_request": run["total_output_tokens"] / ok if ok else 0.0,
                "foreign_cpu": run.get("foreign_cpu"),
            }
    return out


def best_of(rounds: list[dict[int, dict]]) -> dict[int, dict]:
    """Per concurrency, the level of the round with the highest output tok/s (whole: its TTFT and
    TPOT come from the same run).  On a shared machine other processes only ever slow a server
    down, so the best round is the closest to its speed alone."""
    best: dict[int, dict] = {}
    for levels in rounds:
        for c, level in levels.items():
            if level["completed"] and (c not in best or level["output_tok_s"] > best[c]["output_tok_s"]):
                best[c] = level
            best.setdefault(c, level)
    return best


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


def ratio_row(
    ours: dict[int, dict], peer: dict[int, dict], concurrencies: list[int]
) -> dict[str, dict[int, float | None]]:
    """Output tok/s ours ÷ peer (higher is better) and TTFT p99 ours ÷ peer (lower is better)."""

    def get(stats: dict[int, dict], c: int, key: str) -> float | None:
        level = stats.get(c)
        return level[key] if level and level["completed"] else None

    return {
        key: {c: _ratio(get(ours, c, field), get(peer, c, field)) for c in concurrencies}
        for key, field in (("output_tok_s", "output_tok_s"), ("ttft_p99", "ttft_p99_ms"))
    }


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def raw_table(stats: dict[str, dict[int, dict]], concurrencies: list[int]) -> str:
    """Markdown: per server, output tok/s (TPOT median ms) per concurrency, then TTFT p99 per concurrency."""
    head = [
        "server",
        *(f"c={c} out tok/s (TPOT ms)" for c in concurrencies),
        *(f"TTFT p99 c={c}" for c in concurrencies),
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, levels in stats.items():
        cells = [name]
        for c in concurrencies:
            s = levels.get(c)
            bad = f", {s['failed']} failed" if s and s["failed"] else ""
            cells.append(
                "—" if not s or not s["completed"] else f"{s['output_tok_s']:,.0f} ({s['tpot_median_ms']:.1f}){bad}"
            )
        for c in concurrencies:
            s = levels.get(c)
            cells.append("—" if not s or not s["completed"] else f"{s['ttft_p99_ms'] / 1000:.2f} s")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_table(ratios: dict[str, dict[str, dict[int, float | None]]], concurrencies: list[int]) -> str:
    """Markdown: one row per (ours ÷ peer) pair, output tok/s ratios then TTFT p99 ratios."""
    head = ["ours ÷ peer"] + [f"out tok/s c={c}" for c in concurrencies] + [f"TTFT p99 c={c}" for c in concurrencies]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in ratios.items():
        cells = (
            [name]
            + [_fmt(r["output_tok_s"][c], ".2f") for c in concurrencies]
            + [_fmt(r["ttft_p99"][c], ".2f") for c in concurrencies]
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def merge_report(report: dict, old: dict, order: list[str] | None = None) -> None:
    """Fold an earlier run's report into this one: rows only it has are taken as they are; for rows
    both have, each level keeps the measurement other processes disturbed least.  Rows end up in
    `order` (row keys; default: this report's rows, then the earlier one's)."""

    def undisturbed(level: dict) -> float:
        return 1.0 if level.get("foreign_cpu") is None else level["foreign_cpu"]

    report.setdefault("merged_from", []).append(old.get("command"))
    if old.get("checks"):  # the earlier run's server checks, kept beside this run's
        report.setdefault("checks_merged", []).append(old["checks"])
    for key, entry in old["rows"].items():
        entry["levels"] = {int(c): v for c, v in entry["levels"].items()}
        mine = report["rows"].setdefault(key, entry)
        if mine is not entry:
            for c, level in entry["levels"].items():
                if c not in mine["levels"] or undisturbed(level) < undisturbed(mine["levels"][c]):
                    mine["levels"][c] = level
    order = order or list(dict.fromkeys([*report["rows"], *old["rows"]]))
    report["rows"] = dict(sorted(report["rows"].items(), key=lambda kv: order.index(kv[0])))


def row_notes(rows: Iterable[dict]) -> str:
    """Per server: how long each round's start took until its ready URL answered (weights loaded,
    ours also on 2 MB pages), other processes' share of the cores during each level, the load
    average after each round, and the tokens per request the server itself counted."""
    rows, lines = list(rows), []
    for r in rows:
        rounds = r["rounds"]
        foreign = {c: "?" if v["foreign_cpu"] is None else f"{v['foreign_cpu']:.0%}" for c, v in r["levels"].items()}
        ready = [None if x.get("ready_s") is None else round(x["ready_s"], 1) for x in rounds]
        lines.append(
            f"{r['name']}: ready after {ready} s; other processes' share of the cores during each level kept "
            f"{foreign}, 1-min load average after each round {[round(x['loadavg_after'][0], 1) for x in rounds]}"
        )
    for r in rows:
        per = {
            c: f"{v['prompt_tokens_per_request']:.1f}/{v['output_tokens_per_request']:.1f}"
            for c, v in r["levels"].items()
        }
        lines.append(f"tokens per request (prompt/output, the server's usage) {r['name']}: {per}")
    return "\n".join(lines)
