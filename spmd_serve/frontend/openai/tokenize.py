"""vLLM's `POST /tokenize` and `POST /detokenize` on the service port: what a client uses to count a
prompt's tokens against the context (`max_model_len`) or to read ids back, with the served model's
own tokenizer and chat template.

/tokenize takes `prompt` (a string; the tokenizer's own special tokens unless `add_special_tokens`
is false) or chat `messages` (rendered as /v1/chat/completions renders them, with
`add_generation_prompt` / `continue_final_message` / `chat_template_kwargs`), and answers {"count", "max_model_len",
"tokens", "token_strs"} (the vocabulary's pieces with `return_token_strs`, else null).  /detokenize
takes {"tokens": [...]} and answers {"prompt": text}, special tokens written, as vLLM's (HF's
decode) does.  `model`, when given, must name the served model.  As everywhere, an unknown field is
refused by name; errors carry OpenAI's body; the API key applies.
"""

from __future__ import annotations

from typing import Any

from spmd_serve.frontend.common.http_base import AUTH_HINT, JsonBodyHandler, bearer_ok
from spmd_serve.frontend.common.parsing import ProtocolError, is_int, show
from spmd_serve.frontend.openai import prompts
from spmd_serve.frontend.openai.body import OpenAIError, get
from spmd_serve.frontend.openai.fields import FieldError, check_known
from spmd_serve.frontend.openai.handlers import OpenAIServing, send_openai_error
from spmd_serve.frontend.openai.protocol import check_model

_FIELDS = {
    "tokenize": frozenset({
        "model", "prompt", "messages", "add_special_tokens", "add_generation_prompt", "continue_final_message",
        "return_token_strs", "chat_template_kwargs",
    }),
    "detokenize": frozenset({"model", "tokens"}),
}  # fmt: skip


def _check(body: dict[str, Any], what: str, model_names: tuple[str, ...]) -> None:
    try:
        check_known(body, _FIELDS[what])
    except FieldError as e:
        raise OpenAIError(400, e.msg, e.param) from None
    model = body.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise OpenAIError(400, "model must be a string", "model")
        check_model(model, model_names)


def tokenize(body: dict[str, Any], tokenizer: Any, model_names: tuple[str, ...], max_model_len: int) -> dict[str, Any]:
    """The /tokenize answer for `body`; OpenAIError naming the field it refuses."""
    _check(body, "tokenize", model_names)
    if (body.get("prompt") is None) == (body.get("messages") is None):
        raise OpenAIError(400, "exactly one of prompt and messages must be given", "prompt")
    if body.get("prompt") is not None:
        text = get(body, "prompt", "str", None)
        ids = tokenizer.encode(text, add_special_tokens=get(body, "add_special_tokens", "bool", True))
    else:
        if get(body, "add_special_tokens", "bool", False):  # the chat template writes them
            raise OpenAIError(400, "add_special_tokens=true is not supported with messages", "add_special_tokens")
        ids = prompts.chat_prompt(body, tokenizer)[0][0]
    pieces = tokenizer.pieces(ids) if get(body, "return_token_strs", "bool", False) else None
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": pieces}


def detokenize(body: dict[str, Any], tokenizer: Any, model_names: tuple[str, ...]) -> dict[str, Any]:
    """The /detokenize answer for `body`; OpenAIError naming the field it refuses."""
    _check(body, "detokenize", model_names)
    ids = body.get("tokens")
    vocab = tokenizer.vocab_size
    if not isinstance(ids, list) or not all(is_int(t) and 0 <= t < vocab for t in ids):
        raise OpenAIError(400, f"tokens must be a list of token ids below {vocab}, got {show(ids)}", "tokens")
    return {"prompt": tokenizer.decode(ids, skip_special_tokens=False)}


class TokenizeHandler(JsonBodyHandler):
    """POST /tokenize and POST /detokenize."""

    def initialize(self, serving: OpenAIServing, what: str, max_body_size: int) -> None:  # type: ignore[override]
        super().initialize(max_body_size, serving.api_key)
        self.serving, self.what = serving, what

    def send_error_body(self, status: int, msg: str) -> None:
        send_openai_error(self, status, msg)

    def post(self) -> None:
        if not bearer_ok(self.request.headers.get("Authorization"), self.serving.api_key):
            return send_openai_error(self, 401, AUTH_HINT)
        s = self.serving
        try:
            body = self.read_json()
            if self.what == "tokenize":
                answer = tokenize(body, s.tokenizer, s.model_names, s.limits.model_max_len)
            else:
                answer = detokenize(body, s.tokenizer, s.model_names)
        except ProtocolError as e:
            return send_openai_error(self, e.status, e.msg, getattr(e, "param", None))
        except ValueError as e:  # the tokenizer's own refusal of a text
            return send_openai_error(self, 400, str(e).splitlines()[0])
        self.write(answer)


def tokenize_routes(serving: OpenAIServing, max_body_size: int) -> list[tuple]:
    kw = {"serving": serving, "max_body_size": max_body_size}
    return [(rf"/{what}", TokenizeHandler, {**kw, "what": what}) for what in ("tokenize", "detokenize")]
