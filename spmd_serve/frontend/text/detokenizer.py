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

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"
PROMPT_CONTEXT = 5  # prompt ids decoded ahead of the output when continuing a prompt (vLLM's)


class _Decoder(Protocol):
    """What the detokenizer needs from a tokenizer (ServingTokenizer satisfies it)."""

    special_token_ids: frozenset[int]

    def decode(
        self, ids: list[int], skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True
    ) -> str: ...

    def special_text(self, token_id: int) -> str: ...


def join_with_specials(
    decode: Callable[[list[int]], str],
    ids: Iterable[int],
    special: frozenset[int],
    text_of: Callable[[int], str],
    sep: str,
) -> str:
    """vLLM's text for skip_special_tokens=false (its slow tokenizers' rule, which PaddleNLP's decode
    follows too): the ids cut at each special one, each run of others decoded alone, each special
    one as its own string, all joined by `sep` (" " with spaces_between_special_tokens, else "")."""
    pieces: list[str] = []
    run: list[int] = []
    for tid in ids:
        if tid in special:
            if run:
                pieces.append(decode(run))
                run = []
            pieces.append(text_of(tid))
        else:
            run.append(tid)
    if run:
        pieces.append(decode(run))
    return sep.join(pieces)


class IncrementalDetokenizer:
    """Turns a growing list of generated token ids into text deltas (one instance per request).

    `prompt_ids` is kept for callers that want it, but the text is deliberately the decode of the
    *output* ids alone, matching what a non-streaming response returns (`decode(output_ids)`, so
    the first output token's SentencePiece space is dropped exactly as decode drops it).

    Special tokens (the tokenizer's, and the model's eos ids) are dropped, or with
    `skip_special_tokens` false written as `join_with_specials` writes them: each special token
    ends the current run of ids (its held-back text is flushed, as a decode of the run alone
    would end there) and the next run starts afresh.
    """

    def __init__(
        self,
        tokenizer: _Decoder,
        prompt_ids: Sequence[int] = (),
        continue_prompt: bool = False,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._special = tokenizer.special_token_ids
        self._show_special = not skip_special_tokens
        self._spaces = spaces_between_special_tokens
        # between two pieces (runs and special tokens written); only special tokens make a second one
        self._sep = " " if spaces_between_special_tokens and self._show_special else ""
        self._pieces = 0
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
        while seed and self._decode(seed).endswith(REPLACEMENT_CHAR):
            seed.pop()
        self._seed_text = self._decode(seed) if seed else ""
        self._ids: list[int] = list(seed)  # the current run's ids (specials removed), seed first
        self._run_len = 0  # output ids in the current run
        self._run_start = 0  # characters emitted before the current run's text
        self._prefix_offset = 0  # window start: first id of the last emitted delta
        self._read_offset = len(seed)  # ids before this have been emitted as text
        self._chunks: list[str] = []
        self._length = 0  # characters emitted
        self._text_cache: str | None = ""

    @property
    def text(self) -> str:
        """Everything emitted so far (deltas of step() and flush(), concatenated)."""
        if self._text_cache is None:
            self._text_cache = "".join(self._chunks)
        return self._text_cache

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, True, self._spaces)  # one run: no special token in it

    def _emit(self, delta: str) -> str:
        if delta:
            self._chunks.append(delta)
            self._length += len(delta)
            self._text_cache = None
        return delta

    def _window_delta(self) -> tuple[str, str]:
        """(already-emitted text of the window, full text of the window)."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        return prefix_text, new_text

    def step(self, new_ids: Iterable[int]) -> str:
        """Add this step's generated ids; return the text they complete ('' if held back)."""
        out = ""
        pending = False  # ids added to the run since its text was last looked at
        for tid in new_ids:
            tid = int(tid)
            self.output_ids.append(tid)
            if tid not in self._special:
                if self._run_len == 0:  # a run starts: a piece of its own
                    out += self._piece("")
                    self._run_start = self._length
                self._ids.append(tid)
                self._run_len += 1
                pending = True
            elif self._show_special:  # the run ends here, as join_with_specials cuts it
                out += self._end_run() + self._piece(self._tokenizer.special_text(tid))
                pending = False
            # else: decode() skips special tokens, so dropping them here keeps the windows identical
            # to slices of what decode(all output ids) sees.
        return out + self._run_delta() if pending else out

    def _piece(self, text: str) -> str:
        """Start a piece (a run, or a special token's `text`): the separator after an earlier one."""
        self._pieces += 1
        return self._emit((self._sep if self._pieces > 1 else "") + text)

    def _run_delta(self) -> str:
        """The text the run's newest ids complete ('' if held back)."""
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

    def _end_run(self) -> str:
        """Whatever the run still holds back (may contain U+FFFD when the model really ended
        inside a character); the next id starts a new run."""
        prefix_text, new_text = self._window_delta()
        out = ""
        if len(new_text) > len(prefix_text):
            if new_text.startswith(prefix_text):
                out = self._emit(new_text[len(prefix_text) :])
            else:  # a non-prefix-stable tokenizer: emit what makes the run's text right
                full = self._decode(self._ids)
                emitted = self._seed_text + self.text[self._run_start :]
                out = self._emit(full[len(emitted) :] if full.startswith(emitted) else "")
        self._ids, self._run_len, self._seed_text = [], 0, ""
        self._prefix_offset = self._read_offset = 0
        return out

    def flush(self) -> str:
        """At the end of the request: return whatever is still held back (may contain U+FFFD
        when the model really ended inside a character)."""
        return self._end_run()
