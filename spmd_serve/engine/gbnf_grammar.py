"""vLLM's guided_grammar: an answer held to a GBNF grammar (engine/gbnf_parse.py) as a byte grammar
(engine/grammar_table.py), so the masks (engine/json_masks.py) walk it as they walk a JSON schema's.

The rules are written out in place as a Thompson NFA over bytes (characters as their UTF-8 byte
sequences, engine/regex_dfa.py), a jump of engine/gbnf_brackets.py as an edge to its rule's start in
the same copy, and at the brackets: a bracket's
opening byte is a *push* edge (into its inside, built once, remembering where to go after it) and
its closing byte, where its inside may end, a *pop*.  Subset construction then makes one table:
a state is a set of NFA positions of one inside (or of the answer's top level).  The stack must be
known byte by byte: where a byte would push and also be read another way (`return (x);` as a call of
a function named `return`, or a return of `(x)`), that push is written out in place instead, one
level deep, and the table made again (at most MAX_UNROLLS times); a pop read another way too is
refused, naming the bytes written before it.  Only states from which the answer (or
the inside, to its closing byte) can still end are kept, so an answer never strands.
"""

from __future__ import annotations

import functools
import itertools

from spmd_serve.engine import gbnf_brackets
from spmd_serve.engine.gbnf_parse import Alt, Chars, Node, Ref, Rep, Seq, parse
from spmd_serve.engine.grammar_table import MAX_STATES, POP_NAME, Edges, Grammar, Name
from spmd_serve.engine.regex_dfa import _Nfa

MAX_DEPTH = 200  # rules written out within rules (a deeper chain is refused, not a RecursionError)
MAX_UNROLLS = 64  # brackets written out in place where a byte would push and be read otherwise too
Move = tuple[str, int, int]  # a table row's way for a byte (_Table)
Copy = tuple[dict[str, int], int]  # a rule written out in place: (its rules' starts in it, its end)
Push = tuple[int, int, int, int]  # (lo byte, hi byte, bracket id, the NFA state after its closing byte)


class _Builder(_Nfa):
    """The NFA: `eps`/`edges` as a regular expression's, plus `pushes[s]` and `closes[s]` (byte ranges
    that close the inside ending at s); `insides[b]`: bracket b's (start, end)."""

    def __init__(self, rules: dict[str, Node], where: str) -> None:
        super().__init__(True, where)
        self.rules = rules
        self.found, self.jumps = gbnf_brackets.brackets(rules, where)
        self.pushes: list[list[Push]] = []
        self.closes: list[list[tuple[int, int]]] = []
        self.ids: dict[tuple[Seq, int], int] = {}  # (a bracket's sequence, its opening index) -> its id
        self.insides: list[tuple[int, int]] = []
        self.made: list[tuple[Seq, tuple[int, int], int]] = []  # bracket id -> (its sequence, span, depth)

    def state(self) -> int:
        self.pushes.append([])
        self.closes.append([])
        return super().state()

    def rule(self, name: str, depth: int = 0) -> tuple[int, int]:
        """A fresh copy of rule `name` written out in place, with the rules it jumps to (each made
        once in this copy, all ending where it ends)."""
        end = self.state()
        return self._enter(name, ({}, end), depth), end

    def _enter(self, name: str, copy: Copy, depth: int) -> int:
        """Rule `name`'s start in `copy` (made there the first time)."""
        made, end = copy
        if name not in made:
            made[name] = self.state()
            s, e = self.node(self.rules[name], depth, copy)
            self.eps[made[name]].append(s)
            self.eps[e].append(end)
        return made[name]

    def node(self, node: Node, depth: int = 0, copy: Copy | None = None) -> tuple[int, int]:
        """`node`'s fragment (start, end); `copy`: the rule copy it is in, where its jumps go."""
        if depth > MAX_DEPTH:
            raise ValueError(f"{self.where}: rules nest more than {MAX_DEPTH} deep")
        if isinstance(node, Chars):
            return self.chars(node.ranges)
        if isinstance(node, Ref):
            if node in self.jumps and copy is not None:  # (its end is never reached: the jump's target ends the copy)
                return self._enter(node.name, copy, depth + 1), self.state()
            return self.rule(node.name, depth + 1)
        if isinstance(node, Alt):
            start, end = self.state(), self.state()
            for item in node.items:
                s, e = self.node(item, depth, copy)
                self.eps[start].append(s)
                self.eps[e].append(end)
            return start, end
        if isinstance(node, Rep):
            return self._repeat(node, depth, copy)
        return self._seq(node, depth, copy)

    def _seq(self, node: Seq, depth: int, copy: Copy | None = None) -> tuple[int, int]:
        start = end = self.state()
        spans = {a: b for a, b in self.found.get(node, [])}
        k = 0
        while k < len(node.items):
            if k in spans:
                span = (k, spans[k])
                after = self.state()
                b = self._inside(node, span, depth)
                for lo, hi in gbnf_brackets.one_byte(node.items[k]) or ():
                    self.pushes[end].append((lo, hi, b, after))
                end, k = after, span[1] + 1
                continue
            s, e = self.node(node.items[k], depth, copy)
            self.eps[end].append(s)
            end, k = e, k + 1
        return start, end

    def _inside(self, node: Seq, span: tuple[int, int], depth: int) -> int:
        """Bracket `node`'s inside, built once: its id."""
        key = (node, span[0])
        if key not in self.ids:
            self.ids[key] = len(self.insides)
            self.insides.append((0, 0))
            self.made.append((node, span, depth))
            s, e = self._seq(Seq(node.items[span[0] + 1 : span[1]]), depth)
            self.closes[e] += gbnf_brackets.one_byte(node.items[span[1]]) or []
            self.insides[self.ids[key]] = (s, e)
        return self.ids[key]

    def unroll(self, site: int, b: int, after: int) -> None:
        """Bracket b's push at NFA state `site` written out in place instead: its opening byte, its
        inside one level deep (whose own brackets still push) and its closing byte."""
        node, (first, last), depth = self.made[b]
        self.pushes[site] = [p for p in self.pushes[site] if p[2:] != (b, after)]
        s, e = self._seq(Seq(node.items[first : last + 1]), depth)  # (a new sequence: no bracket of its own)
        self.eps[site].append(s)
        self.eps[e].append(after)

    def _repeat(self, node: Rep, depth: int, copy: Copy | None) -> tuple[int, int]:
        start = end = self.state()
        for _ in range(node.lo):
            s, e = self.node(node.item, depth, copy)
            self.eps[end].append(s)
            end = e
        tail = self.state()
        if node.hi is None:
            s, e = self.node(node.item, depth, copy)
            self.eps[end] += [s, tail]
            self.eps[e] += [s, tail]
            return start, tail
        for _ in range(node.hi - node.lo):
            self.eps[end].append(tail)
            s, e = self.node(node.item, depth, copy)
            self.eps[end].append(s)
            end = e
        self.eps[end].append(tail)
        return start, tail


class _Unroll(Exception):
    """A byte that would push and also be read otherwise: the pushes to write out (site, bracket, after)."""

    def __init__(self, message: str, sites: list[tuple[int, int, int]], made: int) -> None:
        super().__init__(message)
        self.sites, self.made = sites, made  # (made: the states made before it)


class _Table:
    """The NFA made deterministic: rows[i] byte -> ("n", state, -1) | ("p", inside's start, return) |
    ("c", -1, -1) (a pop)."""

    def __init__(self, nfa: _Builder, start: int, accept: int) -> None:
        self.nfa, self.accept = nfa, accept
        self._closures: dict[frozenset[int], frozenset[int]] = {}
        self.sets: list[frozenset[int]] = []
        self.ids: dict[frozenset[int], int] = {}
        # (state, byte) it was first reached by, (state, opening byte, closing byte) for a state first
        # reached as where a bracket returns to: a refusal's example
        self.came: list[tuple[int, ...]] = []
        self.rows: list[dict[int, Move]] = []
        self._add(self._closure(frozenset({start})), (-1, 0))
        while len(self.rows) < len(self.sets):
            self.rows.append(self._row(len(self.rows)))

    def _closure(self, states: frozenset[int]) -> frozenset[int]:
        if states not in self._closures:
            todo, seen = list(states), set(states)
            while todo:
                for t in self.nfa.eps[todo.pop()]:
                    if t not in seen:
                        seen.add(t)
                        todo.append(t)
            self._closures[states] = frozenset(seen)
        return self._closures[states]

    def _add(self, states: frozenset[int], came: tuple[int, ...]) -> int:
        if states not in self.ids:
            if len(self.sets) >= MAX_STATES:
                raise ValueError(f"{self.nfa.where} makes more than {MAX_STATES} grammar states")
            self.ids[states] = len(self.sets)
            self.sets.append(states)
            self.came.append(came)
        return self.ids[states]

    def written(self, i: int) -> str:
        """The text first found to reach state i (a bracket's inside as "…")."""
        out: list[bytes] = []
        while self.came[i][0] >= 0:
            i, *read = self.came[i]
            out.append(bytes(read) if len(read) == 1 else bytes([read[0]]) + "…".encode() + bytes([read[1]]))
        return b"".join(reversed(out)).decode("utf-8", "replace")

    def _row(self, i: int) -> dict[int, Move]:
        nfa, members = self.nfa, self.sets[i]
        moves = [(lo, hi, ("n", t, -1)) for s in members for lo, hi, t in nfa.edges[s]]
        moves += [(lo, hi, ("p", b, after)) for s in members for lo, hi, b, after in nfa.pushes[s]]
        moves += [(lo, hi, ("c", -1, -1)) for s in members for lo, hi in nfa.closes[s]]
        cuts = sorted({lo for lo, _, _ in moves} | {hi + 1 for _, hi, _ in moves})
        row: dict[int, Move] = {}
        for lo, hi in zip(cuts, cuts[1:]):  # bytes lo..hi-1 are read alike
            ways = [m for a, b, m in moves if a <= lo and hi - 1 <= b]
            if not ways:
                continue
            kinds = {m[0] for m in ways} | {f"p{m[1]}" for m in ways if m[0] == "p"}
            if len(kinds) > 1 + ("p" in kinds):
                message = (
                    f"{nfa.where}: after {self.written(i)[-40:]!r}, the byte {bytes([lo])!r} may open or close a "
                    "bracket of the grammar's recursion and also be read another way: not built (the stack must be "
                    "known at every byte; write the grammar so that it is)"
                )
                if "c" in kinds:
                    raise ValueError(message)
                sites = [(s, *p[2:]) for s in members for p in nfa.pushes[s] if p[0] <= lo <= p[1]]
                raise _Unroll(message, sites, len(self.sets))
            kind = ways[0][0]
            if kind == "n":
                target = self._closure(frozenset(m[1] for m in ways))
                move: Move = ("n", self._add(target, (i, lo)), -1)
            elif kind == "p":
                inside = self._closure(frozenset({nfa.insides[ways[0][1]][0]}))
                back = self._closure(frozenset(m[2] for m in ways))
                close = nfa.closes[nfa.insides[ways[0][1]][1]][0][0]
                move = ("p", self._add(inside, (i, lo)), self._add(back, (i, lo, close)))
            else:
                move = ("c", -1, -1)
            row.update(dict.fromkeys(range(lo, hi), move))
        return row

    def live(self) -> set[int]:
        """The states from which the answer can end, or (inside a bracket) its closing byte come:
        found backwards from those that can at once (a push's way needs its inside's start and its
        return state both)."""
        into: dict[int, list[int]] = {}  # t -> the states with a byte to t
        pairs: dict[int, list[tuple[int, int]]] = {}  # t -> (a state pushing with t, the push's other state)
        todo = []
        for i, row in enumerate(self.rows):
            for kind, a, b in set(row.values()):
                if kind == "n":
                    into.setdefault(a, []).append(i)
                elif kind == "p":
                    pairs.setdefault(a, []).append((i, b))
                    pairs.setdefault(b, []).append((i, a))
            if self.accept in self.sets[i] or any(m[0] == "c" for m in row.values()):
                todo.append(i)
        good = set(todo)
        while todo:
            t = todo.pop()
            for i in [*into.get(t, ()), *(i for i, other in pairs.get(t, ()) if other in good)]:
                if i not in good:
                    good.add(i)
                    todo.append(i)
        return good


@functools.lru_cache(maxsize=64)
def answer_grammar(text: str, where: str = "guided_grammar") -> Grammar:
    """The grammar of an answer that is one match of GBNF `text`'s `root` rule; ValueError names what
    is not built or wrong (the grammar named `where`)."""
    nfa = _Builder(parse(text, where), where)
    start, accept = nfa.rule("root")
    made = 0
    for unrolled in itertools.count():
        try:
            table = _Table(nfa, start, accept)
            break
        except _Unroll as e:  # (then made again from the start: the rows before it read the old NFA)
            made += e.made
            if unrolled == MAX_UNROLLS or made > 2 * MAX_STATES:
                raise ValueError(str(e)) from None
            for site in e.sites:
                nfa.unroll(*site)
    live = table.live()
    if 0 not in live:
        raise ValueError(f"{where} matches no string: its root never ends")

    def edges(name: Name) -> Edges:
        out: Edges = {}
        for b, m in table.rows[name[1]].items():
            if m[0] == "c":
                out[b] = (POP_NAME, None)
            elif m[1] in live and (m[0] == "n" or m[2] in live):
                out[b] = (("gb", m[1]), None if m[0] == "n" else ("gb", m[2]))
        return out

    return Grammar(edges, ("gb", 0), lambda name: accept in table.sets[name[1]])
