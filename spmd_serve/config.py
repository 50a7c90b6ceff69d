"""The server's configuration: the frozen `ServeConfig`, loading it from flags and environment, and
validating it (CONTRACT §2); the served model directory is checked by model_dir.py (§7).

Every rank runs the same checks on the same inputs, so a bad value stops all ranks with the same
one-line `ConfigError` before any of them reaches a collective operation (no rank is left hanging).
The variables themselves (names, aliases, defaults, ranges) live in `spmd_serve.envs`.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from spmd_serve.envs import BY_FIELD, ENV_VARS, EnvVar


class ConfigError(Exception):
    """A configuration problem; the message is one line naming the variable, value and rule."""


def _default(name: str) -> Any:
    return field(default=BY_FIELD[name].default, repr=not BY_FIELD[name].secret)


def _show(var: EnvVar, value: Any) -> str:
    """A value as the user would have typed it; secrets are never echoed."""
    if var.secret:
        return "<hidden>"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


@dataclass(frozen=True)
class ServeConfig:
    """Validated settings of one server; identical on every rank.  Defaults come from ENV_VARS."""

    model_dir: str | None = _default("model_dir")
    model_name: str | None = _default("model_name")
    mp_num: int = _default("mp_num")
    mp_nnode: int = _default("mp_nnode")
    pod_ips: tuple[str, ...] = _default("pod_ips")
    pod_0_ip: str | None = _default("pod_0_ip")
    cuda_visible_devices: str | None = _default("cuda_visible_devices")
    http_port: int = _default("http_port")
    grpc_port: int = _default("grpc_port")
    health_port: int = _default("health_port")
    metrics_port: int = _default("metrics_port")
    inter_proc_port: int = _default("inter_proc_port")
    host: str = _default("host")
    max_seq_len: int = _default("max_seq_len")
    max_dec_len: int = _default("max_dec_len")
    batch_size: int = _default("batch_size")
    block_size: int = _default("block_size")
    block_bs: int = _default("block_bs")
    block_ratio: float = _default("block_ratio")
    max_cached_task_num: int = _default("max_cached_task_num")
    http_workers: int = _default("http_workers")
    disable_streaming: bool = _default("disable_streaming")
    use_warmup: bool = _default("use_warmup")
    use_hf_tokenizer: bool = _default("use_hf_tokenizer")
    use_cache_kv_int8: bool = _default("use_cache_kv_int8")
    log_dir: str = _default("log_dir")
    output_log_to_console: bool = _default("output_log_to_console")
    enable_prefix_caching: bool = _default("enable_prefix_caching")
    speculate_method: str = _default("speculate_method")
    speculate_max_draft_token_num: int = _default("speculate_max_draft_token_num")
    speculate_max_ngram_size: int = _default("speculate_max_ngram_size")
    speculate_model_path: str | None = _default("speculate_model_path")
    api_key: str | None = _default("api_key")
    max_num_batched_tokens: int = _default("max_num_batched_tokens")
    num_threads: str = _default("num_threads")
    bind_cores: bool = _default("bind_cores")
    drain_timeout_s: float = _default("drain_timeout_s")
    malloc_tuning: bool = _default("malloc_tuning")
    huge_pages: bool = _default("huge_pages")
    log_step_every: int = _default("log_step_every")
    device: str = _default("device")
    speculate_min_acceptance: float = _default("speculate_min_acceptance")

    def __post_init__(self) -> None:
        # Re-checked here (not only when parsing) so that configs built in code or via
        # dataclasses.replace() obey the same rules as ones read from the environment.
        for f in fields(self):
            var = BY_FIELD[f.name]
            value = getattr(self, f.name)
            try:
                var.check(value)
            except ValueError as e:
                raise ConfigError(f"{var.name}={_show(var, value)} is invalid: {e}") from None
        self._check_cross_field()

    def _check_cross_field(self) -> None:
        if self.mp_num % self.mp_nnode:
            raise ConfigError(f"MP_NUM={self.mp_num} is invalid: must be a multiple of MP_NNODE={self.mp_nnode}")
        if self.pod_ips:
            ips = ",".join(self.pod_ips)
            k = len(self.pod_ips)
            if k != self.mp_nnode:
                raise ConfigError(
                    f"POD_IPS={ips} is invalid: lists {k} node(s) but MP_NNODE={self.mp_nnode} (set MP_NNODE={k})"
                )
            if self.pod_0_ip is not None and self.pod_0_ip not in self.pod_ips:
                raise ConfigError(f"POD_0_IP={self.pod_0_ip} is invalid: must be one of POD_IPS={ips}")
        # Two listeners on one number would fail to bind at run time, on rank 0 only; say it now.
        seen: dict[int, str] = {}
        for name in ("http_port", "grpc_port", "health_port", "metrics_port", "inter_proc_port"):
            port, var = getattr(self, name), BY_FIELD[name]
            if port == var.disable_value:
                continue
            if port in seen:
                raise ConfigError(f"{var.name}={port} is invalid: must differ from {seen[port]}={port}")
            seen[port] = var.name

    @property
    def ranks_per_node(self) -> int:
        return self.mp_num // self.mp_nnode

    def num_blocks(self, block_size: int | None = None) -> int:
        """Total KV blocks: BLOCK_BS * ceil(max(MAX_SEQ_LEN, MAX_DEC_LEN) / BLOCK_SIZE)."""
        bs = self.block_size if block_size is None else block_size
        return self.block_bs * math.ceil(max(self.max_seq_len, self.max_dec_len) / bs)

    def to_environ(self) -> dict[str, str]:
        """Canonical variables for the set values, e.g. for `mpirun -x` from the launcher."""
        out: dict[str, str] = {}
        for var in ENV_VARS:
            value = getattr(self, var.field)
            if value is not None and value != ():
                out[var.name] = _show(replace(var, secret=False), value)
        return out


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of exiting, so every error takes one path."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message)


def _flag_help(var: EnvVar) -> str:
    default = "unset" if var.default in (None, ()) else _show(var, var.default)
    names = var.name + (f" (legacy: {', '.join(var.aliases)})" if var.aliases else "")
    rule = "" if var.rule() == "must be a non-empty string" else f"; {var.rule()}"
    text = f"{var.help}{rule}; default {default}; env {names}"
    return text.replace("%", "%%")  # argparse %-formats help strings


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per variable; values stay strings here so flags and env share one parser."""
    for var in ENV_VARS:
        kwargs: dict[str, Any] = {
            "dest": var.field,
            "default": None,
            "help": _flag_help(var),
            "metavar": "0|1" if var.kind == "bool" else var.kind.upper(),
        }
        if var.kind == "bool":  # `--use-warmup` alone means 1; `--use-warmup 0` also works
            kwargs.update(nargs="?", const="1")
        parser.add_argument(var.flag, **kwargs)


def build_arg_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="spmd_serve",
        description="MPI-launched LLM server: mpirun -n MP_NUM spmd_serve [flags]",
        epilog="Every flag has an environment variable; a flag wins over its variable, a canonical "
        "variable over its legacy name. Empty values count as unset.",
    )
    add_config_arguments(parser)
    return parser


def _lookup(var: EnvVar, flag_value: str | None, env: Mapping[str, str]) -> tuple[str | None, str]:
    """The raw value and a label saying where it came from (for the error message)."""
    if flag_value is not None and flag_value.strip():
        return flag_value, f"{var.name}={{}} (from {var.flag})"
    for name in (var.name, *var.aliases):
        raw = env.get(name)
        if raw is not None and raw.strip():
            legacy = f" (legacy name of {var.name})" if name != var.name else ""
            return raw, f"{name}={{}}{legacy}"
    return None, ""


def config_from_args(ns: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ServeConfig:
    """Build the config from parsed flags (see add_config_arguments) plus the environment."""
    env = os.environ if environ is None else environ
    return ServeConfig(**{var.field: _read(var, getattr(ns, var.field, None), env) for var in ENV_VARS})


def _read(var: EnvVar, flag_value: str | None, env: Mapping[str, str]) -> Any:
    """The variable's typed value (its default when unset); ConfigError naming it when invalid."""
    raw, label = _lookup(var, flag_value, env)
    if raw is None:
        return var.default
    try:
        return var.parse(raw)
    except ValueError as e:
        shown = "<hidden>" if var.secret else raw.strip()
        raise ConfigError(f"{label.format(shown)} is invalid: {e}") from None


def env_setting(field: str, environ: Mapping[str, str] | None = None) -> Any:
    """One setting from the environment alone, validated as at start-up: for the tools that build
    a ModelRunner without a ServeConfig (the offline engine, benchmarks)."""
    return _read(BY_FIELD[field], None, os.environ if environ is None else environ)


def load_config(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> ServeConfig:
    """Flags (default sys.argv[1:]) over environment (default os.environ); raises ConfigError."""
    ns = build_arg_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return config_from_args(ns, environ)


F = TypeVar("F", bound=Callable[..., Any])


def exit_on_config_error(fn: F) -> F:
    """Decorator for CLI entry points: a ConfigError becomes `spmd_serve: error: <message>` on
    stderr and exit status 2 (argparse's convention), never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as e:
            print(f"spmd_serve: error: {e}", file=sys.stderr, flush=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]
