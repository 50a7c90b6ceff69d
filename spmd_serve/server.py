"""`mpirun -n N spmd_serve`: the per-rank entry point.

Every rank: read and validate the configuration, check the model directory, load its shard,
agree with the others that loading worked.  Then rank 0 starts the IO thread (HTTP, gRPC) and runs the
engine loop in the main thread (so signals reach it); the other ranks run the worker loop.  Any
exception on any rank is logged and ends the whole job (MPI Abort): no rank is left hanging.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import logging
import os
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: a rank must not load these before its checks
    from spmd_serve.engine.client import EngineClient
    from spmd_serve.engine.metrics import EngineMetrics
    from spmd_serve.frontend.server.app import IOServer
    from spmd_serve.frontend.server.peer_watch import PeerWatch
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

log = logging.getLogger("spmd_serve")


def _setup_logging(rank: int) -> None:
    # `kill -USR1 <pid>` dumps every thread's stack: how to see where a stuck rank is.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.basicConfig(
        level=os.environ.get("SPMD_LOG_LEVEL", "INFO"),
        stream=sys.stderr,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
    )


def _quiet_paddle() -> None:
    os.environ.setdefault("GLOG_minloglevel", "2")  # Paddle's C++ INFO logs drown ours
    os.environ.setdefault("FLAGS_use_mkldnn", "0")


@dataclass
class Frontend:
    """Rank 0's IO side, started before the model loads so that port and tokenizer problems join
    the start-up agreement and health answers (503, not ready) while the shards load."""

    tokenizer: ServingTokenizer
    client: EngineClient
    io: IOServer
    max_model_len: int
    metrics: EngineMetrics  # recorded by the engine, served by the IO thread
    peers: PeerWatch  # fails everything when a rank on this node dies


def _start_frontend(cfg, model_config: dict) -> Frontend:
    from spmd_serve.config import ConfigError
    from spmd_serve.engine.client import EngineClient
    from spmd_serve.engine.metrics import EngineMetrics
    from spmd_serve.frontend.server.app import IOServer
    from spmd_serve.frontend.server.metrics_service import MetricsService
    from spmd_serve.frontend.server.peer_watch import PeerWatch
    from spmd_serve.frontend.server.settings import IOSettings
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

    try:
        tokenizer = ServingTokenizer.from_model_dir(cfg.model_dir, cfg.use_hf_tokenizer)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load the tokenizer of {cfg.model_dir}: {e}") from None
    max_model_len = int(model_config.get("max_position_embeddings", cfg.max_seq_len + cfg.max_dec_len))
    client = EngineClient(capacity=cfg.batch_size + cfg.max_cached_task_num)
    # OpenAI `model`: the served directory's name, or "default" (CONTRACT §4)
    names = (Path(cfg.model_dir).resolve().name or "default", "default")
    settings = IOSettings.from_config(cfg, model_max_len=max_model_len, model_names=names)
    metrics = EngineMetrics()
    peers = PeerWatch(client)
    services: list = [MetricsService(metrics.registry, cfg.host, cfg.metrics_port), peers]
    if cfg.grpc_port != -1:
        from spmd_serve.frontend.triton.service import GrpcService

        services.append(GrpcService.from_settings(client, tokenizer, settings, cfg.grpc_port))
    io = IOServer(client, tokenizer, settings, services=services)
    try:
        io.start()
    except OSError as e:  # a busy port: the message names it
        raise ConfigError(str(e)) from None
    return Frontend(tokenizer, client, io, max_model_len, metrics, peers)


def _load(cfg, comm):
    """Checks, rank 0's front end, shard load; returns (cfg clamped to the model, runner,
    front end or None)."""
    from spmd_serve.dist.comm import node_local_first
    from spmd_serve.export import ensure_demo_model
    from spmd_serve.model_dir import check_model_dir, clamp_to_model
    from spmd_serve.worker.capacity import check_kv_fits, check_served_model, check_supported
    from spmd_serve.worker.model_runner import ModelRunner, read_rank_manifest
    from spmd_serve.worker.rank_cpus import setup_rank_cpus

    if cfg.model_dir is None:  # CONTRACT §2: the built-in demo model, made on first use
        demo = node_local_first(comm, lambda: str(ensure_demo_model("tiny", tp=cfg.mp_num)))
        cfg = dataclasses.replace(cfg, model_dir=demo)
    check_supported(cfg)
    model_config = check_model_dir(cfg, comm.size)
    check_served_model(model_config)
    cfg = clamp_to_model(cfg, model_config)
    manifest = read_rank_manifest(Path(cfg.model_dir) / f"rank_{comm.rank}", cfg.use_cache_kv_int8)
    check_kv_fits(cfg, manifest.kv_cache, comm.ranks_on_node())
    # collective on the node, like ranks_on_node; before the IO thread starts, which inherits the binding
    cpus = setup_rank_cpus(comm, cfg.num_threads, cfg.bind_cores)
    frontend = _start_frontend(cfg, model_config) if comm.rank == 0 else None
    runner = ModelRunner(
        cfg.model_dir,
        comm.rank,
        comm,
        cfg.num_blocks(),
        cfg.block_size,
        cpus.threads,
        kv_int8=cfg.use_cache_kv_int8,
        malloc_tuning=cfg.malloc_tuning,
    )
    return cfg, runner, frontend


def _run_rank0(cfg, comm, runner, fe: Frontend) -> None:
    from spmd_serve.engine.engine import Engine
    from spmd_serve.scheduler.scheduler import SchedulerConfig

    client = fe.client
    sched = SchedulerConfig(
        max_num_seqs=cfg.batch_size,
        num_blocks=cfg.num_blocks(),
        block_size=cfg.block_size,
        block_ratio=cfg.block_ratio,
        max_waiting=cfg.max_cached_task_num,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_model_len=fe.max_model_len,
    )
    engine = Engine(
        sched,
        comm,
        runner,
        client,
        frozenset(fe.tokenizer.eos_token_ids),
        log_every=cfg.log_step_every,
        metrics=fe.metrics,
        drain_timeout_s=cfg.drain_timeout_s,
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
        engine.warm_up(fe.tokenizer.encode("Warm-up request: hello world.") or [fe.tokenizer.bos_token_id or 1])
    client.ready.set()
    log.info(
        "ready: %d rank(s), model %s, HTTP %s:%s, gRPC %s:%s, health %s:%s, metrics %s:%s, %d KV blocks of %d tokens",
        comm.size,
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
    )
    try:
        engine.run()
    finally:
        fe.io.stop()


def serve(cfg) -> int:
    from spmd_serve.dist.comm import Comm
    from spmd_serve.engine.engine import worker_loop

    comm = Comm()
    _setup_logging(comm.rank)
    try:
        from spmd_serve.config import ConfigError

        problem, frontend = "", None
        try:
            cfg, runner, frontend = _load(cfg, comm)
        except ConfigError as e:
            problem = str(e)
        # Start barrier and agreement in one: every rank learns whether every rank loaded.
        results = comm.allgather_flags(not problem, problem)
        failed = [(r, msg) for r, (ok, msg) in enumerate(results) if not ok]
        if failed:
            if frontend is not None:
                frontend.io.stop()
            if comm.rank == 0:  # one line, from one rank, without MPI_Abort (which can eat it)
                where = "" if len(failed) == comm.size else f" (on ranks {[r for r, _ in failed]})"
                print(f"spmd_serve: error: {failed[0][1]}{where}", file=sys.stderr, flush=True)
            sys.exit(2)
        peer_pids = comm.local_peer_pids()
        if comm.rank == 0:
            assert frontend is not None, "rank 0 started its front end in _load"
            frontend.peers.watch(peer_pids)
            _run_rank0(cfg, comm, runner, frontend)
        else:
            # Workers leave signals to rank 0, which stops everyone with a SHUTDOWN plan.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            worker_loop(comm, runner)
    except SystemExit:
        raise
    except BaseException:
        log.error("fatal error on rank %d, ending the job:\n%s", comm.rank, traceback.format_exc())
        comm.abort(1)
    return 0
