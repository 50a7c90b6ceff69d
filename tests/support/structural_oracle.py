"""An independent reader of a structural tag's answers (spmd_serve/engine/structural_tag.py), for the
tests: no automaton, no grammar; it reads the spec itself (both forms) and finds, by backtracking,
every place each part of it may end.  Free text runs to the first of its strings written (the one
ending first): an excluded one may not be written, a trigger opens the tags its begin starts, an
end string of the enclosing tag ends the text.  A JSON value is `json.JSONDecoder.raw_decode`'s,
after any whitespace, validated by jsonschema-rs; a regex is `re.fullmatch`'s; a GBNF grammar its
own oracle's (tests/support/gbnf_oracle.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema_rs

from spmd_serve.engine.gbnf_parse import parse
from tests.support.gbnf_oracle import Oracle

_WS = " \t\n\r"


def later_form(spec: dict[str, Any]) -> dict[str, Any]:
    """The first form ({structures, triggers}) as the later one's triggered tags."""
    if "format" in spec:
        return spec["format"]
    tags = [{"begin": s["begin"], "content": {"type": "json_schema", "json_schema": s["schema"]}, "end": s["end"]}
            for s in spec["structures"]]  # fmt: skip
    return {"type": "triggered_tags", "triggers": spec["triggers"], "tags": tags}


class StructuralOracle:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.root = later_form(spec)

    def accepts(self, data: bytes) -> bool:
        """Whether `data` is a whole answer (the bytes as UTF-8, undecodable ones kept as escapes)."""
        text = data.decode("utf-8", "surrogateescape")
        return "\0" not in text and len(text) in self._ends(self.root, text, 0, ())

    def _ends(
        self, f: dict[str, Any], text: str, i: int, stops: tuple[str, ...], fence: tuple[str, ...] = ()
    ) -> set[int]:
        """Where format `f`, read from text[i], may end (`stops`: the enclosing tag's ends, where `f`
        is its text content and reads them; `fence`: the nearest tag's ends, which its text may not write)."""
        kind = f.get("type", "tag")
        if kind == "const_string":
            return {i + len(f["value"])} if text.startswith(f["value"], i) else set()
        if kind == "json_schema":
            return self._json(f["json_schema"], text, i)
        if kind == "regex":
            return {j for j in range(i, len(text) + 1) if re.fullmatch(f["pattern"], text[i:j])}
        if kind == "grammar":
            oracle = Oracle(parse(f["grammar"]))
            return {j for j in range(i, len(text) + 1) if oracle.accepts(text[i:j].encode("utf-8", "surrogateescape"))}
        if kind in ("sequence", "or"):
            return self._seq(f["elements"], text, i, fence) if kind == "sequence" else {
                j for e in f["elements"] for j in self._ends(e, text, i, (), fence)}  # fmt: skip
        if kind == "tag":
            return self._tag(f, text, i)
        excluded = [*f.get("excludes", []), *(e for e in fence if e not in stops)]
        if kind == "any_text":
            return self._text(text, i, excluded, stops, {})
        if kind == "tags_with_separator":
            return self._separated(f, text, i)
        return self._triggered({**f, "excludes": excluded}, text, i, stops, True)

    def _seq(self, items: list[dict[str, Any]], text: str, i: int, fence: tuple[str, ...]) -> set[int]:
        at = {i}
        for e in items:
            at = {j for k in at for j in self._ends(e, text, k, (), fence)}
        return at

    def _tag(self, f: dict[str, Any], text: str, i: int) -> set[int]:
        if not text.startswith(f["begin"], i):
            return set()
        ends = f["end"] if isinstance(f["end"], list) else [f["end"]]
        body = f["content"]
        reads_ends = (body.get("type") == "any_text" or (body.get("type") == "triggered_tags"
                      and not body.get("stop_after_first"))) and all(ends)  # fmt: skip
        fence = tuple(ends) if all(ends) else ()
        inside = self._ends(body, text, i + len(f["begin"]), fence if reads_ends else (), fence)
        return inside if reads_ends else {j + len(e) for j in inside for e in ends if text.startswith(e, j)}

    def _text(self, text: str, i: int, excluded: list[str], stops: tuple[str, ...], triggers: dict) -> set[int]:
        """Free text from i to where it may end: before the first string of its own written, or at a
        stop; at a trigger, on with `triggers["then"](position)`."""
        strings = [*excluded, *stops, *triggers.get("strings", ())]
        found = [(j + len(s), s) for s in strings if (j := text.find(s, i)) >= 0]
        first = min(found, default=None)
        limit = first[0] if first else len(text) + 1
        ends = set() if stops else set(range(i, limit))
        if first is None or first[1] in excluded:
            return ends
        if first[1] in stops:
            return {first[0]}
        return ends | triggers["then"](first[0] - len(first[1]))

    def _triggered(self, f: dict[str, Any], text: str, i: int, stops: tuple[str, ...], fresh: bool) -> set[int]:
        def after(done: set[int]) -> set[int]:  # (the positions after a tag)
            return done if f.get("stop_after_first") else {
                e for j in done for e in self._triggered(f, text, j, stops, False)}  # fmt: skip

        def then(at: int) -> set[int]:  # (a trigger written at `at`: the tags it begins)
            begun = [
                t for t in f["tags"] if any(t["begin"].startswith(g) and text.startswith(g, at) for g in f["triggers"])
            ]
            return after({j for t in begun for j in self._tag(t, text, at)})

        if fresh and f.get("at_least_one"):
            return after({j for t in f["tags"] for j in self._tag(t, text, i)})
        return self._text(text, i, f.get("excludes", []), stops, {"strings": f["triggers"], "then": then})

    def _separated(self, f: dict[str, Any], text: str, i: int) -> set[int]:
        ends, at, count = set() if f.get("at_least_one") else {i}, {i}, 0
        while at and count < len(text) + 1:
            step = {j for k in at for j in self._ends({"type": "or", "elements": f["tags"]}, text, k, ())}
            ends |= step
            if f.get("stop_after_first"):
                break
            at = {k + len(f["separator"]) for k in step if text.startswith(f["separator"], k)}
            count += 1
        return ends

    def _json(self, schema: Any, text: str, i: int) -> set[int]:
        body = text[i:].lstrip(_WS)
        try:
            value, n = json.JSONDecoder().raw_decode(body)
        except ValueError:
            return set()
        ok = not any(0xD800 <= ord(c) <= 0xDFFF for c in body[:n]) and jsonschema_rs.validator_for(schema).is_valid(
            value
        )
        return {len(text) - len(body) + n} if ok else set()
