"""Rank 0's front end: the hub on INTER_PROC_PORT and the HTTP worker processes behind it.

`start_frontend` runs before the model loads, so that a port or tokenizer problem joins the
start-up agreement and health answers (503, not ready) while the shards load: it checks that every
public port is free, listens on 127.0.0.1:INTER_PROC_PORT and starts PUSH_MODE_HTTP_WORKERS processes
(engine/http_workers.py), which load the tokenizer and bind the public ports meanwhile; their
hellos carry what the engine needs from the tokenizer (EOS ids, the warm-up prompt's ids), so
rank 0 never imports PaddleNLP.
`Frontend.wait_started` collects their hellos before the agreement: a worker that could not start
makes its reason rank 0's one `spmd_serve: error:` line.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spmd_serve.config import ConfigError, ServeConfig
from spmd_serve.engine.frontend_hub import FrontendHub
from spmd_serve.engine.http_workers import HttpWorkers
from spmd_serve.engine.metrics import EngineMetrics, render
from spmd_serve.envs import BY_FIELD
from spmd_serve.frontend.server.settings import IOSettings

PUBLIC_PORTS = ("http_port", "grpc_port", "health_port", "metrics_port")
START_TIMEOUT_S = 120.0  # for the workers' hellos (a PaddleNLP tokenizer takes seconds to import)


@dataclass
class Frontend:
    hub: FrontendHub  # what the engine loop talks to; after wait_started, the tokenizer's facts
    workers: HttpWorkers
    max_model_len: int
    metrics: EngineMetrics  # recorded by the engine, served through the workers

    def wait_started(self, timeout: float = START_TIMEOUT_S) -> None:
        """Every worker has bound its ports and loaded its tokenizer; else ConfigError."""
        try:
            self.hub.wait_workers(self.workers.count, timeout, self.workers.exited)
        except RuntimeError as e:
            raise ConfigError(str(e)) from None

    def stop(self) -> None:
        """After the engine's last outputs: `bye` to every worker, then wait for them to exit."""
        self.workers.stopping = True
        self.hub.close()
        self.workers.stop()


def check_ports_free(cfg: ServeConfig) -> None:
    """Bind each public port once, without SO_REUSEPORT and without listening: a port that another
    program holds is named now (the workers share theirs with each other, so they cannot tell)."""
    for name in PUBLIC_PORTS:
        port, var = getattr(cfg, name), BY_FIELD[name]
        if port == var.disable_value:
            continue
        try:
            with socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((cfg.host, port))
        except OSError as e:
            raise ConfigError(f"cannot listen on {cfg.host}:{port} ({var.name}): {e.strerror or e}") from None


def worker_setup(cfg: ServeConfig, max_model_len: int, capacity: int, hub: FrontendHub) -> dict[str, Any]:
    """What each worker reads from its stdin (JSON)."""
    names = (Path(str(cfg.model_dir)).resolve().name or "default", "default")  # OpenAI `model` (CONTRACT §4)
    settings = IOSettings.from_config(cfg, model_max_len=max_model_len, model_names=names)
    return {
        "settings": dataclasses.asdict(settings),
        "model_dir": cfg.model_dir,
        "use_hf_tokenizer": cfg.use_hf_tokenizer,
        "grpc_port": cfg.grpc_port,
        "metrics_port": cfg.metrics_port,
        "capacity": capacity,
        "port": hub.port,
        "token": hub.token,
    }


def start_frontend(cfg: ServeConfig, model_config: dict[str, Any], cores: frozenset[int] | None = None) -> Frontend:
    """The hub and the HTTP workers, which run on `cores` (the node's, not rank 0's binding)."""
    max_model_len = int(model_config.get("max_position_embeddings", cfg.max_seq_len + cfg.max_dec_len))
    check_ports_free(cfg)
    capacity = cfg.batch_size + cfg.max_cached_task_num
    metrics = EngineMetrics()
    try:
        hub = FrontendHub(cfg.inter_proc_port, capacity, lambda accept: render(metrics.registry, accept))
    except OSError as e:
        raise ConfigError(
            f"cannot listen on 127.0.0.1:{cfg.inter_proc_port} (INTER_PROC_PORT): {e.strerror or e}"
        ) from None
    # Rank 0 loads no tokenizer: the workers do (a PaddleNLP import, seconds) while the shards load,
    # and their hellos carry what the engine needs from it (EOS ids, the warm-up prompt).
    workers = HttpWorkers(cfg.http_workers, worker_setup(cfg, max_model_len, capacity, hub), dict(os.environ), cores)
    workers.start()
    return Frontend(hub, workers, max_model_len, metrics)
