"""vLLM's guided_grammar: an answer held to a GBNF grammar (engine/gbnf_parse.py) or a Lark grammar
(engine/lark_parse.py) as a byte grammar (engine/grammar_table.py), so the masks (engine/json_masks.py)
walk it as they walk a JSON schema's.  A rule whose alternatives begin with itself (`sum: sum "+" product
| product`, as Lark grammars are often written) is read as its other alternatives followed by any number
of the rest: the same strings, with no left recursion.

Its recursion is read with the stack at brackets and needs none at jumps (engine/gbnf_brackets.py);
the rules become an NFA (engine/gbnf_nfa.py) and that one table (engine/gbnf_table.py).  The stack
must be known byte by byte.  Where a byte would push and also be read another way (`return (x);` as a
call of a function named `return`, or a return of `(x)`), that push is written out in place instead,
one level deep, and the table made again (at most MAX_UNROLLS times).  Where a pop would also be read
another way (`<a>text<b/></a>` with `"<" name ">" content "</" name ">"`: the `<` after `text` may
begin an element or close), the sequence's next choice of brackets is taken (there: `>` to `/`) and
all made again (at most MAX_REBRACKETS times); past those, it is refused, naming the bytes written
before it.  Only states from which the answer (or the inside, to its closing byte) can still end are
kept, so an answer never strands.
"""

from __future__ import annotations

import itertools

from spmd_serve.engine import gbnf_brackets, grammar_cache, lark_parse
from spmd_serve.engine.gbnf_nfa import GbnfNfa
from spmd_serve.engine.gbnf_parse import Alt, Node, Ref, Rep, Seq, parse
from spmd_serve.engine.gbnf_table import Rebracket, Table, Unroll
from spmd_serve.engine.grammar_table import MAX_STATES, POP_NAME, Edges, Grammar, Name

MAX_UNROLLS = 64  # pushes written out in place where a byte would push and be read otherwise too
MAX_REBRACKETS = 16  # other choices of brackets where a closing byte would be read otherwise too


@grammar_cache.cached
def answer_grammar(text: str, where: str = "guided_grammar") -> Grammar:
    """The grammar of an answer that is one match of GBNF `text`'s `root` rule (or of a Lark grammar's
    `start`: engine/lark_parse.py); ValueError names what is not built or wrong (the grammar named `where`)."""
    try:
        rules, start = (parse(text, where), "root") if lark_parse.is_gbnf(text) else lark_parse.parse(text, where)
        return _choose({name: _loop(name, node) for name, node in rules.items()}, where, start)
    except RecursionError:  # (groups nested hundreds deep: the parser and the builder recurse)
        raise ValueError(f"{where} nests too deep") from None


def _loop(name: str, node: Node) -> Node:
    """Rule `name` with its alternatives that begin with itself as a loop after the others."""
    alts = node.items if isinstance(node, Alt) else [node]
    rests = [Seq(alt.items[1:]) if isinstance(alt, Seq) and _is_ref(alt.items[:1], name) else None for alt in alts]
    others = [alt for alt, rest in zip(alts, rests) if rest is None]
    loops: list[Node] = [rest for rest in rests if rest is not None and rest.items]
    if not others or len(others) == len(alts):
        return node
    first = others[0] if len(others) == 1 else Alt(others)
    return Seq([first, Rep(loops[0] if len(loops) == 1 else Alt(loops), 0, None)] if loops else [first])


def _is_ref(items: list[Node], name: str) -> bool:
    return bool(items) and isinstance(items[0], Ref) and items[0].name == name


def _choose(rules: dict[str, Node], where: str, start: str) -> Grammar:
    """The byte grammar with the first choices of brackets that read every closing byte one way."""
    choice: dict[Seq, int] = {}
    made = [0]  # (the states made by every try: all of them are bounded, not each)
    for tried in itertools.count():
        try:
            return _grammar(rules, where, choice, made, start)
        except Rebracket as e:
            choice[e.seq] = choice.get(e.seq, 0) + 1
            try:
                gbnf_brackets.brackets(rules, where, choice)
            except (gbnf_brackets.NoMoreChoices, ValueError):
                raise ValueError(str(e)) from None
            if tried == MAX_REBRACKETS or made[0] > 2 * MAX_STATES:
                raise ValueError(str(e)) from None
    raise AssertionError  # (unreached)


def _grammar(rules: dict[str, Node], where: str, choice: dict[Seq, int], made: list[int], root: str) -> Grammar:
    """The byte grammar with these choices of brackets; Rebracket where one pops ambiguously."""
    nfa = GbnfNfa(rules, where, choice)
    start, accept = nfa.rule(root)
    for unrolled in itertools.count():
        try:
            table = Table(nfa, start, accept)
            break
        except Rebracket as e:
            made[0] += e.made
            raise
        except Unroll as e:  # (then made again from the start: the rows before it read the old NFA)
            made[0] += e.made
            if unrolled == MAX_UNROLLS or made[0] > 2 * MAX_STATES:
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
