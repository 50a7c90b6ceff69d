"""An independent reader of a parsed GBNF grammar (spmd_serve/engine/gbnf_parse.py's rules), for the
tests of engine/gbnf_grammar.py: `accepts` reads a text by the rules themselves (the set of positions
each node can end at, no automaton, no stack, no rewriting), and `derive` writes a random text of a
rule by choosing among its alternatives and counts."""

from __future__ import annotations

import random

from spmd_serve.engine.gbnf_parse import Alt, Chars, Node, Ref, Rep, Seq

INF = 1 << 30


class Oracle:
    def __init__(self, rules: dict[str, Node]) -> None:
        self.rules = rules
        self.cost = _min_lengths(rules)

    def accepts(self, data: bytes, rule: str = "root") -> bool:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        memo: dict[tuple[int, int], frozenset[int]] = {}
        return len(text) in self._ends(self.rules[rule], text, 0, memo)

    def _ends(self, node: Node, text: str, i: int, memo: dict[tuple[int, int], frozenset[int]]) -> frozenset[int]:
        key = (id(node), i)
        if key in memo:
            return memo[key]
        memo[key] = frozenset()  # (a left recursion reads nothing more: the tested grammars have none)
        out: set[int] = set()
        if isinstance(node, Chars):
            if i < len(text) and any(lo <= ord(text[i]) <= hi for lo, hi in node.ranges):
                out.add(i + 1)
        elif isinstance(node, Ref):
            out |= self._ends(self.rules[node.name], text, i, memo)
        elif isinstance(node, Alt):
            for item in node.items:
                out |= self._ends(item, text, i, memo)
        elif isinstance(node, Seq):
            at = {i}
            for item in node.items:
                at = {e for p in at for e in self._ends(item, text, p, memo)}
            out |= at
        else:
            assert isinstance(node, Rep)
            at, seen, n = {i}, {i}, 0
            out |= at if node.lo == 0 else set()
            while at and (node.hi is None or n < node.hi):
                at = {e for p in at for e in self._ends(node.item, text, p, memo)}
                n += 1
                if node.hi is None:
                    at -= seen
                    seen |= at
                if n >= node.lo:
                    out |= at
        memo[key] = frozenset(out)
        return memo[key]

    def derive(self, rng: random.Random, rule: str = "root", depth: int = 12) -> str:
        return self._derive(self.rules[rule], rng, depth)

    def _derive(self, node: Node, rng: random.Random, depth: int) -> str:
        if isinstance(node, Chars):
            lo, hi = rng.choice(node.ranges)
            code = rng.randint(lo, min(hi, lo + 300) if rng.random() < 0.8 else hi)
            return chr(code) if not 0xD800 <= code <= 0xDFFF else chr(lo)
        if isinstance(node, Ref):
            return self._derive(self.rules[node.name], rng, depth - 1)
        if isinstance(node, Seq):
            return "".join(self._derive(item, rng, depth) for item in node.items)
        if isinstance(node, Alt):
            ok = [a for a in node.items if self._cost(a) < INF]
            pick = rng.choice(ok) if depth > 0 else min(ok, key=self._cost)
            return self._derive(pick, rng, depth)
        assert isinstance(node, Rep)
        most = node.lo if depth <= 0 else min(node.hi if node.hi is not None else node.lo + 3, node.lo + 3)
        return "".join(self._derive(node.item, rng, depth - 1) for _ in range(rng.randint(node.lo, most)))

    def _cost(self, node: Node) -> int:
        return _cost(node, self.cost)


def _cost(node: Node, rules: dict[str, int]) -> int:
    """The fewest characters `node` can be (INF: none)."""
    if isinstance(node, Chars):
        return 1 if node.ranges else INF
    if isinstance(node, Ref):
        return rules[node.name]
    if isinstance(node, Seq):
        return min(INF, sum(_cost(i, rules) for i in node.items))
    if isinstance(node, Alt):
        return min((_cost(i, rules) for i in node.items), default=INF)
    assert isinstance(node, Rep)
    return 0 if node.lo == 0 else min(INF, node.lo * _cost(node.item, rules))


def _min_lengths(rules: dict[str, Node]) -> dict[str, int]:
    cost = dict.fromkeys(rules, INF)
    while True:
        new = {name: _cost(node, cost) for name, node in rules.items()}
        if new == cost:
            return cost
        cost = new
