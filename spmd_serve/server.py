"""`mpirun -n N spmd_serve`: the per-rank entry point.

Every rank: read and validate the configuration, check the model directory, load its shard,
agree with the others that loading worked.  Rank 0 starts its front end first (rank0_frontend.py: the
HTTP worker processes and the hub they talk to) and then runs the engine loop in its main (only)
thread, so signals reach it; the other ranks run the worker loop.  Any
exception on any rank is logged and ends the whole job (MPI Abort): no rank is left hanging.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import gc
import logging
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:  # imported where used: a rank must not load these before its checks
    from spmd_serve.rank0_frontend import Frontend

log = logging.getLogger("spmd_serve")


def _setup_logging(rank: int) -> None:
    # `kill -USR1 <pid>` dumps every thread's stack: how to see where a stuck rank is.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    from spmd_serve.worker.malloc import install_heap_report

    install_heap_report(f"rank{rank}")  # `kill -USR2 <pid>`: the malloc heap, in use vs kept (benchmarks/soak.py)
    logging.basicConfig(
        level=os.environ.get("SPMD_LOG_LEVEL", "INFO"),
        stream=sys.stderr,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
    )


def _quiet_paddle() -> None:
    os.environ.setdefault("GLOG_minloglevel", "2")  # Paddle's C++ INFO logs drown ours
    os.environ.setdefault("FLAGS_use_mkldnn", "0")


def _load(cfg, comm):
    """Checks, rank 0's front end, shard load; returns (cfg clamped to the model, runner,
    front end or None, draft runner or None)."""
    from spmd_serve.dist.comm import node_local_first
    from spmd_serve.engine.draft_model import draft_pool_blocks
    from spmd_serve.export import ensure_demo_model
    from spmd_serve.model_dir import check_draft_dir, check_model_dir, check_mtp_dir, clamp_to_model
    from spmd_serve.worker.capacity import check_kv_fits, check_served_model, check_supported
    from spmd_serve.worker.model_runner import read_rank_manifest
    from spmd_serve.worker.rank_cpus import setup_rank_cpus
    from spmd_serve.worker.runners import make_draft_runner, make_runner

    if cfg.model_dir is None:  # CONTRACT §2: the built-in demo model, made on first use
        demo = node_local_first(comm, lambda: str(ensure_demo_model(tp=cfg.mp_num)))
        cfg = dataclasses.replace(cfg, model_dir=demo)
        if cfg.speculate_method == "draft_model" and cfg.speculate_model_path is None:  # and its draft
            draft = node_local_first(comm, lambda: str(ensure_demo_model("chat-draft", tp=cfg.mp_num)))
            cfg = dataclasses.replace(cfg, speculate_model_path=draft)
    check_supported(cfg)
    model_config = check_model_dir(cfg, comm.size)
    check_served_model(model_config, cfg.model_dir)
    cfg = clamp_to_model(cfg, model_config)
    draft_config = check_draft_dir(cfg, model_config) if cfg.speculate_method == "draft_model" else None
    mtp_dir = check_mtp_dir(cfg, model_config) if cfg.speculate_method == "mtp" else None
    # the draft runner's export: draft_model's, or the MTP layer's (the target export's mtp/)
    draft_dir = mtp_dir or (cfg.speculate_model_path if draft_config is not None else None)
    manifest = read_rank_manifest(Path(cfg.model_dir) / f"rank_{comm.rank}", cfg.use_cache_kv_int8)
    draft_layout, k = None, cfg.speculate_max_draft_token_num
    if draft_dir is not None:
        draft_layout = read_rank_manifest(Path(str(draft_dir)) / f"rank_{comm.rank}").kv_cache
    draft_blocks = draft_pool_blocks(cfg.num_blocks(), cfg.batch_size, k, cfg.block_size)
    check_kv_fits(cfg, manifest.kv_cache, comm.ranks_on_node(), draft_layout, draft_blocks - cfg.num_blocks())
    node_cores = frozenset(os.sched_getaffinity(0))  # the job's cores here, for the HTTP workers
    cpus = setup_rank_cpus(comm, cfg.num_threads, cfg.bind_cores)  # collective on the node, like ranks_on_node
    frontend = None
    if comm.rank == 0:
        from spmd_serve.rank0_frontend import start_frontend

        frontend = start_frontend(cfg, model_config, node_cores)
    try:
        runner = make_runner(
            cfg.device,
            cfg.model_dir,
            comm.rank,
            comm,
            cfg.num_blocks(),
            cfg.block_size,
            cpus.threads,
            kv_int8=cfg.use_cache_kv_int8,
            malloc_tuning=cfg.malloc_tuning,
            huge_pages=cfg.huge_pages,
            keep_hidden=mtp_dir is not None and comm.rank == 0,  # what the MTP draft reads
        )
        draft_runner = None
        if draft_dir is not None:
            draft_runner = make_draft_runner(
                cfg.device, draft_dir, comm.rank, comm, draft_blocks, cfg.block_size, cpus.threads
            )
        if frontend is not None:  # the HTTP workers started meanwhile: each has said hello, or why not
            frontend.wait_started()
    except BaseException:
        if frontend is not None:  # a runner that refuses (the GPU one) leaves no HTTP worker behind
            frontend.stop()
        raise
    return cfg, runner, frontend, draft_runner


def scheduler_config(cfg, max_model_len: int):
    """The scheduler's settings from the served configuration (CONTRACT §2)."""
    from spmd_serve.scheduler.scheduler import SchedulerConfig

    return SchedulerConfig(
        max_num_seqs=cfg.batch_size,
        num_blocks=cfg.num_blocks(),
        block_size=cfg.block_size,
        block_ratio=cfg.block_ratio,
        max_waiting=cfg.max_cached_task_num,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_prefix_caching=cfg.enable_prefix_caching,
        # a block's K/V depend on the model and on how the pool stores them
        cache_salt=f"{cfg.model_dir}|kv_int8={int(cfg.use_cache_kv_int8)}",
    )


def speculator(cfg, comm=None, draft_runner=None, runner=None):
    """The engine's Speculator from SPECULATE_METHOD and its sizes (CONTRACT §2); None when off.
    draft_model's and mtp's proposers run their plans on the ranks' draft runners."""
    from spmd_serve.engine.draft_model import make_draft_proposer
    from spmd_serve.engine.mtp_proposer import make_mtp_proposer
    from spmd_serve.engine.speculative import make_speculator
    from spmd_serve.model_dir import max_positions

    k = cfg.speculate_max_draft_token_num
    proposer = None
    if cfg.speculate_method == "mtp":
        proposer = make_mtp_proposer(comm, draft_runner, runner, cfg.block_size, cfg.num_blocks(), k)
    elif draft_runner is not None:
        positions = max_positions(cfg.speculate_model_path)
        proposer = make_draft_proposer(comm, draft_runner, cfg.block_size, cfg.num_blocks(), k, positions)
    return make_speculator(
        cfg.speculate_method, k, cfg.speculate_max_ngram_size, cfg.speculate_min_acceptance, proposer=proposer
    )


def _run_rank0(cfg, comm, runner, fe: Frontend, draft_runner) -> None:
    from spmd_serve.engine.engine import Engine

    client = fe.hub
    sched = scheduler_config(cfg, fe.max_model_len)
    engine = Engine(
        sched,
        comm,
        runner,
        client,
        client.eos_token_ids,
        log_every=cfg.log_step_every,
        metrics=fe.metrics,
        drain_timeout_s=cfg.drain_timeout_s,
        speculator=speculator(cfg, comm, draft_runner, runner),
    )

    def stop(signum, _frame) -> None:
        """First SIGTERM/SIGINT: drain (503 to new requests, in-flight ones finish within the
        drain timeout), then stop every rank.  A second one: abort what is in flight now."""
        name = signal.Signals(signum).name
        if engine.stop_event.is_set():
            log.warning("received %s again: aborting the requests in flight now", name)
            engine.abort_event.set()
        else:
            log.info(
                "received %s: draining (new requests get 503) for up to %g s, then stopping all ranks",
                name,
                cfg.drain_timeout_s,
            )
        client.draining.set()
        engine.stop_event.set()
        client.wake()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if cfg.use_warmup:
        engine.warm_up(client.warm_up_ids)
    client.ready.set()
    log.info(
        "ready: %d rank(s), %d HTTP worker(s), model %s, HTTP %s:%s, gRPC %s:%s, health %s:%s, metrics %s:%s, "
        "%d KV blocks of %d tokens, %d KV bytes per token on each rank (%s cache), prefix caching %s",
        comm.size,
        fe.workers.count,
        cfg.model_dir,
        cfg.host,
        cfg.http_port,
        cfg.host,
        cfg.grpc_port,
        cfg.host,
        cfg.health_port,
        cfg.host,
        cfg.metrics_port,
        cfg.num_blocks(),
        cfg.block_size,
        runner.pool.layout.bytes_per_token(runner.pool.int8),
        runner.pool.layout.kind,
        "on" if cfg.enable_prefix_caching else "off",
    )
    client.tick = lambda: fe.workers.check(client.worker_state())  # a worker that dies is started again
    try:
        engine.run()
    finally:
        fe.stop()


def serve(cfg) -> NoReturn:
    from spmd_serve.dist.comm import Comm
    from spmd_serve.engine.engine import worker_loop

    comm = Comm()
    _setup_logging(comm.rank)
    try:
        from spmd_serve.config import ConfigError

        problem, frontend = "", None
        try:
            cfg, runner, frontend, draft_runner = _load(cfg, comm)
        except ConfigError as e:
            problem = str(e)
        # Start barrier and agreement in one: every rank learns whether every rank loaded.
        results = comm.allgather_flags(not problem, problem)
        failed = [(r, msg) for r, (ok, msg) in enumerate(results) if not ok]
        if failed:
            if frontend is not None:
                frontend.stop()
            if comm.rank == 0:  # one line, from one rank, without MPI_Abort (which can eat it)
                where = "" if len(failed) == comm.size else f" (on ranks {[r for r, _ in failed]})"
                print(f"spmd_serve: error: {failed[0][1]}{where}", file=sys.stderr, flush=True)
            # mpirun terminates the other ranks once one exits non-zero; a rank still inside
            # MPI_Finalize then got Paddle's SIGTERM handler, which prints a C++ traceback under the
            # one line.  The job is over by agreement: let SIGTERM end this rank quietly.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            sys.exit(2)
        peer_pids = comm.local_peer_pids()
        # What start-up made (Paddle, the model's objects) lives as long as the rank: out of the
        # collector's sight, a full collection no longer walks it.  Each walked it for 40-160 ms, a
        # pause of every stream, whenever a burst of objects (a grammar's compile) set one off.
        gc.freeze()
        if comm.rank == 0:
            assert frontend is not None, "rank 0 started its front end in _load"
            frontend.hub.set_peers(peer_pids)  # the workers' PeerWatch
            _run_rank0(cfg, comm, runner, frontend, draft_runner)
        else:
            # Workers leave signals to rank 0, which stops everyone with a SHUTDOWN plan.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            worker_loop(comm, runner, draft_runner)
    except SystemExit:
        raise
    except BaseException:
        log.error("fatal error on rank %d, ending the job:\n%s", comm.rank, traceback.format_exc())
        comm.abort(1)
    comm.exit_now(0)  # stopped cleanly: no seconds of Paddle teardown after the drain (fast_exit.py)
