"""spmd_serve.envs/config: defaults, aliases, precedence, messages, model dir, CONTRACT §2."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from spmd_serve import config as config_mod
from spmd_serve import envs as envs_mod
from spmd_serve.config import ConfigError, ServeConfig, build_arg_parser, exit_on_config_error, load_config
from spmd_serve.envs import BY_NAME, ENV_VARS
from spmd_serve.model_dir import check_model_dir, clamp_to_model
from spmd_serve.worker.capacity import check_supported

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO.parent / "shared" / "CONTRACT.md"

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
    "num_threads": 1,
    "drain_timeout_s": 60.0,
    "onednn_min_tokens": None,
    "malloc_tuning": True,
    "log_step_every": 0,
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
    "SPMD_NUM_THREADS": ("8", 8),
    "SPMD_DRAIN_TIMEOUT_S": ("2.5", 2.5),
    "SPMD_ONEDNN_MIN_TOKENS": ("0", 0),
    "SPMD_MALLOC_TUNING": ("no", False),
    "SPMD_LOG_STEP_EVERY": ("50", 50),
}
ALIASES = [(v.name, alias) for v in ENV_VARS for alias in v.aliases]


def _contract_rows() -> list[tuple[list[str], list[str], str]]:
    """(canonical names, legacy names in parentheses, default cell) of each row of the §2 table."""
    text = CONTRACT.read_text(encoding="utf-8")
    section = text.split("\n## 2.", 1)[1].split("\n## 3.", 1)[0]
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


@pytest.mark.skipif(not CONTRACT.exists(), reason="CONTRACT.md not beside the repo")
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


def test_defaults_equal_contract():
    cfg = load_config([], {})
    assert dataclasses.asdict(cfg) == CONTRACT_DEFAULTS
    assert ServeConfig() == cfg
    assert [v.name for v in ENV_VARS if v.internal] == [
        "SPMD_MAX_NUM_BATCHED_TOKENS",
        "SPMD_NUM_THREADS",
        "SPMD_DRAIN_TIMEOUT_S",
        "SPMD_ONEDNN_MIN_TOKENS",
        "SPMD_MALLOC_TUNING",
        "SPMD_LOG_STEP_EVERY",
    ]


@pytest.mark.parametrize("name", [v.name for v in ENV_VARS])
def test_each_variable_by_env_and_flag(name):
    var, (raw, want) = BY_NAME[name], SAMPLES[name]
    assert getattr(load_config([], {name: raw}), var.field) == want
    assert getattr(load_config([var.flag, raw], {}), var.field) == want


@pytest.mark.parametrize(
    "name", ["SPECULATE_METHOD", "SPECULATE_MAX_DRAFT_TOKEN_NUM", "SPECULATE_MAX_NGRAM_SIZE", "SPECULATE_MODEL_PATH"]
)
def test_unbuilt_features_are_refused_at_start(name):
    """Speculative decoding is not built yet: asking for it stops start-up with one line naming
    the variable, rather than being silently ignored; its defaults (off) are accepted."""
    check_supported(load_config([], {}))
    with pytest.raises(ConfigError, match=rf"^{name}=\S+ is not built yet"):
        check_supported(load_config([], {name: SAMPLES[name][0]}))


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
    "raw,want",
    [
        ("1", True),
        ("true", True),
        ("Yes", True),
        ("TRUE", True),
        ("0", False),
        ("false", False),
        ("NO", False),
        (" 1 ", True),
    ],
)
def test_bool_spellings(raw, want):
    assert load_config([], {"DISABLE_STREAMING": raw}).disable_streaming is want


@pytest.mark.parametrize(
    "name,value,rule",
    [
        ("BATCH_SIZE", "0", "[1, 256]"),
        ("BATCH_SIZE", "257", "[1, 256]"),
        ("BATCH_SIZE", "abc", "integer"),
        ("BATCH_SIZE", "1.5", "integer"),
        ("BLOCK_RATIO", "0", "(0, 1]"),
        ("BLOCK_RATIO", "1.01", "(0, 1]"),
        ("BLOCK_RATIO", "nan", "(0, 1]"),
        ("PUSH_MODE_HTTP_WORKERS", "9", "[1, 8]"),
        ("PUSH_MODE_HTTP_WORKERS", "0", "[1, 8]"),
        ("USE_WARMUP", "2", "0/1/true/false/yes/no"),
        ("DISABLE_STREAMING", "on", "0/1"),
        ("SERVICE_HTTP_PORT", "70000", "-1 to disable"),
        ("SERVICE_GRPC_PORT", "0", "[1, 65535]"),
        ("HEALTH_HTTP_PORT", "-1", "[1, 65535]"),
        ("METRICS_HTTP_PORT", "x", "port"),
        ("INTER_PROC_PORT", "-1", "[1, 65535]"),
        ("MAX_SEQ_LEN", "0", ">= 1"),
        ("MAX_DEC_LEN", "-5", ">= 1"),
        ("BLOCK_SIZE", "0", ">= 1"),
        ("BLOCK_BS", "0", ">= 1"),
        ("MAX_CACHED_TASK_NUM", "0", ">= 1"),
        ("MP_NUM", "0", ">= 1"),
        ("MP_NNODE", "two", "integer"),
        ("SPMD_MAX_NUM_BATCHED_TOKENS", "15", ">= 16"),
        ("SPMD_NUM_THREADS", "0", ">= 1"),
        ("SPMD_DRAIN_TIMEOUT_S", "-1", ">= 0"),
        ("SPMD_DRAIN_TIMEOUT_S", "soon", "must be a number"),
        ("SPMD_ONEDNN_MIN_TOKENS", "many", "must be an integer >= 0"),
        ("SPMD_LOG_STEP_EVERY", "-5", ">= 0"),
        ("POD_IPS", "10.0.0.1,,10.0.0.2", "comma-separated"),
        ("POD_0_IP", "a b", "host name"),
        ("CUDA_VISIBLE_DEVICES", "0;1", "device ids"),
        ("HOST", "0.0.0.0 x", "host name"),
    ],
)
def test_invalid_value_message(name, value, rule):
    with pytest.raises(ConfigError) as exc:
        load_config([], {name: value})
    msg = str(exc.value)
    assert msg.startswith(f"{name}={value.strip()} is invalid: "), msg
    assert rule in msg and "\n" not in msg


def test_error_message_names_its_source():
    with pytest.raises(
        ConfigError,
        match=r"^BATCH_SIZE=0 \(from --batch-size\) is invalid: "
        r"must be an integer in \[1, 256\]$",
    ):
        load_config(["--batch-size", "0"], {})
    with pytest.raises(
        ConfigError,
        match=r"^PUSH_MODE_HTTP_PORT=abc \(legacy name of "
        r"SERVICE_HTTP_PORT\) is invalid",
    ):
        load_config([], {"PUSH_MODE_HTTP_PORT": "abc"})
    with pytest.raises(ConfigError, match="unrecognized arguments: --nope"):
        load_config(["--nope"], {})


def test_api_key_is_never_echoed():
    with pytest.raises(ConfigError) as exc:
        load_config([], {"API_KEY": "sec ret"})
    assert "sec" not in str(exc.value) and "API_KEY=<hidden>" in str(exc.value)
    cfg = load_config([], {"API_KEY": "secret"})
    assert "secret" not in repr(cfg) and cfg.api_key == "secret"
    assert "secret" not in build_arg_parser().format_help()


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


def _model_dir(
    tmp_path: Path,
    ranks: int = 1,
    config: str | None = '{"max_position_embeddings": 4096}',
    empty: tuple[int, ...] = (),
) -> Path:
    (d := tmp_path / "model").mkdir()
    if config is not None:
        (d / "config.json").write_text(config)
    for i in range(ranks):
        (d / f"rank_{i}").mkdir()
        if i not in empty:
            (d / f"rank_{i}" / "model.pdiparams").write_bytes(b"x")
    return d


def test_check_model_dir_success(tmp_path):
    cfg = ServeConfig(model_dir=str(_model_dir(tmp_path, ranks=2)), mp_num=2)
    assert check_model_dir(cfg, world_size=2) == {"max_position_embeddings": 4096}


@pytest.mark.parametrize(
    "ranks,mp_num,world,config,empty,expected",
    [
        (1, 2, 1, "{}", (), "MP_NUM=2 but the MPI world size is 1 (start with mpirun -n 2)"),
        (1, 1, 1, None, (), "has no config.json"),
        (1, 1, 1, "{oops", (), "config.json is not valid JSON"),
        (1, 1, 1, "[1, 2]", (), "config.json must hold a JSON object"),
        (0, 1, 1, "{}", (), "has no rank_0/"),
        (1, 2, 2, "{}", (), "has no rank_1/ (it has 1 rank folder(s): exported with --tp 1?"),
        (2, 1, 1, "{}", (), "has 2 rank folders but MP_NUM=1 (exported with --tp 2? set MP_NUM=2)"),
        (2, 2, 2, "{}", (1,), "has an empty rank_1/"),
    ],
)
def test_check_model_dir_failures(tmp_path, ranks, mp_num, world, config, empty, expected):
    d = _model_dir(tmp_path, ranks=ranks, config=config, empty=empty)
    with pytest.raises(ConfigError) as exc:
        check_model_dir(ServeConfig(model_dir=str(d), mp_num=mp_num), world_size=world)
    assert expected in str(exc.value) and "\n" not in str(exc.value)


def test_check_model_dir_missing_and_not_a_dir(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        check_model_dir(ServeConfig(model_dir=str(tmp_path / "nope")), world_size=1)
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        check_model_dir(ServeConfig(model_dir=str(tmp_path / "f")), world_size=1)
    with pytest.raises(ConfigError, match="MODEL_DIR is not set"):
        check_model_dir(ServeConfig(), world_size=1)


def test_clamp_to_model():
    cfg = ServeConfig(max_seq_len=8192, block_size=64)
    assert clamp_to_model(cfg, {"max_position_embeddings": 2048}).max_seq_len == 2048
    assert clamp_to_model(cfg, {"max_position_embeddings": 32768}) == cfg  # never raised
    assert clamp_to_model(cfg, {}) is cfg
    fixed = clamp_to_model(cfg, {"max_position_embeddings": 1024, "block_size": 32})
    assert (fixed.max_seq_len, fixed.block_size) == (1024, 32)
    with pytest.raises(ConfigError, match="block_size=0"):
        clamp_to_model(cfg, {"block_size": 0})


def test_exit_on_config_error(capsys):
    @exit_on_config_error
    def main() -> None:
        load_config(["--batch-size", "0"], {})

    with pytest.raises(SystemExit, match="^2$"):
        main()
    err = capsys.readouterr().err
    assert err.startswith("spmd_serve: error: BATCH_SIZE=0") and "Traceback" not in err


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
