"""vLLM's `thinking_token_budget` and the Messages API's `thinking.budget_tokens`, served by `mpirun -n 1
spmd_serve` (the demo model, Qwen2.5's chat template with a think block the prompt opens; n-gram
speculation on, so drafts are verified against the budget too) to the official `openai` and `anthropic`
clients: a greedy answer thinks what it thinks unbudgeted for its budget's tokens, then writes the close
tag, then exactly what the model writes after that prompt (a completions request of those ids); its
thinking and content split at the tag, whole and streamed alike; a budget larger than the thinking
changes nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import anthropic
import openai
import pytest
import requests

from tests.support.hf_tokenizer_dirs import QWEN2_TEMPLATE, THINKING
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.mpi
CHAT = [{"role": "user", "content": "Tell me about the sea."}]
THINK = {"chat_template_kwargs": {"thinking": True, "enable_thinking": True}}
KW = dict(model="default", messages=CHAT, max_tokens=24, temperature=0)


@pytest.fixture(scope="module")
def client(served_tp1: Path, tmp_path_factory) -> openai.OpenAI:
    model = shutil.copytree(served_tp1, tmp_path_factory.mktemp("qwen") / "thinking")
    (model / "chat_template.jinja").write_text(QWEN2_TEMPLATE + THINKING)
    env = {"SPECULATE_METHOD": "ngram", "SPECULATE_MAX_DRAFT_TOKEN_NUM": "3"}
    with ServerProcess(1, model, tmp_path_factory.mktemp("logs") / "server.log", **env) as srv:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{srv.http_port}/v1", api_key="x", max_retries=0, timeout=60)


def answer(client: openai.OpenAI, **extra) -> tuple[list[int], list[int], str, str | None]:
    """(prompt ids, answer ids, reasoning ("" for none), content) of a greedy thinking answer."""
    body = {**THINK, "return_token_ids": True, **extra}
    got = client.chat.completions.create(**KW, extra_body=body)
    c = got.choices[0]
    thinking = (c.message.model_extra or {}).get("reasoning") or ""
    return got.model_extra["prompt_token_ids"], c.model_extra["token_ids"], thinking, c.message.content


def close_tag(client: openai.OpenAI) -> list[int]:
    """`</think>`'s ids as the server forces them: the tokenizer's, less a leading lone space (its dummy prefix)."""
    base = str(client.base_url).removesuffix("/v1/")
    body = {"prompt": "</think>", "add_special_tokens": False, "return_token_strs": True}
    got = requests.post(base + "/tokenize", json=body, timeout=30).json()
    ids, strs = got["tokens"], got["token_strs"]
    while len(ids) > 1 and not strs[0].replace("\u2581", " ").strip():
        ids, strs = ids[1:], strs[1:]
    assert requests.post(base + "/detokenize", json={"tokens": ids}, timeout=30).json()["prompt"] == "</think>"
    return ids


def test_the_think_block_closes_after_its_budget(client):
    prompt, free, free_thinking, _ = answer(client)
    assert "</think>" not in free_thinking  # (the demo model does not close it within max_tokens itself)
    tag = close_tag(client)
    for budget in (0, 5):
        _, ids, thinking, content = answer(client, thinking_token_budget=budget)
        assert ids[:budget] == free[:budget] and ids[budget : budget + len(tag)] == tag
        # then what the model writes after those ids (a completion of them)
        rest = client.completions.create(
            model="default", prompt=prompt + ids[: budget + len(tag)], max_tokens=KW["max_tokens"] - budget - len(tag),
            temperature=0, extra_body={"return_token_ids": True},
        ).choices[0].model_extra["token_ids"]  # fmt: skip
        assert ids[budget + len(tag) :] == rest
        assert content and "</think>" not in thinking + content
        streamed = ["", ""]
        body = {**THINK, "thinking_token_budget": budget}
        for chunk in client.chat.completions.create(**KW, stream=True, extra_body=body):
            for c in chunk.choices:
                streamed[0] += (c.delta.model_extra or {}).get("reasoning") or ""
                streamed[1] += c.delta.content or ""
        assert streamed == [thinking, content]
    assert answer(client, thinking_token_budget=100)[1:] == answer(client)[1:]  # (more than it thinks: unchanged)


def test_the_messages_api_budget_is_chats(client):
    base = str(client.base_url).removesuffix("/v1/")
    messages = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0).messages
    _, _, thinking, content = answer(client, thinking_token_budget=4)
    got = messages.create(
        model="default", messages=CHAT, max_tokens=24, thinking={"type": "enabled", "budget_tokens": 4},
        extra_body={"temperature": 0},
    )  # fmt: skip
    assert [(b.type, getattr(b, "thinking", None) or b.text) for b in got.content] == [
        ("thinking", thinking), ("text", content)]  # fmt: skip
