"""Incremental output text of one sequence: token ids -> text deltas, cut at stop strings.

Used by every protocol through `frontend.common.generation.Generation`.  Stop strings are checked
on the detokenised text (CONTRACT.md §3: per request, never shared across the batch) and the stop
text is trimmed, unless the request keeps it (OpenAI's include_stop_str_in_output).  A request
that ended on one of its `hidden_stop_ids` (OpenAI's stop_token_ids; with skip_special_tokens false,
the eos ids too) leaves that token's text out in the same way (vLLM's rule); the ids themselves are
all reported.  Stop strings are looked for
only from the token after the first `min_tokens` on (vLLM's rule for OpenAI's min_tokens, as the
engine masks EOS and stop ids until then; 0 for the native API, whose min_dec_len holds off EOS only).
"""

from __future__ import annotations

from typing import Any


class OutputAssembler:
    """Turns engine token ids into text deltas, cutting at this request's stop strings.

    While streaming, the last len(longest stop) - 1 characters are held back: they could still
    become the start of a stop string, and text once sent cannot be taken back.
    """

    def __init__(
        self,
        detokenizer: Any,
        stop_sequences: tuple[str, ...],
        include_stop: bool = False,
        hidden_stop_ids: frozenset[int] = frozenset(),
        min_tokens: int = 0,
    ) -> None:
        self._detok = detokenizer
        self._min_tokens = min_tokens
        self._stops = stop_sequences
        self._include_stop = include_stop
        self._hidden = hidden_stop_ids
        self._hold = max((len(s) for s in stop_sequences), default=1) - 1
        self.text = ""
        self.ids: list[int] = []
        self.sent = 0  # characters of self.text already handed out
        self.stopped = False  # a stop string was found (text is cut before it)
        self.stop = ""  # ... this one

    def add(self, new_ids: list[int], finished: bool, stopped: bool = True) -> str:
        """Feed one engine output; return the text that may be sent now.  `stopped`: when finished,
        the engine stopped on the last token (finish_reason "stop"), not at a length limit."""
        if self.stopped:  # the text is final once cut at a stop string
            return ""
        if len(new_ids) > 1:  # a speculative step's tokens: one at a time, so that the ids end at
            delta = ""  # the token that completed a stop string, as they would without speculation
            for i, token in enumerate(new_ids):
                delta += self.add([token], finished and i == len(new_ids) - 1, stopped)
                if self.stopped:
                    break
            return delta
        self.ids.extend(new_ids)
        checked = len(self.text)
        if finished and stopped and new_ids and new_ids[-1] in self._hidden:  # the stop token ended it
            new_ids = new_ids[:-1]
        self.text += self._detok.step(new_ids)
        if finished:
            self.text += self._detok.flush()
        if self._stops and len(self.ids) > self._min_tokens:
            # A stop string starting before checked - hold would already have been found (or lies
            # wholly in the first min_tokens tokens' text).
            start = max(0, checked - self._hold)
            hits = [(i, -len(s), s) for i, s in ((self.text.find(s, start), s) for s in self._stops) if i >= 0]
            if hits:
                at, minus_len, self.stop = min(hits)  # the first stop string, the longest of those there
                self.text = self.text[: at - minus_len if self._include_stop else at]
                self.stopped = True
        end = len(self.text)
        if not (finished or self.stopped):
            end = max(self.sent, end - self._hold)
        delta, self.sent = self.text[self.sent : end], end
        return delta
