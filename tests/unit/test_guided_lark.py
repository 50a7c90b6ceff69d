"""vLLM's guided_grammar in Lark's syntax (spmd_serve/engine/lark_parse.py, lark_terms.py): the byte
grammar reads what the Lark package itself parses (Earley, every way of splitting the text into
terminals) on random walks and their near-misses; left recursion is read as a loop (GBNF too); the
grammar's kind is told by its lines; what is not built or wrong is refused naming it and where."""

from __future__ import annotations

import json
import random
import re

import lark
import pytest

from spmd_serve.engine import structural_tag
from spmd_serve.engine.gbnf_grammar import answer_grammar
from spmd_serve.engine.lark_parse import is_gbnf
from spmd_serve.frontend.openai.protocol import OpenAIError
from tests.support.fake_tokenizer import parsed as _parse
from tests.support.grammar_walk import mutants, sampled_answers, walk_to_end

SQL = r"""
?start: select_statement
?select_statement: "SELECT " column_list " FROM " table_name
?column_list: column_name ("," column_name)*
?table_name: identifier
?column_name: identifier
?identifier: /[a-zA-Z_][a-zA-Z0-9_]*/
"""  # (vLLM's documented example)
JSON = r"""
?start: value
?value: object
| array
| ESCAPED_STRING
| SIGNED_NUMBER      -> number
| "true"             -> true
| "false"            -> false
| "null"             -> null
array  : "[" [value ("," value)*] "]"
object : "{" [pair ("," pair)*] "}"
pair   : ESCAPED_STRING ":" value
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""  # (outlines' JSON grammar, on Lark's common terminals)
CALC = r"""
?start: sum
?sum: product
    | sum "+" product   -> add
    | sum "-" product   -> sub
?product: atom
    | product "*" atom  -> mul
    | product "/" atom  -> div
?atom: NUMBER           -> number
     | "-" atom         -> neg
     | NAME             -> var
     | "(" sum ")"
%import common.CNAME -> NAME
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
"""  # (Lark's calculator: left recursion)
GRAMMARS = {
    "sql": SQL,
    "json": JSON,
    "calc": CALC,
    "features": r"""
// a comment
start: greeting+ farewell?   // another
greeting: ("hello"i | "hi"i) NAME "!" ~ 1..3
        | /hey+/i NAME
!farewell.2: "bye" ["," NAME] | _sig
_sig: DASH~2 LETTERS
NAME: UPPER LOWER*
UPPER: "A".."Z"
LOWER: /[a-z]/
DASH: "-"
LETTERS.3: /[a-cé]+/
%import common (WS, INT)
%ignore WS
%ignore "#" INT
""",
    "common": "start: (" + " | ".join(
        ["C_COMMENT", "ESCAPED_STRING", 'SQL_COMMENT "\\n"', 'CPP_COMMENT "\\n"', 'SH_COMMENT "\\n"', "HEXDIGIT",
         "SIGNED_FLOAT", "WORD", "NEWLINE", '"," SIGNED_INT']) + ")*\n" + "".join(
        f"%import common.{n}\n" for n in ["C_COMMENT", "ESCAPED_STRING", "SQL_COMMENT", "CPP_COMMENT", "SH_COMMENT",
                                          "HEXDIGIT", "SIGNED_FLOAT", "WORD", "NEWLINE", "SIGNED_INT"]),
    "nested": 'start: list\nlist: "(" item* ")"\nitem: list | ATOM\nATOM: /[a-z 0-9] + /x\n%ignore " "',
    "flags": r'start: /a.b/s "|" /a.b/ "|" /[^x]y/i "|" /(?i)k[^s]/ "|" /\d\/?/',
}  # fmt: skip
NOISE = b'()[]{}"\\:,- abc019\n\xe3/*#AaHhYyBbk!|'


def _reference(text: str):
    parser = lark.Lark(text, parser="earley", lexer="dynamic_complete")

    def accepts(data: bytes) -> bool:
        try:
            parser.parse(data.decode())
        except (UnicodeDecodeError, lark.exceptions.LarkError):
            return False
        return True

    return accepts


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_the_grammar_reads_what_lark_reads(name):
    g, accepts, rng = answer_grammar(GRAMMARS[name]), _reference(GRAMMARS[name]), random.Random(name)
    agreed = 0
    for _ in range(50):
        data = walk_to_end(g, rng)
        assert accepts(data), data
        for other in mutants(rng, data, NOISE):
            assert g.may_end(g.step(g.start, other)) == accepts(other), other
            agreed += accepts(other)
    assert agreed > 10  # (near-misses that are answers too: the comparison saw both kinds)


def test_what_lark_reads_some_way_this_reads_too():
    """Lark skips an ignored run whole (its longest match), so after `"bye"` and a space it never
    reads the literal `" "`; this reads the string the way that matches (a superset)."""
    text = 'start: "bye" [" " NAME]\nNAME: /[A-Z]/\n%import common.WS\n%ignore WS'
    g, accepts = answer_grammar(text), _reference(text)
    assert g.may_end(g.step(g.start, b"bye\t P")) and not accepts(b"bye\t P")
    assert g.may_end(g.step(g.start, b"bye P")) and accepts(b"bye P")


def test_left_recursion_is_a_loop():
    for text in ('root ::= root "a" | "b" | root', 'start: start "a" | "b"'):
        g = answer_grammar(text)
        assert [g.may_end(g.step(g.start, s) or g.start) for s in (b"b", b"baaa", b"a", b"ab")] == [1, 1, 0, 0]
    g = answer_grammar(CALC)
    assert g.may_end(g.step(g.start, b"-x1 * (2.5e3 - y)/ 4"))
    assert g.step(g.start, b"(1))") is None and not g.may_end(g.step(g.start, b"1 +"))
    with pytest.raises(ValueError, match=re.escape("refer back to themselves (root -> x -> root)")):
        answer_grammar('root ::= x "a" | "a"\nx ::= root "b"')  # (left recursion through another rule)


def test_the_kind_is_told_by_the_lines():
    assert is_gbnf('root ::= "a"') and is_gbnf('# c\n  x-y ::= "a"\nroot ::= x-y')
    assert not is_gbnf('start: "a ::= b"') and not is_gbnf('start: x\n// y ::= z\nx: "a"')
    g = answer_grammar('start: "a ::= b"')
    assert g.may_end(g.step(g.start, b"a ::= b"))
    with pytest.raises(ValueError, match=re.escape("unexpected ':' (a grammar with a line that begins `name ::=`")):
        answer_grammar('root ::= "a"\nstart: "b"')


LARK = "guided_grammar (read as Lark: no line begins `name ::=`): "


@pytest.mark.parametrize(
    "text, message",
    [
        ('start: x\n_sep{x}: x ("," x)*', "'_sep' is a template: templates are not built at line 2"),
        ("start: _sep{A}", "'_sep' is used as a template"),
        ("%declare A\nstart: A", "%declare is not built at line 1"),
        ("start: A\n%import python.NAME -> A", "only `%import common.NAME` and `%import common (NAME, ...)`"),
        ("start: X\n%import common.NUMBERS -> X", "common has no terminal 'NUMBERS' (it has CNAME, CPP_COMMENT,"),
        ("start: x", "'start' refers to 'x', which is not defined"),
        ('start: A\nA: b\nb: "x"', "terminal 'A' refers to the rule 'b'"),
        ("start: /abc", "unterminated regular expression at line 1, column 12"),
        ("start: /a(?=b)/", "/a(?=b)/: assert (no lookaround or backreference) are not read in a terminal"),
        ("start: /^a$/", "/^a$/: anchors are not read"),
        ("start: /a/q", "the flag 'q' of /a/ is not read"),
        ("start: /a(/", "/a(/ is not a valid regular expression"),
        ("start: /(?i:a)/", "flags inside the pattern are not read"),
        ('start: "ab".."z"', 'a range is "a".."z": one character at each end'),
        ('start: "z".."a"', "the range 'z'..'a' is backwards"),
        ('start: "a" ~ 3..1', "a repeat is ~ n or ~ n..m, ordered, at most 256"),
        ('start: "a"\nstart: "b"', "'start' is defined twice at line 2"),
        ('A: "a"', "no rule (a lowercase name) to start from"),
        ('start: "a" @', "unexpected '@'"),
        ('start: "a")', "')' without its opening bracket"),
        ('start: ("a"\n', "'(' without its closing bracket"),
        ('start: "a"\n%ignore B', "'%ignore' refers to 'B', which is not defined"),
        ("%frobnicate\nstart: A", "unknown directive %frobnicate"),
    ],
)
def test_what_is_not_built_or_wrong_is_refused_by_name(text, message):
    with pytest.raises(ValueError) as e:
        answer_grammar(text, "guided_grammar")
    assert str(e.value).startswith(LARK) and message in str(e.value), str(e.value)


def test_what_vllm_reads_beside_lark():
    """Single-quoted literals and `#` comments (vLLM's reading of a Lark grammar takes both)."""
    g = answer_grammar("start: 'a\\'' \"b\" # a comment\n  | 'c' // another")
    assert [g.may_end(g.step(g.start, s) or g.start) for s in (b"a'b", b"c", b"a'", b"#")] == [1, 1, 0, 0]


def test_the_answer_is_start_else_the_first_rule():
    g = answer_grammar('a: "x"\nstart: "y"')
    assert g.may_end(g.step(g.start, b"y")) and g.step(g.start, b"x") is None
    g = answer_grammar('a: "x" B\nb: "y"\nB: "z"')
    assert g.may_end(g.step(g.start, b"xz")) and g.step(g.start, b"y") is None


def test_a_structural_tags_grammar_may_be_lark():
    tag = {
        "type": "sequence",
        "elements": [{"type": "grammar", "grammar": SQL}, {"type": "const_string", "value": ";"}],
    }
    g = structural_tag.answer_grammar(json.dumps({"format": tag}))
    assert g.may_end(g.step(g.start, b"SELECT a,b FROM t;")) and g.step(g.start, b"SELECT a FROM ;") is None


def test_the_fields_take_lark():
    assert _parse({"guided_grammar": SQL}).params.gbnf == SQL
    assert _parse({"structured_outputs": {"grammar": JSON}}, "chat").params.gbnf == JSON
    with pytest.raises(OpenAIError, match=re.escape("structured_outputs.grammar (read as Lark: no line begins")):
        _parse({"structured_outputs": {"grammar": "start: x"}})


def test_sampled_answers_stay_on_the_grammar():
    """Through the sampler with random logits (the EOS often the likeliest): each answer is one Lark reads."""
    vocab = [b"", b"SELECT ", b" FROM ", b"a", b"b_1", b",", b"SELECT a FROM", b" ", b"x,", b"1", b"FROM"]
    answers, accepts = sampled_answers(SQL, vocab, 40, steps=30), _reference(SQL)
    assert all(accepts(a) for a in answers), answers
    assert len(answers) > 20
