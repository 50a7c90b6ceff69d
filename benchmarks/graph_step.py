"""Exported graphs (rank 0's segment 0, i.e. the whole model at --tp 1) timed alone on a synthetic
step: batch B, C tokens of past each (blocks of 64), Q new tokens each (1, a decode step, by
default; more: prefill chunks).  With several model directories (or
oneDNN settings) the runs alternate A, B, A, B, ... in one process, so a noisy shared machine
slows every variant alike; each prints its median, 25th percentile and minimum.

    python benchmarks/graph_step.py DIR [DIR ...] --batch B --past C [--query Q] [--onednn 0 1] [--threads 1]
                                    [--runs 40] [--prof] [--kv-int8 0 1] [--huge-pages 0 1] [--decode-graph]

`--onednn 0 1` runs every directory with oneDNN off and on (one predictor each); `--huge-pages 0 1`
with its parameters left on 4 KB pages and read onto 2 MB pages, as a served rank's
(worker/params.py; default 1, as served).  `--decode-graph`: the segment's decode variant (DeepSeek's
fused MLA decode), which a served step whose every query is one token runs; else the general graph.  `--prof` turns
on Paddle's per-op profiler (printed at exit: calls per op type over warm-up + runs, so it also
counts the ops one run executes; Paddle also writes `profile.log` into the current directory —
do not commit it).  Used for the before/after of graph changes in RESULTS.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from paddle import inference

from spmd_serve.config import env_setting
from spmd_serve.manifest import read_manifest
from spmd_serve.worker.graph_ops import register_graph_ops
from spmd_serve.worker.kv_cache import KVCachePool
from spmd_serve.worker.malloc import tune_malloc
from spmd_serve.worker.params import HostParams
from spmd_serve.worker.predictor import batch_paddle_gc
from spmd_serve.worker.step_tables import step_feeds

BLOCK = 64


class Graph:
    """One predictor of `model_dir`'s rank-0 segment 0, bound to its own KV pool."""

    def __init__(
        self,
        model_dir: str,
        onednn: bool,
        threads: int,
        prof: bool,
        kv_int8: bool = False,
        num_blocks: int = 256,
        huge_pages: bool = True,
        decode: bool = False,
    ) -> None:
        rank_dir = Path(model_dir) / "rank_0"
        man = read_manifest(rank_dir)
        ops = register_graph_ops(man, rank_dir, threads)  # the C++ ops get the threads, as in ModelRunner
        self.dims, spec = man.dims, man.specs(kv_int8)[0]
        if decode:  # the variant a served step whose every query is one token runs (DeepSeek's MLA)
            if spec.decode is None:
                raise SystemExit(f"{model_dir}: the export has no decode graph (--decode-graph)")
            spec = spec.decode
        self.inv_freq = man.inv_freq_array
        self.label = f"{model_dir} {spec.name} onednn={int(onednn)}"
        # as served (worker/params.py): the predictor made from a skeleton, bound to the rank's copy
        self.params = HostParams(huge_pages, threads)
        program, file = rank_dir / f"{spec.name}.json", rank_dir / f"{spec.params_name}.pdiparams"
        quantised = man.quant is not None
        self.p = self.params.load(
            program, file, lambda p: self._create(program, p, ops, threads, onednn, prof, quantised)
        )
        pool = KVCachePool(man.kv_cache, num_blocks, BLOCK, man.kv_scales if kv_int8 else None)
        self.pool = pool  # the predictor shares its memory: keep it alive
        # written, as a served pool is: np.zeros' untouched pages all map the kernel's one zero page,
        # which stays in cache, and attention then read its "past" at no memory cost (RESULTS.md
        # "Session 41": 0.47 against ~1.1 ms a layer cold at B = 32 on --demo small)
        for arrays in pool.caches.values():
            for a in arrays:
                a.fill(1 if a.dtype == np.int8 else 0.01)
        for n in self.p.get_input_names():
            if n in pool:
                self.p.get_input_handle(n).share_external_data(pool.tensor(n))
        self.times: list[float] = []

    @staticmethod
    def _create(program: Path, params: Path, ops: int, threads: int, onednn: bool, prof: bool, quantised: bool):
        cfg = inference.Config(str(program), str(params))
        cfg.disable_gpu()
        cfg.disable_glog_info()
        cfg.set_cpu_math_library_num_threads(1 if ops else threads)
        cfg.enable_mkldnn() if onednn else cfg.disable_mkldnn()
        if quantised:
            cfg.delete_pass("constant_folding_pass")  # as worker/predictor.py loads quantised graphs
        if prof:
            cfg.enable_profile()
        batch_paddle_gc()  # as worker/predictor.py makes its predictors
        return inference.create_predictor(cfg)

    def run(self, feeds: dict[str, np.ndarray]) -> None:
        t = time.perf_counter()
        for n, v in feeds.items():
            if n in self.p.get_input_names():
                h = self.p.get_input_handle(n)
                h.reshape(list(v.shape))
                h.copy_from_cpu(v)
        self.p.run()
        self.p.get_output_handle(self.p.get_output_names()[0]).copy_to_cpu()
        self.times.append(time.perf_counter() - t)


def step_inputs(graphs: list[Graph], batch: int, past: int, query: int = 1) -> dict[str, np.ndarray]:
    """A step of `batch` sequences with `past` tokens each in the cache and `query` new tokens each
    (1: a decode step; more: prefill chunks): every input any of `graphs` takes (worker/step_tables.py)."""
    mb = (past + query + BLOCK - 1) // BLOCK
    pos = past + np.arange(query, dtype=np.int64)  # [query]: one sequence's new positions
    tables = np.arange(batch * mb, dtype=np.int64).reshape(batch, mb)  # every sequence its own blocks
    plan = SimpleNamespace(
        input_ids=np.full(batch * query, 5, np.int64),
        positions=np.tile(pos, batch),  # [batch * query]
        query_lens=np.full(batch, query, np.int64),
        ctx_lens=np.full(batch, past, np.int64),
        block_tables=tables,
        slot_mapping=(tables[:, pos // BLOCK] * BLOCK + pos % BLOCK).reshape(-1),  # [batch, query] -> flat
    )
    names = {n for g in graphs for n in g.p.get_input_names()}
    return step_feeds(plan, graphs[0].dims, graphs[0].inv_freq, BLOCK, names)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--past", type=int, default=64)
    ap.add_argument("--query", type=int, default=1, help="new tokens per sequence (1: decode; more: prefill)")
    ap.add_argument("--onednn", type=int, nargs="+", default=[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--prof", action="store_true")
    ap.add_argument("--kv-int8", type=int, nargs="+", default=[0], help="1: the int8-KV graphs and pool (0 1: both)")
    ap.add_argument("--huge-pages", type=int, nargs="+", default=[1], help="1: parameters on 2 MB pages (0 1: both)")
    ap.add_argument("--decode-graph", action="store_true", help="the export's decode graph (--query 1), as served")
    args = ap.parse_args()
    if env_setting("malloc_tuning"):
        tune_malloc()  # as ModelRunner (SPMD_MALLOC_TUNING=0: glibc's)
    variants = [(d, o, q, h) for d in args.dirs for o in args.onednn for q in args.kv_int8 for h in args.huge_pages]
    blocks = args.batch * ((args.past + args.query + BLOCK - 1) // BLOCK)  # the step's, none shared
    graphs = []
    for d, o, q, h in variants:
        graphs.append(Graph(d, bool(o), args.threads, args.prof, bool(q), max(256, blocks), bool(h), args.decode_graph))
        graphs[-1].label += f" huge_pages={h}"
        print(f"{graphs[-1].label}: {graphs[-1].params.report()}", flush=True)
    feeds = step_inputs(graphs, args.batch, args.past, args.query)
    for _ in range(3):  # warm-up (oneDNN creates its primitives here)
        for g in graphs:
            g.run(feeds)
    for g in graphs:
        g.times.clear()
    for _ in range(args.runs):
        for g in graphs:
            g.run(feeds)
    for g in graphs:
        ms = 1e3 * np.asarray(g.times)
        print(
            f"{g.label} B={args.batch} C={args.past} Q={args.query} threads={args.threads}: "
            f"median {np.median(ms):.2f} ms "
            f"p25 {np.percentile(ms, 25):.2f} min {ms.min():.2f} ({len(ms)} runs)",
            flush=True,
        )


if __name__ == "__main__":
    main()
