"""The string formats (engine/json_formats.py) against an independent validator: every value a
random walk through a format's grammar writes is one jsonschema-rs (Rust, format assertion on)
takes, and pydantic too for pydantic's own formats; hand-picked edge cases of each standard are
read exactly as jsonschema-rs reads them."""

from __future__ import annotations

import json
import random
import uuid

import jsonschema_rs
import pytest
from pydantic import IPvAnyAddress, TypeAdapter

from spmd_serve.engine.grammar_table import complete
from spmd_serve.engine.json_formats import ANY_STRING_FORMATS, FORMATS
from spmd_serve.engine.json_schema import grammar
from tests.support.grammar_walk import walk

PYDANTIC = {**{f"uuid{v}": getattr(__import__("pydantic"), f"UUID{v}", None) for v in (1, 3, 4, 5, 6, 7, 8)},
            "ipvanyaddress": IPvAnyAddress}  # fmt: skip


UNHELD = {"hostname": 253, "email": 254}  # (the lengths in all not held: json_formats.py says why)


def _schema(fmt: str) -> dict:
    return {"type": "object", "properties": {"v": {"type": "string", "format": fmt}}, "required": ["v"]}


def _reference(fmt: str) -> jsonschema_rs.Validator:
    return jsonschema_rs.validator_for({"type": "string", "format": fmt}, validate_formats=True)


@pytest.mark.parametrize("fmt", [*FORMATS, *ANY_STRING_FORMATS])
def test_every_value_a_walk_writes_is_valid_to_the_reference(fmt):
    g, rng, reference = grammar(json.dumps(_schema(fmt))), random.Random(fmt), _reference(fmt)
    for _ in range(120):
        value = json.loads(walk(g, rng).decode("utf-8", "replace"))["v"]
        assert reference.is_valid(value) or len(value) > UNHELD.get(fmt, len(value)), (fmt, value)
        if PYDANTIC.get(fmt) is not None:
            TypeAdapter(PYDANTIC[fmt]).validate_python(value)  # raises where it is not
        if fmt.startswith("uuid") and fmt != "uuid":
            assert uuid.UUID(value).version == int(fmt[4:]), value


EDGES = {
    "duration": ["PT1H1S", "PT1.5S", "P1W", "P1W1D", "P1Y1D", "PT1M", "P1DT1H1M1S", "P0D", "PT36H", "P1Y2M3DT4H5M6S"],
    "hostname": ["a" * 63 + ".com", "a" * 64 + ".com", "a-.b", "-a.b", "a..b", "a", "1.2.3.4", "a.b.", "ab--cd.com",
                 "a--b.com", "abc--d.com", "a_b.com", "a.123", "a-b-c"],
    "email": ["a@b.co", ".a@b.co", "a..b@c.co", "a.@b.co", "a@-b.co", "a@b-.co", "a%b@c.co", "a+b@c.co",
              "a" * 64 + "@b.co", "a" * 65 + "@b.co", "a!#$&'*/=?^_`{|}~-@b.co", "a@b_c.co", "a@b.co.", "a.b@c.de"],
    "uri": ["http:", "a:b", "http://a b", "http://[::1]/", "http://a/%zz", "a:[", "a:#a#b", "a:?b?c",
            "a://u@h:80/p?q#f", "a:/b", "a://", "a:b[c", "a://h:x", "a://h:80:80", "a://[1::2", "a:%41",
            "a://a@b@c", "a://h:", "a://:80", "a://u:p@h", "a:b/c:d", "A+1.-:x", "a://[::ffff:1.2.3.4]", "a:?#"],
}  # fmt: skip


@pytest.mark.parametrize("fmt", EDGES)
def test_edge_cases_are_read_as_the_reference_reads_them(fmt):
    """Each is read whole only if jsonschema-rs takes it (never looser); the ordinary ones both take."""
    g, reference = grammar(json.dumps(_schema(fmt))), _reference(fmt)
    taken = 0
    for value in EDGES[fmt]:
        ours = complete(g.step(g.start, json.dumps({"v": value}).encode()))
        assert not ours or reference.is_valid(value), (fmt, value)
        taken += ours
    assert taken >= 4, fmt
