"""spmd_serve.config's error messages: every bad value names its variable (or flag), its value and
the allowed range in one line, never echoes API_KEY, and `exit_on_config_error` turns them into
one `spmd_serve: error:` line."""

from __future__ import annotations

import pytest

from spmd_serve.config import ConfigError, build_arg_parser, exit_on_config_error, load_config


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
        ("SPMD_NUM_THREADS", "0", "auto or an integer >= 1"),
        ("SPMD_DRAIN_TIMEOUT_S", "-1", ">= 0"),
        ("SPMD_DRAIN_TIMEOUT_S", "soon", "must be a number"),
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


def test_exit_on_config_error(capsys):
    @exit_on_config_error
    def main() -> None:
        load_config(["--batch-size", "0"], {})

    with pytest.raises(SystemExit, match="^2$"):
        main()
    err = capsys.readouterr().err
    assert err.startswith("spmd_serve: error: BATCH_SIZE=0") and "Traceback" not in err
