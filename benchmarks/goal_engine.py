"""Decode-only engine figures for issue 6's goals: the offline engine (no HTTP), run under mpirun.

    mpirun -n 1 python benchmarks/goal_engine.py MODEL_DIR --batch 32 [--input-len 16] [--output-len 48]

Admits `--batch` prompts at once, runs the engine until every request has its first token (the
prefill steps), then measures the remaining decode steps only: steps/s, output tokens/s and the
per-step phase split (engine/step_stats.py) diffed over exactly those steps; and the whole run from
admission to the last token (`whole_tokens_per_s`: the work a `generate()` call does, prefill
included).  Also times, in the same process and with the same thread count, a numpy float32
matmul of this rank's decode shapes and a numpy copy of a buffer larger than the caches, so every
ratio is taken on one machine state.  Rank 0 prints one JSON line; `benchmarks/goals.py` runs this
and judges the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np


def copy_bandwidth(nbytes: int = 256 << 20, reps: int = 7, sync=None, threads: int = 1) -> float:
    """STREAM-style copy bandwidth (bytes read + bytes written per second), median of `reps`, with
    `threads` threads each copying its share (numpy releases the GIL while it copies).
    `sync` (e.g. an MPI barrier) is called once the arrays are paged in, so that ranks copying
    "at the same time" really do (paging 512 MB in takes longer than the timed copies)."""
    import threading

    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    if sync is not None:
        sync()
    edges = np.linspace(0, src.size, threads + 1).astype(int)

    def part(i: int) -> None:
        np.copyto(dst[edges[i] : edges[i + 1]], src[edges[i] : edges[i + 1]])

    times = []
    for _ in range(reps):
        t = time.perf_counter()
        workers = [threading.Thread(target=part, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        times.append(time.perf_counter() - t)
    return 2 * nbytes / float(np.median(times))


def shard_matmuls(dims: dict) -> list[tuple[int, int]]:
    """(in, out) of every weight matmul of one decode step on this rank (embedding excluded:
    it is a row gather).  Column shards: q/k/v/gate/up; row shards: o/down; vocab-parallel head."""
    h, d, inter = dims["hidden"], dims["head_dim"], dims["intermediate"]  # per-rank dims
    q, kv = dims["heads"] * d, dims["kv_heads"] * d
    layer = [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]
    return layer * dims["num_layers"] + [(h, dims["vocab_local"])]


def weight_bytes_per_step(dims: dict) -> int:
    """Bytes of weights one decode step must read on this rank (fp32 matmul weights + norms)."""
    mats = sum(i * o for i, o in shard_matmuls(dims))
    norms = (2 * dims["num_layers"] + 1) * dims["hidden"]
    return 4 * (mats + norms)


def numpy_matmul_flops(dims: dict, tokens: int, reps: int = 9) -> float:
    """FLOP/s of the decode step's weight matmuls ([tokens, in] @ [in, out], distinct weights)."""
    rng = np.random.default_rng(0)
    shapes = shard_matmuls(dims)
    ws = [rng.standard_normal((i, o), dtype=np.float32) for i, o in shapes]
    xs = {i: rng.standard_normal((tokens, i), dtype=np.float32) for i, _ in shapes}
    flops = sum(2 * tokens * i * o for i, o in shapes)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for (i, _), w in zip(shapes, ws):
            xs[i] @ w
        times.append(time.perf_counter() - t)
    return flops / float(np.median(times))


def run(
    model_dir: str, batch: int, input_len: int, output_len: int, num_threads: int, segments: int = 1
) -> dict | None:
    from spmd_serve.config import env_setting
    from spmd_serve.dist.comm import Comm
    from spmd_serve.engine.client import EngineClient
    from spmd_serve.engine.engine import Engine, worker_loop
    from spmd_serve.protocol import StepPlan
    from spmd_serve.sampling_params import SamplingParams
    from spmd_serve.scheduler.request import Request
    from spmd_serve.scheduler.scheduler import SchedulerConfig
    from spmd_serve.worker.model_runner import ModelRunner

    comm = Comm()
    num_blocks, block_size = 512, 64
    runner = ModelRunner(
        model_dir, comm.rank, comm, num_blocks, block_size, num_threads, malloc_tuning=env_setting("malloc_tuning")
    )
    comm.barrier()
    if comm.rank != 0:
        worker_loop(comm, runner)
        copy_bandwidth(sync=comm.barrier)  # with rank 0's: each rank's share when all ranks stream
        return None
    sched = SchedulerConfig(
        max_num_seqs=max(batch, 1),
        num_blocks=num_blocks,
        block_size=block_size,
        block_ratio=1.0,
        max_waiting=batch + 1,
        max_num_batched_tokens=max(512, batch * input_len),
        max_model_len=4096,
    )
    engine = Engine(sched, comm, runner, EngineClient(capacity=batch), frozenset({2}))
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=output_len, min_tokens=output_len, temperature=0.0)
    reqs = [
        Request(str(i), [1] + rng.integers(10, 1000, input_len - 1).tolist(), params, eos_token_ids=frozenset({2}))
        for i in range(batch)
    ]
    t_admit = time.perf_counter()  # the whole run (prefill + decode): the work PaddleNLP's generate() does
    for r in reqs:
        engine.scheduler.add_request(r)
    while not all(r.output_token_ids for r in reqs):  # prefill (and its first tokens)
        engine.step()
    st = engine.stats
    before, steps0, sampled0, t0 = st.totals(), st.steps, st.sampled, time.perf_counter()
    # TP = 1: the decode in `segments` parts, each followed by a copy measurement (left out of the
    # times): the VM's bandwidth swings within minutes (RESULTS.md "Session 22": 25.8-33.6 GB/s),
    # so each part is divided by a copy of its own moment.  For models larger than the L3 (300 MB
    # here, `--demo 1b`): a copy evicts a smaller model's weights and slows its next part
    segmented = comm.size == 1 and segments > 1
    per_segment = max(1, -(-(output_len - 1) // segments)) if segmented else output_len
    parts, copying = [], 0.0
    while engine.scheduler.has_unfinished():
        t, n0 = time.perf_counter(), st.steps
        while engine.scheduler.has_unfinished() and st.steps - n0 < per_segment:
            engine.step()
        took = time.perf_counter() - t
        if segmented:
            t = time.perf_counter()
            copy = copy_bandwidth(threads=num_threads, reps=3)
            copying += time.perf_counter() - t
            parts.append({"steps": st.steps - n0, "steps_per_s": (st.steps - n0) / took, "copy_threads_Bps": copy})
    end = time.perf_counter() - copying
    elapsed, whole = end - t0, end - t_admit
    after = st.totals()
    comm.send_plan(StepPlan.shutdown(engine.step_id + 1))
    concurrent_bw = copy_bandwidth(sync=comm.barrier)
    steps, sampled = st.steps - steps0, st.sampled - sampled0
    ms = {k: 1e3 * (after[k] - before[k]) / max(steps, 1) for k in after}
    dims = dataclasses.asdict(runner.dims)
    return {
        "model_dir": model_dir,
        "tp": dims["tp"],
        "batch": batch,
        "threads": num_threads,
        "decode_steps": steps,
        "decode_tokens": sampled,
        "elapsed_s": elapsed,
        "steps_per_s": steps / elapsed,
        "tokens_per_s": sampled / elapsed,
        "whole_elapsed_s": whole,  # admission to the last token, prefill included
        "whole_tokens_per_s": sum(len(r.output_token_ids) for r in reqs) / whole,
        "ms_per_step": ms,
        "weight_bytes_per_step": weight_bytes_per_step(dims),
        "flops_per_token": 2 * sum(i * o for i, o in shard_matmuls(dims)),
        "copy_bandwidth_concurrent_Bps": concurrent_bw,  # while every rank of the job copies
        "copy_bandwidth_Bps": copy_bandwidth(),
        "copy_bandwidth_threads_Bps": copy_bandwidth(threads=num_threads),  # with the rank's threads
        "numpy_matmul_flops": numpy_matmul_flops(dims, batch),
        "segments": parts,  # TP = 1: each part of the decode with the copy bandwidth measured after it
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank (the C++ graph ops')")
    ap.add_argument("--segments", type=int, default=1, help="TP = 1: decode parts, a copy measured after each")
    args = ap.parse_args()
    res = run(args.model_dir, args.batch, args.input_len, args.output_len, args.threads, args.segments)
    if res is not None:
        print("GOAL_ENGINE " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
