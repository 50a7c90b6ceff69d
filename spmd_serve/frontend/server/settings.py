"""`IOSettings`: what rank 0's IO server needs to know, as one frozen value.

Owns the fields (ports, length limits, API key, body size, model names, liveness threshold) and
their defaults, the `Limits` every protocol checks requests against, and `from_config`, which
copies the fields it needs from any object (ServeConfig) by name, so nothing in the front end
imports the configuration module.  The app (`server.app`), the OpenAPI document
(`server.openapi`) and the gRPC service read it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from spmd_serve.frontend.common.liveness import DEFAULT_LIVE_THRESHOLD_S
from spmd_serve.frontend.common.parsing import Limits


@dataclass(frozen=True)
class IOSettings:
    host: str = "0.0.0.0"
    http_port: int = 9965  # SERVICE_HTTP_PORT; -1 disables the service app
    health_port: int = 8110  # HEALTH_HTTP_PORT; -1 disables the health app
    max_seq_len: int = 8192
    max_dec_len: int = 1024
    model_max_len: int | None = None  # the model's context length; None: max_seq_len + max_dec_len
    disable_streaming: bool = False
    api_key: str | None = None
    max_body_size: int = 8 << 20  # bytes; larger bodies get 413
    live_threshold_s: float = DEFAULT_LIVE_THRESHOLD_S
    model_names: tuple[str, ...] = ("default",)  # OpenAI `model` values served (first: its name)
    reuse_port: bool = False  # SO_REUSEPORT on every public port: one of several HTTP worker processes

    @classmethod
    def from_config(cls, cfg: Any, **overrides: Any) -> IOSettings:
        """Take every field of ours that `cfg` has an attribute for; overrides win."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {n: getattr(cfg, n) for n in names if hasattr(cfg, n)}
        return cls(**{**values, **overrides})

    @property
    def limits(self) -> Limits:
        model_max = self.model_max_len or self.max_seq_len + self.max_dec_len
        return Limits(self.max_seq_len, self.max_dec_len, model_max)
