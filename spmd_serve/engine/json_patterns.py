"""A JSON string held to a regular expression: JSON Schema's `pattern`, and the `format`s built
(engine/json_formats.py, each as a DFA), as states of a JSON grammar (engine/json_grammar.py); and a whole
answer held to one (vLLM's guided_regex: `answer_grammar`), ended by an EOS where it may end.

The string's characters are the pattern DFA's (engine/regex_dfa.py) bytes, written as a model would
write them in JSON: raw, except a quote, a backslash and the control characters with a short escape
(\\n \\t \\r \\b \\f), which come as that escape; other control characters cannot be written, and no
character is taken as a \\u escape (stricter than JSON, never looser).  The closing quote comes only
where the pattern may end.
"""

from __future__ import annotations

import functools

from spmd_serve.engine import grammar_cache
from spmd_serve.engine.grammar_table import COUNTS, FAR_WINDOW, Edges, Grammar, Name, can_end
from spmd_serve.engine.regex_dfa import Dfa, compile_dfa

# byte -> the letter after a backslash that writes it in a JSON string
ESCAPED = {0x22: ord('"'), 0x5C: ord("\\"), 0x0A: ord("n"), 0x09: ord("t"), 0x0D: ord("r"), 0x08: ord("b"),
           0x0C: ord("f")}  # fmt: skip
WRITABLE = frozenset(range(0x20, 0x100)) | frozenset(ESCAPED)


MAX_BOUNDED_STATES = 20000  # a pattern's DFA times a length's counts (the grammar's own limit too)
FAR = -1  # a count within the counted stretch


@functools.lru_cache(maxsize=64)
def string_dfa(pattern: str, where: str, lo: int = 0, hi: int | None = None) -> Dfa:
    """A string pattern's DFA, within a length where one is given (`bounded`)."""
    if (lo, hi) == (0, None):
        return compile_dfa(pattern, where, WRITABLE)
    return bounded(string_dfa(pattern, where), where, lo, hi)  # (the unbounded one cached: one compile)


def bounded(dfa: Dfa, where: str, lo: int = 0, hi: int | None = None) -> Dfa:
    """A string DFA's product with a count of its characters (each begins at a byte that is no
    UTF-8 continuation: up to `hi`, or up to `lo` where there is none), only the states from which a
    match of that length can still end.  A long maxLength is counted on the stack (`Dfa.far`) from
    `lo` to where the count must be known again: FAR_WINDOW characters (a token's reach) and the
    longest way to a match (`_reach`) before `hi`."""
    if (lo, hi) == (0, None):
        return dfa
    first, limit = (lo, hi - FAR_WINDOW - _reach(dfa)) if hi is not None else (0, 0)
    first, limit = (first, limit) if limit - first >= 2 else (0, 0)

    def count(k: int) -> int | None:  # the count's name after `k` characters (None: past hi)
        if hi is None:
            return min(k, lo)
        return None if k > hi else FAR if first <= k < limit else k

    start = (0, FAR if first <= 0 < limit else 0)
    ids: dict[tuple[int, int], int] = {}
    trans: list[dict[int, int]] = []
    todo: list[tuple[int, int]] = []
    far: dict[int, tuple[int, int, int]] = {}
    into: list[list[int]] = []  # (reversed edges: the counted ones to the stretch's end too)

    def add(state: tuple[int, int]) -> int:
        if state not in ids:
            if len(ids) >= MAX_BOUNDED_STATES:
                raise ValueError(f"{where} with its length makes more than {MAX_BOUNDED_STATES} states")
            ids[state] = i = len(ids)
            trans.append({})
            into.append([])
            todo.append(state)
            if state[1] == FAR:  # the stepper leaves the stretch at its limit, to the state there
                far[i] = (first, limit, add((state[0], limit)))
        return ids[state]

    add(start)
    while todo:
        s, c = here = todo.pop()
        for b, t in dfa.trans[s].items():
            step = not 0x80 <= b < 0xC0  # (a character begins)
            k = count(c + step) if c != FAR else FAR
            if k is None:
                continue
            trans[ids[here]][b] = i = add((t, k))
            into[i].append(ids[here])
            if c == FAR and step:  # (the stepper's way out of the stretch)
                into[far[i][2]].append(ids[here])
    accept = {i for (s, c), i in ids.items() if s in dfa.accept and (c == FAR or c >= lo)}
    live = can_end(accept, into.__getitem__)
    if 0 not in live:
        raise ValueError(f"{where}: no string of the pattern has a length within minLength and maxLength")
    return Dfa(tuple({b: t for b, t in out.items() if t in live} for out in trans), frozenset(accept), far)


def _reach(dfa: Dfa) -> int:
    """The most bytes any state needs to reach a match (its states all can)."""
    into: list[list[int]] = [[] for _ in dfa.trans]
    for s, out in enumerate(dfa.trans):
        for t in out.values():
            into[t].append(s)
    dist = dict.fromkeys(dfa.accept, 0)
    todo = list(dfa.accept)
    for s in todo:  # (breadth first: todo grows as it is read)
        for r in into[s]:
            if r not in dist:
                dist[r] = dist[s] + 1
                todo.append(r)
    return max(dist.values(), default=0)


def counted(dfa: Dfa, name: Name) -> tuple[int, int, Name] | None:
    """A pattern string's state in its length's counted stretch (engine/grammar_table.py)."""
    _, node, s, exit_, escaped = name
    if s not in dfa.far:
        return None
    first, limit, there = dfa.far[s]
    return first, limit, ("rx", node, there, exit_, escaped)


def edges(dfa: Dfa, name: Name, close: Name) -> Edges:
    """("rx", node, s, exit, escaped): in the string at DFA state `s`; `escaped`: a backslash was
    just written, so the letter of one of the escaped bytes comes next.  `close`: after the string."""
    _, node, s, exit_, escaped = name
    assert isinstance(s, int)
    out = dfa.trans[s]
    counts = COUNTS if s in dfa.far else None  # (each byte that begins a character adds one)
    if escaped:
        return {letter: (("rx", node, out[b], exit_, False), counts) for b, letter in ESCAPED.items() if b in out}
    result: Edges = {
        b: (("rx", node, t, exit_, False), None if 0x80 <= b < 0xC0 else counts)
        for b, t in out.items()
        if b not in ESCAPED
    }
    if any(b in ESCAPED for b in out):
        result[ord("\\")] = (("rx", node, s, exit_, True), None)
    if s in dfa.accept:
        result[ord('"')] = (close, None)
    return result


@grammar_cache.cached
def answer_grammar(pattern: str, where: str = "guided_regex") -> Grammar:
    """The grammar of an answer that is one match of `pattern` (any byte its DFA takes); ValueError
    names what is not built (the pattern named `where`)."""
    dfa = compile_dfa(pattern, where)
    return Grammar(
        lambda name: {b: (("rxa", t), None) for b, t in dfa.trans[name[1]].items()},
        ("rxa", 0),
        lambda name: name[1] in dfa.accept,
    )
