"""tool_choice "auto": the model's tool calls read out of its free text, whole or as it streams, in
the format its chat template teaches (openai.tool_formats).

A block of calls counts only when all of it is calls of the request's tools (with
parallel_tool_calls false, only while no call has been read before it, and of one call); anything
else the model wrote stays text in `content`, so nothing is lost.  Whitespace alone around calls is
dropped (vLLM drops all text after the first call).  Streamed, text goes out as soon as it cannot be
the start of a block, and a block's calls go out once it is closed, so the streamed content and
calls equal the whole answer's.
"""

from __future__ import annotations

from spmd_serve.frontend.openai.tool_formats import JSON, TAGS, Call, json_calls


def held_prefix(text: str, tag: str) -> int:
    """How many of text's last characters could be the start of `tag` (held back while streaming)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class CallParser:
    """One choice's answer read as it comes: feed() each new piece of text, finish() at its end;
    each returns the content to send now and the calls closed since."""

    def __init__(self, fmt: str, names: frozenset[str], max_calls: int | None = None) -> None:
        self.fmt, self.names, self.max_calls = fmt, names, max_calls  # (beyond max_calls, calls are text)
        self.count = 0  # calls read
        self.pending = ""  # text not yet sent: a possible tag's start, a block being written
        self.inside = False  # tags: within a block; json: the answer is calls
        self.held = ""  # tags: spaces alone since the last block of calls (or the start), not yet sent
        self.in_text = False  # tags: text other than spaces has been sent since the last block of calls
        self.decided = False  # json: the answer's first character read (calls, or text)

    def feed(self, text: str) -> tuple[str, list[Call]]:
        self.pending += text
        return self._json(False) if self.fmt == JSON else self._tagged(False)

    def finish(self) -> tuple[str, list[Call]]:
        return self._json(True) if self.fmt == JSON else self._tagged(True)

    def _room(self, calls: list[Call] | None) -> list[Call] | None:
        """The calls, or None where they would go beyond max_calls."""
        if calls is None or (self.max_calls is not None and self.count + len(calls) > self.max_calls):
            return None
        self.count += len(calls)
        return calls

    def _json(self, end: bool) -> tuple[str, list[Call]]:
        if not self.decided:
            stripped = self.pending.lstrip()
            if not stripped and not end:
                return "", []
            self.decided, self.inside = True, stripped[:1] in ("{", "[")
        if not self.inside:
            out, self.pending = self.pending, ""
            return out, []
        if not end:
            return "", []
        calls = self._room(json_calls(self.pending, self.names))
        out, self.pending = ("", "") if calls else (self.pending, "")
        return out, calls or []

    def _tagged(self, end: bool) -> tuple[str, list[Call]]:
        tags = TAGS[self.fmt]
        out: list[str] = []
        calls: list[Call] = []
        while True:
            if self.inside:  # a block being written: read once closed (or at the answer's end)
                close = self.pending.find(tags.close)
                if close < 0 and not end:
                    break
                block = self.pending if close < 0 else self.pending[: close + len(tags.close)]
                self.pending, self.inside = self.pending[len(block) :], False
                read = self._room(tags.read(block.removesuffix(tags.close), self.names))
                if read is None:  # not calls of the tools (or one too many): the text it was
                    self._add(tags.open + block, out)
                else:
                    calls += read
                    self.held, self.in_text = "", False
                continue
            start = self.pending.find(tags.open)
            if start >= 0:
                self._add(self.pending[:start], out)
                self.pending, self.inside = self.pending[start + len(tags.open) :], True
                continue
            keep = 0 if end else held_prefix(self.pending, tags.open)
            self._add(self.pending[: len(self.pending) - keep], out)
            self.pending = self.pending[len(self.pending) - keep :]
            if end and self.held:  # spaces alone at the end: dropped after a call, else the answer's
                out.append("" if self.count else self.held)
                self.held = ""
            break
        return "".join(out), calls

    def _add(self, text: str, out: list[str]) -> None:
        """Text outside blocks: sent, but spaces alone (so far) between blocks or before the first
        are held until text (send them) or calls (drop them) follow."""
        if self.in_text or text.strip():
            out.append(self.held + text)
            self.held, self.in_text = "", True
        else:
            self.held += text
