"""The table of every configuration variable (CONTRACT §2) and how one raw value is parsed.

This module owns *what* can be configured: the canonical name, the legacy aliases older releases
used, the default, the type and the allowed range of each variable, in the order of the contract
table.  Turning the environment and the command line into a validated `ServeConfig` is
`spmd_serve.config`'s job; keeping the table here, free of logic about sources, lets the CLI
help, the launcher and a drift test all read one list.
"""

from __future__ import annotations

import math
import os.path
import re
from dataclasses import dataclass
from typing import Any, Literal

# "path" is a string that gets `~` expanded; "list" is a comma-separated list -> tuple[str, ...].
Kind = Literal["int", "float", "bool", "str", "path", "port", "list"]

_TRUE = frozenset({"1", "true", "yes"})
_FALSE = frozenset({"0", "false", "no"})
_INT_RE = re.compile(r"[+-]?\d+")
# Hostnames, IPv4 and IPv6 addresses; no spaces: a stray space in POD_IPS is an error, not a node.
_ADDR = r"[A-Za-z0-9_.:-]+"


@dataclass(frozen=True)
class EnvVar:
    """One configuration variable: its names, its default and the rule a value must satisfy."""

    name: str
    aliases: tuple[str, ...]
    default: Any
    kind: Kind
    help: str
    field: str  # the ServeConfig attribute it fills
    minimum: float | None = None
    maximum: float | None = None
    min_exclusive: bool = False  # BLOCK_RATIO is in (0, 1]: zero would admit nothing
    disable_value: int | None = None  # ports: -1 switches the listener off
    pattern: str | None = None  # full-match regex for str/list entries
    pattern_help: str | None = None  # human wording of `pattern` for error messages
    secret: bool = False  # never echo the value (API_KEY) in messages or help
    internal: bool = False  # not in the contract; a knob for operators and tests

    @property
    def flag(self) -> str:
        """The command-line flag: the variable name, lowercase, dashes, without the SPMD_ prefix."""
        return "--" + self.name.lower().removeprefix("spmd_").replace("_", "-")

    def rule(self) -> str:
        """The allowed range in words, used verbatim in error messages and --help."""
        lo, hi = self.minimum, self.maximum
        if self.kind == "port":
            off = f" or {self.disable_value} to disable" if self.disable_value is not None else ""
            return f"must be a port in [1, 65535]{off}"
        if self.kind == "bool":
            return "must be one of 0/1/true/false/yes/no"
        if self.kind in ("int", "float"):
            what = "an integer" if self.kind == "int" else "a number"
            left = "(" if self.min_exclusive else "["
            if lo is not None and hi is not None:
                return f"must be {what} in {left}{_num(lo)}, {_num(hi)}]"
            if lo is not None:
                return f"must be {what} {'>' if self.min_exclusive else '>='} {_num(lo)}"
            return f"must be {what}"
        if self.pattern_help:
            return f"must be {self.pattern_help}"
        return "must be a non-empty string"

    def parse(self, raw: str) -> Any:
        """Convert one non-empty raw string; raises ValueError(self.rule()) when it is not valid."""
        text = raw.strip()
        if self.kind == "bool":
            low = text.lower()
            if low not in _TRUE | _FALSE:
                raise ValueError(self.rule())
            value: Any = low in _TRUE
        elif self.kind in ("int", "port"):
            if not _INT_RE.fullmatch(text):  # int() would also take "1_000" and " 7 "
                raise ValueError(self.rule())
            value = int(text)
        elif self.kind == "float":
            try:
                value = float(text)
            except ValueError:
                raise ValueError(self.rule()) from None
        elif self.kind == "list":
            value = tuple(part.strip() for part in text.split(","))
        elif self.kind == "path":
            value = os.path.expanduser(text)
        else:
            value = text
        self.check(value)
        return value

    def check(self, value: Any) -> None:
        """Validate an already-typed value (also used on directly built ServeConfigs)."""
        if value is None:
            if self.default is None:  # optional variables may stay unset
                return
            raise ValueError(self.rule())
        ok: bool
        if self.kind == "bool":
            ok = isinstance(value, bool)
        elif self.kind == "port":
            ok = _is_int(value) and (1 <= value <= 65535 or value == self.disable_value)
        elif self.kind in ("int", "float"):
            typed = _is_int(value) if self.kind == "int" else _is_real(value)
            ok = typed and self._in_range(value)
        elif self.kind == "list":
            # () is "unset"; a given list holds only valid entries ("a,,b" is a typo, not 2 nodes)
            ok = isinstance(value, tuple) and all(self._str_ok(v) for v in value)
        else:
            ok = self._str_ok(value)
        if not ok:
            raise ValueError(self.rule())

    def _in_range(self, value: float) -> bool:
        if self.minimum is not None:
            if value < self.minimum or (self.min_exclusive and value == self.minimum):
                return False
        return self.maximum is None or value <= self.maximum

    def _str_ok(self, value: Any) -> bool:
        if not isinstance(value, str) or not value:
            return False
        return self.pattern is None or re.fullmatch(self.pattern, value) is not None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return (isinstance(value, float) or _is_int(value)) and math.isfinite(value)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _v(name: str, default: Any, kind: Kind, help: str, field: str, *aliases: str, **rule: Any) -> EnvVar:
    return EnvVar(name, tuple(aliases), default, kind, help, field, **rule)


_POS = {"minimum": 1}
_ADDR_RULE = {"pattern": _ADDR, "pattern_help": "a host name or IP address"}

# Every row of CONTRACT §2, in the contract's order; legacy names (in parentheses there) as aliases.
# (one row of CONTRACT §2 per entry, kept as compact as the contract's table)
# fmt: off
ENV_VARS: tuple[EnvVar, ...] = (
    _v("MODEL_DIR", None, "path", "served model directory (unset: the built-in demo model)",
       "model_dir"),
    _v("model_name", None, "str", "with start_server: download then serve $MODEL_DIR/$model_name",
       "model_name"),
    _v("MP_NUM", 1, "int", "tensor-parallel degree = number of ranks = MPI world size", "mp_num",
       **_POS),
    _v("MP_NNODE", 1, "int", "number of nodes; MP_NUM must be a multiple of it", "mp_nnode",
       **_POS),
    _v("POD_IPS", (), "list", "multi-node: comma-separated node addresses", "pod_ips",
       pattern=_ADDR, pattern_help="a comma-separated list of host names or IP addresses"),
    _v("POD_0_IP", None, "str", "multi-node: the master node's address (must be in POD_IPS)",
       "pod_0_ip", **_ADDR_RULE),
    _v("CUDA_VISIBLE_DEVICES", None, "str", "devices; the rank with local index k uses the k-th",
       "cuda_visible_devices", pattern=r"[A-Za-z0-9_-]+(,[A-Za-z0-9_-]+)*",
       pattern_help="a comma-separated list of device ids, e.g. 0,1"),
    _v("SERVICE_HTTP_PORT", 9965, "port", "HTTP API port (native + OpenAI)", "http_port",
       "PUSH_MODE_HTTP_PORT", disable_value=-1),
    _v("SERVICE_GRPC_PORT", 8811, "port", "gRPC API port (Triton/KServe v2)", "grpc_port",
       "GRPC_PORT", disable_value=-1),
    # Health and metrics cannot be disabled: start_server polls /v2/health/ready, and operators
    # expect /metrics wherever the server runs.
    _v("HEALTH_HTTP_PORT", 8110, "port", "health port (/v2/health/live, /v2/health/ready); "
       "cannot be disabled", "health_port", "HTTP_PORT"),
    _v("METRICS_HTTP_PORT", 8722, "port", "Prometheus /metrics port; cannot be disabled",
       "metrics_port", "METRICS_PORT"),
    _v("INTER_PROC_PORT", 56666, "port", "internal: rank 0 engine <-> extra HTTP workers; binds "
       "loopback (127.0.0.1) only, never public", "inter_proc_port",
       "INTER_QUEUE_PORT", "INFER_QUEUE_PORT"),
    _v("HOST", "0.0.0.0", "str", "bind address of the public ports", "host", **_ADDR_RULE),
    _v("MAX_SEQ_LEN", 8192, "int", "max input tokens (clamped to the model's limit)", "max_seq_len",
       **_POS),
    _v("MAX_DEC_LEN", 1024, "int", "max tokens a request may ask to generate", "max_dec_len",
       **_POS),
    _v("BATCH_SIZE", 50, "int", "max running sequences", "batch_size", minimum=1, maximum=256),
    _v("BLOCK_SIZE", 64, "int", "tokens per KV block (the model's config.json may fix it)",
       "block_size", **_POS),
    _v("BLOCK_BS", 50, "int", "KV capacity in full-length sequences: total blocks = BLOCK_BS * "
       "ceil(max(MAX_SEQ_LEN, MAX_DEC_LEN) / BLOCK_SIZE)", "block_bs", **_POS),
    _v("BLOCK_RATIO", 0.75, "float", "admission watermark: admit new requests only while used "
       "blocks <= BLOCK_RATIO * total", "block_ratio", minimum=0, maximum=1, min_exclusive=True),
    _v("MAX_CACHED_TASK_NUM", 128, "int", "waiting-queue capacity; beyond it requests get 429",
       "max_cached_task_num", **_POS),
    _v("PUSH_MODE_HTTP_WORKERS", 1, "int", "HTTP worker processes on the master node",
       "http_workers", minimum=1, maximum=8),
    _v("DISABLE_STREAMING", False, "bool", "1: native streaming requests get only the final frame",
       "disable_streaming"),
    _v("USE_WARMUP", False, "bool", "1: run warm-up requests before reporting ready", "use_warmup"),
    _v("USE_HF_TOKENIZER", False, "bool", "1: HuggingFace tokenizer.json instead of the PaddleNLP "
       "tokenizer", "use_hf_tokenizer"),
    _v("USE_CACHE_KV_INT8", False, "bool", "1: int8 KV cache", "use_cache_kv_int8"),
    _v("LOG_DIR", "./log", "path", "logs and pid file", "log_dir", "FD_LOG_DIR"),
    _v("OUTPUT_LOG_TO_CONSOLE", False, "bool", "1: logs also to the console",
       "output_log_to_console"),
    _v("ENABLE_PREFIX_CACHING", True, "bool", "reuse the KV blocks of an identical prompt prefix "
       "across requests (0: off)", "enable_prefix_caching"),
    _v("SPECULATE_METHOD", "none", "str", "speculative decoding: none, inference_with_reference "
       "(alias ngram), mtp, draft_model", "speculate_method",
       pattern=r"none|inference_with_reference|ngram|mtp|draft_model",
       pattern_help="one of none, inference_with_reference, ngram, mtp, draft_model"),
    _v("SPECULATE_MAX_DRAFT_TOKEN_NUM", 1, "int", "draft tokens proposed per sequence and step",
       "speculate_max_draft_token_num", minimum=1, maximum=8),
    _v("SPECULATE_MAX_NGRAM_SIZE", 3, "int", "longest n-gram matched by inference_with_reference",
       "speculate_max_ngram_size", minimum=1, maximum=8),
    _v("SPECULATE_MODEL_PATH", None, "path", "the draft model directory (SPECULATE_METHOD="
       "draft_model)", "speculate_model_path"),
    _v("API_KEY", None, "str", "when set, HTTP and gRPC requests need 'Authorization: Bearer "
       "<key>'", "api_key", pattern=r"\S+", pattern_help="a non-empty string without whitespace",
       secret=True),
    # Internal knobs (not in the contract).
    _v("SPMD_MAX_NUM_BATCHED_TOKENS", 512, "int", "internal: token budget of one engine step "
       "(prefill chunk size)", "max_num_batched_tokens", minimum=16, internal=True),
    _v("SPMD_NUM_THREADS", "auto", "str", "internal: CPU threads per rank for the graph ops; auto: the "
       "cores this node gives the job divided by the ranks on it", "num_threads",
       pattern=r"auto|[1-9][0-9]*", pattern_help="auto or an integer >= 1", internal=True),
    _v("SPMD_BIND_CORES", True, "bool", "internal: bind each rank on a node to its own cores (when "
       "the launcher left every rank all of them)", "bind_cores", internal=True),
    _v("SPMD_DRAIN_TIMEOUT_S", 60.0, "float", "internal: on SIGTERM, seconds in-flight requests may "
       "take to finish before they are aborted (a second SIGTERM aborts at once)", "drain_timeout_s",
       minimum=0, internal=True),
    _v("SPMD_MALLOC_TUNING", True, "bool", "internal: keep a step's intermediates on the glibc heap "
       "(mallopt) instead of fresh mmaps", "malloc_tuning", internal=True),
    _v("SPMD_HUGE_PAGES", True, "bool", "internal: read a rank's parameters onto 2 MB pages (their mapping "
       "advised MADV_HUGEPAGE before they are read; what missed, MADV_COLLAPSE after)",
       "huge_pages", internal=True),
    _v("SPMD_LOG_STEP_EVERY", 0, "int", "internal: log the per-phase step split every N steps "
       "(0: never)", "log_step_every", minimum=0, internal=True),
    _v("SPMD_DEVICE", "auto", "str", "internal: the ranks' runner: auto (GPU when Paddle is built with "
       "CUDA; the GPU runner is not built yet and refuses, docs/gpu.md), cpu or gpu", "device",
       pattern=r"auto|cpu|gpu", pattern_help="auto, cpu or gpu", internal=True),
    _v("SPMD_SPECULATE_MIN_ACCEPTANCE", 0.3, "float", "internal: a request drafts while its drafts' "
       "running acceptance rate is at least this (engine/speculative.py); 0: every decoding request "
       "drafts every step and no step is gated by speed (tests of the mechanics, forced benchmarks)",
       "speculate_min_acceptance", minimum=0, maximum=1, internal=True),
)
# fmt: on

BY_FIELD: dict[str, EnvVar] = {v.field: v for v in ENV_VARS}
BY_NAME: dict[str, EnvVar] = {n: v for v in ENV_VARS for n in (v.name, *v.aliases)}
