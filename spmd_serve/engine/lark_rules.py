"""What a Lark grammar's definitions (engine/lark_parse.py) make for engine/gbnf_grammar.py: the
rules and terminals the answer reaches, `%ignore`'s items allowed before the answer and after each
token written in a rule (a literal, a regex or a terminal: as Lark's lexer skips them between tokens),
and the answer's rule: `start`, else the first rule (as vLLM reads a Lark grammar).
"""

from __future__ import annotations

from typing import Protocol

from spmd_serve.engine.gbnf_parse import Alt, Node, Ref, Rep, Seq, mentions

IGNORE, START = "%ignore", "%start"  # (rule names no grammar can write)


class _Reader(Protocol):
    def fail(self, what: str) -> ValueError: ...


def is_terminal(name: str) -> bool:
    return name.lstrip("_")[:1].isupper()


class Definitions:
    """The definitions read so far, the tokens written in rules, the %ignore items and the imports."""

    def __init__(self, where: str) -> None:
        self.defs: dict[str, Node] = {}
        self.tokens: set[Node] = set()  # (the node after which an ignored run may come)
        self.ignores: list[Node] = []
        self.where = where

    def define(self, r: _Reader, name: str, node: Node) -> None:
        if name in self.defs:
            raise r.fail(f"{name!r} is defined twice")
        self.defs[name] = node

    def token(self, node: Node, in_rule: bool) -> Node:
        """`node`, noted as a token where it is written in a rule (an ignored run may follow it)."""
        if in_rule:
            self.tokens.add(node)
        return node


def finish(g: Definitions, common: dict[str, Node]) -> tuple[dict[str, Node], str]:
    """The rules the answer reaches, with the ignored runs after each token; the answer's name."""
    rules = [n for n in g.defs if not is_terminal(n)]
    if not rules:
        raise ValueError(f"{g.where}: no rule (a lowercase name) to start from")
    start = "start" if "start" in g.defs else rules[0]
    defs = {**{"common." + k: v for k, v in common.items()}, **g.defs}
    for name, node in [*g.defs.items(), *(("%ignore", item) for item in g.ignores)]:
        for ref in mentions(node):
            if ref.name not in defs:
                raise ValueError(f"{g.where}: {name!r} refers to {ref.name!r}, which is not defined")
            if is_terminal(name) and not is_terminal(ref.name.removeprefix("common.")):
                raise ValueError(f"{g.where}: terminal {name!r} refers to the rule {ref.name!r}")
    if g.ignores:
        for name in rules:
            defs[name] = _ignoring(defs[name], g.tokens)
        defs[IGNORE] = g.ignores[0] if len(g.ignores) == 1 else Alt(g.ignores)
        defs[START] = Seq([Rep(Ref(IGNORE), 0, None), Ref(start)])
        start = START
    reached, todo = {start}, [start]
    while todo:
        for ref in mentions(defs[todo.pop()]):
            if ref.name not in reached:
                reached.add(ref.name)
                todo.append(ref.name)
    return {name: defs[name] for name in defs if name in reached}, start


def _ignoring(node: Node, tokens: set[Node]) -> Node:
    """`node` with an ignored run (`%ignore`'s items, any number) after each of its tokens."""
    if isinstance(node, Seq):
        items: list[Node] = []
        for item in node.items:
            items.append(_ignoring(item, tokens))
            if item in tokens:
                items.append(Rep(Ref(IGNORE), 0, None))
        node.items = items
    elif isinstance(node, Alt):
        node.items = [_ignoring(item, tokens) for item in node.items]
    elif isinstance(node, Rep):
        node.item = _ignoring(node.item, tokens)
        if node.item in tokens:
            node.item = Seq([node.item, Rep(Ref(IGNORE), 0, None)])
    return node
