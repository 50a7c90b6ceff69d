"""Where a GBNF grammar's recursion is read with the stack (engine/gbnf_grammar.py): its *brackets*,
and where it needs none: its *jumps*.

A byte grammar (engine/grammar_table.py) pushes where to return on one byte and pops on one byte.
So a rule that refers back to itself is built where its recursion is written between two
one-byte characters of one sequence: in `term ::= "(" ws expr ")" ws | num`, the `(` pushes where to
go after the `)`, and the `)` pops.  In each sequence of a recursive rule that mentions its own rules
(those it can reach and that reach it), the bracket is the nearest one-byte item before the first
such mention and the nearest after the last (else one around each mention that has them).  A
reference to one of its own rules at a rule's very end (`ws ::= [ ] ws | ""`, `factor ::= "-"
unary | num` with `unary ::= factor`) is a jump: nothing follows it, so it returns where the rule
returns and needs no stack.  Every other reference is written out in place, which ends only if those
references alone make no cycle: left recursion (`expr ::= expr "+" term`) and recursion without
brackets are refused, naming the rules.
"""

from __future__ import annotations

from spmd_serve.engine.gbnf_parse import Alt, Chars, Node, Ref, Rep, Seq, _refs, mentions


def one_byte(item: Node) -> list[tuple[int, int]] | None:
    """The byte ranges of an item that is one ASCII character (a bracket's end), else None."""
    item = _unwrap(item)
    if isinstance(item, Chars) and item.ranges and item.ranges[-1][1] < 0x80:
        return list(item.ranges)
    return None


def _cycles(graph: dict[str, list[str]]) -> dict[str, frozenset[str]]:
    """Each rule's strongly connected component of a reference graph (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comp: dict[str, frozenset[str]] = {}
    for root in graph:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on.add(v)
            if i < len(graph[v]):
                work.append((v, i + 1))
                w = graph[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                members: list[str] = []
                while not members or members[-1] != v:
                    members.append(stack.pop())
                    on.discard(members[-1])
                comp.update(dict.fromkeys(members, frozenset(members)))
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
    return comp


def _unwrap(item: Node) -> Node:
    """The item a group of one item holds."""
    while isinstance(item, Seq) and len(item.items) == 1:
        item = item.items[0]
    return item


class NoMoreChoices(Exception):
    """A sequence's choices of brackets are all tried."""


def _spans(items: list[Node], own: list[int], pick: int) -> list[tuple[int, int]]:
    """A sequence's brackets around its items at `own` (its rule's recursion), its `pick`-th choice:
    one around them all (the nearest first, then wider, the opening end first), else one around each
    it can (the others may be brackets of their own inside)."""
    one = [k for k, item in enumerate(items) if one_byte(item)]
    opens, closes = [k for k in one if k < own[0]], [k for k in one if k > own[-1]]
    choices = [[(o, c)] for o in reversed(opens) for c in closes]
    if pick >= max(len(choices), 1):
        raise NoMoreChoices
    if choices:
        return choices[pick]
    spans: list[tuple[int, int]] = []
    for m in own:
        after = spans[-1][1] if spans else -1
        opens, closes = [k for k in one if after < k < m], [k for k in one if k > m]
        if m > after and opens and closes:
            spans.append((opens[-1], closes[0]))
    return spans


def brackets(
    rules: dict[str, Node], where: str, choice: dict[Seq, int]
) -> tuple[dict[Seq, list[tuple[int, int]]], set[Ref]]:
    """(the brackets: sequence -> its (opening index, closing index) spans, in order, its `choice`-th
    (default 0); the jumps: a rule's references to its own rules at its very end); ValueError where
    the other references outside brackets make a cycle, NoMoreChoices past a sequence's last."""
    comp = _cycles({name: sorted(set(_refs(node))) for name, node in rules.items()})
    found: dict[Seq, list[tuple[int, int]]] = {}
    jumps: set[Ref] = set()
    plain: dict[str, set[str]] = {name: set() for name in rules}  # the references outside brackets

    def visit(node: Node, rule: str, inside: bool, tail: bool) -> None:
        if isinstance(node, Ref):
            if tail and node.name in comp[rule] and recursive(rule):
                jumps.add(node)
            elif not inside:
                plain[rule].add(node.name)
        elif isinstance(node, Rep):  # (an optional item ends where the repeat ends)
            visit(node.item, rule, inside, tail and (node.lo, node.hi) in ((0, 1), (1, 1)))
        elif isinstance(node, Alt):
            for item in node.items:
                visit(item, rule, inside, tail)
        elif isinstance(node, Seq):
            own = [k for k, item in enumerate(node.items) if any(n in comp[rule] for n in _refs(item))]
            spans = _spans(node.items, own, choice.get(node, 0)) if own and recursive(rule) and not inside else []
            if spans:
                found[node] = spans
            spans = found.get(node, [])
            for k, item in enumerate(node.items):
                within = any(a < k < b for a, b in spans)
                visit(item, rule, inside or within, tail and k == len(node.items) - 1 and not within)

    def recursive(rule: str) -> bool:
        return len(comp[rule]) > 1 or rule in _refs(rules[rule])

    for name, node in rules.items():
        visit(node, name, False, True)
    jumped: dict[str, set[str]] = {name: set() for name in rules}
    for name, node in rules.items():
        jumped[name] = {r.name for r in mentions(node) if r in jumps}
    _acyclic(plain, jumped, where)
    return found, jumps


def _acyclic(plain: dict[str, set[str]], jumped: dict[str, set[str]], where: str) -> None:
    """ValueError naming a cycle of references outside brackets that is not jumps alone (each copy of
    a rule written out in place would write out another), if there is one."""
    comp = _cycles({name: sorted(plain[name] | jumped[name]) for name in plain})
    for u in sorted(plain):
        for v in sorted(plain[u]):
            if v in comp[u]:  # (then back from v to u, breadth first)
                came = {v: v}
                todo = [v]
                for w in todo:
                    todo += [x for x in sorted(plain[w] | jumped[w]) if x in comp[u] and x not in came]
                    came.update({x: w for x in plain[w] | jumped[w] if x in comp[u] and x not in came})
                path = [u]
                while path[-1] != v:
                    path.append(came[path[-1]])
                cycle = " -> ".join([u, *reversed(path)])
                raise ValueError(
                    f"{where}: the rules refer back to themselves ({cycle}) without one-character brackets "
                    'around the recursion, such as "(" ... ")": not built (a left recursion, or a recursion '
                    "a byte grammar cannot read with its stack)"
                )
