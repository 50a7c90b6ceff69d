"""A character-level fake tokenizer with the interface of spmd_serve/frontend/text/tokenizer.py:
one id per character (OFFSET above its code point), ids below OFFSET special and written as nothing;
and its detokenizer, which can be told to fail on some ids (`poison`).
"""

from __future__ import annotations

from spmd_serve.frontend.text.chat_template import normalize_messages

BOS, EOS, OFFSET = 1, 2, 3  # ids below OFFSET are special and decode to ""


class FakeDetokenizer:
    def __init__(self, tok: FakeTokenizer) -> None:
        self._tok = tok
        self.text = ""

    def step(self, new_ids: list[int]) -> str:
        if self._tok.poison & set(new_ids):  # a request whose detokenisation fails
            raise ValueError("undecodable fake token")
        delta = self._tok.decode(new_ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        return ""


class FakeTokenizer:
    eos_token_ids = [EOS]
    bos_token_id = BOS
    has_chat_template = True
    chat_template_source: str | None = None  # (its template shows no tools: tool_choice "auto" refused)
    vocab_size = 0x110000 + OFFSET
    special_token_ids = frozenset({BOS, EOS})
    poison: frozenset[int] = frozenset()  # ids the detokenizer fails on

    def token_bytes(self, token_id: int) -> bytes:
        return self.decode([token_id]).encode("utf-8", "surrogatepass")  # (a lone surrogate's bytes too)

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.decode([i]) for i in ids]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        # a tokenizer whose settings add BOS (tokenizer_config's add_bos_token: true)
        return [BOS] * add_special_tokens + [ord(c) + OFFSET for c in text]

    def decode(
        self, ids: list[int], skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True
    ) -> str:
        return "".join(chr(i - OFFSET) for i in ids if i >= OFFSET)

    def render_chat(
        self,
        messages: list[dict],
        system: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict | None = None,  # (no variables in this template)
        tools: list | None = None,  # (a line naming them, as a template that shows tools would)
    ) -> str:
        turns = ([{"role": "system", "content": system}] if system else []) + list(messages)
        shown = f"<tools>{' '.join(t['function']['name'] for t in tools)}\n" if tools else ""
        text = shown + "".join(f"<{m['role']}>{m['content'] or ''}\n" for m in turns)
        if continue_final_message:  # (the real one: frontend/text/chat_template.render)
            return text[:-1]
        return text + ("<assistant>" if add_generation_prompt else "")

    def encode_prompt(
        self, *, text: str | None = None, messages: list[dict] | None = None, system: str | None = None, **chat
    ) -> list[int]:
        if text is not None:
            messages = [{"role": "user", "content": text}]
        # ValueError for every malformed message, as the real ServingTokenizer raises (its own checks)
        messages = normalize_messages(messages, None)
        if any(m["role"] not in ("user", "assistant", "system") for m in messages):
            raise ValueError("messages: role must be user, assistant or system")
        return [BOS] + self.encode(self.render_chat(messages, system, **chat))

    def detokenizer(self, prompt_ids: list[int], *continue_skip_spaces: bool) -> FakeDetokenizer:
        return FakeDetokenizer(self)


def parsed(body: dict, kind: str = "completion"):
    """An OpenAI request body (model "m", prompt or one user message "hi", plus `body`) parsed with
    this tokenizer: the OpenAIRequest, or the OpenAIError it is refused with."""
    from spmd_serve.frontend.common.parsing import Limits
    from spmd_serve.frontend.openai.protocol import parse_openai

    prompt = {"prompt": "hi"} if kind == "completion" else {"messages": [{"role": "user", "content": "hi"}]}
    return parse_openai(kind, {"model": "m", **prompt, **body}, FakeTokenizer(), Limits(100, 50, 120), ("m",))
