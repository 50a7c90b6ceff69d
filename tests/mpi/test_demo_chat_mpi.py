"""The default demo (no MODEL_DIR: the trained "chat" model, exported on first use) served on two
ranks answers a greeting in English, and stops at its end-of-turn token (issue 15 item 4).  With
SPECULATE_METHOD=draft_model and no SPECULATE_MODEL_PATH it drafts with the demo's own draft
(`chat-draft`, exported on first use too) and gives the same answer."""

from __future__ import annotations

import pytest
import requests

from spmd_serve.export.demo.training_data import chat_pairs
from tests.support.metrics_scrape import Samples
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """SPMD_SERVE_CACHE: the demo is exported into this module's own directory, never ~/.cache; the
    first test exports the chat model, the second finds it there and exports only its draft."""
    return tmp_path_factory.mktemp("demo") / "cache"


def test_bare_server_answers_hello_in_english(cache, tmp_path):
    with ServerProcess(2, None, tmp_path / "server.log", SPMD_SERVE_CACHE=str(cache)) as srv:
        body = {"text": "Hello, how are you?", "temperature": 0, "max_dec_len": 48, "return_usage": True}
        res = requests.post(srv.url, json=body, timeout=120).json()
    assert res["error_code"] == 0, res
    assert res["result"] == dict(chat_pairs())["Hello, how are you?"]  # what it was taught
    assert res["finish_reason"] == "stop" and res["tokens_all_num"] < 48  # <|end|> ended it
    assert "demo-chat-tp2" in [d.name.rsplit("-v", 1)[0] for d in cache.iterdir()]  # exported on first use


def test_bare_server_drafts_with_the_demo_draft(cache, tmp_path):
    env = {"SPMD_SERVE_CACHE": str(cache), "SPECULATE_METHOD": "draft_model"}
    with ServerProcess(2, None, tmp_path / "server.log", SPECULATE_MAX_DRAFT_TOKEN_NUM="3", **env) as srv:
        body = {"text": "Hello, how are you?", "temperature": 0, "max_dec_len": 48}
        res = requests.post(srv.url, json=body, timeout=120).json()
        metrics = Samples(requests.get(f"http://127.0.0.1:{srv.env['METRICS_HTTP_PORT']}/metrics", timeout=10).text)
    assert res["error_code"] == 0 and res["result"] == dict(chat_pairs())["Hello, how are you?"], res
    assert metrics.get("spec_decode_num_accepted_tokens_total", method="draft_model") > 0
    names = sorted(d.name for d in cache.iterdir())
    assert [n.rsplit("-v", 1)[0] for n in names] == ["demo-chat-draft-tp2", "demo-chat-tp2"]
