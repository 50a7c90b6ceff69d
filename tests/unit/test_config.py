"""spmd_serve.envs/config: defaults, aliases, precedence, cross-field rules, CONTRACT §2 (the
error messages are in test_config_errors.py, the model directory in test_model_dir.py)."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from spmd_serve import config as config_mod
from spmd_serve import envs as envs_mod
from spmd_serve.config import ConfigError, ServeConfig, build_arg_parser, load_config
from spmd_serve.envs import BY_NAME, ENV_VARS
from spmd_serve.worker.capacity import check_supported
from tests.support import contract

REPO = Path(__file__).resolve().parents[2]

# The contract's default column, as typed values.
CONTRACT_DEFAULTS = {
    "model_dir": None,
    "model_name": None,
    "mp_num": 1,
    "mp_nnode": 1,
    "pod_ips": (),
    "pod_0_ip": None,
    "cuda_visible_devices": None,
    "http_port": 9965,
    "grpc_port": 8811,
    "health_port": 8110,
    "metrics_port": 8722,
    "inter_proc_port": 56666,
    "host": "0.0.0.0",
    "max_seq_len": 8192,
    "max_dec_len": 1024,
    "batch_size": 50,
    "block_size": 64,
    "block_bs": 50,
    "block_ratio": 0.75,
    "max_cached_task_num": 128,
    "http_workers": 1,
    "disable_streaming": False,
    "use_warmup": False,
    "use_hf_tokenizer": False,
    "use_cache_kv_int8": False,
    "log_dir": "./log",
    "output_log_to_console": False,
    "enable_prefix_caching": True,
    "speculate_method": "none",
    "speculate_max_draft_token_num": 1,
    "speculate_max_ngram_size": 3,
    "speculate_model_path": None,
    "api_key": None,
    "max_num_batched_tokens": 512,
    "num_threads": "auto",
    "bind_cores": True,
    "drain_timeout_s": 60.0,
    "malloc_tuning": True,
    "huge_pages": True,
    "log_step_every": 0,
    "device": "auto",
    "speculate_min_acceptance": 0.3,
}

# A valid non-default raw value for every variable, and what it parses to.
SAMPLES = {
    "MODEL_DIR": ("/m/x", "/m/x"),
    "model_name": ("llama", "llama"),
    "MP_NUM": ("4", 4),
    "MP_NNODE": ("1", 1),
    "POD_IPS": ("10.0.0.1", ("10.0.0.1",)),
    "POD_0_IP": ("10.0.0.1", "10.0.0.1"),
    "CUDA_VISIBLE_DEVICES": ("2,3", "2,3"),
    "SERVICE_HTTP_PORT": ("18000", 18000),
    "SERVICE_GRPC_PORT": ("18001", 18001),
    "HEALTH_HTTP_PORT": ("18002", 18002),
    "METRICS_HTTP_PORT": ("18003", 18003),
    "INTER_PROC_PORT": ("18004", 18004),
    "HOST": ("127.0.0.1", "127.0.0.1"),
    "MAX_SEQ_LEN": ("4096", 4096),
    "MAX_DEC_LEN": ("77", 77),
    "BATCH_SIZE": ("256", 256),
    "BLOCK_SIZE": ("16", 16),
    "BLOCK_BS": ("3", 3),
    "BLOCK_RATIO": ("1", 1.0),
    "MAX_CACHED_TASK_NUM": ("5", 5),
    "PUSH_MODE_HTTP_WORKERS": ("8", 8),
    "DISABLE_STREAMING": ("1", True),
    "USE_WARMUP": ("yes", True),
    "USE_HF_TOKENIZER": ("TRUE", True),
    "USE_CACHE_KV_INT8": ("1", True),
    "LOG_DIR": ("/tmp/logs", "/tmp/logs"),
    "OUTPUT_LOG_TO_CONSOLE": ("1", True),
    "ENABLE_PREFIX_CACHING": ("0", False),
    "SPECULATE_METHOD": ("ngram", "ngram"),
    "SPECULATE_MAX_DRAFT_TOKEN_NUM": ("8", 8),
    "SPECULATE_MAX_NGRAM_SIZE": ("2", 2),
    "SPECULATE_MODEL_PATH": ("/m/draft", "/m/draft"),
    "API_KEY": ("sk-123", "sk-123"),
    "SPMD_MAX_NUM_BATCHED_TOKENS": ("16", 16),
    "SPMD_NUM_THREADS": ("8", "8"),
    "SPMD_BIND_CORES": ("0", False),
    "SPMD_DRAIN_TIMEOUT_S": ("2.5", 2.5),
    "SPMD_MALLOC_TUNING": ("no", False),
    "SPMD_HUGE_PAGES": ("0", False),
    "SPMD_LOG_STEP_EVERY": ("50", 50),
    "SPMD_DEVICE": ("cpu", "cpu"),
    "SPMD_SPECULATE_MIN_ACCEPTANCE": ("0", 0.0),
}
ALIASES = [(v.name, alias) for v in ENV_VARS for alias in v.aliases]


def _contract_rows() -> list[tuple[list[str], list[str], str]]:
    """(canonical names, legacy names in parentheses, default cell) of each row of the §2 table."""
    section = contract.env_section()
    rows = []
    for line in section.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        head, _, legacy = cells[0].partition("(")
        canonical = re.findall(r"`([^`]+)`", head)
        if canonical:
            rows.append((canonical, re.findall(r"`([^`]+)`", legacy), cells[1]))
    return rows


def test_every_contract_variable_is_in_the_table():
    rows = _contract_rows()
    assert len(rows) >= 20
    for canonical, legacy, default in rows:
        for name in canonical:
            assert name in BY_NAME and BY_NAME[name].name == name, f"{name} missing from ENV_VARS"
        for alias in legacy:  # a legacy name must be an alias of the row's variable
            assert alias in BY_NAME and BY_NAME[alias] is BY_NAME[canonical[0]], alias
            assert alias in BY_NAME[canonical[0]].aliases
        for name in canonical:  # default column: unset/all, a number or a backticked string
            var = BY_NAME[name]
            if default.startswith("unset") or default == "all":
                assert var.default in (None, ()), name
            else:
                assert var.default == var.parse(default.strip("`")), f"{name}: {default}"
    # And the reverse: nothing but the internal knobs is missing from the contract.
    listed = {n for canonical, legacy, _ in rows for n in canonical + legacy}
    assert {n for n, v in BY_NAME.items() if not v.internal} == listed
    assert [v.name for v in ENV_VARS if not v.internal] == [n for c, _, _ in rows for n in c]


def test_contract_copy_is_current():
    """tests/support/contract_env.md is ../shared/CONTRACT.md's §2 (where the contract is present)."""
    shared = contract.shared_env_section()
    assert contract.COPY.read_text(encoding="utf-8") == (shared or contract.COPY.read_text(encoding="utf-8"))
    assert "## 2." in contract.env_section() and "`MODEL_DIR`" in contract.env_section()


def test_defaults_equal_contract():
    cfg = load_config([], {})
    assert dataclasses.asdict(cfg) == CONTRACT_DEFAULTS
    assert ServeConfig() == cfg
    assert [v.name for v in ENV_VARS if v.internal] == [
        "SPMD_MAX_NUM_BATCHED_TOKENS",
        "SPMD_NUM_THREADS",
        "SPMD_BIND_CORES",
        "SPMD_DRAIN_TIMEOUT_S",
        "SPMD_MALLOC_TUNING",
        "SPMD_HUGE_PAGES",
        "SPMD_LOG_STEP_EVERY",
        "SPMD_DEVICE",
        "SPMD_SPECULATE_MIN_ACCEPTANCE",
    ]


@pytest.mark.parametrize("name", [v.name for v in ENV_VARS])
def test_each_variable_by_env_and_flag(name):
    var, (raw, want) = BY_NAME[name], SAMPLES[name]
    assert getattr(load_config([], {name: raw}), var.field) == want
    assert getattr(load_config([var.flag, raw], {}), var.field) == want


@pytest.mark.parametrize("method", ["inference_with_reference", "ngram"])
def test_ngram_speculation_is_accepted_with_any_k(method):
    check_supported(load_config([], {}))
    for k in ("1", "8"):
        check_supported(load_config([], {"SPECULATE_METHOD": method, "SPECULATE_MAX_DRAFT_TOKEN_NUM": k}))


@pytest.mark.parametrize(
    "name,value",
    [("SPECULATE_MAX_DRAFT_TOKEN_NUM", "9"), ("SPECULATE_MAX_DRAFT_TOKEN_NUM", "0"), ("SPECULATE_MAX_NGRAM_SIZE", "9")],
)
def test_speculation_sizes_out_of_range_are_refused(name, value):
    with pytest.raises(ConfigError, match=name):
        load_config([], {"SPECULATE_METHOD": "ngram", name: value})


def test_a_draft_model_path_without_draft_model_is_refused():
    with pytest.raises(ConfigError, match="^SPECULATE_MODEL_PATH=.* has no effect"):
        check_supported(load_config([], {"SPECULATE_METHOD": "ngram", "SPECULATE_MODEL_PATH": "/m/draft"}))


@pytest.mark.parametrize("canonical,alias", ALIASES)
def test_legacy_alias(canonical, alias):
    raw, want = SAMPLES[canonical]
    assert getattr(load_config([], {alias: raw}), BY_NAME[canonical].field) == want


@pytest.mark.parametrize("canonical,alias", ALIASES)
def test_canonical_beats_alias(canonical, alias):
    raw, want = SAMPLES[canonical]
    cfg = load_config([], {alias: "19999", canonical: raw})
    assert getattr(cfg, BY_NAME[canonical].field) == want


def test_flag_beats_env_and_empty_counts_as_unset():
    cfg = load_config(["--batch-size", "7", "--use-warmup"], {"BATCH_SIZE": "9", "USE_WARMUP": "0"})
    assert (cfg.batch_size, cfg.use_warmup) == (7, True)
    assert load_config(["--use-warmup", "0"], {"USE_WARMUP": "1"}).use_warmup is False
    # Empty canonical falls through to the legacy name; empty everything is the default.
    env = {"SERVICE_HTTP_PORT": "", "PUSH_MODE_HTTP_PORT": "1234"}
    assert load_config([], env).http_port == 1234
    assert load_config([], {"MODEL_DIR": "", "BATCH_SIZE": " "}) == ServeConfig()
    assert load_config(["--batch-size", ""], {"BATCH_SIZE": "3"}).batch_size == 3


@pytest.mark.parametrize(
    "env,fragment",
    [
        ({"MP_NUM": "3", "MP_NNODE": "2"}, "MP_NUM=3 is invalid: must be a multiple of MP_NNODE=2"),
        (
            {"POD_IPS": "a,b", "MP_NNODE": "2", "MP_NUM": "2", "POD_0_IP": "c"},
            "POD_0_IP=c is invalid: must be one of POD_IPS=a,b",
        ),
        ({"POD_IPS": "a,b"}, "POD_IPS=a,b is invalid: lists 2 node(s) but MP_NNODE=1"),
        ({"HEALTH_HTTP_PORT": "9965"}, "HEALTH_HTTP_PORT=9965 is invalid: must differ from SERVICE_HTTP_PORT=9965"),
    ],
)
def test_cross_field_rules(env, fragment):
    with pytest.raises(ConfigError) as exc:
        load_config([], env)
    assert fragment in str(exc.value)


def test_cross_field_rules_accept_valid_multi_node_and_disabled_ports():
    cfg = load_config(
        [],
        {
            "POD_IPS": "10.0.0.1, 10.0.0.2",
            "POD_0_IP": "10.0.0.2",
            "MP_NNODE": "2",
            "MP_NUM": "16",
            "SERVICE_HTTP_PORT": "-1",
            "SERVICE_GRPC_PORT": "-1",
        },
    )
    assert cfg.pod_ips == ("10.0.0.1", "10.0.0.2") and cfg.ranks_per_node == 8
    assert (cfg.http_port, cfg.grpc_port) == (-1, -1)


def test_replace_and_direct_construction_are_validated():
    with pytest.raises(ConfigError, match="BATCH_SIZE=0 is invalid"):
        dataclasses.replace(ServeConfig(), batch_size=0)
    with pytest.raises(ConfigError, match="USE_WARMUP=1 is invalid"):
        ServeConfig(use_warmup=1)  # type: ignore[arg-type]


def test_to_environ_round_trips():
    cfg = load_config(["--pod-ips", "a", "--api-key", "k", "--use-warmup"], {"MAX_SEQ_LEN": "100"})
    assert load_config([], cfg.to_environ()) == cfg


def test_num_blocks():
    assert ServeConfig().num_blocks() == 50 * 128  # 50 * ceil(8192 / 64)
    cfg = ServeConfig(max_seq_len=100, max_dec_len=130, block_size=64, block_bs=3)
    assert cfg.num_blocks() == 3 * 3  # ceil(130 / 64) = 3
    assert cfg.num_blocks(block_size=16) == 3 * 9
    assert ServeConfig(max_seq_len=128, max_dec_len=1, block_size=64, block_bs=1).num_blocks() == 2


def test_help_lists_every_flag():
    text = build_arg_parser().format_help()
    for var in ENV_VARS:
        assert var.flag in text and var.name in text
    assert "loopback" in text and "-1 to disable" in text


@pytest.mark.parametrize("module", [config_mod, envs_mod])
def test_no_heavy_imports(module):
    tree = ast.parse(Path(module.__file__).read_text())
    nodes = list(ast.walk(tree))
    names = {a.name.split(".")[0] for n in nodes if isinstance(n, ast.Import) for a in n.names}
    names |= {(n.module or "").split(".")[0] for n in nodes if isinstance(n, ast.ImportFrom)}
    assert not names & {"paddle", "mpi4py", "tornado"}
