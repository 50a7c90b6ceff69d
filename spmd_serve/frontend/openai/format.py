"""The shapes of OpenAI responses (CONTRACT.md §4): completion and chat objects, their streamed
chunks, usage, vLLM's token ids (return_token_ids) and the model list (logprobs: openai.logprob_format).

Pure functions of plain data, so the formats can be unit-tested without a server.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from spmd_serve.frontend.openai import reasoning, tool_parsers, tools
from spmd_serve.frontend.openai.logprob_format import LogprobFormat, TokenLogprobs
from spmd_serve.frontend.openai.protocol import OpenAIRequest


@dataclass
class ChoiceState:
    """What one choice has produced so far."""

    index: int
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    started: bool = False  # a chunk of this choice has gone out
    text_offset: int = 0  # completions logprobs: characters before the next token
    logprobs: list[tuple[int, TokenLogprobs]] = field(default_factory=list)
    cached_tokens: int = 0  # of its prompt, served from the prefix cache
    prompt_logprobs: list[Any] | None = None  # vLLM's: [None, {token id: {logprob, rank, decoded_token}}, ...]
    call_id: str = field(default_factory=tools.call_id)  # a named tool_choice: the id of the choice's call
    calls: tool_parsers.CallParser | None = None  # tool_choice "auto": the streamed answer's reader
    thinking: reasoning.ReasoningSplitter | None = None  # a reasoning model's streamed answer: its think block apart
    token_ids: list[int] = field(default_factory=list)  # vLLM's return_token_ids: the answer's ids
    stop_sequence: str = ""  # the stop string that ended the answer, if one did
    stop_reason: str | int | None = None  # vLLM's: that string, or the stop_token_ids id that ended it
    abort_message: str = ""  # finish_reason "abort": who ended it (SGLang's finish_reason message)
    ids_sent: int = 0  # ... of which streamed chunks have carried the first ones


class Formatter(LogprobFormat):
    """Builds the objects of one response (one id, one model name, one creation time)."""

    def __init__(self, req: OpenAIRequest, resp_id: str, tokenizer: Any, model: str) -> None:
        super().__init__(req, tokenizer)
        self.id, self.model = resp_id, model
        self.created = int(time.time())

    def usage(self, states: list[ChoiceState]) -> dict[str, Any]:
        """Each prompt counts once, whatever `n` (so do its cached tokens: its first choice's)."""
        prompt = sum(len(p) for p in self.req.prompts)
        completion = sum(s.num_tokens for s in states)
        cached = sum(s.cached_tokens for s in states if s.index % self.req.n == 0)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def whole(self, states: list[ChoiceState]) -> dict[str, Any]:
        """The non-streaming response."""
        choices = []
        for s in states:
            lp = self.logprobs(s.logprobs, s)
            if self.chat:
                echoed = self.req.prompt_texts[0] if self.req.echo else ""  # vLLM's chat echo: the last message
                think, answer = self._splitter().split(s.text) if self.req.reasoning else ("", s.text)
                message: dict[str, Any] = {"role": "assistant", "content": echoed + answer or (None if think else "")}
                reason, calls = s.finish_reason, self._calls(s, s.finish_reason)
                if calls is not None:  # tool_choice "required"
                    message, reason = {**message, "content": "", "tool_calls": calls}, "tool_calls"
                elif self.req.tool_function == tools.AUTO:
                    message, reason = self._auto_message(echoed + answer, reason)
                elif (
                    self.req.tool_function and self.req.tool_function != tools.REQUIRED
                ):  # vLLM's: the answer is the named function's arguments
                    message = {**message, "content": echoed, "tool_calls": [self._call(s)]}
                choices.append({"index": s.index, "message": self._thought(message, think), "logprobs": lp})
                choices[-1]["finish_reason"] = reason
            else:
                text = (self.req.prompt_texts[s.index // self.req.n] if self.req.echo else "") + s.text
                choices.append({"index": s.index, "text": text, "logprobs": lp, "finish_reason": s.finish_reason})
                if self.req.prompt_logprobs is not None:  # vLLM's: per choice in completions
                    choices[-1]["prompt_logprobs"] = s.prompt_logprobs
            choices[-1]["stop_reason"] = s.stop_reason
            self._token_ids(choices[-1], choices[-1], s, not self.chat)  # (chat's prompt ids: beside, below)
        body = self._envelope("chat.completion" if self.chat else "text_completion", choices)
        if self.chat and self.req.prompt_logprobs is not None:  # vLLM's: once for chat's one prompt
            body["prompt_logprobs"] = states[0].prompt_logprobs
        if self.chat and self.req.token_ids:
            body["prompt_token_ids"] = self.req.prompts[0]
        body["usage"] = self.usage(states)
        return body

    def chunk(
        self,
        states: list[ChoiceState],
        i: int,
        text: str,
        entries: list[tuple[int, TokenLogprobs]],
        finish_reason: str | None,
    ) -> dict[str, Any] | None:
        """One streamed chunk of choice i (its first carries the role / the echoed prompt); its
        usage: null, or with continuous_usage_stats the request's so far (every choice, as at the end).
        None: nothing to send yet (text that may begin a tool call, held back)."""
        state = states[i]
        first, state.started = not state.started, True
        lp = self.logprobs(entries, state)
        think = ""
        if self.req.reasoning:  # (the answer's own text: an echoed message is content)
            state.thinking = state.thinking or self._splitter()
            think, text = state.thinking.feed(text)
            if finish_reason is not None:
                think, text = (a + b for a, b in zip((think, text), state.thinking.finish()))
        if first and self.req.echo:  # the echoed prompt (completions) or last message (chat) first
            text = self.req.prompt_texts[state.index // self.req.n if not self.chat else 0] + text
        if self.chat:
            delta, finish_reason = self._chat_delta(state, text, first, finish_reason)
            delta = self._thought(delta, think)
            if (self.req.tool_function == tools.AUTO or self.req.reasoning) and not (delta or finish_reason or lp):
                return None  # (text that may begin a call or a think block's tag, held back)
            choice = {"index": state.index, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}
        else:
            choice = {"index": state.index, "text": text, "logprobs": lp, "finish_reason": finish_reason}
        if finish_reason is not None:  # (vLLM's: in the last chunk, as in the whole answer)
            choice["stop_reason"] = state.stop_reason
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice])
        self._token_ids(body, choice, state, first)
        if self.req.include_usage:
            body["usage"] = self.usage(states) if self.req.continuous_usage else None
        return body

    def _token_ids(self, body: dict[str, Any], choice: dict[str, Any], state: ChoiceState, first: bool) -> None:
        """vLLM's return_token_ids: the choice's answer ids not yet sent, and with its first (or whole)
        answer its prompt's ids: in the choice for completions, beside the choices for chat."""
        if not self.req.token_ids:
            return
        choice["token_ids"], state.ids_sent = state.token_ids[state.ids_sent :], len(state.token_ids)
        if first:
            (body if self.chat else choice)["prompt_token_ids"] = self.req.prompts[state.index // self.req.n]

    def _call(self, s: ChoiceState) -> dict[str, Any]:
        return tools.tool_call(self.req.tool_function, s.text, s.call_id)

    def _chat_delta(
        self, state: ChoiceState, text: str, first: bool, finish_reason: str | None
    ) -> tuple[dict[str, Any], str | None]:
        """A chat chunk's delta (and finish reason): text, a named tool call's arguments so far, or
        tool_choice "required"'s calls, whole in the last chunk."""
        role = {"role": "assistant"} if first else {}
        if self.req.tool_function == tools.REQUIRED:
            calls = self._calls(state, finish_reason)
            if calls is not None:
                return {**role, "tool_calls": [{"index": j, **c} for j, c in enumerate(calls)]}, "tool_calls"
            # (cut short: no whole list of calls, its text the content)
            return ({**role, "content": state.text} if finish_reason is not None else role), finish_reason
        if self.req.tool_function == tools.AUTO:
            return self._auto_delta(state, text, role, finish_reason)
        if self.req.tool_function and (text or first):
            call = tools.tool_call_delta(self.req.tool_function, text, state.call_id, first)
            return {**role, "tool_calls": [call]}, finish_reason
        sends = text or not self.req.reasoning and (first or finish_reason is None)  # (thinking: content once there is)
        return ({**role, "content": text} if sends else role), finish_reason

    def _splitter(self) -> reasoning.ReasoningSplitter:
        return reasoning.ReasoningSplitter(self.req.thinking_open)

    def _thought(self, message: dict[str, Any], think: str) -> dict[str, Any]:
        """A message or delta with its thinking, under vLLM's name and DeepSeek's (none where dropped)."""
        if not think or self.req.reasoning != reasoning.SPLIT:
            return message
        return {**message, "reasoning": think, "reasoning_content": think}

    def _calls(self, s: ChoiceState, reason: str | None) -> list[dict[str, Any]] | None:
        """tool_choice "required": a finished answer's tool calls (None: not that, or cut short by
        max_tokens, which leaves no whole list of calls: its text stays the content)."""
        if self.req.tool_function != tools.REQUIRED or reason != "stop":
            return None
        calls = tools.calls_of(s.text)
        return None if calls is None else [tools.tool_call(name, args, tools.call_id()) for name, args in calls]

    def _reader(self) -> tool_parsers.CallParser:
        return tool_parsers.CallParser(self.req.tool_format, self.req.tool_names, self.req.max_calls)

    def _auto_message(self, text: str, reason: str | None) -> tuple[dict[str, Any], str | None]:
        """tool_choice "auto": the answer's message (the calls read out of its text, the rest its
        content: null where nothing else) and finish reason ("tool_calls" where it stopped on calls)."""
        reader = self._reader()
        (content, calls), (more, later) = reader.feed(text), reader.finish()
        calls += later
        message: dict[str, Any] = {"role": "assistant", "content": content + more or (None if calls else "")}
        if not calls:
            return message, reason
        message["tool_calls"] = [tools.tool_call(name, args, tools.call_id()) for name, args in calls]
        return message, "tool_calls" if reason == "stop" else reason

    def _auto_delta(
        self, state: ChoiceState, text: str, role: dict[str, str], finish_reason: str | None
    ) -> tuple[dict[str, Any], str | None]:
        """... streamed: the text that cannot begin a call, and each call once it is closed."""
        state.calls = state.calls or self._reader()
        content, calls = state.calls.feed(text)
        if finish_reason is not None:
            more, later = state.calls.finish()
            content, calls = content + more, calls + later
        delta: dict[str, Any] = {**role, "content": content} if content or (role and not calls) else {}
        if calls:
            delta["tool_calls"] = [
                {"index": state.calls.count - len(calls) + j, **tools.tool_call(name, args, tools.call_id())}
                for j, (name, args) in enumerate(calls)
            ]  # (the reader's count: every call it has read, these last)
        return delta, "tool_calls" if finish_reason == "stop" and state.calls.count else finish_reason

    def usage_chunk(self, states: list[ChoiceState]) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = self.usage(states)
        return body


Pieces = tuple[str, str, list[dict[str, Any]]]  # (thinking, text, tool-call deltas) of a chat answer


def whole_pieces(fmt: Formatter, states: list[ChoiceState]) -> tuple[Pieces, str | None, list[Any]]:
    """A whole chat answer's (choice 0's) pieces, finish reason and logprobs entries (chat's, one per
    token): what the Responses and Messages APIs build their answers from (each call a delta with its index)."""
    choice = fmt.whole(states)["choices"][0]
    message = choice["message"]
    calls = [{"index": j, **c} for j, c in enumerate(message.get("tool_calls") or [])]
    pieces = (message.get("reasoning") or "", message.get("content") or "", calls)
    return pieces, choice["finish_reason"], (choice["logprobs"] or {}).get("content") or []


def chunk_pieces(chunk: dict[str, Any]) -> tuple[Pieces, str | None, list[Any]]:
    """... of one streamed chat chunk."""
    choice = chunk["choices"][0]
    delta = choice["delta"]
    pieces = (delta.get("reasoning") or "", delta.get("content") or "", delta.get("tool_calls") or [])
    return pieces, choice["finish_reason"], (choice.get("logprobs") or {}).get("content") or []


def model_list(names: tuple[str, ...], max_model_len: int) -> dict[str, Any]:
    created = int(time.time())
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "spmd_serve",
                "root": names[0],
                "max_model_len": max_model_len,
            }
            for name in names
        ],
    }
