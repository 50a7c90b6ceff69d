"""vLLM's guided_grammar (spmd_serve/engine/gbnf_parse.py, gbnf_brackets.py, gbnf_grammar.py): a GBNF
grammar's byte grammar reads exactly what an independent reader of its rules reads
(tests/support/gbnf_oracle.py) on random derivations, walks and their mutations; JSON answers load
with `json`, expressions parse with Python's `ast`; what is not built is refused naming the rules
or the bytes; the masks equal stepping each token alone."""

from __future__ import annotations

import ast
import json
import random
import re

import pytest

from spmd_serve.engine.gbnf_grammar import answer_grammar
from spmd_serve.engine.gbnf_parse import parse
from spmd_serve.engine.json_masks import JsonVocab
from spmd_serve.frontend.openai.protocol import OpenAIError
from spmd_serve.sampling_params import SamplingParams
from tests.support.fake_tokenizer import parsed
from tests.support.gbnf_oracle import Oracle
from tests.support.grammar_walk import mutants, sampled_answers, walk_to_end

JSON = r"""
root   ::= value                      # any JSON value, with whitespace between its lexemes
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( member ("," ws member)* )? "}" ws
member ::= string ":" ws value
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,16})? ws
ws     ::= ([ \t\n] ws)?
"""
ARITHMETIC = r"""
root   ::= expr
expr   ::= term (ws [-+] ws term)*
term   ::= factor (ws [*/%] ws factor)*
factor ::= ("0" | [1-9] [0-9]*) ("." [0-9]+)? | "(" ws expr ws ")" | "-" factor
ws     ::= " "?
"""
STATEMENTS = r"""
root ::= stmt+
stmt ::= "return" ws expr ";" | ident ws "(" args? ")" ";" | "if" "(" expr ")" "{" stmt* "}" ("else" "{" stmt* "}")?
expr ::= term ([-+] term)*
term ::= ident | [0-9]+ | neg | ident "(" args? ")" | "(" expr ")"
neg ::= "-" term
args ::= expr ("," expr)*
ident ::= [a-z]+
ws ::= [ ]+
"""  # ("return (" reads as a call statement and as a return: that bracket is written out once; term
# and neg end in each other: jumps)
GRAMMARS = {
    "statements": STATEMENTS,
    "json": JSON,
    "arithmetic": ARITHMETIC,
    "nested": r'root ::= ( "(" root ")" | "[" root "]" | [a-c] )*',
    "counted": r'root ::= "a" root "b" | "c"',  # a^n c b^n
    "list": 'root ::= ("- " item)+\nitem ::= [^\\n]+ "\\n"',
    "kana": 'root ::= [ぁ-ゟ]+ ("、" [ぁ-ゟ]+)* "。"? .{0,2}',
    "xml": 'root ::= element\nelement ::= "<" name ">" content "</" name ">"\ncontent ::= ([^<]+ | element)*\n'
    "name ::= [a-z]+",  # (the `<` after text may begin an element or close: brackets `>` to `/`)
    "lines": 'root ::= line{1,3}\nline ::= ( [A-Z] [a-z]* " " )+ "\\U0001F600"? "\\n"',
}


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_the_grammar_reads_what_its_rules_read(name):
    rules, g = parse(GRAMMARS[name]), answer_grammar(GRAMMARS[name])
    oracle, rng = Oracle(rules), random.Random(name)
    for data in [oracle.derive(rng).encode() for _ in range(60)] + [walk_to_end(g, rng) for _ in range(60)]:
        assert oracle.accepts(data), data  # (a derivation is in the language; so must every walk be)
        assert g.may_end(g.step(g.start, data)), data
        for other in mutants(rng, data):
            assert g.may_end(g.step(g.start, other)) == oracle.accepts(other), other


def test_json_and_expressions_read_by_python():
    rng = random.Random(1)
    g, a = answer_grammar(JSON), answer_grammar(ARITHMETIC)
    for _ in range(80):
        json.loads(walk_to_end(g, rng, stop=0.3))
        ast.parse(walk_to_end(a, rng).decode(), mode="eval")
    for bad in (b"[1,]", b'{"a" 1}', b"01", b"[[]", b"{}}", b'"\x01"'):
        assert not g.may_end(g.step(g.start, bad)), bad
    assert g.may_end(g.step(g.start, b'{"a": [1, {"b": [null, true]}], "c": "\\u00e9"}\n'))


def test_the_stack_holds_the_nesting():
    g = answer_grammar(GRAMMARS["counted"])
    for n in (0, 1, 7, 300):
        assert g.may_end(g.step(g.start, b"a" * n + b"c" + b"b" * n))
        assert g.step(g.start, b"a" * n + b"c" + b"b" * (n + 1)) is None
        assert not g.may_end(g.step(g.start, b"a" * (n + 1) + b"c" + b"b" * n))
    assert len(g.table) < 20  # (the nesting is on the stack, not in states)


@pytest.mark.parametrize(
    "text, message",
    [
        ('root ::= root "a"', "refer back to themselves (root -> root) without one-character brackets"),
        ('root ::= x\nx ::= "(" y\ny ::= x ")" | "z"', "(y -> x -> y)"),
        ('root ::= "(" root ")" | "(" "x" ")" | "y"', "the byte b'(' may open or close a bracket"),
        ('root ::= "(" in ")" | "x"\nin ::= root ")"?', "after '((…)', the byte b')' may open or close"),
        ('root ::= "a" root', "matches no string"),
        ("rot ::= [a]", "no rule named 'root'"),
        ('root ::= "a" b', "rule 'root' refers to 'b', which is not defined"),
        ('root ::= "a', "unterminated literal at line 1, column 12"),
        ('root ::= "a"\n  [b-a]', "the range 'b'-'a' is backwards at line 2"),
        ('root ::= "\\q"', "unknown escape \\q"),
        ('root ::= "\\uD800"', "no character"),
        ('root ::= "a"{3,1}', "must be ordered"),
        ('root ::= "a"{,}', "a repeat is"),
        ('root ::= "a")', "')' without its '('"),
        ('root ::= ("a"', "'(' without its ')'"),
        ('root ::= "a"\nroot ::= "b"', "rule 'root' is defined twice"),
        ("root ::= @", "unexpected '@'"),
        ('start: "a"\nroot ::= "b"', "after 'start' (a grammar with a line that begins `name ::=` is read as GBNF"),
        ('root ::= "a"{300}', "at most 256"),
        ("root ::= " + "(" * 400 + '"a"' + ")" * 400, "nests too deep"),
        (
            "root ::= r0\n" + "".join(f'r{i} ::= "a" r{i + 1} "b"\n' for i in range(70)) + 'r70 ::= "c"',
            "more than 64 deep",
        ),
    ],
)
def test_what_is_not_built_or_wrong_is_refused_by_name(text, message):
    with pytest.raises(ValueError) as e:
        answer_grammar(text, "guided_grammar")
    assert str(e.value).startswith("guided_grammar") and message in str(e.value), str(e.value)


def test_a_rule_ending_in_its_own_rules_needs_no_stack():
    """`ws ::= [ ] ws | ...` and a recursion at the end of two rules (`factor` and `unary`) loop in
    the table; after a bracket (`root ::= ("[" root "]" root)?`) only the bracket pushes."""
    g = answer_grammar('root ::= "x" ws "y"\nws ::= [ ] ws | "\\t" ws | ""')
    assert g.may_end(g.step(g.start, b"x \t \ty")) and g.step(g.start, b"x \t \ty")[1] == ()
    g = answer_grammar('root ::= factor\nfactor ::= [0-9] | "-" unary | "(" factor ")"\nunary ::= factor')
    assert g.step(g.start, b"-" * 500 + b"(--(-")[1] != () and g.step(g.start, b"-" * 500)[1] == ()
    assert g.may_end(g.step(g.start, b"--(-(1))")) and len(g.table) - g.start[0] <= 8  # (after the reserved rows)
    g = answer_grammar('root ::= ("[" root "]" root)?')
    assert g.may_end(g.step(g.start, b"[[][]][]")) and g.step(g.start, b"[]]") is None


VOCAB = [b"", b"{", b"}", b"[", b"]", b'{"', b'"}', b"},", b"]}", b"}]", b"1", b"12", b" ", b"\n", b"tr", b"ue",
         b"true", b'"a"', b'"', b":", b", ", b",", b"a", b"\\", b"null", b"-", b"e5", b"\xc3", b"\xa9",
         "é".encode()]  # fmt: skip


def test_masks_equal_stepping_each_token():
    g, vocab, rng = answer_grammar(JSON), JsonVocab(VOCAB), random.Random(3)
    seen = 0
    for _ in range(40):
        data = walk_to_end(g, rng, stop=0.05)
        state = g.start
        for b in data:
            expect = [bool(t) and g.step(state, t) is not None for t in VOCAB]
            assert vocab.allowed(g, state).tolist() == expect, (data, state)
            seen += len(state[1]) > 0
            state = g.step(state, bytes([b]))
    assert seen > 50  # (inside nested brackets, where the closing tokens read the stack)


_parse = parsed


def test_the_fields():
    for kind in ("completion", "chat"):
        assert _parse({"guided_grammar": 'root ::= "a"'}, kind).params.gbnf == 'root ::= "a"'
        assert _parse({"structured_outputs": {"grammar": 'root ::= "b"'}}, kind).params.gbnf == 'root ::= "b"'
    for body, want in [
        ({"guided_grammar": "root ::= x"}, "guided_grammar: rule 'root' refers to 'x', which is not defined"),
        ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs.grammar: '(' without its ')'"),
        ({"guided_grammar": 3}, "guided_grammar must be a string"),
        ({"guided_grammar": 'root ::= "a"', "structured_outputs": {"grammar": 'root ::= "a"'}}, "cannot both"),
        ({"guided_grammar": 'root ::= "a"', "guided_regex": "a"}, "guided_grammar and a guided_regex cannot both"),
        ({"guided_grammar": 'root ::= "a"', "guided_choice": ["a"]}, "guided_grammar and a guided choice cannot"),
        ({"guided_grammar": 'root ::= "a"', "guided_json": {"type": "object"}}, "and a JSON schema cannot both"),
        ({"guided_grammar": 'root ::= "a"', "min_tokens": 2}, "not with ignore_eos or min_tokens"),
    ]:
        with pytest.raises(OpenAIError, match=re.escape(want)):
            _parse(body)
    with pytest.raises(ValueError, match="not more"):
        SamplingParams(regex="a", gbnf='root ::= "a"').validate()


def test_sampled_answers_stay_on_the_grammar_and_end_only_where_it_may():
    """Through the sampler with random logits (the EOS often the likeliest): each answer is a match."""
    text = 'root ::= "[" ( item ("," item)* )? "]"\nitem ::= "1" | "12" | root'
    vocab = [b"", b"[", b"]", b"1", b"12", b",", b"[]", b"],", b"]]", b"x", b",1", b"[1"]
    answers, oracle = sampled_answers(text, vocab, 60), Oracle(parse(text))
    assert all(oracle.accepts(a) for a in answers), answers
    assert len(answers) > 30
