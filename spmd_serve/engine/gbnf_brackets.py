"""Where a GBNF grammar's recursion is read with the stack (engine/gbnf_grammar.py): its *brackets*.

A byte grammar (engine/grammar_table.py) pushes where to return on one byte and pops on one byte.
So a rule that refers back to itself is built where its recursion is written between two
one-byte characters of one sequence: in `term ::= "(" ws expr ")" ws | num`, the `(` pushes where to
go after the `)`, and the `)` pops.  In each sequence of a recursive rule that mentions its own rules
(those it can reach and that reach it), the bracket is the nearest one-byte item before the first
such mention and the nearest after the last (else one around each mention that has them).  Every
other reference is written out in place, which
ends only if those references alone make no cycle: left recursion (`expr ::= expr "+" term`) and
recursion without such brackets are refused, naming the rules.
"""

from __future__ import annotations

from spmd_serve.engine.gbnf_parse import Alt, Chars, Node, Ref, Rep, Seq, _refs


def one_byte(item: Node) -> list[tuple[int, int]] | None:
    """The byte ranges of an item that is one ASCII character (a bracket's end), else None."""
    item = _unwrap(item)
    if isinstance(item, Chars) and item.ranges and item.ranges[-1][1] < 0x80:
        return list(item.ranges)
    return None


def _cycles(rules: dict[str, Node]) -> dict[str, frozenset[str]]:
    """Each rule's strongly connected component of the reference graph (Tarjan's, iterative)."""
    graph = {name: sorted(set(_refs(node))) for name, node in rules.items()}
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


def untail(rules: dict[str, Node]) -> dict[str, Node]:
    """The rules with a rule's own name at the end of its alternatives read as a loop: `x ::= a x | b`
    as `x ::= a* b` (`ws ::= [ ] ws | ""`, `ws ::= ([ ] ws)?`), needing no stack."""
    out = dict(rules)
    for name, node in rules.items():
        node = _unwrap(node)
        alts = [_unwrap(a) for a in node.items] if isinstance(node, Alt) else [node]
        if len(alts) == 1 and isinstance(node, Rep) and (node.lo, node.hi) == (0, 1):
            alts = [_unwrap(node.item), Seq([])]
        tails = [a for a in alts if isinstance(a, Seq) and a.items and _is_ref(a.items[-1], name)]
        if tails:
            ends = [a for a in alts if a not in tails]
            loop: list[Node] = [Seq(a.items[:-1]) for a in tails if isinstance(a, Seq)]
            out[name] = Seq([Rep(Alt(loop) if len(loop) > 1 else loop[0], 0, None), Alt(ends) if ends else Chars([])])
    return out


def _unwrap(item: Node) -> Node:
    """The item a group of one item holds."""
    while isinstance(item, Seq) and len(item.items) == 1:
        item = item.items[0]
    return item


def _is_ref(item: Node, name: str) -> bool:
    item = _unwrap(item)
    return isinstance(item, Ref) and item.name == name


def _spans(items: list[Node], own: list[int]) -> list[tuple[int, int]]:
    """A sequence's brackets around its items at `own` (its rule's recursion): one around them all,
    else one around each it can (the others may be brackets of their own inside)."""
    one = [k for k, item in enumerate(items) if one_byte(item)]
    opens, closes = [k for k in one if k < own[0]], [k for k in one if k > own[-1]]
    if opens and closes:
        return [(opens[-1], closes[0])]
    spans: list[tuple[int, int]] = []
    for m in own:
        after = spans[-1][1] if spans else -1
        opens, closes = [k for k in one if after < k < m], [k for k in one if k > m]
        if m > after and opens and closes:
            spans.append((opens[-1], closes[0]))
    return spans


def brackets(rules: dict[str, Node], where: str) -> dict[Seq, list[tuple[int, int]]]:
    """The brackets (sequence -> its (opening index, closing index) spans, in order); ValueError
    where the references outside them make a cycle."""
    comp = _cycles(rules)
    found: dict[Seq, list[tuple[int, int]]] = {}
    plain: dict[str, set[str]] = {name: set() for name in rules}  # the references outside brackets

    def visit(node: Node, rule: str, inside: bool) -> None:
        if isinstance(node, Ref):
            if not inside:
                plain[rule].add(node.name)
        elif isinstance(node, Rep):
            visit(node.item, rule, inside)
        elif isinstance(node, Alt):
            for item in node.items:
                visit(item, rule, inside)
        elif isinstance(node, Seq):
            own = [k for k, item in enumerate(node.items) if any(n in comp[rule] for n in _refs(item))]
            recursive = len(comp[rule]) > 1 or rule in _refs(rules[rule])
            if own and recursive and not inside and _spans(node.items, own):
                found[node] = _spans(node.items, own)
            spans = found.get(node, [])
            for k, item in enumerate(node.items):
                visit(item, rule, inside or any(a < k < b for a, b in spans))

    for name, node in rules.items():
        visit(node, name, False)
    _acyclic(plain, where)
    return found


def _acyclic(plain: dict[str, set[str]], where: str) -> None:
    """ValueError naming a cycle of references outside brackets, if there is one."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    for root in plain:
        path: list[str] = []
        work = [(root, iter(sorted(plain[root])))] if root not in state else []
        if work:
            state[root] = 1
            path.append(root)
        while work:
            v, out = work[-1]
            w = next(out, None)
            if w is None:
                state[v] = 2
                path.pop()
                work.pop()
            elif state.get(w) == 1:
                cycle = " -> ".join([*path[path.index(w) :], w])
                raise ValueError(
                    f"{where}: the rules refer back to themselves ({cycle}) without one-character brackets "
                    'around the recursion, such as "(" ... ")": not built (a left recursion, or a recursion '
                    "a byte grammar cannot read with its stack)"
                )
            elif w not in state:
                state[w] = 1
                path.append(w)
                work.append((w, iter(sorted(plain[w]))))
