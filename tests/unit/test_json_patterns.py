"""Strings held to a regular expression (spmd_serve/engine/regex_dfa.py, json_patterns.py): the DFA
accepts exactly what Python's re.fullmatch does (every string hypothesis draws from the pattern, and
random strings either way), from every state a match can still end, and in a schema a `pattern` or
`format` string is read whole exactly when its JSON value matches; what is not built is refused."""

from __future__ import annotations

import ipaddress
import json
import random
import re
import uuid
from datetime import date, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from spmd_serve.engine.grammar_table import complete
from spmd_serve.engine.json_formats import FORMATS, format_dfa
from spmd_serve.engine.json_masks import JsonVocab
from spmd_serve.engine.json_patterns import WRITABLE
from spmd_serve.engine.json_schema import grammar
from spmd_serve.engine.regex_dfa import compile_dfa

PATTERNS = [r"^[a-z\d]+(-x|y){2,3}.$", r"[^a-c\W]*", r"\d{4}-\d{2}", r"(ab|a)*b?", r"[é-ü]+😊?", r"a{0,3}",
            r"(a|b|)c", r"\w+@\w+(\.\w+)+", r"[\s\S]x", r'"[^"\\]*"', r"[^\u00e9]+", r"x*?y+?",
            r"[\u0100-\U0001F600]{1,2}", *(rules[0] for rules in FORMATS.values() if len(rules) == 1)]  # fmt: skip
ALPHABET = 'abcxy-019é😊ü \n.@_W"\\:TZ+'


def accepts(dfa, text: str) -> bool:
    state: int | None = 0
    for b in text.encode():
        state = dfa.trans[state].get(b)
        if state is None:
            return False
    return state in dfa.accept


def full(pattern: str, text: str) -> bool:
    """re.fullmatch with ECMA's ASCII classes where the pattern names one, Unicode otherwise."""
    flags = re.ASCII if re.search(r"\\[dws]", pattern, re.I) else 0
    return re.fullmatch(pattern.removeprefix("^").removesuffix("$"), text, flags) is not None


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_dfa_accepts_what_re_fullmatch_does(pattern):
    dfa, rng = compile_dfa(pattern, "p"), random.Random(pattern)
    for _ in range(2000):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 9)))
        assert accepts(dfa, text) == full(pattern, text), (pattern, text)
    # from every state a match can still end (an answer held to it never strands)
    reach = set(dfa.accept)
    while len(reach) < len(dfa.trans):
        more = {s for s, out in enumerate(dfa.trans) if set(out.values()) & reach} - reach
        assert more, f"states {set(range(len(dfa.trans))) - reach} cannot end"
        reach |= more


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_string_the_pattern_describes_is_accepted(data):
    pattern = data.draw(st.sampled_from(PATTERNS))
    flags = re.ASCII if re.search(r"\\[dws]", pattern, re.I) else 0
    text = data.draw(st.from_regex(re.compile(pattern.removeprefix("^").removesuffix("$"), flags), fullmatch=True))
    assert accepts(compile_dfa(pattern, "p"), text)


def test_any_character_class_is_exact_over_all_of_unicode():
    rng = random.Random(1)
    for pattern in (r"[^a]", r".", r"[\u0100-\U0001F600]", r"[^\u00e9\U00010000-\U0010FFFF]", r"\W"):
        dfa = compile_dfa(pattern, "p")
        for _ in range(5000):
            c = chr(rng.choice([rng.randint(0, 0x7FF), rng.randint(0, 0xFFFF), rng.randint(0, 0x10FFFF)]))
            if not 0xD800 <= ord(c) <= 0xDFFF:
                assert accepts(dfa, c) == full(pattern, c), (pattern, hex(ord(c)))


def _object(value: dict) -> bytes:
    return json.dumps({"v": value}, ensure_ascii=False).encode()


def _schema(string: dict) -> object:
    return grammar(json.dumps({"type": "object", "properties": {"v": {"type": "string", **string}}, "required": ["v"]}))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(PATTERNS[:13]), st.text(ALPHABET, max_size=8))
def test_a_pattern_string_is_read_whole_exactly_when_its_value_matches(pattern, value):
    g = _schema({"pattern": pattern})
    written = b'{"v":' + json.dumps(value, ensure_ascii=False).encode() + b"}"  # (quote, backslash, \n escaped)
    assert complete(g.step(g.start, written)) == full(pattern, value), written


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(PATTERNS[:13]), st.text(ALPHABET, max_size=8), st.integers(0, 4), st.none() | st.integers(0, 6))
def test_a_pattern_with_a_length_reads_exactly_its_matches_of_that_length(pattern, value, lo, hi):
    hi = None if hi is None else max(hi, lo)
    try:
        g = _schema({"pattern": pattern, "minLength": lo, **({"maxLength": hi} if hi is not None else {})})
    except ValueError as e:
        assert "no string of the pattern has a length" in str(e)
        return
    written = b'{"v":' + json.dumps(value, ensure_ascii=False).encode() + b"}"
    fits = lo <= len(value) and (hi is None or len(value) <= hi)
    assert complete(g.step(g.start, written)) == (full(pattern, value) and fits), (written, lo, hi)


@settings(max_examples=100, deadline=None)
@given(st.dates(), st.datetimes(timezones=st.timezones()), st.uuids(), st.ip_addresses(v=4))
def test_formats_read_what_python_writes_of_them(day, moment, ident, address):
    stamp = moment.isoformat()
    for fmt, value in (("date", day.isoformat()), ("date-time", stamp), ("time", stamp.split("T")[1]),
                       ("uuid", str(ident)), ("ipv4", str(address))):  # fmt: skip
        if fmt in ("date-time", "time") and moment.utcoffset() and moment.utcoffset().seconds % 60:
            continue  # (RFC 3339 offsets are whole minutes)
        g = _schema({"format": fmt})
        assert complete(g.step(g.start, json.dumps({"v": value}).encode())), (fmt, value)


@settings(max_examples=150, deadline=None)
@given(
    st.ip_addresses(v=6), st.timedeltas(timedelta(0), timedelta(days=10**6)).map(lambda t: t // timedelta(seconds=1))
)
def test_ipv6_and_duration_read_what_python_writes_and_pydantic_reads_them(address, seconds):
    """An address as Python writes it; a duration in RFC 3339's full form (pydantic writes "PT1H1S",
    which its appendix A does not take), read by pydantic as the same span."""
    hours, s = divmod(seconds, 3600)
    duration = f"P{hours // 24}DT{hours % 24}H{s // 60}M{s % 60}S"
    assert TypeAdapter(timedelta).validate_python(duration) == timedelta(seconds=seconds)
    for fmt, value in (("ipv6", str(address)), ("ipv6", address.exploded), ("ipv6", str(address).upper()),
                       ("duration", duration)):  # fmt: skip
        g = _schema({"format": fmt})
        assert complete(g.step(g.start, json.dumps({"v": value}).encode())), (fmt, value)


def test_ipv6_takes_exactly_what_python_s_ipaddress_takes():
    """RFC 3986's nine forms: a written address with up to two characters changed is read exactly
    when ipaddress.IPv6Address reads it (no zone)."""
    dfa = format_dfa("ipv6", "ipv6")
    rng = random.Random(3)
    for _ in range(6000):
        address = ipaddress.IPv6Address(
            rng.getrandbits(128) & rng.choice([2**128 - 1, 0xFFFF << 64, 2**32 - 1, 2**48 - 1])
        )
        text = rng.choice([str(address), address.exploded, "::ffff:" + str(ipaddress.IPv4Address(rng.getrandbits(32)))])
        for _ in range(rng.randrange(3)):
            j, c = rng.randrange(len(text) + 1), rng.choice("0129afAF:.g%")
            text = rng.choice([text[:j] + c + text[j:], text[:j] + text[j + 1 :], text[:j] + c + text[j + 1 :]])
        try:
            python = ipaddress.IPv6Address(text) is not None and "%" not in text
        except ValueError:
            python = False
        assert accepts(dfa, text) == python, text


def test_a_duration_is_one_pydantic_reads():
    """Every duration the DFA takes (random walks) is a timedelta to pydantic; ISO 8601's parts in
    order, at least one, and no sign."""
    dfa = format_dfa("duration", "duration")
    rng = random.Random(4)
    for _ in range(300):
        state, text = 0, ""
        while not (state in dfa.accept and (not dfa.trans[state] or rng.random() < 0.3)):
            b = rng.choice(list(dfa.trans[state]))
            state, text = dfa.trans[state][b], text + chr(b)
        try:
            TypeAdapter(timedelta).validate_python(text)
        except ValidationError as e:  # (the form is one, only its size past a timedelta's 999,999,999 days)
            assert "too large" in str(e) or "may not exceed" in str(e), text
    for bad in (
        "P",
        "PT",
        "P1H",
        "1D",
        "-P1D",
        "P1.5D",
        "P1DT",
        "P1W1D",
        "PT1S1M",
        "P1234567890D",
        "PT1H1S",
        "PT1.5S",
        "P1Y1D",
    ):
        assert not accepts(dfa, bad), bad


@pytest.mark.parametrize(
    "fmt,bad", [("date", "2024-13-01"), ("date", "2023-02-29"), ("date", "1900-02-29"), ("date", "2024-04-31"),
                ("time", "23:59:60Z"), ("date", "24-01-01"), ("time", "25:00:00Z"), ("time", "12:00:00"),
                ("uuid", str(uuid.uuid4())[:-1]), ("ipv4", "256.1.1.1"), ("ipv4", "1.2.3"),
                ("email", "a@b"), ("hostname", "-a.b"), ("date-time", "2024-01-01 12:00:00Z"), ("uri", "example.com"),
                ("uri", "http://a b"), ("uri", "a://h:x"), ("uri", "http://a:65536/"), ("uri", "a://[v1.x]"), ("uri", "http://[::1]/"),
                ("hostname", "a" * 64 + ".b"), ("hostname", "ab--cd.e"), ("email", ".a@b.co"), ("email", "a..b@c.co"),
                ("email", "a@-b.co"), ("email", "a" * 65 + "@b.co"), ("email", "a@b.c1"), ("uri", "http://a/%zz"),
                ("uri", "1http://a")],
)  # fmt: skip
def test_formats_refuse_what_is_not_of_them(fmt, bad):
    g = _schema({"format": fmt})
    assert not complete(g.step(g.start, json.dumps({"v": bad}).encode()))


@pytest.mark.parametrize(
    "string,why",
    [({"pattern": "(a)\\1"}, "groupref is not supported"), ({"pattern": "a(?=b)"}, "assert is not supported"),
     ({"pattern": "(?i)a"}, "flags"), ({"pattern": "a$b"}, "only at the pattern's ends"),
     ({"pattern": "["}, "not a valid regular expression"), ({"pattern": "a{300}"}, "above 256"),
     ({"pattern": "\x01"}, "matches no string that can be written"), ({"pattern": 5}, "must be a string"),
     ({"pattern": "(a{256}){256}"}, "too large (more than 50000 NFA states)"),
     ({"pattern": ".{0,256}"}, "makes more than 2000 states"),
     ({"pattern": "abc", "maxLength": 2}, "no string of the pattern has a length"),
     ({"format": "idn-email"}, "the format 'idn-email'"),
     ({"pattern": "a", "format": "date"}, "not supported")],
)  # fmt: skip
def test_what_is_not_built_is_refused_by_name(string, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        _schema(string)


def test_masks_equal_stepping_each_token_alone():
    """The vocabulary walk over a pattern string's states (escapes, multi-byte characters) equals
    stepping every token alone, from every state the grammar has."""
    g = _schema({"pattern": r'[a-c"\\é]{1,3}-\d'})
    tokens = [bytes([b]) for b in range(256)] + [b'"a', b'\\"', b"\\\\", "é".encode(), b'-1"', b'-1"}', b'{"v":"']
    vocab = JsonVocab(tokens)
    for s in range(3, len(g.table)):
        want = [g.step((s, ()), t) is not None for t in tokens]
        assert vocab.allowed(g, (s, ())).tolist() == want, s
    assert 0x01 not in WRITABLE and 0x0A in WRITABLE


@pytest.mark.parametrize(
    "uri", ["https://example.com/a/b?c=d&e=%20f#g", "mailto:a@b.c", "urn:isbn:0451450523", "http://127.0.0.1:80/",
            "ftp://u:p@host/x;type=a", "HTTP://EXAMPLE.COM"],
)  # fmt: skip
def test_a_uri_format_reads_absolute_uris(uri):
    g = _schema({"format": "uri"})
    assert complete(g.step(g.start, json.dumps({"v": uri}).encode())), uri


def test_a_date_is_a_day_of_its_month():
    """Every day of 1896-2404 (leap years by 4, not 1900 or 2100, 2000 and 2400 yes) is read whole,
    and no other month-day of those years."""
    dfa = format_dfa("date", "date")
    days = {(date(1896, 1, 1) + timedelta(n)).isoformat() for n in range((date(2405, 1, 1) - date(1896, 1, 1)).days)}
    for year in range(1896, 2405):
        for month in range(1, 13):
            for day in range(1, 32):
                text = f"{year:04d}-{month:02d}-{day:02d}"
                assert accepts(dfa, text) == (text in days), text
