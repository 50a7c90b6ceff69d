"""A JSON string held to a regular expression: JSON Schema's `pattern`, and the `format`s built
(FORMATS, each as its pattern), as states of a JSON grammar (engine/json_grammar.py); and a whole
answer held to one (vLLM's guided_regex: `answer_grammar`), ended by an EOS where it may end.

The string's characters are the pattern DFA's (engine/regex_dfa.py) bytes, written as a model would
write them in JSON: raw, except a quote, a backslash and the control characters with a short escape
(\\n \\t \\r \\b \\f), which come as that escape; other control characters cannot be written, and no
character is taken as a \\u escape (stricter than JSON, never looser).  The closing quote comes only
where the pattern may end.
"""

from __future__ import annotations

import functools

from spmd_serve.engine.grammar_table import COUNTS, FAR_WINDOW, Edges, Grammar, Name, can_end
from spmd_serve.engine.regex_dfa import Dfa, compile_dfa

# byte -> the letter after a backslash that writes it in a JSON string
ESCAPED = {0x22: ord('"'), 0x5C: ord("\\"), 0x0A: ord("n"), 0x09: ord("t"), 0x0D: ord("r"), 0x08: ord("b"),
           0x0C: ord("f")}  # fmt: skip
WRITABLE = frozenset(range(0x20, 0x100)) | frozenset(ESCAPED)
# (RFC 3339's leap second, :60, left out: Python's datetime and pydantic refuse it)
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
# a day its month has: February's 29th only in a leap year (by 4, not by 100 unless by 400)
_LEAP = r"([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29"
_DATE = (rf"([0-9]{{4}}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
         rf"|02-(0[1-9]|1[0-9]|2[0-8]))|{_LEAP})")  # fmt: skip
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"  # (a label's 63-character bound left out: 8x the states)
_H16, _IPV4 = "[0-9a-fA-F]{1,4}", rf"({_OCTET}\.){{3}}{_OCTET}"
_LS32 = rf"({_H16}:{_H16}|{_IPV4})"


def _before(n: int) -> str:
    """RFC 3986's `[ *n( h16 ":" ) h16 ]`: the groups before an IPv6 address's `::`."""
    return rf"(({_H16}:){{0,{n}}}{_H16})?"


# RFC 3986's IPv6address, its nine forms (no zone)
_IPV6 = "|".join([rf"({_H16}:){{6}}{_LS32}", rf"::({_H16}:){{5}}{_LS32}",
                  *(rf"{_before(n)}::({_H16}:){{{4 - n}}}{_LS32}" for n in range(4)), rf"{_before(4)}::{_LS32}",
                  rf"{_before(5)}::{_H16}", rf"{_before(6)}::"])  # fmt: skip
# ISO 8601's duration as pydantic writes and reads a timedelta: its parts in order, at least one;
# a fraction of seconds; weeks alone (RFC 3339's appendix A); no sign; at most 9 digits a number
# (a timedelta's days: a model cannot write digits forever)
_N = "[0-9]{1,9}"
_SEC = rf"{_N}(\.{_N})?S"
_CLOCK = rf"T({_N}H({_N}M)?({_SEC})?|{_N}M({_SEC})?|{_SEC})"
_DURATION = rf"P(({_N}Y({_N}M)?({_N}D)?|{_N}M({_N}D)?|{_N}D)({_CLOCK})?|{_CLOCK}|{_N}W)"
FORMATS = {  # RFC 3339's date, time and date-time, RFC 4122's uuid, ...; an email's address and a URI simplified
    # (the nine formats OpenAI's strict mode supports, and uri)
    "date": _DATE,
    "time": _TIME,
    "date-time": _DATE + "T" + _TIME,
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "duration": _DURATION,
    "hostname": rf"{_LABEL}(\.{_LABEL})*",
    "email": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+",
    # RFC 3986's absolute URI, its parts' characters not told apart: a scheme, then its characters
    "uri": r"[A-Za-z][A-Za-z0-9+.\-]*:([A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})+",
    # pydantic's: IPvAnyAddress, and UUID1 ... UUID8 (the version's digit, RFC 4122's variant)
    "ipvanyaddress": f"({_IPV4})|({_IPV6})",
    **{
        f"uuid{v}": rf"[0-9a-fA-F]{{8}}-[0-9a-fA-F]{{4}}-{v}[0-9a-fA-F]{{3}}-[89abAB][0-9a-fA-F]{{3}}-[0-9a-fA-F]{{12}}"
        for v in (1, 3, 4, 5, 6, 7, 8)
    },
}
ANY_STRING_FORMATS = ("password", "binary", "path")  # (pydantic's SecretStr, bytes, Path: any string is one)


MAX_BOUNDED_STATES = 20000  # a pattern's DFA times a length's counts (the grammar's own limit too)
FAR = -1  # a count within the counted stretch


@functools.lru_cache(maxsize=64)
def string_dfa(pattern: str, where: str, lo: int = 0, hi: int | None = None) -> Dfa:
    """A string pattern's DFA; with a length, the product with a count of its characters (each
    begins at a byte that is no UTF-8 continuation: up to `hi`, or up to `lo` where there is none),
    only the states from which a match of that length can still end.  A long maxLength is counted on
    the stack (`Dfa.far`) from `lo` to where the count must be known again: FAR_WINDOW characters
    (a token's reach) and the longest way to a match (`_reach`) before `hi`."""
    if (lo, hi) == (0, None):
        return compile_dfa(pattern, where, WRITABLE)
    dfa = string_dfa(pattern, where)  # (the unbounded one, cached: one compile for every length asked)
    first, limit = (lo, hi - FAR_WINDOW - _reach(dfa)) if hi is not None else (0, 0)
    first, limit = (first, limit) if limit - first >= 2 else (0, 0)

    def count(k: int) -> int | None:  # the count's name after `k` characters (None: past hi)
        if hi is None:
            return min(k, lo)
        return None if k > hi else FAR if first <= k < limit else k

    start = (0, FAR if first <= 0 < limit else 0)
    ids: dict[tuple[int, int], int] = {}
    trans: list[dict[int, int]] = []
    todo: list[tuple[int, int]] = []
    far: dict[int, tuple[int, int, int]] = {}
    into: list[list[int]] = []  # (reversed edges: the counted ones to the stretch's end too)

    def add(state: tuple[int, int]) -> int:
        if state not in ids:
            if len(ids) >= MAX_BOUNDED_STATES:
                raise ValueError(f"{where} with its length makes more than {MAX_BOUNDED_STATES} states")
            ids[state] = i = len(ids)
            trans.append({})
            into.append([])
            todo.append(state)
            if state[1] == FAR:  # the stepper leaves the stretch at its limit, to the state there
                far[i] = (first, limit, add((state[0], limit)))
        return ids[state]

    add(start)
    while todo:
        s, c = here = todo.pop()
        for b, t in dfa.trans[s].items():
            step = not 0x80 <= b < 0xC0  # (a character begins)
            k = count(c + step) if c != FAR else FAR
            if k is None:
                continue
            trans[ids[here]][b] = i = add((t, k))
            into[i].append(ids[here])
            if c == FAR and step:  # (the stepper's way out of the stretch)
                into[far[i][2]].append(ids[here])
    accept = {i for (s, c), i in ids.items() if s in dfa.accept and (c == FAR or c >= lo)}
    live = can_end(accept, into.__getitem__)
    if 0 not in live:
        raise ValueError(f"{where}: no string of the pattern has a length within minLength and maxLength")
    return Dfa(tuple({b: t for b, t in out.items() if t in live} for out in trans), frozenset(accept), far)


def _reach(dfa: Dfa) -> int:
    """The most bytes any state needs to reach a match (its states all can)."""
    into: list[list[int]] = [[] for _ in dfa.trans]
    for s, out in enumerate(dfa.trans):
        for t in out.values():
            into[t].append(s)
    dist = dict.fromkeys(dfa.accept, 0)
    todo = list(dfa.accept)
    for s in todo:  # (breadth first: todo grows as it is read)
        for r in into[s]:
            if r not in dist:
                dist[r] = dist[s] + 1
                todo.append(r)
    return max(dist.values(), default=0)


def counted(dfa: Dfa, name: Name) -> tuple[int, int, Name] | None:
    """A pattern string's state in its length's counted stretch (engine/grammar_table.py)."""
    _, node, s, exit_, escaped = name
    if s not in dfa.far:
        return None
    first, limit, there = dfa.far[s]
    return first, limit, ("rx", node, there, exit_, escaped)


def edges(dfa: Dfa, name: Name, close: Name) -> Edges:
    """("rx", node, s, exit, escaped): in the string at DFA state `s`; `escaped`: a backslash was
    just written, so the letter of one of the escaped bytes comes next.  `close`: after the string."""
    _, node, s, exit_, escaped = name
    assert isinstance(s, int)
    out = dfa.trans[s]
    counts = COUNTS if s in dfa.far else None  # (each byte that begins a character adds one)
    if escaped:
        return {letter: (("rx", node, out[b], exit_, False), counts) for b, letter in ESCAPED.items() if b in out}
    result: Edges = {
        b: (("rx", node, t, exit_, False), None if 0x80 <= b < 0xC0 else counts)
        for b, t in out.items()
        if b not in ESCAPED
    }
    if any(b in ESCAPED for b in out):
        result[ord("\\")] = (("rx", node, s, exit_, True), None)
    if s in dfa.accept:
        result[ord('"')] = (close, None)
    return result


@functools.lru_cache(maxsize=64)
def answer_grammar(pattern: str, where: str = "guided_regex") -> Grammar:
    """The grammar of an answer that is one match of `pattern` (any byte its DFA takes); ValueError
    names what is not built (the pattern named `where`)."""
    dfa = compile_dfa(pattern, where)
    return Grammar(
        lambda name: {b: (("rxa", t), None) for b, t in dfa.trans[name[1]].items()},
        ("rxa", 0),
        lambda name: name[1] in dfa.accept,
    )
