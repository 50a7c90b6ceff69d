"""A GBNF grammar's rules (engine/gbnf_parse.py) as a Thompson NFA over bytes, for engine/gbnf_table.py
to make one table: characters as their UTF-8 byte sequences (engine/regex_dfa.py), each reference
written out in place as a copy of its rule, a jump (engine/gbnf_brackets.py) as an edge to its rule's
start in the same copy, and each bracket's opening byte a *push* edge into its inside (built once,
remembering the NFA state after its closing byte), its closing byte, where the inside may end, a
*close*.  `unroll` writes one push out in place instead, one level deep.
"""

from __future__ import annotations

from spmd_serve.engine import gbnf_brackets
from spmd_serve.engine.gbnf_parse import Alt, Chars, Node, Ref, Rep, Seq
from spmd_serve.engine.regex_dfa import _Nfa

MAX_DEPTH = 64  # rules written out within rules (a deeper chain is refused, before a RecursionError)
Copy = tuple[dict[str, int], int]  # a rule written out in place: (its rules' starts in it, its end)
Push = tuple[int, int, int, int]  # (lo byte, hi byte, bracket id, the NFA state after its closing byte)


class GbnfNfa(_Nfa):
    """The NFA: `eps`/`edges` as a regular expression's, plus `pushes[s]` and `closes[s]` (byte ranges
    that close the inside ending at s); `insides[b]`: bracket b's (start, end)."""

    def __init__(self, rules: dict[str, Node], where: str, choice: dict[Seq, int]) -> None:
        super().__init__(True, where)
        self.rules = rules
        self.found, self.jumps = gbnf_brackets.brackets(rules, where, choice)
        self.closing: dict[int, int] = {}  # an inside's end state -> its bracket's id
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
            self.closing[e] = self.ids[key]
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
        self._closures.clear()  # (the closures read the old edges)

    def _repeat(self, node: Rep, depth: int, copy: Copy | None) -> tuple[int, int]:
        return self.copies(node.lo, node.hi, lambda: self.node(node.item, depth, copy))
