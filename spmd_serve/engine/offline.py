"""Offline generation under mpirun, without HTTP: the same engine, scheduler and ranks as the
server, driven to completion for a fixed list of prompts.  Used by the parity tests and the
benchmarks; with `capture_logits` rank 0 also keeps every sampled row of logits.

    mpirun -n 2 python -m spmd_serve.engine.offline MODEL_DIR PROMPTS.json OUT.npz
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from spmd_serve.engine.sampler import Sampler
from spmd_serve.model_dir import MTP_FOLDER
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request

if TYPE_CHECKING:
    from spmd_serve.dist.comm import Comm
    from spmd_serve.engine.engine import Engine
    from spmd_serve.engine.speculative import Proposer
    from spmd_serve.worker.model_runner import ModelRunner


class _CapturingSampler(Sampler):
    """Keeps a copy of every sampled row of logits, by request (the parity tests compare them)."""

    def __init__(self, captured: dict[str, list[npt.NDArray[np.float32]]]) -> None:
        self.captured = captured

    def observe(self, requests: list[Request], logits: npt.NDArray[np.float32], rows: list[int]) -> None:
        for req, i in zip(requests, rows):
            self.captured[req.req_id].append(logits[i].copy())


@dataclass
class EngineSettings:
    """The scheduler and pool settings of an offline engine (the server's come from ServeConfig)."""

    num_blocks: int = 256
    block_size: int = 16
    max_num_seqs: int = 64
    block_ratio: float = 1.0
    max_num_batched_tokens: int = 512
    eos_token_ids: frozenset[int] = frozenset()
    kv_int8: bool | None = None  # int8 KV pool (None: the USE_CACHE_KV_INT8 environment variable)
    # Off unless asked for: `generate` admits every prompt before the first step, so it would only
    # matter for prompts admitted late, and the parity tests compare full prefills.
    enable_prefix_caching: bool = False
    # speculative decoding (SPECULATE_METHOD and its sizes; min_acceptance: the per-step rule's threshold)
    speculate_method: str = "none"
    speculate_max_draft_token_num: int = 1
    speculate_max_ngram_size: int = 3
    speculate_min_acceptance: float | None = None
    speculate_model_path: str | None = None  # the draft model's export (opened by `open_draft`)

    @property
    def use_kv_int8(self) -> bool:
        from spmd_serve.config import env_setting

        return bool(env_setting("use_cache_kv_int8")) if self.kv_int8 is None else self.kv_int8


def open_ranks(model_dir: str, s: EngineSettings) -> tuple[Comm, ModelRunner]:
    """Every rank: its shard loaded and the start barrier passed.  Ranks 1..N-1 then call
    `worker_loop`; rank 0 builds engines (`make_engine`) and sends SHUTDOWN when done.  A
    `speculate_model_path` that is the export's own MTP draft (`<model_dir>/mtp`) is its
    SPECULATE_METHOD=mtp draft (`with_mtp` sets it)."""
    from spmd_serve.config import env_setting
    from spmd_serve.dist.comm import Comm
    from spmd_serve.worker.rank_cpus import setup_rank_cpus
    from spmd_serve.worker.runners import make_runner

    comm = Comm()
    cpus = setup_rank_cpus(comm, env_setting("num_threads"), env_setting("bind_cores"))
    mtp = s.speculate_model_path is not None and Path(s.speculate_model_path) == Path(model_dir) / MTP_FOLDER
    runner = make_runner(
        env_setting("device"),
        model_dir,
        comm.rank,
        comm,
        s.num_blocks,
        s.block_size,
        cpus.threads,
        kv_int8=s.use_kv_int8,
        malloc_tuning=env_setting("malloc_tuning"),
        huge_pages=env_setting("huge_pages"),
        keep_hidden=mtp and comm.rank == 0,  # what the export's MTP layer drafts from
    )
    comm.barrier()
    return comm, runner


def open_draft(comm: Comm, s: EngineSettings) -> ModelRunner | None:
    """Every rank, after `open_ranks`: the draft runner of `s.speculate_model_path` (None if unset),
    its pool the mirror of `s.num_blocks` plus scratch for `s.max_num_seqs` requests drafting up to
    the most tokens a setting may ask for; then `worker_loop(comm, runner, draft_runner)`."""
    from spmd_serve.config import env_setting
    from spmd_serve.engine.draft_model import draft_pool_blocks
    from spmd_serve.engine.speculative import MAX_DRAFT_TOKENS
    from spmd_serve.worker.rank_cpus import setup_rank_cpus
    from spmd_serve.worker.runners import make_draft_runner

    if s.speculate_model_path is None:
        return None
    cpus = setup_rank_cpus(comm, env_setting("num_threads"), env_setting("bind_cores"))
    blocks = draft_pool_blocks(s.num_blocks, s.max_num_seqs, MAX_DRAFT_TOKENS, s.block_size)
    runner: ModelRunner = make_draft_runner(
        env_setting("device"), s.speculate_model_path, comm.rank, comm, blocks, s.block_size, cpus.threads
    )
    comm.barrier()
    return runner


def with_mtp(model_dir: str, s: EngineSettings) -> EngineSettings:
    """SPECULATE_METHOD=mtp: the settings with the export's MTP draft as the draft model."""
    from spmd_serve.engine.speculative import canonical_method

    if canonical_method(s.speculate_method) != "mtp" or s.speculate_model_path is not None:
        return s
    return replace(s, speculate_model_path=str(Path(model_dir) / MTP_FOLDER))


def _draft_proposer(
    comm: Comm, runner: ModelRunner, draft_runner: ModelRunner | None, s: EngineSettings
) -> Proposer | None:
    """draft_model's or mtp's proposer over the ranks' draft runners (None for the other methods)."""
    from spmd_serve.engine.draft_model import make_draft_proposer, scratch_per_seq
    from spmd_serve.engine.mtp_proposer import make_mtp_proposer
    from spmd_serve.engine.speculative import canonical_method
    from spmd_serve.model_dir import max_positions

    method = canonical_method(s.speculate_method)
    if method not in ("draft_model", "mtp"):
        return None
    assert draft_runner is not None and s.speculate_model_path is not None, f"{method} needs open_draft's runner"
    k = s.speculate_max_draft_token_num
    need = s.num_blocks + s.max_num_seqs * scratch_per_seq(k, s.block_size)
    have = draft_runner.pool.num_blocks
    assert need <= have, f"the draft pool has {have} blocks, {need} needed"
    if method == "mtp":
        return make_mtp_proposer(comm, draft_runner, runner, s.block_size, s.num_blocks, k)
    positions = max_positions(s.speculate_model_path)
    return make_draft_proposer(comm, draft_runner, s.block_size, s.num_blocks, k, positions)


def make_engine(
    comm: Comm,
    runner: ModelRunner,
    model_dir: str,
    s: EngineSettings,
    capacity: int,
    sampler: Sampler | None = None,
    draft_runner: ModelRunner | None = None,
) -> Engine:
    """Rank 0: an engine over ranks opened by `open_ranks` (several may run one after the other;
    they share the pool, each with its own block accounting); `draft_runner`: `open_draft`'s."""
    from spmd_serve.engine.client import EngineClient
    from spmd_serve.engine.engine import Engine
    from spmd_serve.engine.speculative import DEFAULT_MIN_ACCEPTANCE, make_speculator
    from spmd_serve.scheduler.scheduler import SchedulerConfig

    cfg = json.loads(open(f"{model_dir}/config.json").read())
    sched = SchedulerConfig(
        max_num_seqs=s.max_num_seqs,
        num_blocks=s.num_blocks,
        block_size=s.block_size,
        block_ratio=s.block_ratio,
        max_waiting=capacity + 1,
        max_num_batched_tokens=s.max_num_batched_tokens,
        max_model_len=int(cfg["max_position_embeddings"]),
        enable_prefix_caching=s.enable_prefix_caching,
        cache_salt=f"{model_dir}|kv_int8={int(s.use_kv_int8)}",
    )
    spec = make_speculator(
        s.speculate_method,
        s.speculate_max_draft_token_num,
        s.speculate_max_ngram_size,
        s.speculate_min_acceptance if s.speculate_min_acceptance is not None else DEFAULT_MIN_ACCEPTANCE,
        _draft_proposer(comm, runner, draft_runner, s),
    )
    client = EngineClient(capacity=capacity)
    return Engine(sched, comm, runner, client, s.eos_token_ids, sampler=sampler, speculator=spec)


def generate(
    model_dir: str, prompts: list[list[int]], params: SamplingParams, *, capture_logits: bool = False, **settings: Any
) -> dict[str, Any] | None:
    """Rank 0 returns {"tokens": [[...]], "logits": [array [n, V]], "stats": {...}}; others None.
    `settings`: the fields of `EngineSettings`."""
    from spmd_serve.engine.engine import worker_loop
    from spmd_serve.protocol import StepPlan

    s = with_mtp(model_dir, EngineSettings(**settings))
    comm, runner = open_ranks(model_dir, s)
    draft_runner = open_draft(comm, s)
    if comm.rank != 0:
        worker_loop(comm, runner, draft_runner)
        return None
    captured: dict[str, list[npt.NDArray[np.float32]]] = {str(i): [] for i in range(len(prompts))}
    sampler = _CapturingSampler(captured) if capture_logits else None
    engine = make_engine(comm, runner, model_dir, s, len(prompts), sampler, draft_runner)
    reqs = [Request(str(i), list(p), params, eos_token_ids=s.eos_token_ids) for i, p in enumerate(prompts)]
    for r in reqs:  # all admitted before the first step, so they are batched together
        engine.scheduler.add_request(r)
    t0 = time.perf_counter()
    while engine.scheduler.has_unfinished():
        engine.step()
    elapsed = time.perf_counter() - t0
    comm.send_plan(StepPlan.shutdown(engine.step_id + 1))
    return {
        "tokens": [r.output_token_ids for r in reqs],
        "logits": [np.stack(captured[r.req_id]) if captured[r.req_id] else np.zeros((0,)) for r in reqs],
        "preemptions": sum(r.num_preemptions for r in reqs),
        "elapsed_s": elapsed,
        "stats": engine.stats.as_dict(),
        "op_threads": runner.op_threads,  # the C++ graph ops' threads on rank 0 (0: Paddle's ops only)
    }


def run_chats(
    engine: Engine, system: list[int], turns: list[list[list[int]]], params: SamplingParams
) -> list[list[Request]]:
    """Multi-turn chats that share a system prompt: round k submits every chat's turn k — its whole
    history (the system prompt, the earlier user turns and answers) plus `turns[chat][k]` — and
    steps the engine until all are answered, as chat clients do.  Returns the requests by round."""
    histories = [list(system) for _ in turns]
    rounds: list[list[Request]] = []
    for k in range(len(turns[0])):
        reqs = []
        for c, chat in enumerate(turns):
            histories[c] += chat[k]
            reqs.append(Request(f"chat{c}-turn{k}", histories[c], params, eos_token_ids=engine.eos))
            engine.scheduler.add_request(reqs[-1])
        while engine.scheduler.has_unfinished():
            engine.step()
        for c, r in enumerate(reqs):
            histories[c] += r.output_token_ids
        rounds.append(reqs)
    return rounds


def main(argv: list[str]) -> int:
    """argv: MODEL_DIR PROMPTS_JSON OUT_NPZ; PROMPTS_JSON = {"prompts": [[ids]], "params": {...}, "engine": {...}}."""
    model_dir, prompts_path, out_path = argv
    spec = json.loads(open(prompts_path).read())
    engine_kw = dict(spec.get("engine", {}))
    if "eos_token_ids" in engine_kw:
        engine_kw["eos_token_ids"] = frozenset(engine_kw["eos_token_ids"])
    res = generate(
        model_dir, spec["prompts"], SamplingParams(**spec.get("params", {})), capture_logits=True, **engine_kw
    )
    if res is not None:
        np.savez(
            out_path,
            tokens=np.array(res["tokens"], dtype=object),
            logits=np.array(res["logits"], dtype=object),
            preemptions=res["preemptions"],
            stats=json.dumps(res["stats"]),
            elapsed_s=res["elapsed_s"],
            op_threads=res["op_threads"],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
