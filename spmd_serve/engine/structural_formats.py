"""A structural tag's spec (engine/structural_tag.py) read into format nodes, both of vLLM's forms:
the first ({"structures": [{"begin", "schema", "end"}], "triggers": [...]}) and xgrammar's later one
({"format": {...}}: const_string, json_schema, any_text, regex, grammar, sequence, or, tag,
triggered_tags, tags_with_separator).  Every other format type, and any field beyond those listed,
is refused by name: nothing a request sent is left out.

Nodes (a list, index-referenced): ("const", bytes); ("json", k) the k-th schema; ("text", roles)
any text in which none of the patterns `roles` maps is written, each to its role (an excluded string,
a tag's end that ends it, or a trigger that opens tags); ("rx", pattern, where) and ("gbnf", text,
where) (compiled with the grammar, not here: reading a spec stays quick);
("seq", (node, ...)); ("or", (node, ...)); ("trig", text node, (tag, ...), at_least_one,
stop_after_first) with each tag a ("seq", (begin, content[, end])) whose begin is a const; ("sep",
tags "or" node, separator "seq" node, at_least_one, stop_after_first).  A tag whose content is any
text or triggered tags hands its ends to that text (xgrammar reads such text up to the first end);
free text deeper within a tag has the tag's ends among its excluded strings (its `fence`), as
xgrammar's, so no text runs past the end of the tag it is in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MAX_NODES = 2000
MAX_TEXT_BYTES = 256  # a literal: a begin, a const_string, a separator
MAX_PATTERN_BYTES = 64  # a string free text looks for: a trigger, an excluded string, an end
MAX_DEPTH = 32  # formats within formats (each text within tags looks for their ends too)
MAX_TEXT_PATTERNS = 1024  # all of one free text's patterns' bytes (its automaton's states)
EXCLUDED, STOP, TRIGGER = "excluded", "stop", "trigger"
_SAID = {EXCLUDED: "an excluded string", STOP: "an end of its tag", TRIGGER: "a trigger"}
_FIELDS = {
    "const_string": {"value"}, "json_schema": {"json_schema", "style"}, "any_text": {"excludes"},
    "regex": {"pattern"}, "grammar": {"grammar"}, "sequence": {"elements"}, "or": {"elements"},
    "tag": {"begin", "content", "end"},
    "triggered_tags": {"triggers", "tags", "at_least_one", "stop_after_first", "excludes"},
    "tags_with_separator": {"tags", "separator", "at_least_one", "stop_after_first"},
}  # fmt: skip


@dataclass
class Formats:
    """A spec's nodes, its root node and the JSON schemas (with where each is)."""

    nodes: list[tuple[Any, ...]] = field(default_factory=list)
    schemas: list[tuple[Any, str]] = field(default_factory=list)
    root: int = 0

    def add(self, node: tuple[Any, ...]) -> int:
        if len(self.nodes) >= MAX_NODES:
            raise ValueError(f"a structural tag of more than {MAX_NODES} parts is not supported")
        self.nodes.append(node)
        return len(self.nodes) - 1

    def begin_of(self, tag: int) -> bytes:
        """A tag's begin (its sequence's first node, a const)."""
        begin: bytes = self.nodes[self.nodes[tag][1][0]][1]
        return begin


def _text(value: Any, where: str, empty: bool = True, most: int = MAX_TEXT_BYTES) -> bytes:
    if not isinstance(value, str) or (not value and not empty) or len(value.encode()) > most:
        size = "a" if empty else "a non-empty"
        raise ValueError(f"{where} must be {size} string of at most {most} bytes, got {json.dumps(value)[:60]}")
    if "\0" in value:
        raise ValueError(f"{where} must not hold a NUL character")
    return value.encode()


def _list(spec: dict[str, Any], key: str, where: str, empty: bool = False) -> list[Any]:
    items = spec.get(key, [] if empty else None)
    if not isinstance(items, list) or not (empty or items) or len(items) > 64:
        raise ValueError(f"{where}.{key} must be a list of {0 if empty else 1} to 64 items")
    return items


def _flag(spec: dict[str, Any], key: str, where: str) -> bool:
    value = spec.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{where}.{key} must be a boolean, got {json.dumps(value)[:40]}")
    return value


def read(spec: Any, name: str) -> Formats:
    """A structural tag's spec (`name`: the field it came in) as nodes; ValueError names the fault."""
    if not isinstance(spec, dict):
        raise ValueError(f"{name} must be an object with structures and triggers, or a format")
    if spec.get("type", "structural_tag") != "structural_tag":
        raise ValueError(f"{name}.type must be 'structural_tag', got {json.dumps(spec.get('type'))[:40]}")
    out = Formats()
    if "format" in spec:
        if set(spec) - {"type", "format"}:
            raise ValueError(f"{name}: {sorted(set(spec) - {'type', 'format'})[0]} is not a field beside format")
        out.root = _Reader(out).format(spec["format"], f"{name}.format", ())
        return out
    other = sorted(set(spec) - {"type", "structures", "triggers"})
    if other:
        raise ValueError(f"{name}: {other[0]} is not a structural tag's field (structures and triggers, or format)")
    reader, tags = _Reader(out), []
    for k, item in enumerate(_list(spec, "structures", name)):
        where = f"{name}.structures[{k}]"
        if not isinstance(item, dict) or set(item) != {"begin", "schema", "end"}:
            raise ValueError(f"{where} must be an object of begin, schema and end")
        out.schemas.append((item["schema"], f"({where}.schema)"))
        json_node = out.add(("json", len(out.schemas) - 1))
        tags.append(reader.tag_node(_text(item["begin"], f"{where}.begin"), json_node, [item["end"]], where))
    triggers = _list(spec, "triggers", name)
    out.root = reader.triggered(triggers, tags, name, [], (False, False), (), "structure")
    return out


class _Reader:
    def __init__(self, out: Formats) -> None:
        self.out = out
        self.depth = 0

    def format(self, spec: Any, where: str, stops: tuple[bytes, ...], fence: tuple[bytes, ...] = ()) -> int:
        """The node of a format; `stops`: its enclosing tag's ends, where it is that tag's text content
        (they end it); `fence`: the nearest enclosing tag's ends, which no free text within it may
        write (as xgrammar's: text of a tag's sequence cannot run past its end)."""
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise ValueError(f"{where}: formats nested more than {MAX_DEPTH} deep are not supported")
            return self._format(spec, where, stops, fence)
        finally:
            self.depth -= 1

    def _format(self, spec: Any, where: str, stops: tuple[bytes, ...], fence: tuple[bytes, ...]) -> int:
        kind = spec.get("type") if isinstance(spec, dict) else None
        if kind not in _FIELDS:
            raise ValueError(f"{where}: the format type {json.dumps(kind)[:40]} is not supported by this server "
                             f"(only {', '.join(_FIELDS)})")  # fmt: skip
        extra = sorted(set(spec) - _FIELDS[kind] - {"type"})
        if extra:
            raise ValueError(f"{where}: {extra[0]} is not a field of {kind} here")
        add = self.out.add
        if kind == "const_string":
            return add(("const", _text(spec.get("value"), f"{where}.value")))
        if kind == "json_schema":
            if spec.get("style", "json") != "json":
                raise ValueError(f"{where}.style {json.dumps(spec['style'])[:40]} is not supported (only json)")
            self.out.schemas.append((spec.get("json_schema"), f"({where}.json_schema)"))
            return add(("json", len(self.out.schemas) - 1))
        if kind == "regex":
            pattern = spec.get("pattern")
            if not isinstance(pattern, str):
                raise ValueError(f"{where}.pattern must be a string")
            return add(("rx", pattern, f"{where}.pattern"))  # (compiled with the grammar: off the IO loop)
        if kind == "grammar":
            if not isinstance(spec.get("grammar"), str):
                raise ValueError(f"{where}.grammar must be a string")
            return add(("gbnf", spec["grammar"], f"{where}.grammar"))
        if kind in ("sequence", "or"):
            elements = enumerate(_list(spec, "elements", where))
            items = [self.format(e, f"{where}.elements[{k}]", (), fence) for k, e in elements]
            return add(("seq" if kind == "sequence" else "or", tuple(items)))
        if kind == "tag":
            return self.tag(spec, where)
        excluded = [
            _text(e, f"{where}.excludes[{k}]", False, MAX_PATTERN_BYTES)
            for k, e in enumerate(_list(spec, "excludes", where, True))
        ]
        excluded += [e for e in fence if e not in stops and e not in excluded]  # (free text stays within its tag)
        if kind == "any_text":
            return add(("text", self.patterns(where, {EXCLUDED: excluded, STOP: list(stops)})))
        tags = [self.tag(t, f"{where}.tags[{k}]") for k, t in enumerate(_list(spec, "tags", where))]
        once, first = _flag(spec, "at_least_one", where), _flag(spec, "stop_after_first", where)
        if kind == "tags_with_separator":
            separator = add(("const", _text(spec.get("separator"), f"{where}.separator")))
            alts = add(("or", tuple(tags)))
            return add(("sep", alts, add(("seq", (separator, alts))), once, first))
        return self.triggered(_list(spec, "triggers", where), tags, where, excluded, (once, first), stops, "tag")

    def triggered(self, triggers: list[Any], tags: list[int], where: str, excluded: list[bytes],
                  flags: tuple[bool, bool], stops: tuple[bytes, ...], part: str) -> int:  # fmt: skip
        """("trig", ...): every tag's begin starts with a trigger, every trigger begins a tag (`part`)."""
        trig = [_text(t, f"{where}.triggers[{k}]", False, MAX_PATTERN_BYTES) for k, t in enumerate(triggers)]
        begins = [self.out.begin_of(t) for t in tags]
        for k, begin in enumerate(begins):
            if not any(begin.startswith(t) for t in trig):
                raise ValueError(f"{where}: {part} {k}'s begin {begin.decode()!r} starts with none of the triggers")
        for t in trig:
            if not any(b.startswith(t) for b in begins):
                raise ValueError(f"{where}.triggers: {t.decode()!r} begins no {part}")
        text = self.out.add(("text", self.patterns(where, {TRIGGER: trig, EXCLUDED: excluded, STOP: list(stops)})))
        return self.out.add(("trig", text, tuple(tags), *flags))

    def tag(self, spec: Any, where: str) -> int:
        """("seq", (begin, content[, one of its ends])); a text content reads the ends itself."""
        if (
            not isinstance(spec, dict)
            or spec.get("type", "tag") != "tag"
            or set(spec) - {"type"} != {"begin", "content", "end"}
        ):
            raise ValueError(f"{where} must be a tag: an object of begin, content and end")
        begin, ends, content = _text(spec["begin"], f"{where}.begin"), spec["end"], spec["content"]
        # (not triggered tags that stop after the first: the end must still follow that one)
        text = isinstance(content, dict) and (
            content.get("type") == "any_text"
            or (content.get("type") == "triggered_tags" and not content.get("stop_after_first"))
        )
        ends = ends if isinstance(ends, list) else [ends]
        if not ends or len(ends) > 64:
            raise ValueError(f"{where}.end must be a string or a list of 1 to 64 strings")
        fence = tuple(_text(e, f"{where}.end", True, MAX_PATTERN_BYTES) for e in ends) if all(ends) else ()
        stops = fence if text else ()
        return self.tag_node(
            begin, self.format(content, f"{where}.content", stops, fence), [] if stops else ends, where
        )

    def tag_node(self, begin: bytes, content: int, ends: list[Any], where: str) -> int:
        """("seq", (begin, content[, one of the ends])): no ends where the content reads them."""
        items = [self.out.add(("const", begin)), content]
        if ends:
            ends_ = (self.out.add(("const", _text(e, f"{where}.end", True, MAX_PATTERN_BYTES))) for e in ends)
            items.append(self.out.add(("or", tuple(ends_))))
        return self.out.add(("seq", tuple(items)))

    def patterns(self, where: str, by_role: dict[str, list[bytes]]) -> dict[bytes, str]:
        """A text node's patterns, each to its role; none may hold another (each would be read twice)."""
        roles: dict[bytes, str] = {}
        for role, ps in by_role.items():
            for p in ps:
                if roles.get(p, role) != role:
                    raise ValueError(f"{where}: {p.decode()!r} is both {_SAID[roles[p]]} and {_SAID[role]}")
                roles[p] = role
        if sum(map(len, roles)) > MAX_TEXT_PATTERNS:
            raise ValueError(f"{where}: free text looking for more than {MAX_TEXT_PATTERNS} bytes of triggers, "
                             "excluded strings and ends is not supported")  # fmt: skip
        for p in roles:
            inner = next((q for q in roles if q != p and q in p), None)
            if inner is not None:
                raise ValueError(f"{where}: {p.decode()!r} holds {inner.decode()!r} ({_SAID[roles[inner]]}); "
                                 "such text would be read two ways")  # fmt: skip
        return roles
