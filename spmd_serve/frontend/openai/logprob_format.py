"""The logprobs of OpenAI responses, in both forms: the legacy completions one (tokens, token_logprobs,
top_logprobs, text_offset; echo's prompt entries first) and the chat one (content: token, logprob, bytes,
top_logprobs), with vLLM's return_tokens_as_token_ids and prompt_logprobs.  openai.format's Formatter
builds on it.
"""

from __future__ import annotations

from typing import Any, Protocol

from spmd_serve.frontend.openai.protocol import OpenAIRequest

# (chosen logprob, [(token id, logprob)] top n), as the engine reports per token; None for a prompt's
# first token (echo: nothing predicts it)
TokenLogprobs = tuple[float, list[tuple[int, float]]] | None


class Choice(Protocol):
    """What these read and write of a choice's state (openai.format.ChoiceState)."""

    index: int
    text_offset: int
    prompt_logprobs: list[Any] | None


class LogprobFormat:
    """The logprobs members of one response's choices."""

    def __init__(self, req: OpenAIRequest, tokenizer: Any) -> None:
        self.req, self.tok = req, tokenizer
        self.chat = req.kind == "chat"

    def _token(self, token_id: int) -> tuple[str, list[int]]:
        """A token's text and bytes in logprobs: its own, or "token_id:<id>" (vLLM's
        return_tokens_as_token_ids: every token named apart, bytes of no character included)."""
        if self.req.tokens_as_ids:
            name = f"token_id:{token_id}"
            return name, list(name.encode())
        raw = self.tok.token_bytes(token_id)
        return raw.decode("utf-8", errors="replace"), list(raw)

    def logprobs(self, entries: list[tuple[int, TokenLogprobs]], state: Choice) -> Any:
        """The `logprobs` member for these tokens, or None when the request did not ask."""
        if self.req.logprobs is None:
            return None
        if self.chat:
            content = []
            for tid, entry in entries:
                assert entry is not None, "chat has no echo, so no prompt entries"
                lp, top = entry
                text, raw = self._token(tid)
                content.append(
                    {
                        "token": text,
                        "logprob": lp,
                        "bytes": raw,
                        "top_logprobs": [
                            {"token": t, "logprob": v, "bytes": b} for t, b, v in ((*self._token(i), v) for i, v in top)
                        ],
                    }
                )
            return {"content": content}
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for tid, entry in entries:
            text, _ = self._token(tid)
            out["tokens"].append(text)
            out["token_logprobs"].append(None if entry is None else entry[0])
            out["top_logprobs"].append(None if entry is None else {self._token(i)[0]: v for i, v in entry[1]})
            out["text_offset"].append(state.text_offset)
            state.text_offset += len(text)
        return out

    def prompt_entries(self, state: Choice, scored: list[Any] | None) -> list[tuple[int, TokenLogprobs]]:
        """Echo with logprobs: the prompt's tokens as logprobs entries (its first unscored), from the
        engine's entries of the others (the first output's); none for any other output."""
        if scored is None or not self.req.echo or self.chat:
            return []
        prompt, k = self.req.prompts[state.index // self.req.n], self.req.logprobs or 0
        return [(prompt[0], None), *((tid, (lp, top[:k])) for tid, (lp, top, _) in zip(prompt[1:], scored))]

    def prompt_logprobs(self, state: Choice, scored: list[Any] | None) -> None:
        """vLLM's prompt_logprobs of the choice, from the engine's entries (the first output's): None
        for the first token, then per token its own entry first (its rank counts the tokens the model
        put at least as high) and the position's top k after it, keyed by token id."""
        k = self.req.prompt_logprobs
        if scored is None or k is None:
            return
        out: list[Any] = [None]
        for tid, (lp, top, rank) in zip(self.req.prompts[state.index // self.req.n][1:], scored):
            entry = {str(tid): self._scored(tid, lp, rank)}
            entry.update({str(i): self._scored(i, v, r) for r, (i, v) in enumerate(top[:k], 1) if i != tid})
            out.append(entry)
        state.prompt_logprobs = out

    def _scored(self, token_id: int, logprob: float, rank: int) -> dict[str, Any]:
        return {"logprob": logprob, "rank": rank, "decoded_token": self._token(token_id)[0]}
