"""Prefix caching on real ranks (issue 15): greedy multi-turn chats that share a system prompt give
the same tokens with and without caching at TP 1 and 2 — under chunked prefill and a pool small
enough to preempt — and a real server (ENABLE_PREFIX_CACHING at its default, on) reports the
cached prompt tokens in native and OpenAI usage and in /metrics."""

from __future__ import annotations

import openai
import pytest
import requests

from tests.support.metrics_scrape import Samples
from tests.support.server_process import ServerProcess
from tests.support.spec_driver import run_driver

pytestmark = pytest.mark.mpi
SYSTEM = "You are a careful assistant. Answer in one short sentence, and never repeat the question. "
QUESTIONS = [
    ["What is a lantern?", "And a compass?", "Which one is older?"],
    ["Name a river.", "How long is it?", "Does it freeze?"],
    ["Tell me about bread.", "Who bakes it?", "At what time?"],
]
BLOCK = 16


@pytest.fixture(scope="module")
def tok(demo_checkpoint):
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

    return ServingTokenizer.from_model_dir(demo_checkpoint)


def run_chats(n: int, model_dir, tok, tmp_path) -> dict:
    spec = {
        "system": [tok.bos_token_id] + tok.encode(SYSTEM),
        "turns": [[tok.encode(" User: " + q + " Assistant:") for q in chat] for chat in QUESTIONS],
        "params": {"max_tokens": 20, "min_tokens": 20, "temperature": 0.0},
        # 32-token steps chunk every prefill; 16 blocks of 16 cannot hold three growing last turns
        "engine": {"block_size": BLOCK, "num_blocks": 16, "max_num_batched_tokens": 32, "max_num_seqs": 3},
    }
    return run_driver(n, "tests.support.prefix_chat_driver", model_dir, spec, tmp_path)


@pytest.mark.parametrize("tp", [1, 2])
def test_multi_turn_chats_give_the_same_greedy_tokens_with_and_without_caching(
    tp, served_tp1, served_tp2, tok, tmp_path
):
    got = run_chats(tp, served_tp1 if tp == 1 else served_tp2, tok, tmp_path)
    plain, cached = got["plain"], got["caching"]
    assert cached["tokens"] == plain["tokens"]
    assert plain["preemptions"] > 0 and cached["preemptions"] > 0  # the pool was too small for all
    assert plain["hits"] == 0 and all(c == 0 for rnd in plain["cached"] for c in rnd)
    system_blocks = (1 + len(tok.encode(SYSTEM))) // BLOCK * BLOCK
    first, second, third = cached["cached"]
    assert first[0] == 0 and all(c >= system_blocks for c in first[1:])  # later chats reuse the system prompt
    assert all(c > system_blocks for c in second)  # the next turn reuses its own chat as well
    assert all(c >= system_blocks for c in third) and sum(second + third) > 6 * system_blocks
    # hits count every admission, re-admissions after preemption included; usage only the first
    assert cached["hits"] >= sum(map(sum, cached["cached"])) and cached["queries"] > cached["hits"]


@pytest.fixture(scope="module")
def server(served_tp1, tmp_path_factory):
    with ServerProcess(1, served_tp1, tmp_path_factory.mktemp("logs") / "server.log", BLOCK_SIZE=str(BLOCK)) as srv:
        srv.metrics_url = f"http://127.0.0.1:{srv.env['METRICS_HTTP_PORT']}/metrics"
        yield srv


def metrics(srv) -> Samples:
    return Samples(requests.get(srv.metrics_url, timeout=10).text)


def test_a_repeated_prompt_reports_its_cached_tokens_everywhere(server, tok):
    body = {"text": "Where is the old mill?", "system": SYSTEM, "max_dec_len": 6, "temperature": 0}
    body.update(return_usage=True, min_dec_len=6)
    n_prompt = len(tok.encode_prompt(text=body["text"], system=SYSTEM))
    hit = (n_prompt - 1) // BLOCK * BLOCK  # every full block but one holding the last prompt token
    before = metrics(server)
    first = requests.post(server.url, json=body, timeout=60).json()
    again = requests.post(server.url, json=body, timeout=60).json()
    assert first["usage"]["cached_tokens"] == 0 and first["usage"]["prompt_tokens"] == n_prompt
    assert again["usage"]["cached_tokens"] == hit > 0
    assert again["tokens_all_ids"] == first["tokens_all_ids"]  # the cache changes no greedy token
    after = metrics(server)
    assert after.get("prefix_cache_queries_total") - before.get("prefix_cache_queries_total") == 2 * n_prompt
    assert after.get("prefix_cache_hits_total") - before.get("prefix_cache_hits_total") == hit

    client = openai.OpenAI(base_url=server.url.rsplit("/chat/", 1)[0], api_key="none", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": body["text"]}]
    chat = client.chat.completions.create(model="default", messages=messages, max_tokens=6, temperature=0)
    assert chat.usage.prompt_tokens == n_prompt  # the same template: the same prompt, all but the last block cached
    assert chat.usage.prompt_tokens_details.cached_tokens == hit


def test_a_cache_salt_keeps_a_prompts_blocks_to_its_own_salt(server, tok):
    """vLLM's cache_salt on the real server: a salted prompt is found again under its salt alone; the
    answer is the same whatever the salt (greedy), and its id is the request_id asked for."""
    client = openai.OpenAI(base_url=server.url.rsplit("/chat/", 1)[0], api_key="none", max_retries=0)
    # (a system prompt of its own: no other test's prompt shares a first block with this one)
    messages = [{"role": "system", "content": "Salted. " + SYSTEM}, {"role": "user", "content": "Which bird?"}]
    n_prompt = len(tok.encode_prompt(messages=messages))
    hit = (n_prompt - 1) // BLOCK * BLOCK

    def cached(salt: str | None) -> tuple[int, str]:
        extra = {"request_id": f"salted-{salt}"} | ({"cache_salt": salt} if salt else {})
        chat = client.chat.completions.create(
            model="default", messages=messages, max_tokens=4, temperature=0, extra_body=extra
        )
        assert chat.id == f"chatcmpl-salted-{salt}"
        return chat.usage.prompt_tokens_details.cached_tokens, chat.choices[0].message.content

    first = cached("tenant-a")
    assert first[0] == 0 and hit > 0
    assert cached("tenant-a") == (hit, first[1])
    assert cached("tenant-b") == (0, first[1])
    assert cached(None) == (0, first[1])  # (the unsalted cache never held this prompt)
    assert cached(None) == (hit, first[1])
    assert cached("tenant-b") == (hit, first[1])
