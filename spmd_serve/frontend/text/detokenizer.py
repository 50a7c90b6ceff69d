"""Incremental (streaming) detokenization: token ids in, text deltas out.

This module owns `IncrementalDetokenizer`, which the front end feeds with each step's new token
ids and which returns only the newly finished text.  Its contract:

* the concatenation of every `step()` delta plus `flush()` equals `decode(all output ids)`
  (special tokens skipped), i.e. a streamed answer is byte-identical to a non-streamed one;
* no delta ends in a partial UTF-8 character: byte-fallback pieces of one character arrive as
  several tokens, and while the decoded tail is U+FFFD the text is held back;
* work per token is O(1) in the sequence length.

The O(1) part uses vLLM's prefix/read offsets: only the window `ids[prefix_offset:]` is decoded,
where `ids[prefix_offset:read_offset]` were already emitted.  Decoding that already-emitted
"prefix" again, and diffing against it, rather than decoding the new ids alone, is what keeps
SentencePiece's space handling right: a piece like "▁world" decodes to "world" at the start of a
decode call but to " world" after other text, and inside the window it is never first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"
PROMPT_CONTEXT = 5  # prompt ids decoded ahead of the output when continuing a prompt (vLLM's)


class _Decoder(Protocol):
    """What the detokenizer needs from a tokenizer (ServingTokenizer satisfies it)."""

    special_token_ids: frozenset[int]

    def decode(self, ids: list[int]) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing list of generated token ids into text deltas (one instance per request).

    `prompt_ids` is kept for callers that want it, but the text is deliberately the decode of the
    *output* ids alone, matching what a non-streaming response returns (`decode(output_ids)`, so
    the first output token's SentencePiece space is dropped exactly as decode drops it).
    """

    def __init__(self, tokenizer: _Decoder, prompt_ids: Sequence[int] = (), continue_prompt: bool = False) -> None:
        self._tokenizer = tokenizer
        self._special = tokenizer.special_token_ids
        self.prompt_ids: list[int] = list(prompt_ids)
        self.output_ids: list[int] = []  # every id passed to step(), special ones included
        # continue_prompt: the text continues the prompt's (OpenAI completions, where "Hello" +
        # "▁world" must read " world"), so the window starts with the prompt's last few ids,
        # already "emitted"; otherwise the text is decode(output ids) alone.
        seed = [i for i in prompt_ids if i not in self._special][-PROMPT_CONTEXT:] if continue_prompt else []
        # A prompt that ends inside a character (its last byte-fallback pieces) would let the
        # output's first bytes rewrite the seed's text: the window would never start with the text
        # already emitted, and every delta (the whole answer) would be held back.  So the seed stops
        # before them; the output's bytes then decode on their own, as decode(output ids) does.
        while seed and tokenizer.decode(seed).endswith(REPLACEMENT_CHAR):
            seed.pop()
        self._seed_text = tokenizer.decode(seed) if seed else ""
        self._ids: list[int] = list(seed)  # ids that produce text (specials removed)
        self._prefix_offset = 0  # window start: first id of the last emitted delta
        self._read_offset = len(seed)  # ids before this have been emitted as text
        self._chunks: list[str] = []
        self._text_cache: str | None = ""

    @property
    def text(self) -> str:
        """Everything emitted so far (deltas of step() and flush(), concatenated)."""
        if self._text_cache is None:
            self._text_cache = "".join(self._chunks)
        return self._text_cache

    def _emit(self, delta: str) -> str:
        if delta:
            self._chunks.append(delta)
            self._text_cache = None
        return delta

    def _window_delta(self) -> tuple[str, str]:
        """(already-emitted text of the window, full text of the window)."""
        prefix_text = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tokenizer.decode(self._ids[self._prefix_offset :])
        return prefix_text, new_text

    def step(self, new_ids: Iterable[int]) -> str:
        """Add this step's generated ids; return the text they complete ('' if held back)."""
        added = False
        for tid in new_ids:
            tid = int(tid)
            self.output_ids.append(tid)
            # decode() skips special tokens, so dropping them here keeps the windows identical
            # to slices of what decode(all output ids) sees.
            if tid not in self._special:
                self._ids.append(tid)
                added = True
        if not added:
            return ""
        prefix_text, new_text = self._window_delta()
        # Hold back while the tail is U+FFFD: it is most likely the first bytes of a character
        # whose remaining byte-fallback pieces have not been generated yet.
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""
        if not new_text.startswith(prefix_text):
            # Never seen with SentencePiece (its decode is left-to-right), but if a tokenizer
            # rewrote earlier text we would rather hold back than emit a wrong delta.
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return self._emit(new_text[len(prefix_text) :])

    def flush(self) -> str:
        """At the end of the request: return whatever is still held back (may contain U+FFFD
        when the model really ended inside a character)."""
        prefix_text, new_text = self._window_delta()
        self._prefix_offset = self._read_offset = len(self._ids)
        if len(new_text) <= len(prefix_text):
            return ""
        if new_text.startswith(prefix_text):
            return self._emit(new_text[len(prefix_text) :])
        # Fallback for a non-prefix-stable tokenizer: emit what makes the total text right.
        full = self._tokenizer.decode(self._ids)
        emitted = self._seed_text + self.text
        return self._emit(full[len(emitted) :] if full.startswith(emitted) else "")
