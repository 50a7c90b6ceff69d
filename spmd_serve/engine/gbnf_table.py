"""A GBNF grammar's NFA (engine/gbnf_nfa.py) made one table by subset construction: a state is a set
of NFA positions of one bracket's inside (or of the answer's top level), and each byte of a row is
read one way: on in the same inside, a push (into an inside, and where it returns to) or a pop.  A
byte read two ways at once is refused by the exceptions below, which engine/gbnf_grammar.py answers
by writing pushes out in place (`Unroll`) or by another choice of brackets (`Rebracket`).
"""

from __future__ import annotations

from spmd_serve.engine.gbnf_nfa import GbnfNfa
from spmd_serve.engine.gbnf_parse import Seq
from spmd_serve.engine.grammar_table import MAX_STATES

Move = tuple[str, int, int]  # a row's way for a byte: ("n", state, -1) | ("p", inside's start, return) | ("c", -1, -1)


class Unroll(Exception):
    """A byte that would push and also be read otherwise: the pushes to write out (site, bracket, after)."""

    def __init__(self, message: str, sites: list[tuple[int, int, int]], made: int) -> None:
        super().__init__(message)
        self.sites, self.made = sites, made  # (made: the states made before it)


class Rebracket(Exception):
    """A byte that would pop and also be read otherwise: the sequence whose bracket pops there."""

    def __init__(self, message: str, seq: Seq, made: int) -> None:
        super().__init__(message)
        self.seq, self.made = seq, made  # (made: the states made before it)


class Table:
    """The NFA made deterministic: rows[i] byte -> ("n", state, -1) | ("p", inside's start, return) |
    ("c", -1, -1) (a pop)."""

    def __init__(self, nfa: GbnfNfa, start: int, accept: int) -> None:
        self.nfa, self.accept = nfa, accept
        self.sets: list[frozenset[int]] = []
        self.ids: dict[frozenset[int], int] = {}
        # (state, byte) it was first reached by, (state, opening byte, closing byte) for a state first
        # reached as where a bracket returns to: a refusal's example
        self.came: list[tuple[int, ...]] = []
        self.rows: list[dict[int, Move]] = []
        self._add(self.nfa.closure(frozenset({start})), (-1, 0))
        while len(self.rows) < len(self.sets):
            self.rows.append(self._row(len(self.rows)))

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
                    closing = next(s for s in members if any(a <= lo <= b for a, b in nfa.closes[s]))
                    raise Rebracket(message, nfa.made[nfa.closing[closing]][0], len(self.sets))
                sites = [(s, *p[2:]) for s in members for p in nfa.pushes[s] if p[0] <= lo <= p[1]]
                raise Unroll(message, sites, len(self.sets))
            kind = ways[0][0]
            if kind == "n":
                target = self.nfa.closure(frozenset(m[1] for m in ways))
                move: Move = ("n", self._add(target, (i, lo)), -1)
            elif kind == "p":
                inside = self.nfa.closure(frozenset({nfa.insides[ways[0][1]][0]}))
                back = self.nfa.closure(frozenset(m[2] for m in ways))
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
