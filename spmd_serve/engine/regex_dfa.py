"""A regular expression as a DFA over UTF-8 bytes, for JSON Schema's `pattern` and `format`
(engine/json_schema.py, engine/json_patterns.py).

The pattern is parsed by Python's own regex parser (`re._parser`: JSON Schema's ECMA-262 patterns
read alike for what is built), then built as a Thompson NFA whose edges are byte ranges (each set of
characters as the UTF-8 byte sequences of its code points, as Rust's regex-syntax does), then made a
DFA by subset construction.  A pattern is matched whole (as outlines' and vLLM's grammars read it):
a leading `^` and trailing `$` change nothing.  Classes are ECMA's: `\\d` is [0-9], `\\w` [A-Za-z0-9_],
`\\s` ASCII whitespace; `.` is any character but a newline.

Built: literals, classes (ranges, negation, \\d \\w \\s and their negations), `.`, groups,
alternation, `*` `+` `?` `{m,n}` (lazy or not: a DFA reads them alike).  Refused by name:
backreferences, lookarounds, anchors inside the pattern, case-insensitive and other flags.
Only states from which a match can still end are kept, so an answer held to the DFA never
strands; `writable` bytes alone are taken (a JSON string cannot hold most control bytes).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

from spmd_serve.engine.grammar_table import can_end

MAX_DFA_STATES = 2000
MAX_NFA_STATES = 50000
MAX_REPEAT = 256  # the largest bounded count {m,n} built (each count is copies of its NFA)
_TOP = 0x10FFFF
Ranges = list[tuple[int, int]]  # code point intervals, sorted and apart
_CATEGORY: dict[Any, Ranges] = {
    sre.CATEGORY_DIGIT: [(0x30, 0x39)],
    sre.CATEGORY_WORD: [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    sre.CATEGORY_SPACE: [(0x09, 0x0D), (0x20, 0x20)],
}
_NEGATED = {sre.CATEGORY_NOT_DIGIT: sre.CATEGORY_DIGIT, sre.CATEGORY_NOT_WORD: sre.CATEGORY_WORD,
            sre.CATEGORY_NOT_SPACE: sre.CATEGORY_SPACE}  # fmt: skip


@dataclass(frozen=True)
class Dfa:
    """trans[state]: byte -> next state; the start is state 0; `accept`: where a match may end;
    `far`: counted states (engine/grammar_table.py) of a length's stretch, as a Grammar's."""

    trans: tuple[dict[int, int], ...]
    accept: frozenset[int]
    far: dict[int, tuple[int, int, int]] = field(default_factory=dict)


def _norm(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _complement(ranges: Ranges) -> Ranges:
    out, at = [], 0
    for lo, hi in _norm(ranges):
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    return out + ([(at, _TOP)] if at <= _TOP else [])


def _utf8(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """The byte-range sequences whose UTF-8 strings are exactly the code points lo..hi (no surrogates)."""
    for a, b in ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, _TOP)):  # one encoded length each
        if lo < a <= hi or lo <= b < hi:
            return [s for x, y in ((lo, min(hi, b)), (max(lo, b + 1), hi)) if x <= y for s in _utf8(x, y)]
    if lo <= 0xDFFF and hi >= 0xD800:  # surrogates have no UTF-8
        return [s for x, y in ((lo, 0xD7FF), (0xE000, hi)) if x <= y for s in _utf8(x, y)]
    n = len(chr(lo).encode())
    for i in range(1, n):  # split until the bytes after the first vary over whole continuation ranges
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m:
                return _utf8(lo, lo | m) + _utf8((lo | m) + 1, hi)
            if hi & m != m:
                return _utf8(lo, (hi & ~m) - 1) + _utf8(hi & ~m, hi)
    first, last = chr(lo).encode(), chr(hi).encode()
    return [list(zip(first, last))]


class _Nfa:
    """A Thompson NFA: eps[s] the states s reaches for free, edges[s] its (lo byte, hi byte, next)."""

    def __init__(self, dotall: bool, where: str) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int, int]]] = []
        self.dotall, self.where = dotall, where
        self._closures: dict[frozenset[int], frozenset[int]] = {}

    def state(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:  # (nested counts multiply: (a{200}){200} is 40,000 copies)
            raise ValueError(f"{self.where} is too large (more than {MAX_NFA_STATES} NFA states)")
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def chars(self, ranges: Ranges) -> tuple[int, int]:
        start, end = self.state(), self.state()
        for lo, hi in _norm(ranges):
            for seq in _utf8(lo, hi):
                at = start
                for k, (a, b) in enumerate(seq):
                    nxt = end if k == len(seq) - 1 else self.state()
                    self.edges[at].append((a, b, nxt))
                    at = nxt
        return start, end

    def seq(self, items: Any, where: str) -> tuple[int, int]:
        start = end = self.state()
        for op, av in items:
            s, e = self.item(op, av, where)
            self.eps[end].append(s)
            end = e
        return start, end

    def item(self, op: Any, av: Any, where: str) -> tuple[int, int]:
        if op is sre.LITERAL:
            return self.chars([(av, av)])
        if op is sre.NOT_LITERAL:
            return self.chars(_complement([(av, av)]))
        if op is sre.ANY:
            return self.chars([(0, _TOP)] if self.dotall else _complement([(10, 10)]))
        if op is sre.IN:
            return self.chars(_class(av, where))
        if op is sre.SUBPATTERN:
            if av[1] or av[2]:
                raise ValueError(f"{where}: flags inside the pattern are not supported")
            return self.seq(av[3], where)
        if op is sre.BRANCH:
            start, end = self.state(), self.state()
            for alt in av[1]:
                s, e = self.seq(alt, where)
                self.eps[start].append(s)
                self.eps[e].append(end)
            return start, end
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", sre.MAX_REPEAT)):
            lo, hi, items = av
            return self.repeat(lo, hi, items, where)
        raise ValueError(f"{where}: {str(op).lower()} is not supported in a pattern (no lookaround or backreference)")

    def repeat(self, lo: int, hi: Any, items: Any, where: str) -> tuple[int, int]:
        if lo > MAX_REPEAT or (hi is not sre.MAXREPEAT and hi > MAX_REPEAT):
            raise ValueError(f"{where}: a repeat count above {MAX_REPEAT} is not supported")
        return self.copies(lo, None if hi is sre.MAXREPEAT else hi, lambda: self.seq(items, where))

    def copies(self, lo: int, hi: int | None, make: Callable[[], tuple[int, int]]) -> tuple[int, int]:
        """lo to hi (None: any number of) fragments made by `make`, one after another."""
        start = end = self.state()
        for _ in range(lo):
            s, e = make()
            self.eps[end].append(s)
            end = e
        tail = self.state()
        if hi is None:  # then any number more
            s, e = make()
            self.eps[end] += [s, tail]
            self.eps[e] += [s, tail]
            return start, tail
        for _ in range(hi - lo):  # each optional copy may end the run
            self.eps[end].append(tail)
            s, e = make()
            self.eps[end].append(s)
            end = e
        self.eps[end].append(tail)
        return start, tail

    def closure(self, states: frozenset[int]) -> frozenset[int]:
        """The states `states` reach for free (kept: an NFA that changes must clear `_closures`)."""
        if states not in self._closures:
            todo, seen = list(states), set(states)
            while todo:
                for t in self.eps[todo.pop()]:
                    if t not in seen:
                        seen.add(t)
                        todo.append(t)
            self._closures[states] = frozenset(seen)
        return self._closures[states]


def _class(items: Any, where: str) -> Ranges:
    ranges: Ranges = []
    negate = False
    for op, av in items:
        if op is sre.NEGATE:
            negate = True
        elif op is sre.LITERAL:
            ranges.append((av, av))
        elif op is sre.RANGE:
            ranges.append(av)
        elif op is sre.CATEGORY and av in _CATEGORY:
            ranges += _CATEGORY[av]
        elif op is sre.CATEGORY and av in _NEGATED:
            ranges += _complement(_CATEGORY[_NEGATED[av]])
        else:
            raise ValueError(f"{where}: {str(av).lower()} is not supported in a character class")
    return _complement(ranges) if negate else ranges


def compile_dfa(pattern: str, where: str, writable: frozenset[int] = frozenset(range(256))) -> Dfa:
    """The DFA of `pattern` matched whole, over the `writable` bytes; ValueError names what is not built."""
    try:
        parsed = sre_parse.parse(pattern)
    except re.error as e:
        raise ValueError(f"{where} is not a valid regular expression: {e}") from None
    flags = parsed.state.flags & ~(sre.SRE_FLAG_UNICODE | sre.SRE_FLAG_VERBOSE | sre.SRE_FLAG_DOTALL)
    if flags:
        raise ValueError(f"{where}: flags (case-insensitive, ...) are not supported in a pattern")
    items = list(parsed)
    if items and items[0] == (sre.AT, sre.AT_BEGINNING) or items[:1] == [(sre.AT, sre.AT_BEGINNING_STRING)]:
        items = items[1:]
    if items and items[-1][0] is sre.AT and items[-1][1] in (sre.AT_END, sre.AT_END_STRING):
        items = items[:-1]
    if any(op is sre.AT for op, _ in items):
        raise ValueError(f"{where}: anchors are supported only at the pattern's ends")
    nfa = _Nfa(bool(parsed.state.flags & sre.SRE_FLAG_DOTALL), where)
    start, end = nfa.seq(items, where)
    return _determinize(nfa, start, end, writable, where)


def _determinize(nfa: _Nfa, start: int, end: int, writable: frozenset[int], where: str) -> Dfa:
    closure = nfa.closure
    ids = {closure(frozenset({start})): 0}
    trans: list[dict[int, frozenset[int]]] = []
    order = [next(iter(ids))]
    while len(trans) < len(order):
        edges = [e for s in order[len(trans)] for e in nfa.edges[s]]
        cuts = sorted({a for a, _, _ in edges} | {b + 1 for _, b, _ in edges})
        moves: dict[int, frozenset[int]] = {}
        for lo, hi in zip(cuts, cuts[1:]):  # bytes lo..hi-1 go to the same NFA states
            targets = frozenset(t for a, b, t in edges if a <= lo and hi - 1 <= b)
            if targets:
                moves.update(dict.fromkeys((byte for byte in range(lo, hi) if byte in writable), closure(targets)))
        trans.append(moves)
        for target in trans[-1].values():
            if target not in ids:
                ids[target] = len(order)
                order.append(target)
                if len(order) > MAX_DFA_STATES:
                    raise ValueError(f"{where} makes more than {MAX_DFA_STATES} states")
    # keep only the states from which a match can still end (a held answer never strands)
    into: list[list[int]] = [[] for _ in order]  # the states that go to each (reversed edges)
    for i, out in enumerate(trans):
        for t in set(out.values()):
            into[ids[t]].append(i)
    live = can_end((i for i, states in enumerate(order) if end in states), into.__getitem__)
    if 0 not in live:
        raise ValueError(f"{where} matches no string that can be written")
    renum = {old: new for new, old in enumerate(sorted(live))}
    table = [{b: renum[ids[t]] for b, t in trans[old].items() if ids[t] in live} for old in sorted(live)]
    return _minimal(table, {renum[i] for i in live if end in order[i]})


def _runs(out: dict[int, int]) -> list[tuple[int, int, int]]:
    """(first byte, last byte, target) of each run of consecutive bytes that go to one state."""
    runs: list[tuple[int, int, int]] = []
    for b in sorted(out):
        if runs and runs[-1][1] == b - 1 and runs[-1][2] == out[b]:
            runs[-1] = (runs[-1][0], b, out[b])
        else:
            runs.append((b, b, out[b]))
    return runs


def _minimal(trans: list[dict[int, int]], accept: set[int]) -> Dfa:
    """The same DFA with states that read alike merged (Moore's partition refinement): fewer grammar
    states, so fewer masks to walk."""
    runs = [_runs(out) for out in trans]  # (each state's runs of bytes that go to one state)
    shapes: dict[tuple[tuple[int, int], ...], int] = {}
    shape = [shapes.setdefault(tuple((lo, hi) for lo, hi, _ in r), len(shapes)) for r in runs]  # (a small id)
    targets = [[t for _, _, t in r] for r in runs]
    cls = [int(i in accept) for i in range(len(trans))]
    while True:  # (a state's key: its class, its runs, and their targets' classes; states whose runs
        # differ only where their targets are alike stay apart: larger than minimal, never wrong)
        keys: dict[tuple[Any, ...], int] = {}
        new = [keys.setdefault((cls[i], shape[i], tuple(map(cls.__getitem__, targets[i]))), len(keys))
               for i in range(len(trans))]  # fmt: skip
        if len(keys) == len(set(cls)):
            break
        cls = new
    first = {c: k for k, c in enumerate(dict.fromkeys([cls[0], *cls]))}  # (the start stays state 0)
    table: list[dict[int, int]] = [{} for _ in first]
    for i, out in enumerate(trans):
        table[first[cls[i]]] = {b: first[cls[t]] for b, t in out.items()}
    return Dfa(tuple(table), frozenset(first[cls[i]] for i in accept))
