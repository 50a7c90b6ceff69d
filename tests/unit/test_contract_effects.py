"""Every CONTRACT §2 variable has a test that shows its effect (issue 17 item 4).

`EFFECTS` names, per variable, the tests where setting it changes what the server does (most
run a real server or start_server; the cheaper ones show the setting's effect on the part that
reads it).  Two checks keep the list honest: every variable of the §2 table is in it (or in
`PENDING`, with the issue item that owns it), and every test it names exists.  The wiring tests
below show the variables the front end and the scheduler read reaching them from the
environment (`IOSettings.from_config`, `server.scheduler_config`), so the effect tests of those
parts, which take the settings directly, stand for the variables."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from spmd_serve.config import load_config
from tests.support import contract

REPO = Path(__file__).resolve().parents[2]
HERE = "tests/unit/test_contract_effects.py"

FRONT_END = f"{HERE}::test_front_end_settings_come_from_the_environment"
SCHEDULER = f"{HERE}::test_scheduler_settings_come_from_the_environment"
SPECULATOR = "tests/unit/test_spec_proposer.py::test_the_speculator_settings_come_from_the_environment"
START = "tests/e2e/test_start_server.py"
FAILURES = "tests/mpi/test_failures_mpi.py"
NETNS = "tests/e2e/test_multinode_netns.py::test_start_server_builds_the_hostfile_from_pod_ips"
PREEMPTION = "tests/mpi/test_server_mpi.py::test_32_concurrent_requests_under_preemption"
EFFECTS: dict[str, list[str]] = {
    "CUDA_VISIBLE_DEVICES": [
        "tests/unit/test_device_select.py::test_local_rank_takes_kth_visible_device",
        "tests/unit/test_device_select.py::test_rank_device_reads_the_launchers_environment",
    ],
    "MODEL_DIR": [
        f"{START}::test_start_request_stop_restart",
        "tests/mpi/test_demo_chat_mpi.py::test_bare_server_answers_hello_in_english",
    ],
    "model_name": ["tests/e2e/test_download_model.py::test_start_server_serves_the_downloaded_model"],
    "MP_NUM": [f"{FAILURES}::test_world_size_must_match_mp_num", f"{FAILURES}::test_missing_rank_folder_is_named"],
    "MP_NNODE": [NETNS, "tests/e2e/test_multinode_hostfile.py::test_single_node_has_no_hostfile"],
    "POD_IPS": [NETNS, "tests/e2e/test_multinode_hostfile.py::test_master_first_and_slots_per_node"],
    "POD_0_IP": [NETNS, "tests/e2e/test_multinode_hostfile.py::test_pod_0_ip_defaults_to_the_first_address"],
    "SERVICE_HTTP_PORT": [f"{FAILURES}::test_busy_port_is_named", FRONT_END],
    "SERVICE_GRPC_PORT": ["tests/mpi/test_grpc_mpi.py::test_busy_grpc_port_is_named"],
    "HEALTH_HTTP_PORT": [f"{START}::test_busy_port_fails_fast_naming_it", FRONT_END],
    "METRICS_HTTP_PORT": [
        "tests/mpi/test_metrics_mpi.py::test_busy_metrics_port_stops_the_job_with_one_line_naming_it"
    ],
    "INTER_PROC_PORT": ["tests/mpi/test_http_workers_mpi.py::test_a_busy_port_is_one_line_naming_it"],
    "HOST": ["tests/e2e/test_multinode_netns.py::test_mpirun_hostfile_across_two_namespaces", FRONT_END],
    "MAX_SEQ_LEN": [
        "tests/mpi/test_grpc_mpi.py::test_errors_are_grpc_status_codes_and_server_stays_healthy",
        FRONT_END,
    ],
    "MAX_DEC_LEN": [
        "tests/mpi/test_grpc_mpi.py::test_errors_are_grpc_status_codes_and_server_stays_healthy",
        FRONT_END,
    ],
    "BATCH_SIZE": [
        PREEMPTION,
        "tests/http/test_http_workers.py::test_the_capacity_counts_the_requests_of_every_worker",
        SCHEDULER,
    ],
    "BLOCK_SIZE": [PREEMPTION, SCHEDULER],
    "BLOCK_BS": [PREEMPTION, f"{FAILURES}::test_bad_value_stops_every_rank_with_one_line", SCHEDULER],
    "BLOCK_RATIO": ["tests/unit/test_scheduler.py::test_watermark_blocks_admission_while_running_grows", SCHEDULER],
    "MAX_CACHED_TASK_NUM": [
        "tests/http/test_http_workers.py::test_the_capacity_counts_the_requests_of_every_worker",
        SCHEDULER,
    ],
    "PUSH_MODE_HTTP_WORKERS": ["tests/mpi/test_http_workers_mpi.py::test_two_worker_processes_that_are_no_ranks"],
    "DISABLE_STREAMING": [
        "tests/http/test_native_api.py::test_disable_streaming_sends_only_final_frame",
        "tests/http/test_grpc_service.py::test_explicit_non_stream_and_disable_streaming_give_one_final_response",
        FRONT_END,
    ],
    "USE_WARMUP": ["tests/mpi/test_metrics_mpi.py::test_fresh_server_after_warm_up_reports_idle_and_nothing_counted"],
    "USE_HF_TOKENIZER": ["tests/mpi/test_tokenizer_mpi.py::test_cjk_emoji_stream_equals_non_stream"],
    "USE_CACHE_KV_INT8": [
        "tests/mpi/test_quant_mpi.py::test_server_with_int8_kv_cache_answers",
        "tests/mpi/test_kv_int8_long_mpi.py::test_int8_kv_agrees_with_fp32_at_long_positions",
        SCHEDULER,
    ],
    "LOG_DIR": [
        f"{START}::test_start_request_stop_restart",
        f"{START}::test_output_log_to_console_copies_the_rank_logs_to_the_console",
    ],
    "OUTPUT_LOG_TO_CONSOLE": [f"{START}::test_output_log_to_console_copies_the_rank_logs_to_the_console"],
    "ENABLE_PREFIX_CACHING": [
        "tests/mpi/test_prefix_cache_mpi.py::test_multi_turn_chats_give_the_same_greedy_tokens_with_and_without_caching",
        "tests/mpi/test_prefix_cache_mpi.py::test_a_repeated_prompt_reports_its_cached_tokens_everywhere",
        SCHEDULER,
    ],
    "SPECULATE_METHOD": [
        "tests/mpi/test_speculative_server_mpi.py::test_frames_carry_the_accepted_tokens_and_add_up_to_the_answer",
        "tests/unit/test_config.py::test_unbuilt_proposers_are_refused_at_start",
        SPECULATOR,
    ],
    "SPECULATE_MAX_DRAFT_TOKEN_NUM": [
        "tests/mpi/test_speculative_server_mpi.py::test_frames_carry_the_accepted_tokens_and_add_up_to_the_answer",
        "tests/unit/test_spec_scheduler.py::test_drafts_never_pass_max_tokens_and_a_stop_drops_the_rest",
        SPECULATOR,
    ],
    "SPECULATE_MAX_NGRAM_SIZE": [
        "tests/unit/test_spec_proposer.py::test_ngram_index_matches_the_definition_as_tokens_arrive",
        SPECULATOR,
    ],
    "SPECULATE_MODEL_PATH": [
        "tests/mpi/test_speculative_server_mpi.py::test_a_draft_model_gives_the_answer_of_plain_decoding_counted_by_method",
        "tests/unit/test_model_dir.py::test_a_draft_that_cannot_draft_for_the_target_is_refused_in_one_line",
    ],
    "API_KEY": [
        "tests/mpi/test_grpc_mpi.py::test_health_metadata_config",
        "tests/mpi/test_metrics_mpi.py::test_counters_and_histograms_grow_by_exact_amounts",
        FRONT_END,
    ],
}
PENDING: dict[str, str] = {}  # variables whose effect belongs to an open item (another change adds the test)


def contract_variables() -> list[str]:
    section = contract.env_section()
    rows = [line.strip().strip("|").split("|")[0] for line in section.splitlines() if line.startswith("|")]
    return [name for cell in rows for name in re.findall(r"`([^`]+)`", cell.partition("(")[0])]


def test_every_contract_variable_has_an_effect_test():
    names = contract_variables()
    assert len(names) >= 30
    missing = [n for n in names if n not in EFFECTS and n not in PENDING]
    assert missing == [], f"no effect test listed for {missing}"
    assert set(EFFECTS) | set(PENDING) <= set(names)  # nothing listed that the contract lost
    assert not set(EFFECTS) & set(PENDING)


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_listed_effect_test_exists():
    functions: dict[str, set[str]] = {}
    for tests in EFFECTS.values():
        for node in tests:
            path, _, name = node.partition("::")
            if path not in functions:
                functions[path] = _test_functions(REPO / path)
            assert name in functions[path], f"{node} does not exist"


def test_front_end_settings_come_from_the_environment():
    """What the HTTP workers and gRPC are built with (IOSettings.from_config, rank0_frontend.py)."""
    from spmd_serve.frontend.server.settings import IOSettings

    env = {
        "HOST": "127.0.0.7",
        "SERVICE_HTTP_PORT": "18001",
        "HEALTH_HTTP_PORT": "18002",
        "MAX_SEQ_LEN": "300",
        "MAX_DEC_LEN": "40",
        "DISABLE_STREAMING": "1",
        "API_KEY": "k3y",
    }
    s = IOSettings.from_config(load_config([], env))
    assert (s.host, s.http_port, s.health_port) == ("127.0.0.7", 18001, 18002)
    assert (s.max_seq_len, s.max_dec_len, s.disable_streaming, s.api_key) == (300, 40, True, "k3y")
    assert IOSettings.from_config(load_config([], {})).disable_streaming is False


def test_scheduler_settings_come_from_the_environment():
    """What rank 0's engine schedules with (server.scheduler_config)."""
    from spmd_serve.server import scheduler_config

    env = {
        "BATCH_SIZE": "7",
        "BLOCK_SIZE": "16",
        "BLOCK_BS": "3",
        "MAX_SEQ_LEN": "100",
        "MAX_DEC_LEN": "20",
        "BLOCK_RATIO": "0.5",
        "MAX_CACHED_TASK_NUM": "9",
        "ENABLE_PREFIX_CACHING": "0",
        "USE_CACHE_KV_INT8": "1",
        "MODEL_DIR": "/m",
    }
    s = scheduler_config(load_config([], env), 4096)
    assert (s.max_num_seqs, s.block_size, s.block_ratio, s.max_waiting) == (7, 16, 0.5, 9)
    assert s.num_blocks == 3 * 7  # BLOCK_BS x ceil(max(MAX_SEQ_LEN, MAX_DEC_LEN) / BLOCK_SIZE)
    assert s.enable_prefix_caching is False and s.cache_salt == "/m|kv_int8=1"
    default = scheduler_config(load_config([], {"MODEL_DIR": "/m"}), 4096)
    assert default.enable_prefix_caching is True and default.cache_salt == "/m|kv_int8=0"
