"""A long maxLength, counted on the stack (engine/grammar_table.py's counted states; json_strings.py,
json_patterns.py): a string, plain or held to a pattern, is read whole exactly when its length is
within its bounds, across the counted stretch and out of it; its grammar does not grow with the
maxLength; and the masks from every count equal stepping each token alone, tokens longer than the
table's reach (FAR_WINDOW) included."""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_serve.engine.grammar_table import FAR_WINDOW, complete
from spmd_serve.engine.json_formats import FORMATS
from spmd_serve.engine.json_masks import JsonVocab
from spmd_serve.engine.json_schema import grammar

CHARS = 'abé😊"\\\n\x01'  # (quote, backslash and control characters escaped; the astral one as a pair or raw)


def _schema(string: dict) -> object:
    return grammar(json.dumps({"type": "object", "properties": {"v": {"type": "string", **string}}, "required": ["v"]}))


def _written(value: str, ascii_only: bool = False) -> bytes:
    return b'{"v":' + json.dumps(value, ensure_ascii=ascii_only).encode() + b"}"


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 20), st.integers(2 * FAR_WINDOW + 1, 400), st.data())
def test_a_long_string_is_read_whole_exactly_within_its_bounds(lo, span, data):
    hi = lo + span
    g = _schema({"minLength": lo, "maxLength": hi})
    assert g.far  # (the stretch is there)
    n = data.draw(st.sampled_from([0, lo - 1, lo, lo + 1, hi // 2, hi - FAR_WINDOW, hi - 1, hi, hi + 1, hi + 40]))
    value = "".join(data.draw(st.sampled_from(CHARS)) for _ in range(max(n, 0)))
    assert complete(g.step(g.start, _written(value))) == (lo <= len(value) <= hi), (lo, hi, len(value))
    bmp = value.replace("😊", "x")  # (\u escapes: one character each)
    assert complete(g.step(g.start, _written(bmp, True))) == (lo <= len(bmp) <= hi)


@pytest.mark.parametrize(
    "key,regex,head,unit,tail",
    [({"pattern": r"[a-cé]+(-[0-9]{1,3})?"}, r"[a-cé]+(-[0-9]{1,3})?", "", "abcé", "-123"),
     ({"pattern": r"x[^\"]*y"}, r"x[^\"]*y", "x", "xé😊 ", "y"),
     ({"format": "uri"}, FORMATS["uri"][0], "http:", "ab%2F/", "")],
)  # fmt: skip
def test_a_long_pattern_string_is_read_whole_exactly_within_its_bounds(key, regex, head, unit, tail):
    rng = random.Random(5)
    for lo, hi in ((0, 100), (1, 2083), (7, 300)):
        g = _schema({**key, "minLength": lo, "maxLength": hi})
        assert g.far
        for n in (1, lo, hi // 2, hi - FAR_WINDOW - 5, hi - 6, hi - 4, hi - 1, hi, hi + 1, hi + 7):
            body = "".join(rng.choice(unit) for _ in range(max(n - len(head) - len(tail), 0)))
            for value in (head + body + tail, head + body, head + body + "!" + tail):
                matches = re.fullmatch(regex, value) is not None
                assert complete(g.step(g.start, _written(value))) == (matches and lo <= len(value) <= hi), (
                    lo, hi, value[-20:], len(value)
                )  # fmt: skip


def test_the_grammar_does_not_grow_with_the_max_length():
    sizes = {len(_schema({"maxLength": hi}).table) for hi in (500, 10**4, 10**6, 2**31 - 1)}
    assert len(sizes) == 1 and sizes.pop() < 1000
    uri = {len(_schema({"format": "uri", "minLength": 1, "maxLength": hi}).table) for hi in (2083, 10**5)}
    assert len(uri) == 1


VOCAB = [bytes([b]) for b in range(256)] + [
    b"ab", b'a"', b'a"}', b"\\n", b"\\u00e9", b"\\ud83d\\ude0a", "é😊".encode(), b"%2F", b"http:", b"-12",
    *(b"a" * n for n in (FAR_WINDOW - 1, FAR_WINDOW, FAR_WINDOW + 1, FAR_WINDOW + 9, 70)),
    b"a" * (FAR_WINDOW + 3) + b'"}', "é".encode() * 20, b"\\n" * 20,
]  # fmt: skip


@pytest.mark.parametrize(
    "string,prefix",
    [({"minLength": 3, "maxLength": 150}, "a"), ({"maxLength": 120}, "é"),
     ({"pattern": r"[a-cé]+(-[0-9]{1,3})?", "maxLength": 140}, "a"), ({"format": "uri", "maxLength": 130}, "h:"),
     ({"pattern": r"[a-z]+@[a-z]{40}", "maxLength": 140}, "a")],
)  # fmt: skip
def test_masks_equal_stepping_each_token_alone_at_every_count(string, prefix):
    """From each count of the string (before, in and after its counted stretch), the vocabulary's
    mask is each token stepped alone with the count on the stack: long tokens near the end refused,
    and never none (a pattern's way to its match, however long, is kept open)."""
    g = _schema(string)
    vocab = JsonVocab(VOCAB)
    hi = string["maxLength"]
    state = g.step(g.start, b'{"v":"' + prefix.encode())
    for k in range(len(prefix), hi + 1):
        want = [g.step(state, t) is not None for t in VOCAB]
        assert vocab.allowed(g, state).tolist() == want, k
        if k == hi:
            assert want[ord('"')] and not want[ord("a")]  # only the closing quote
        byte = next((b for b in b"a@" if want[b]), None)  # (the prefix's letter while it may come)
        assert byte is not None or want[ord('"')], k  # (never stranded)
        if byte is None:
            break
        state = g.step(state, bytes([byte]))
    else:
        return
    assert k == hi


def test_alternatives_of_two_long_strings_are_refused_by_name():
    with pytest.raises(ValueError, match="strings of a long maxLength alike are not built"):
        _schema({"anyOf": [{"type": "string", "maxLength": 500}, {"type": "string", "maxLength": 300}]})
    g = grammar(json.dumps({"type": "object", "properties": {"v": {"anyOf": [
        {"type": "string", "maxLength": 500}, {"type": "null"}]}}, "required": ["v"]}))  # fmt: skip
    assert complete(g.step(g.start, _written("a" * 500))) and not complete(g.step(g.start, _written("a" * 501)))
