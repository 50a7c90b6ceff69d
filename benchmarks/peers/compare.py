"""Side by side with llama.cpp's `llama-server`: the same checkpoint, the same threads, the same
`spmd_serve bench` load, one server after the other, then the ratio table of issue 16's Goals.

    python -m benchmarks.peers.compare --demo small [--threads 2] [--tp2] [--json FILE]

Steps: build llama-server (build_llama, cached); write the demo HF checkpoint once; export it with
`spmd_serve export --checkpoint` (f32, and weight_only_int8 for the Q8_0 row; --tp 2 for --tp2)
and convert it to GGUF F32 / F16 / Q8_0 (gguf_convert); then for each row start the server
(servers.running: free 127.0.0.1 ports, always stopped), check it (prompt token counts of text
prompts against the other servers, greedy continuations), run `spmd_serve bench` (OpenAI
completions, token-id prompts, ignore_eos + min_tokens = max_tokens, temperature 0) at each
concurrency, and stop it.  Never two servers at once: the machine has two cores.  Other jobs on
those cores are measured during each level (machine.ForeignCpu) and a disturbed level is
repeated (--max-foreign, --retries, --budget-min); --merge folds in an earlier run's JSON.

Everything generated lives under `$SPMD_SERVE_CACHE/peers/work/demo-<size>/` (reused by later
runs; --fresh remakes it).  Not in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.peers import ratios, servers
from benchmarks.peers.build_llama import DEFAULT_VERSION, LlamaCpp, cache_root, ensure_llama_cpp
from benchmarks.peers.checks import check_inputs, probe, summarize_checks
from benchmarks.peers.machine import ForeignCpu, machine, wait_quiet
from benchmarks.peers.models import prepare
from benchmarks.peers.ratios import merge_report


@dataclass(frozen=True)
class Row:
    key: str  # --rows name
    name: str  # table label
    kind: str  # "ours" or "llama"
    model: str  # export name (ours) or GGUF outtype (llama)
    ranks: int = 1


ROWS = (
    Row("ours-f32", "spmd_serve -n 1 f32", "ours", "f32-tp1"),
    Row("llama-f32", "llama-server F32", "llama", "f32"),
    Row("llama-f16", "llama-server F16", "llama", "f16"),
    Row("ours-bf16", "spmd_serve -n 1 bf16", "ours", "bf16-tp1"),
    Row("ours-int8", "spmd_serve -n 1 int8", "ours", "int8-tp1"),
    Row("llama-q8_0", "llama-server Q8_0", "llama", "q8_0"),
    Row("ours-tp2", "spmd_serve -n 2 f32", "ours", "f32-tp2", ranks=2),
)
DEFAULT_ROWS = ("ours-f32", "llama-f32", "llama-f16", "ours-int8", "llama-q8_0")
# (ours, peer) pairs of the ratio table, where both rows ran.
PAIRS = (
    ("ours-f32", "llama-f32"),
    ("ours-f32", "llama-f16"),
    ("ours-bf16", "llama-f16"),
    ("ours-int8", "llama-q8_0"),
    ("ours-tp2", "llama-f32"),
)


def bench_level(
    server: servers.Server, args: argparse.Namespace, tokenizer_dir: Path, conc: int, attempt: int, out: Path
) -> dict:
    """One `spmd_serve bench` run of one concurrency level; its JSON.  Every level and attempt sends
    prompts of its own (the seed says which), the same ones to every server: no server answers a
    prompt it has seen before from its prompt cache."""
    n = args.num_prompts_c1 if conc == 1 else args.num_prompts
    script = servers.spmd_serve_cmd()
    # fresh_connections: llama-server drops kept-alive connections after streams (see there)
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.peers.fresh_connections",
        *(script if len(script) == 1 else ["-m", "spmd_serve"]),
        "bench",
        "--backend",
        "openai-completions",
        "--base-url",
        server.base_url,
        "--tokenizer",
        str(tokenizer_dir),
        "--input-len",
        str(args.input_len),
        "--output-len",
        str(args.output_len),
        "--num-prompts",
        str(n),
        "--concurrency",
        str(conc),
        "--seed",
        str(args.seed + 1000 * conc + attempt),
        "--no-progress",
        "--json",
        str(out),
    ]
    if server.metrics_url:
        cmd += ["--metrics-url", server.metrics_url]
    print("+", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, env=servers.child_env(), stdout=subprocess.PIPE, text=True, check=False)
    print(done.stdout, flush=True)
    if done.returncode:
        raise RuntimeError(f"spmd_serve bench failed ({done.returncode}) against {server.name}")
    return json.loads(out.read_text())


def bench(server: servers.Server, args: argparse.Namespace, tokenizer_dir: Path, out_dir: Path) -> list[dict]:
    """Each concurrency level (1: --num-prompts-c1 prompts, others: --num-prompts), repeated up to
    --retries times while other processes took more than --max-foreign of the cores during it
    (no waiting nor repeating past --budget-min); the attempt kept is the least disturbed.  Every
    attempt is recorded ("attempts" in each run)."""
    docs = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for conc in (int(c) for c in args.concurrency.split(",")):
        attempts = []
        for attempt in range(1 + args.retries):
            left = args.deadline - time.monotonic()
            before = wait_quiet(server.pid, args.max_busy, max(0.0, min(args.quiet_timeout, left)))
            meter = ForeignCpu(server.pid)
            doc = bench_level(server, args, tokenizer_dir, conc, attempt, out_dir / f"bench-c{conc}-{attempt}.json")
            foreign = meter.share()
            attempts.append((foreign, doc))
            print(
                f"  c={conc} attempt {attempt + 1}: other processes used {foreign:.0%} of the cores "
                f"({before:.0%} just before)",
                flush=True,
            )
            if foreign <= args.max_foreign or time.monotonic() > args.deadline:
                break
        foreign, doc = min(attempts, key=lambda a: a[0])
        for run in doc["runs"]:
            run["foreign_cpu"] = foreign
            run["attempts"] = [
                {"foreign_cpu": f, "output_throughput": d["runs"][0]["output_throughput"]} for f, d in attempts
            ]
        docs.append(doc)
    return docs


def make_server(row: Row, model: Path, args: argparse.Namespace, lc: LlamaCpp, log_dir: Path) -> servers.Server:
    max_len = args.input_len + args.output_len
    if row.kind == "ours":
        threads = args.threads if row.ranks == 1 else 1  # TP=2: one core per rank
        return servers.spmd_serve(
            row.name,
            model,
            row.ranks,
            threads,
            args.slots,
            max_len,
            tuple(args.mpirun_args.split()),
            log_dir / f"{row.key}-logs",
        )
    return servers.llama_server(row.name, lc.server, model, args.threads, args.slots, args.slots * (max_len + 64))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--demo", default="small", help="demo model size (spmd_serve export --demo's names: small, 1b, ...)"
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads of each server (TP=1)")
    ap.add_argument("--tp2", action="store_true", help="also `mpirun -n 2 spmd_serve` (TP=2, one thread per rank)")
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS), help=f"rows to run, of {', '.join(r.key for r in ROWS)}")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--num-prompts", type=int, default=64, help="prompts per level (concurrency > 1)")
    ap.add_argument("--num-prompts-c1", type=int, default=16, help="prompts at concurrency 1")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--slots", type=int, default=32, help="llama-server -np and spmd_serve BATCH_SIZE")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mpirun-args", default="--bind-to none", help="extra mpirun flags for spmd_serve")
    ap.add_argument("--llama-cpp-python", default=DEFAULT_VERSION, help="sdist version (or latest)")
    ap.add_argument("--check-prompts", type=int, default=16, help="random text prompts of the tokenizer check")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every row this many times, interleaved (odd rounds in reverse row order); each level "
        "reports its best round (by output tok/s)",
    )
    ap.add_argument(
        "--max-busy",
        type=float,
        default=0.25,
        help="before each level, wait until other processes use "
        "at most this share of the cores, up to --quiet-timeout s",
    )
    ap.add_argument("--quiet-timeout", type=float, default=60.0)
    ap.add_argument(
        "--max-foreign",
        type=float,
        default=0.1,
        help="repeat a level when other processes took more than this share of the cores during it",
    )
    ap.add_argument("--retries", type=int, default=2, help="repeats of a disturbed level (the cleanest is kept)")
    ap.add_argument(
        "--budget-min",
        type=float,
        default=30.0,
        help="after this many minutes, no more waiting for quiet cores nor repeats: the rest is measured once",
    )
    ap.add_argument(
        "--merge",
        type=Path,
        default=None,
        help="an earlier run's JSON: keep its rows, and per level "
        "the less disturbed of its and this run's measurements",
    )
    ap.add_argument("--fresh", action="store_true", help="remake the checkpoint, exports and GGUFs")
    ap.add_argument("--json", type=Path, default=None, help="write everything here (default: in the work dir)")
    args = ap.parse_args(argv)
    args.deadline = time.monotonic() + 60 * args.budget_min
    if args.tp2 and "ours-tp2" not in args.rows.split(","):
        args.rows += ",ours-tp2"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    by_key = {r.key: r for r in ROWS}
    unknown = [k for k in args.rows.split(",") if k not in by_key]
    if unknown:
        raise SystemExit(f"compare: unknown rows {unknown}; choose from {list(by_key)}")
    rows = [by_key[k] for k in by_key if k in args.rows.split(",")]
    work = cache_root() / "work" / f"demo-{args.demo}"
    if args.fresh:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    lc = ensure_llama_cpp(args.llama_cpp_python)
    paths = prepare(args, rows, lc, work)
    run_dir = work / time.strftime("run-%Y%m%d-%H%M%S")
    ckpt = work / "hf"
    texts, prompt_ids = check_inputs(ckpt / "tokenizer.model", args.check_prompts, args.input_len, args.seed)
    levels = [int(c) for c in args.concurrency.split(",")]
    report: dict = {
        "command": " ".join(["python -m benchmarks.peers.compare", *(argv or sys.argv[1:])]),
        "llama_cpp": lc.describe(),
        "machine_before": machine(),
        "args": vars(args) | {"json": str(args.json)},
        "rows": {},
    }
    probes: dict[str, dict] = {}
    for rnd in range(args.rounds):
        # odd rounds in reverse order: no row always runs right after the same one (llama-server's
        # c = 32, say) or always last, where a drift of this VM's speed lands on it every round
        for row in rows if rnd % 2 == 0 else rows[::-1]:
            server = make_server(row, paths[row.model], args, lc, run_dir / f"round{rnd}")
            print(f"== round {rnd + 1}/{args.rounds}, {row.name}: {server.info['command']}", flush=True)
            entry = report["rows"].setdefault(row.key, {"name": row.name, "info": server.info, "rounds": []})
            with servers.running(server, run_dir / f"round{rnd}" / f"{row.key}.log"):
                if rnd == 0:
                    probes[row.name] = probe(server, texts, prompt_ids, 32)
                docs = bench(server, args, ckpt, run_dir / f"round{rnd}" / row.key)  # the same prompts for all
            stats = ratios.level_stats(docs)
            entry["rounds"].append({"loadavg_after": os.getloadavg(), "ready_s": server.ready_s, "levels": stats})
    for entry in report["rows"].values():
        entry["levels"] = ratios.best_of([r["levels"] for r in entry["rounds"]])
    if args.merge:
        merge_report(report, json.loads(args.merge.read_text()), [r.key for r in ROWS])
    stats = {r["name"]: r["levels"] for r in report["rows"].values()}
    report["ratios"] = {
        f"{report['rows'][a]['name']} ÷ {report['rows'][b]['name']}": ratios.ratio_row(
            report["rows"][a]["levels"], report["rows"][b]["levels"], levels
        )
        for a, b in PAIRS
        if a in report["rows"] and b in report["rows"]
    }
    report["checks"] = summarize_checks([r.name for r in rows], probes)
    report["check_texts"] = texts
    raw, ratio = ratios.raw_table(stats, levels), ratios.ratio_table(report["ratios"], levels)
    print(
        f"\n{lc.describe()}; {args.threads} threads; {args.input_len} in / {args.output_len} out; "
        f"{args.num_prompts_c1} prompts at c=1, {args.num_prompts} otherwise\n\n{raw}\n\n{ratio}\n"
    )
    print(ratios.row_notes(report["rows"].values()))
    print(json.dumps(report["checks"], indent=1, ensure_ascii=False))
    out = args.json or run_dir / "peers.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, ensure_ascii=False, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
