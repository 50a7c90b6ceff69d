"""The default demo (no MODEL_DIR: the trained "chat" model, exported on first use) served on two
ranks answers a greeting in English, and stops at its end-of-turn token (issue 15 item 4)."""

from __future__ import annotations

import pytest
import requests

from spmd_serve.export.demo.training_data import chat_pairs
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.mpi


def test_bare_server_answers_hello_in_english(tmp_path):
    # SPMD_SERVE_CACHE: the demo is exported into the test's own directory, never ~/.cache
    with ServerProcess(2, None, tmp_path / "server.log", SPMD_SERVE_CACHE=str(tmp_path / "cache")) as srv:
        body = {"text": "Hello, how are you?", "temperature": 0, "max_dec_len": 48, "return_usage": True}
        res = requests.post(srv.url, json=body, timeout=120).json()
    assert res["error_code"] == 0, res
    assert res["result"] == dict(chat_pairs())["Hello, how are you?"]  # what it was taught
    assert res["finish_reason"] == "stop" and res["tokens_all_num"] < 48  # <|end|> ended it
    assert list((tmp_path / "cache").iterdir())[0].name.startswith("demo-chat-tp2")
