"""vLLM's `structural_tag` (xgrammar's structural tags, read by engine/structural_formats.py): which
texts an answer may be, as one byte grammar (engine/grammar_table.py).  vLLM's OpenAI API takes it as
`response_format: {"type": "structural_tag", ...}` and as the `structural_tag` /
`structured_outputs.structural_tag` JSON text.  In the first form, free text in which each trigger
written opens a structure (the rest of a begin that starts with it, one JSON value of its schema,
its end), then free text again; the later form composes such parts (engine/structural_formats.py).

The states are json_grammar's for the JSON values (every schema's nodes in one list:
json_schema.nodes_of) and these, each with the continuation K it goes on to (another state name, or
END_NAME: the answer is whole): ("fk", node, K) a format node about to be read; ("fseq", node, i, K)
a sequence at its i-th element; ("flit", bytes, k, K) a literal after its k-th byte; ("ftext", node,
seen, K) free text, `seen` its longest end that begins one of its patterns (an Aho–Corasick
automaton); ("fafter", node, K) after a triggered tag; ("fsep", node, count, K) tags with a
separator after `count` of them; ("frx", node, state, K) and ("fgb", node, state, K) a regex's and a
GBNF grammar's own states.  Where the text may go on one way or end and go on to K, both are read
together (json_grammar's "set") until they part: the grammar stays one table.
"""

from __future__ import annotations

import json
from typing import Any

from spmd_serve.engine import gbnf_grammar, grammar_cache, json_schema, regex_dfa
from spmd_serve.engine.grammar_table import DEAD, END_NAME, POP, POP_NAME, Edges, Grammar, Name
from spmd_serve.engine.json_grammar import Builder
from spmd_serve.engine.structural_formats import STOP, TRIGGER, Formats, read


def canonical(spec: Any, name: str) -> str:
    """The structural tag as compact JSON text (what SamplingParams carries), checked as `read` does."""
    read(spec, name)
    return json.dumps(spec, separators=(",", ":"), ensure_ascii=False)


class _Builder(Builder):
    """json_grammar's builder with the format nodes' states (the module docstring)."""

    def __init__(self, formats: Formats) -> None:
        nodes, self.roots = json_schema.nodes_of(formats.schemas)
        super().__init__(nodes)
        self.formats, self.f = formats, [_compiled(node) for node in formats.nodes]
        self.roles: dict[int, dict[bytes, str]] = {n: node[1] for n, node in enumerate(self.f) if node[0] == "text"}
        self._prefixes = {k: {p[:n] for p in roles for n in range(1, len(p) + 1)} for k, roles in self.roles.items()}
        self._goto: dict[tuple[int, bytes, int], bytes] = {}
        self._empties: dict[int, bool] = {}
        self._fails: dict[tuple[int, bytes], bytes] = {}
        for node in self.f:  # (a repetition that may read nothing would repeat without end)
            if node[0] == "sep" and self.f[self.f[node[2]][1][0]][1] == b"" and self._empty(node[1]):
                raise ValueError("tags_with_separator with an empty separator and a tag that may be empty is not "
                                 "supported (it would repeat without end)")  # fmt: skip
        self.kinds.update(fk=self._enter, fseq=self._seq, flit=self._lit, ftext=self._text, fafter=self._after_tag,
                          fsep=self._sep, frx=self._rx, fgb=self._gbnf, end=lambda _: {})  # fmt: skip

    def _ws_edges(self, name: Name) -> Edges:
        """After a JSON value: K at once (whitespace there is K's, as xgrammar's JSON ends at its
        last bracket; a trigger or an end may begin with a space)."""
        base = name[1]
        if isinstance(base, tuple) and base[0] == "fjx":
            return self.edges(base[1])
        return super()._ws_edges(name)

    def _union(self, alternatives: list[Edges]) -> Edges:
        """json_grammar's union, its sets flat (a set of sets would make new names forever)."""
        try:
            edges = super()._union(alternatives)
            return {b: (_flat(target), back) for b, (target, back) in edges.items()}
        except ValueError as e:  # (here also where free text and a JSON value may both read the same bytes)
            raise ValueError(f"{e} (in a structural tag, also text read beside a free JSON object or array)") from None

    def _or_end(self, edges: Edges, k: Name) -> Edges:
        """`edges`, read together with K's (the text may end here and go on to K)."""
        return edges if k == END_NAME else self._union([edges, self.edges(k)])

    def _enter(self, name: Name) -> Edges:
        _, n, k = name
        node = self.f[n]
        kind = node[0]
        if kind == "const":
            return self._lit(("flit", node[1], 0, k))
        if kind == "json":
            return self.edges(("ws", ("val", self.roots[node[1]], ("fjx", k)), 0))
        if kind == "text":
            return self._text(("ftext", n, b"", k))
        if kind == "seq":
            return self._seq(("fseq", n, 0, k))
        if kind == "or":
            return self._union([self._enter(("fk", c, k)) for c in node[1]])
        if kind == "rx":
            return self._rx(("frx", n, 0, k))
        if kind == "gbnf":
            return self._gbnf(("fgb", n, node[1].start[0], k))
        if kind == "trig":  # (at_least_one: a tag at once)
            after: Name = ("fafter", n, k)
            return self._union([self._enter(("fk", t, after)) for t in node[2]]) if node[3] else self._text_of(n, k)
        return self._sep(("fsep", n, 0, k))

    def _seq(self, name: Name) -> Edges:
        _, n, i, k = name
        items = self.f[n][1]
        return self._enter(("fk", items[i], ("fseq", n, i + 1, k) if i + 1 < len(items) else k))

    def _lit(self, name: Name) -> Edges:
        _, data, i, k = name
        if i == len(data):
            return self.edges(k)
        return {data[i]: (("flit", data, i + 1, k) if i + 1 < len(data) else k, None)}

    def _text_of(self, trig: int, k: Name) -> Edges:
        return self._text(("ftext", self.f[trig][1], b"", ("fafter", trig, k)))

    def _text(self, name: Name) -> Edges:
        """Any byte but NUL (a special token's); one that ends a pattern: an excluded one has no way
        on, a stop goes on to K (the tag's end read), a trigger to the tags its begin starts."""
        _, n, seen, k = name
        roles = self.roles[n]
        out = self._past(n, k)
        edges: Edges = {}
        for b in range(1, 256):
            after = self._next(n, seen, b)
            role = roles.get(after)
            if role is None:
                edges[b] = (("ftext", n, after, k), None)
            elif role == STOP:
                edges[b] = (out, None)
            elif role == TRIGGER:  # (k: ("fafter", trig, K), whose tags these are)
                begun = frozenset(
                    self._begun(t, after, k) for t in self.f[k[1]][2] if self.formats.begin_of(t).startswith(after)
                )
                edges[b] = (next(iter(begun)) if len(begun) == 1 else ("set", begun), None)
        return edges if STOP in roles.values() else self._or_end(edges, out)

    def _past(self, n: int, k: Name) -> Name:
        """What follows text node n: K, or past its triggered tags where it is theirs (k is then
        ("fafter", trig, K); a tag's text content inside triggered tags goes on to that "fafter")."""
        return k[2] if k[0] == "fafter" and self.f[k[1]][1] == n else k

    def _begun(self, tag: int, read: bytes, k: Name) -> Name:
        """The state after a tag's begin's first len(read) bytes (the trigger), going on to K."""
        rest: Name = ("fseq", tag, 1, k)
        begin = self.formats.begin_of(tag)
        return rest if len(read) == len(begin) else ("flit", begin, len(read), rest)

    def _next(self, n: int, seen: bytes, b: int) -> bytes:
        """The longest end of seen + b that begins one of text node n's patterns (Aho–Corasick's
        goto and failure); a whole pattern exactly where one was written, since none holds another."""
        key = (n, seen, b)
        if key not in self._goto:
            text = seen + bytes([b])
            self._goto[key] = (
                text if text in self._prefixes[n] else self._next(n, self._fail(n, seen), b) if seen else b""
            )
        return self._goto[key]

    def _fail(self, n: int, seen: bytes) -> bytes:
        """The longest proper end of `seen` that begins a pattern (kept: each is asked for often)."""
        if (n, seen) not in self._fails:
            self._fails[n, seen] = b"" if len(seen) <= 1 else self._next(n, self._fail(n, seen[:-1]), seen[-1])
        return self._fails[n, seen]

    def _after_tag(self, name: Name) -> Edges:
        """After a triggered tag: K (stop_after_first), else free text again."""
        _, n, k = name
        return self.edges(k) if self.f[n][4] else self._text_of(n, k)

    def _sep(self, name: Name) -> Edges:
        """Tags with a separator after `count` of them: another (after the separator, past the first),
        and K once at least one came (or none is needed)."""
        _, n, count, k = name
        _, alts, then, once, first = self.f[n]
        more: Edges = {} if count and first else self._enter(("fk", alts if not count else then, ("fsep", n, 1, k)))
        return self._or_end(more, k) if count or not once else more

    def _rx(self, name: Name) -> Edges:
        _, n, s, k = name
        dfa = self.f[n][1]
        edges: Edges = {b: (("frx", n, t, k), None) for b, t in dfa.trans[s].items()}
        return self._or_end(edges, k) if s in dfa.accept else edges

    def _gbnf(self, name: Name) -> Edges:
        """A GBNF grammar's table row (its pops and pushes on the stack, as its own), K where it may end."""
        _, n, s, k = name
        g = self.f[n][1]
        edges: Edges = {}
        for b, t in enumerate(g.table[s].tolist()):
            push = int(g.pushes[s, b])
            if t != DEAD and b:  # (never NUL: a special token's)
                edges[b] = (POP_NAME, None) if t == POP else (("fgb", n, t, k), ("fgb", n, push, k) if push else None)
        return self._or_end(edges, k) if s in g.ends else edges

    def may_end(self, name: Name) -> bool:
        """Whether the answer may end at `name` (an EOS may come): whatever is left may be empty."""
        kind = name[0]
        if name == END_NAME:
            return True
        if kind == "set":
            return any(self.may_end(m) for m in name[1])
        if kind == "ws":
            return isinstance(name[1], tuple) and name[1][0] == "fjx" and self.may_end(name[1][1])
        if kind == "fk":
            return self._empty(name[1]) and self.may_end(name[2])
        if kind == "fseq":
            return all(self._empty(c) for c in self.f[name[1]][1][name[2] :]) and self.may_end(name[3])
        if kind == "ftext":
            return self._empty(name[1]) and self.may_end(self._past(name[1], name[3]))
        if kind == "fafter":
            return (self.f[name[1]][4] or self._empty(self.f[name[1]][1])) and self.may_end(name[2])
        if kind == "fsep":  # (a state only after a tag: entering is "fk"'s)
            return self.may_end(name[3])
        if kind in ("frx", "fgb"):
            node = self.f[name[1]]
            return name[2] in (node[1].accept if kind == "frx" else node[1].ends) and self.may_end(name[3])
        return False

    def _empty(self, n: int) -> bool:
        """Whether format node n may be read as no text at all."""
        if n not in self._empties:
            node = self.f[n]
            kind = node[0]
            if kind in ("seq", "or"):
                empty = (all if kind == "seq" else any)(self._empty(c) for c in node[1])
            elif kind in ("trig", "sep"):
                empty = not node[3] and (kind == "sep" or self._empty(node[1]))
            elif kind == "text":
                empty = STOP not in self.roles[n].values()
            elif kind in ("rx", "gbnf"):
                empty = 0 in node[1].accept if kind == "rx" else node[1].start[0] in node[1].ends
            else:
                empty = node == ("const", b"")  # (a JSON value is never empty)
            self._empties[n] = empty
        return self._empties[n]


def _compiled(node: tuple[Any, ...]) -> tuple[Any, ...]:
    """A regex node with its DFA (over the bytes but NUL), a GBNF one with its grammar."""
    if node[0] == "rx":
        return ("rx", regex_dfa.compile_dfa(node[1], node[2], frozenset(range(1, 256))))
    return ("gbnf", gbnf_grammar.answer_grammar(node[1], node[2])) if node[0] == "gbnf" else node


def _members(name: Name) -> frozenset[Name]:
    return frozenset(m for n in name[1] for m in _members(n)) if name[0] == "set" else frozenset((name,))


def _flat(name: Name) -> Name:
    members = _members(name)
    return next(iter(members)) if len(members) == 1 else ("set", members)


@grammar_cache.cached
def answer_grammar(text: str, name: str = "structural_tag") -> Grammar:
    """The grammar of a structural tag given as JSON text; ValueError names what is not supported."""
    formats = read(json.loads(text), name)
    try:
        builder = _Builder(formats)
        start: Name = ("fk", formats.root, END_NAME)
        return Grammar(builder.edges, start, may_end=builder.may_end, counted=builder.counted, what=f"the {name}")
    except RecursionError:  # (formats nested hundreds deep: the builder recurses)
        raise ValueError(f"{name} nests too deep") from None
