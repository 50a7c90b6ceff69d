"""An independent reader of a structural tag's answers (spmd_serve/engine/structural_tag.py), for the
tests: no automaton, no grammar.  Free text runs to the first trigger written (the one ending
first); from there the text must be one of the structures whose begin starts with that trigger:
the begin, a JSON value (`json.JSONDecoder.raw_decode`) that the structure's schema validates
(jsonschema-rs), the end, then free text again.  Whitespace around the value is JSON's
(the grammar's bound on it is not read here, so only what the grammar takes is checked against it).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs

_WS = " \t\n\r"


class StructuralOracle:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.triggers: list[str] = spec["triggers"]
        self.structures = [(s["begin"], jsonschema_rs.validator_for(s["schema"]), s.get("end", ""))
                           for s in spec["structures"]]  # fmt: skip

    def accepts(self, data: bytes) -> bool:
        """Whether `data` is a whole answer (the bytes as UTF-8, undecodable ones kept as escapes)."""
        return self._text(data.decode("utf-8", "surrogateescape"))

    def _text(self, text: str) -> bool:
        if "\0" in text:
            return False
        found = [(i + len(t), i, t) for t in self.triggers if (i := text.find(t)) >= 0]
        if not found:
            return True
        _, at, trigger = min(found)
        return any(self._structure(text[at:], k) for k, (begin, _, _) in enumerate(self.structures)
                   if begin.startswith(trigger))  # fmt: skip

    def _structure(self, text: str, k: int) -> bool:
        begin, validator, end = self.structures[k]
        if not text.startswith(begin):
            return False
        rest = text[len(begin) :]
        body = rest.lstrip(_WS)
        try:
            value, n = json.JSONDecoder().raw_decode(body)
        except ValueError:
            return False
        if any(0xD800 <= ord(c) <= 0xDFFF for c in body[:n]) or not validator.is_valid(value):
            return False
        after = body[n:].lstrip(_WS) if end else body[n:]
        return after.startswith(end) and self._text(after[len(end) :])
