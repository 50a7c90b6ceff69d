"""The prompts of an OpenAI body as token ids and text: `/v1/completions`' `prompt` (a string, strings,
token ids or lists of them; encoded with the tokenizer's own special tokens unless
`add_special_tokens` is false), chat's `messages` through the chat template (vLLM's
`add_generation_prompt` / `continue_final_message`), vLLM's `truncate_prompt_tokens`, and every id
checked against the vocabulary.  Refusals are `OpenAIError`s naming the field.
"""

from __future__ import annotations

from typing import Any

from spmd_serve.frontend.common.parsing import is_int, show
from spmd_serve.frontend.openai import reasoning
from spmd_serve.frontend.openai.body import OpenAIError, get
from spmd_serve.frontend.openai.tools import template_messages
from spmd_serve.frontend.text import chat_template


def completion_prompts(body: dict[str, Any], tokenizer: Any) -> tuple[list[list[int]], list[str]]:
    p = body.get("prompt")
    bad = OpenAIError(
        400, "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids", "prompt"
    )
    if isinstance(p, str):
        p = [p]
    elif isinstance(p, list) and p and all(is_int(t) for t in p):
        p = [p]
    if not isinstance(p, list) or not p:
        raise bad
    # raw text, no chat template; the tokenizer's own BOS/EOS unless add_special_tokens is false (vLLM)
    special = get(body, "add_special_tokens", "bool", True)
    ids_list, texts = [], []
    for item in p:
        if isinstance(item, str):
            ids_list.append(tokenizer.encode(item, add_special_tokens=special))
            texts.append(item)
        elif isinstance(item, list) and item and all(is_int(t) and t >= 0 for t in item):
            check_vocab([item], tokenizer)  # before decode(), which fails on such an id
            ids_list.append(list(item))
            texts.append(tokenizer.decode(item, skip_special_tokens=False))  # (echo: vLLM's text, a BOS written)
        else:
            raise bad
    return ids_list, texts


def chat_prompt(
    body: dict[str, Any], tokenizer: Any, tools: list[dict[str, Any]] | None = None
) -> tuple[list[list[int]], list[str]]:
    """The chat's prompt ids (and "" for its text); `tools`: the template's (frontend/openai/tools.py)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise OpenAIError(400, "messages must be a non-empty list of {role, content}", "messages")
    # vLLM's: continue_final_message (the reply continues the last message) implies no generation prompt
    cont = get(body, "continue_final_message", "bool", False)
    if cont and body.get("add_generation_prompt") is True:
        raise OpenAIError(
            400, "continue_final_message and add_generation_prompt cannot both be true", "continue_final_message"
        )
    options: dict[str, Any] = {"continue_final_message": True} if cont else {}  # (only what differs from the defaults)
    if not get(body, "add_generation_prompt", "bool", True):
        options["add_generation_prompt"] = False
    effort = reasoning.effort_variables(body, getattr(tokenizer, "chat_template_source", None))
    variables = body.get("chat_template_kwargs")
    if variables or effort:
        options["template_kwargs"] = {**effort, **_template_kwargs(variables or {})}
    if tools is not None:
        options["tools"] = tools
    try:
        ids = tokenizer.encode_prompt(messages=template_messages(msgs), **options)
    except ValueError as e:
        raise OpenAIError(400, f"invalid messages: {e}", "messages") from None
    return [list(ids)], [""]


# the template's own variables, which the request's fields set (or which are not built: tools, documents)
_RESERVED = ("messages", "add_generation_prompt", "continue_final_message", "tools", "documents")


def _template_kwargs(variables: Any) -> dict[str, Any]:
    """vLLM's chat_template_kwargs: more variables for the chat template (Qwen3's enable_thinking, ...)."""
    if not isinstance(variables, dict):
        raise OpenAIError(400, f"chat_template_kwargs must be an object, got {show(variables)}", "chat_template_kwargs")
    taken = next((k for k in _RESERVED if k in variables), None)
    if taken is not None:
        raise OpenAIError(
            400,
            f"chat_template_kwargs.{taken}: not a variable a request may set this way",
            f"chat_template_kwargs.{taken}",
        )
    return variables


def truncate(body: dict[str, Any], prompts: list[list[int]], texts: list[str], tokenizer: Any) -> None:
    """vLLM's truncate_prompt_tokens: keep each prompt's last k tokens (echo shows what is kept)."""
    k = get(body, "truncate_prompt_tokens", "int", None, 1)
    for i, ids in enumerate(prompts):
        if k is not None and len(ids) > k:
            prompts[i] = ids[-k:]
            texts[i] = tokenizer.decode(prompts[i], skip_special_tokens=False) if texts[i] else ""


def check_vocab(prompts: list[list[int]], tokenizer: Any) -> None:
    vocab = getattr(tokenizer, "vocab_size", None)
    for ids in prompts:
        if not ids:
            raise OpenAIError(400, "the prompt is empty", "prompt")
        if vocab is not None and max(ids) >= vocab:
            raise OpenAIError(400, f"token id {max(ids)} is outside the vocabulary (size {vocab})", "prompt")


def echoed_message(body: dict[str, Any]) -> str:
    """vLLM's chat echo: the last message's content (its text parts joined) when the assistant wrote
    it, which the answer then follows (with continue_final_message, continues); else nothing."""
    last = body["messages"][-1]
    return chat_template.normalize_messages([last], None)[0]["content"] if last.get("role") == "assistant" else ""
