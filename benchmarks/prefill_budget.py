"""The chunked-prefill budget (SPMD_MAX_NUM_BATCHED_TOKENS) against TTFT and decode speed under load:
`mpirun -n 1 spmd_serve` started once per budget on the benchmarks/peers export of a demo model,
`spmd_serve bench` (OpenAI completions, 128 in / 128 out forced, greedy) at the given concurrencies,
budgets interleaved round by round so a shared machine slows each alike; the best round per budget
and level is kept (others only ever slow a server down).  Other processes' share of the cores during
each level is recorded (benchmarks/peers/machine.ForeignCpu).

    python -m benchmarks.prefill_budget --demo small --budgets 256,512,1024,2048 [--concurrency 8,32]
                                       [--rounds 2] [--threads 2] [--json FILE]

The exports come from `python -m benchmarks.peers.compare --demo ...` (it makes them once).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.peers import servers
from benchmarks.peers.build_llama import cache_root
from benchmarks.peers.machine import ForeignCpu
from spmd_serve.manifest import MANIFEST_VERSION


def bench(server: servers.Server, tokenizer: Path, conc: int, prompts: int, out: Path) -> dict:
    cmd = [
        *servers.spmd_serve_cmd(),
        "bench",
        "--backend",
        "openai-completions",
        "--base-url",
        server.base_url,
        "--tokenizer",
        str(tokenizer),
        "--input-len",
        "128",
        "--output-len",
        "128",
        "--num-prompts",
        str(prompts),
        "--concurrency",
        str(conc),
        "--seed",  # prompts of its own per level: a repeated prompt would be answered from the prefix cache
        str(conc),
        "--no-progress",
        "--json",
        str(out),
        "--metrics-url",
        str(server.metrics_url),
    ]
    meter = ForeignCpu(server.pid or 0)
    subprocess.run(cmd, env=servers.child_env(), stdout=subprocess.DEVNULL, check=True)
    run = json.loads(out.read_text())["runs"][0]
    return {
        "output_tok_s": run["output_throughput"],
        "ttft_p50_ms": run["ttft_ms"]["median"],
        "ttft_p99_ms": run["ttft_ms"]["p99"],
        "tpot_median_ms": run["tpot_ms"]["median"],
        "foreign_cpu": meter.share(),
        "server_phases": run.get("server_phases"),
    }


def keep_best(best: dict[str, dict], key: str, got: dict) -> None:
    """Keep the round with the most output tok/s per key (others only ever slow a server down)."""
    if key not in best or got["output_tok_s"] > best[key]["output_tok_s"]:
        best[key] = got


def report(best: dict[str, dict], column: str, args: argparse.Namespace, out: Path) -> None:
    """The best rounds (keys "<server>/c<concurrency>") as a table, and everything as JSON at `out`."""
    print(
        f"\n| {column} | c | output tok/s | TTFT p50 ms | TTFT p99 ms | TPOT ms | others' CPU |\n"
        "|---|---|---|---|---|---|---|"
    )
    for key, got in best.items():
        name, conc = key.rsplit("/", 1)
        print(
            f"| {name} | {conc[1:]} | {got['output_tok_s']:.0f} | {got['ttft_p50_ms']:.0f} "
            f"| {got['ttft_p99_ms']:.0f} | {got['tpot_median_ms']:.1f} | {got['foreign_cpu']:.0%} |"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "best": best}, indent=1, default=str))
    print(f"wrote {out}")


def parse_common(ap: argparse.ArgumentParser, argv: list[str] | None, concurrency: str, rounds: int):
    """The options every served A/B here shares, added to `ap`, and the parsed arguments."""
    ap.add_argument("--demo", default="small")
    ap.add_argument("--concurrency", default=concurrency)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    return ap.parse_args(argv)


def export_dir(demo: str) -> tuple[Path, Path]:
    """The benchmarks/peers work folder of a demo model and its TP = 1 float32 export there."""
    work = cache_root() / "work" / f"demo-{demo}"
    model = work / f"ours-f32-tp1-v{MANIFEST_VERSION}"
    if not (model / "config.json").is_file():
        raise SystemExit(f"no export at {model}: run `python -m benchmarks.peers.compare --demo {demo}` first")
    return work, model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", default="256,512,1024,2048")
    args = parse_common(ap, argv, concurrency="8,32", rounds=2)
    work, model = export_dir(args.demo)
    run_dir = work / time.strftime("budget-%Y%m%d-%H%M%S")
    best: dict[str, dict] = {}
    for rnd in range(args.rounds):
        for budget in args.budgets.split(","):
            server = servers.spmd_serve(
                f"budget {budget}", model, 1, args.threads, 32, 256, log_dir=run_dir / f"logs-{budget}"
            )
            server.env["SPMD_MAX_NUM_BATCHED_TOKENS"] = budget
            with servers.running(server, run_dir / f"r{rnd}-{budget}.log"):
                for conc in (int(c) for c in args.concurrency.split(",")):
                    got = bench(server, work / "hf", conc, args.num_prompts, run_dir / f"r{rnd}-{budget}-c{conc}.json")
                    key = f"{budget}/c{conc}"
                    print(
                        f"round {rnd} budget {budget} c={conc}: {got['output_tok_s']:.0f} tok/s, TTFT p50 "
                        f"{got['ttft_p50_ms']:.0f} p99 {got['ttft_p99_ms']:.0f} ms, TPOT {got['tpot_median_ms']:.1f} ms"
                        f" (others {got['foreign_cpu']:.0%} of the cores)",
                        flush=True,
                    )
                    keep_best(best, key, got)
    report(best, "budget", args, args.json or run_dir / "budgets.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
