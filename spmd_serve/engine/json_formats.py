"""JSON Schema's string `format`s as DFAs (engine/json_patterns.py writes them in a JSON string):
the nine formats OpenAI's strict mode supports, `uri`, and pydantic's own (uuid1 ... uuid8,
ipvanyaddress; password, binary and path are any string: ANY_STRING_FORMATS).

Each is exactly what its standard names, as a strict validator (jsonschema-rs) reads it, and never
what Python or pydantic refuse: RFC 3339's date (a day its month has, February's 29th only in a
leap year), time and date-time (no leap second: Python's datetime refuses it) and duration (its
appendix A, at most 9 digits a number so a model cannot write digits forever); RFC 4122's uuid;
RFC 3986's IPv4 and IPv6 addresses and URI (a port at most 65535, as the WHATWG parser behind
pydantic's URLs wants; no IP-literal host, "[::1]": its 150 states made pydantic's HttpUrl, a uri
of maxLength 2083, 7,504 grammar states to build in a second, 1,407 without); RFC 1123's hostname
(labels of at most 63 characters, none with "--" as its 3rd and 4th, which IDNA reserves); an email
address as a dot-atom of at most 64 characters at a hostname-like domain whose last label is
letters (email-validator's).  A format may need several regular expressions at once (a structure
and its length rules): the DFA is their intersection.

Not held: a hostname's 253 characters in all, an address's 254.  Counted as a maxLength they made
4,375 and 11,233 states (0.4 and 1.1 s to build, megabytes of table each): a schema's own maxLength
bounds them where it matters.
"""

from __future__ import annotations

import functools

from spmd_serve.engine.grammar_table import can_end
from spmd_serve.engine.json_patterns import MAX_BOUNDED_STATES, WRITABLE, bounded
from spmd_serve.engine.regex_dfa import Dfa, compile_dfa

_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_LEAP = r"([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29"
_DATE = (rf"([0-9]{{4}}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
         rf"|02-(0[1-9]|1[0-9]|2[0-8]))|{_LEAP})")  # fmt: skip
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_H16, _IPV4 = "[0-9a-fA-F]{1,4}", rf"({_OCTET}\.){{3}}{_OCTET}"
_LS32 = rf"({_H16}:{_H16}|{_IPV4})"


def _before(n: int) -> str:
    """RFC 3986's `[ *n( h16 ":" ) h16 ]`: the groups before an IPv6 address's `::`."""
    return rf"(({_H16}:){{0,{n}}}{_H16})?"


_IPV6 = "(" + "|".join([rf"({_H16}:){{6}}{_LS32}", rf"::({_H16}:){{5}}{_LS32}",
                        *(rf"{_before(n)}::({_H16}:){{{4 - n}}}{_LS32}" for n in range(4)),
                        rf"{_before(4)}::{_LS32}", rf"{_before(5)}::{_H16}", rf"{_before(6)}::"]) + ")"  # fmt: skip
# RFC 3339's duration: its parts in order (an hour's minutes and seconds only after it), weeks alone
_N = "[0-9]{1,9}"
_CLOCK = rf"T({_N}H({_N}M({_N}S)?)?|{_N}M({_N}S)?|{_N}S)"
_DURATION = rf"P(({_N}D|{_N}M({_N}D)?|{_N}Y({_N}M({_N}D)?)?)({_CLOCK})?|{_CLOCK}|{_N}W)"
# hostname: letters, digits and inner hyphens; each label at most 63, none "??--..."
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
_SHORT = r"[A-Za-z0-9-]{1,63}"
_NOT_RESERVED = r"([A-Za-z0-9-]{1,3}|[A-Za-z0-9-]{2}[A-Za-z0-9][A-Za-z0-9-]*|[A-Za-z0-9-]{2}-[A-Za-z0-9][A-Za-z0-9-]*)"
_HOST_RULES = (rf"{_LABEL}(\.{_LABEL})*", rf"{_SHORT}(\.{_SHORT})*", rf"{_NOT_RESERVED}(\.{_NOT_RESERVED})*")
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
# RFC 3986: a scheme, then "//" and an authority and a path, or a path; then a query and a fragment
_CHAR = r"([A-Za-z0-9._~!$&'()*+,;=-]|%[0-9A-Fa-f]{2})"  # (unreserved, sub-delims, percent-encoded)
_PCHAR = rf"({_CHAR}|[:@])"
_PORT = r"([0-9]{0,4}|[0-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_AUTHORITY = rf"(({_CHAR}|:)*@)?{_CHAR}*(:{_PORT})?"  # (a registered name or an IPv4 address)
_HIER = rf"(//{_AUTHORITY}(/{_PCHAR}*)*|/({_PCHAR}+(/{_PCHAR}*)*)?|{_PCHAR}+(/{_PCHAR}*)*)?"
_URI = rf"[A-Za-z][A-Za-z0-9+.-]*:{_HIER}(\?({_PCHAR}|[/?])*)?(#({_PCHAR}|[/?])*)?"

# format: the regular expressions a value matches all of
FORMATS: dict[str, tuple[str, ...]] = {
    "date": (_DATE,),
    "time": (_TIME,),
    "date-time": (_DATE + "T" + _TIME,),
    "duration": (_DURATION,),
    "uuid": (r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",),
    "ipv4": (_IPV4,),
    "ipv6": (_IPV6,),
    "hostname": _HOST_RULES,
    "email": (
        rf"{_ATEXT}+(\.{_ATEXT}+)*@({_LABEL}\.)+[A-Za-z]{{2,63}}",
        r"[!-?A-~]{1,64}@.*",
        *(rf"[!-?A-~]*@{rule}" for rule in _HOST_RULES[1:]),
    ),
    "uri": (_URI,),
    "ipvanyaddress": (f"({_IPV4})|({_IPV6})",),
    **{
        f"uuid{v}": (
            rf"[0-9a-fA-F]{{8}}-[0-9a-fA-F]{{4}}-{v}[0-9a-fA-F]{{3}}-[89abAB][0-9a-fA-F]{{3}}-[0-9a-fA-F]{{12}}",
        )
        for v in (1, 3, 4, 5, 6, 7, 8)
    },
}
ANY_STRING_FORMATS = ("password", "binary", "path")  # (pydantic's SecretStr, bytes, Path: any string is one)


@functools.lru_cache(maxsize=64)
def format_dfa(fmt: str, where: str, lo: int = 0, hi: int | None = None) -> Dfa:
    """The DFA of a format's values within minLength `lo` / maxLength `hi`."""
    return bounded(_whole(fmt), where, lo, hi)


@functools.lru_cache(maxsize=len(FORMATS))
def _whole(fmt: str) -> Dfa:
    """A format's DFA, made once whatever property names it (its rules are this module's)."""
    where = f"the format {fmt!r}"
    dfas = [compile_dfa(rule, where, WRITABLE) for rule in FORMATS[fmt]]
    return functools.reduce(lambda a, b: intersect(a, b, where), dfas)


@functools.lru_cache(maxsize=64)
def other_keys(names: tuple[str, ...], where: str) -> Dfa:
    """A key that is none of `names` (additionalProperties beside properties): any string, intersected
    with the complement of the names' trie (read as the string's own bytes: a JSON answer writes a
    character one way only, json_patterns.py)."""
    trie: list[dict[int, int]] = [{}]
    ends = set()
    for name in names:
        at = 0
        for b in name.encode():
            at = trie[at].setdefault(b, len(trie))
            trie += [{}] if at == len(trie) else []
        ends.add(at)
    other = len(trie)  # (off the trie: no name)
    trans = tuple({b: out.get(b, other) for b in range(256)} for out in trie) + (dict.fromkeys(range(256), other),)
    return intersect(compile_dfa(r"[\s\S]*", where, WRITABLE), Dfa(trans, frozenset(range(other + 1)) - ends), where)


def intersect(a: Dfa, b: Dfa, where: str) -> Dfa:
    """The DFA of the strings both take (their product), only states from which both can end."""
    ids, trans, todo = {(0, 0): 0}, [dict[int, int]()], [(0, 0)]
    into: list[list[int]] = [[]]
    while todo:
        here = todo.pop()
        out_a, out_b = a.trans[here[0]], b.trans[here[1]]
        for byte in out_a.keys() & out_b.keys():
            there = (out_a[byte], out_b[byte])
            if there not in ids:
                if len(ids) >= MAX_BOUNDED_STATES:
                    raise ValueError(f"{where} makes more than {MAX_BOUNDED_STATES} states")
                ids[there] = len(ids)
                trans.append({})
                into.append([])
                todo.append(there)
            trans[ids[here]][byte] = ids[there]
            into[ids[there]].append(ids[here])
    accept = {i for (s, t), i in ids.items() if s in a.accept and t in b.accept}
    live = can_end(accept, into.__getitem__)
    return Dfa(tuple({c: t for c, t in out.items() if t in live} for out in trans), frozenset(accept))
