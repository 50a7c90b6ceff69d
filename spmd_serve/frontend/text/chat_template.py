"""Chat templates: found in a model directory and rendered with HuggingFace's conventions, and the
messages checked before they reach one (`normalize_messages`: roles, content as text parts).

Where a template comes from (as HF's `from_pretrained` does): `chat_template.jinja` if present
(it overrides the config), else tokenizer_config.json's `chat_template`, a string or HF's list of
`{"name", "template"}` entries of which "default" is used.

How it is rendered (as HF's `apply_chat_template` does, so a checkpoint's template produces the
prompt its authors tested): a *sandboxed* Jinja environment (templates ship with possibly
untrusted checkpoints) with `trim_blocks`, `lstrip_blocks`, the loop controls
(`{% break %}`/`{% continue %}`), `raise_exception(msg)`, `strftime_now(fmt)`, a `tojson` filter
that does not HTML-escape, and the variables `messages`, `add_generation_prompt`, `tools=None`,
`documents=None` and the tokenizer's special-token strings (`bos_token`, `eos_token`, ...).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE_FILE = "chat_template.jinja"
_ROLES_HINT = "each message must be an object with string 'role' and 'content'"


def _raise_exception(message: str) -> None:
    # Templates call raise_exception() (HF convention) to reject conversations they cannot render.
    raise jinja2.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # HF's override: Jinja's own tojson HTML-escapes '<', '>', '&' and "'".
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_template(source: str) -> jinja2.Template:
    """Compile `source` in the sandbox; ValueError (one line) when it is not valid Jinja."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:  # a broken checkpoint, not a bad request
        raise ValueError(f"invalid chat_template: {e.message} (template line {e.lineno})") from e
    except jinja2.TemplateError as e:
        raise ValueError(f"invalid chat_template: {e}") from e


@functools.lru_cache(maxsize=8)
def variables(source: str) -> frozenset[str]:
    """The variables a template reads that it does not set itself (jinja2.meta's: what vLLM keeps of a
    request's chat_template_kwargs); none for a template that does not parse."""
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(source)))
    except jinja2.TemplateError:
        return frozenset()


def find_template(model_dir: str | Path, tokenizer_config: dict[str, Any]) -> str | None:
    """The chat template source of a model directory, or None when it has none."""
    path = Path(model_dir) / TEMPLATE_FILE
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = tokenizer_config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list):  # HF: [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
        raise ValueError(
            "tokenizer_config.json: chat_template is a list of named templates "
            f"without a 'default' one (names: {sorted(map(str, named))})"
        )
    raise ValueError(
        "tokenizer_config.json: chat_template must be a string or a list of "
        f"{{'name', 'template'}} objects, got {type(template).__name__}"
    )


def render(
    template: jinja2.Template,
    messages: list[dict[str, Any]],
    special_tokens: dict[str, Any],
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    template_kwargs: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The prompt text; jinja2.TemplateError / TypeError etc. propagate to the caller.
    `continue_final_message` (vLLM's, HF's): the text ends where the last message's content does (what
    the template writes after it, an end of turn, cut), so the model continues that message.
    `template_kwargs` (vLLM's chat_template_kwargs, e.g. Qwen3's enable_thinking): more variables,
    which win over the special-token strings, as transformers passes them (not the ones above).
    `tools`: OpenAI's function tools, as transformers passes them (frontend/openai/tools.py)."""
    text = template.render(
        messages=messages,
        tools=tools,
        documents=None,
        add_generation_prompt=add_generation_prompt and not continue_final_message,
        **{**special_tokens, **(template_kwargs or {})},
    )
    if not continue_final_message:
        return text
    final = messages[-1]["content"].strip()  # as transformers cuts (templates may strip what they write)
    if not final:
        raise ValueError("continue_final_message: the final message is empty, so there is nothing to continue")
    at = text.rfind(final)
    if at < 0:
        raise ValueError("continue_final_message: the final message does not appear in the rendered chat")
    return text[: at + len(final)]


def _content_text(content: Any, index: int) -> str:
    """Message content as a string: a str, or a list of {"type": "text", "text": ...} parts joined by
    newlines (vLLM's rule for a template that reads content as a string, as chat templates do)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise ValueError(
                    f"messages[{index}].content: only parts of the form "
                    "{'type': 'text', 'text': <string>} are supported"
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise ValueError(
        f"messages[{index}].content must be a string or a list of text parts, got {type(content).__name__}"
    )


def normalize_messages(messages: Any, system: str | None) -> list[dict[str, Any]]:
    """`messages` (with `system` as a leading system message) checked, each content made one string;
    ValueError naming the first bad message."""
    if not isinstance(messages, list):
        raise ValueError(f"messages must be a list, got {type(messages).__name__}")
    out: list[dict[str, str]] = []
    if system is not None:
        if not isinstance(system, str):
            raise ValueError(f"system must be a string, got {type(system).__name__}")
        out.append({"role": "system", "content": system})
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] is {type(m).__name__}; {_ROLES_HINT}")
        if not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}].role is missing or not a string; {_ROLES_HINT}")
        if m.get("content") is None and m.get("tool_calls"):  # an assistant turn that called tools
            out.append(dict(m))
            continue
        if m.get("content") is None and m["role"] == "assistant":
            # a turn that only thought (this server's own answer then has content null; vLLM takes it
            # back): its content is the empty text, its other keys (reasoning_content) go on as they came
            out.append({**m, "content": ""})
            continue
        if "content" not in m or m["content"] is None:
            raise ValueError(f"messages[{i}].content is missing; {_ROLES_HINT}")
        # the message's other keys (`name`, ...) go to the template as they came, as vLLM and
        # transformers pass them: the template uses them or not, nothing is dropped on the way
        out.append({**m, "content": _content_text(m["content"], i)})
    if not out:
        raise ValueError("messages must not be empty")
    return out
