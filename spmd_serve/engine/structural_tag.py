"""vLLM's `structural_tag` (xgrammar's structural tags in their first form, which vLLM's OpenAI API
takes as `response_format: {"type": "structural_tag", "structures": [...], "triggers": [...]}` and as
the `structural_tag` / `structured_outputs.structural_tag` JSON text): free text, in which each
`trigger` written opens a structure — the rest of a `begin` that starts with it, one JSON value of
that structure's `schema`, then its `end` — and free text again after it.  The answer may end (an
EOS, or max_tokens) anywhere in free text, not inside a structure.

Held as one byte grammar (engine/grammar_table.py) with the JSON answers' states
(engine/json_grammar.py): every schema's nodes in one list (json_schema.nodes_of), and three more
kinds of state: ("stext", seen) free text, where `seen` is the longest end of it that begins a
trigger (an Aho–Corasick automaton over the triggers); ("sbegin", i, k) structure i's begin after
its k-th byte; ("send", i, k) its end after the k-th.  Where a trigger begins several structures,
their states are read together (json_grammar's "set") until the begins part.  Whitespace may
come between the begin and the value, and between the value and the end, as between JSON lexemes
(the Hermes form writes "<tool_call>\\n{...}\\n</tool_call>").
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from spmd_serve.engine import json_schema
from spmd_serve.engine.grammar_table import Edges, Grammar, Name
from spmd_serve.engine.json_grammar import Builder

MAX_STRUCTURES = 64
MAX_TAG_BYTES = 256  # a begin, end or trigger


@dataclass(frozen=True)
class Spec:
    """A structural tag read from the request: each structure's (begin, schema, end), the triggers."""

    structures: tuple[tuple[bytes, Any, bytes], ...]
    triggers: tuple[bytes, ...]


def _tag(value: Any, where: str, empty: bool = True) -> bytes:
    if not isinstance(value, str) or (not value and not empty) or len(value.encode()) > MAX_TAG_BYTES:
        size = "a" if empty else "a non-empty"
        raise ValueError(
            f"{where} must be {size} string of at most {MAX_TAG_BYTES} bytes, got {json.dumps(value)[:60]}"
        )
    if "\0" in value:
        raise ValueError(f"{where} must not hold a NUL character")
    return value.encode()


def read(spec: Any, name: str) -> Spec:
    """A structural tag's object (`name`: the field it came in), checked; ValueError names the fault."""
    if not isinstance(spec, dict):
        raise ValueError(f"{name} must be an object with structures and triggers, got {json.dumps(spec)[:60]}")
    if "format" in spec:
        raise ValueError(f"{name}: the structural tag's later form (format: ...) is not supported by this server "
                         "(only structures and triggers)")  # fmt: skip
    other = sorted(set(spec) - {"type", "structures", "triggers"})
    if other or spec.get("type", "structural_tag") != "structural_tag":
        raise ValueError(f"{name}: {other[0] if other else 'type'} is not a structural tag's field here "
                         "(structures, triggers and type 'structural_tag')")  # fmt: skip
    items, triggers = spec.get("structures"), spec.get("triggers")
    if not isinstance(items, list) or not 0 < len(items) <= MAX_STRUCTURES:
        raise ValueError(f"{name}.structures must be a list of 1 to {MAX_STRUCTURES} structures")
    if not isinstance(triggers, list) or not 0 < len(triggers) <= MAX_STRUCTURES:
        raise ValueError(f"{name}.triggers must be a list of 1 to {MAX_STRUCTURES} strings")
    trig = tuple(dict.fromkeys(_tag(t, f"{name}.triggers[{k}]", False) for k, t in enumerate(triggers)))
    for t in trig:
        inner = next((u for u in trig if u != t and u in t), None)
        if inner is not None:
            raise ValueError(f"{name}.triggers: {t.decode()!r} holds another trigger, {inner.decode()!r}")
    structures = []
    for k, item in enumerate(items):
        where = f"{name}.structures[{k}]"
        if not isinstance(item, dict) or set(item) - {"begin", "schema", "end"} or not {"begin", "schema"} <= set(item):
            raise ValueError(f"{where} must be an object of begin, schema and end (end may be left out)")
        begin, end = _tag(item["begin"], f"{where}.begin", False), _tag(item.get("end", ""), f"{where}.end")
        if not any(begin.startswith(t) for t in trig):
            raise ValueError(f"{where}.begin {item['begin']!r} starts with none of the triggers")
        structures.append((begin, item["schema"], end))
    for t in trig:
        if not any(b.startswith(t) for b, _, _ in structures):
            raise ValueError(f"{name}.triggers: {t.decode()!r} begins no structure")
    return Spec(tuple(structures), trig)


def canonical(spec: Any, name: str) -> str:
    """The structural tag as compact JSON text (what SamplingParams carries), checked as `read` does."""
    read(spec, name)
    return json.dumps(spec, separators=(",", ":"), ensure_ascii=False)


class _Builder(Builder):
    """The JSON answers' builder with free text and the structures' begins and ends."""

    def __init__(self, spec: Spec, name: str) -> None:
        nodes, self.roots = json_schema.nodes_of(
            [s for _, s, _ in spec.structures], f"({name}.structures[{{}}].schema)"
        )
        super().__init__(nodes)
        self.spec = spec
        self.kinds.update(stext=self._text, sbegin=self._begin, send=self._end)
        self._prefixes = {t[:n] for t in spec.triggers for n in range(1, len(t) + 1)}
        self._goto: dict[tuple[bytes, int], bytes] = {}

    def _lexeme(self, base: Name) -> Edges:
        return self._end(base) if base[0] == "send" else super()._lexeme(base)

    def _ws_edges(self, name: Name) -> Edges:
        """JSON's whitespace, but after the value of a structure with no end: text at once (a
        trigger may begin with a space)."""
        base = name[1]
        if isinstance(base, tuple) and base[0] == "send" and not self.spec.structures[base[1]][2]:
            return self._text(("stext", b""))
        return super()._ws_edges(name)

    def _text(self, name: Name) -> Edges:
        """("stext", seen): any byte but NUL (a special token's); one ending a trigger opens the
        structures whose begins start with it."""
        seen = name[1]
        assert isinstance(seen, bytes)
        edges: Edges = {}
        for b in range(1, 256):
            after = self._next(seen, b)
            if after not in self.spec.triggers:
                edges[b] = (("stext", after), None)
                continue
            opened = frozenset(
                self._begun(i, len(after)) for i, (begin, _, _) in enumerate(self.spec.structures)
                if begin.startswith(after)
            )  # fmt: skip
            edges[b] = (next(iter(opened)) if len(opened) == 1 else ("set", opened), None)
        return edges

    def _next(self, seen: bytes, b: int) -> bytes:
        """The longest end of seen + b that begins a trigger (Aho–Corasick's goto and failure); a
        whole trigger exactly where one was written, since none holds another."""
        key = (seen, b)
        if key not in self._goto:
            text = seen + bytes([b])
            self._goto[key] = text if text in self._prefixes else self._next(self._fail(seen), b) if seen else b""
        return self._goto[key]

    def _fail(self, seen: bytes) -> bytes:
        """The longest proper end of `seen` (itself a trigger's beginning) that begins a trigger."""
        return b"" if len(seen) <= 1 else self._next(self._fail(seen[:-1]), seen[-1])

    def _begun(self, i: int, k: int) -> Name:
        """The state after structure i's begin's k-th byte: the rest of it, or the value."""
        if k < len(self.spec.structures[i][0]):
            return ("sbegin", i, k)
        return ("ws", ("val", self.roots[i], ("send", i, 0)), 0)

    def _begin(self, name: Name) -> Edges:
        _, i, k = name
        assert isinstance(i, int) and isinstance(k, int)
        return {self.spec.structures[i][0][k]: (self._begun(i, k + 1), None)}

    def _end(self, name: Name) -> Edges:
        """("send", i, k): structure i's end after its k-th byte (k = 0: the value is read), then text."""
        _, i, k = name
        assert isinstance(i, int) and isinstance(k, int)
        end = self.spec.structures[i][2]
        if k == len(end):
            return self._text(("stext", b""))
        return {end[k]: (("send", i, k + 1) if k + 1 < len(end) else ("stext", b""), None)}

    def may_end(self, name: Name) -> bool:
        """Free text, or whitespace after a value whose structure's end is empty (text follows)."""
        if name[0] == "set":
            return any(self.may_end(n) for n in name[1])
        after = name[1] if name[0] == "ws" else None
        return name[0] == "stext" or (
            isinstance(after, tuple) and after[0] == "send" and not self.spec.structures[after[1]][2]
        )


@functools.lru_cache(maxsize=64)
def answer_grammar(text: str, name: str = "structural_tag") -> Grammar:
    """The grammar of a structural tag given as JSON text; ValueError names what is not supported."""
    builder = _Builder(read(json.loads(text), name), name)
    return Grammar(builder.edges, ("stext", b""), may_end=builder.may_end, counted=builder.counted)
