"""Two checkouts served side by side: `mpirun -n 1 spmd_serve` from each tree in turn (its PYTHONPATH,
so its Python and its op library) on the benchmarks/peers export of a demo model, `spmd_serve bench`
(OpenAI completions, 128 in / 128 out forced, greedy) at the given concurrencies, the trees
alternating round by round and in reverse order every other round (this VM's speed drifts over
minutes and the second of a pair ran slower: RESULTS.md "Session 76").  Prints every round and, per
tree and level, the best round; other processes' share of the cores is recorded for each.

    python -m benchmarks.served_ab --trees /work/main /work/tree [--demo small] [--concurrency 12,32]
                                   [--rounds 3] [--threads 2] [--num-prompts 64] [--json FILE]

Build each tree's op library first (`python -c "from ops import paddle_ext; paddle_ext.library_path()"`
with that tree on PYTHONPATH): a server that builds it at start-up is timed out by nothing, but the
build's CPU would disturb the other tree's round.  The export comes from `benchmarks.peers.compare`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.peers import servers
from benchmarks.prefill_budget import bench, export_dir, keep_best, parse_common, report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", nargs=2, type=Path, required=True)
    args = parse_common(ap, argv, concurrency="12,32", rounds=3)
    work, model = export_dir(args.demo)
    run_dir = work / time.strftime("trees-%Y%m%d-%H%M%S")
    best: dict[str, dict] = {}
    for rnd in range(args.rounds):
        order = list(enumerate(args.trees))
        for i, tree in order if rnd % 2 == 0 else order[::-1]:
            name = f"tree{i}"
            server = servers.spmd_serve(name, model, 1, args.threads, 32, 256, log_dir=run_dir / f"logs-{name}")
            server.env["PYTHONPATH"] = str(tree.resolve())
            with servers.running(server, run_dir / f"r{rnd}-{name}.log"):
                for conc in (int(c) for c in args.concurrency.split(",")):
                    got = bench(server, work / "hf", conc, args.num_prompts, run_dir / f"r{rnd}-{name}-c{conc}.json")
                    print(
                        f"round {rnd} {name} ({tree}) c={conc}: {got['output_tok_s']:.0f} tok/s, TTFT p99 "
                        f"{got['ttft_p99_ms']:.0f} ms, TPOT {got['tpot_median_ms']:.1f} ms"
                        f" (others {got['foreign_cpu']:.0%} of the cores)",
                        flush=True,
                    )
                    keep_best(best, f"{tree}/c{conc}", got)
    report(best, "tree", args, args.json or run_dir / "trees.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
