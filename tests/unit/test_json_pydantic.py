"""pydantic's own schemas and validators against our grammars: a model with the shapes pydantic
writes for everyday fields (a float in bounds, dicts with and without a size, a tuple, a
discriminated union, an enum, Optional, lists, a long string, URLs), and a recursive one (a
tree), compile; any instance pydantic dumps is read whole; and every answer a random walk through
the grammar writes is one pydantic validates."""

from __future__ import annotations

import json
import random
import uuid
from datetime import timedelta, timezone
from ipaddress import IPv6Address
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_serve.engine.grammar_table import complete
from spmd_serve.engine.json_schema import grammar
from tests.support.grammar_walk import walk
from tests.support.pydantic_models import Cat, Color, Dog, Kinds, Record, Tree

G = grammar(json.dumps(Record.model_json_schema()))
TREE = grammar(json.dumps(Tree.model_json_schema()))
WORDS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=4)
PETS = st.builds(Cat, pet_type=st.just("cat"), meows=st.integers(0, 10)) | st.builds(
    Dog, pet_type=st.just("dog"), bark=st.decimals(-1.4, 1.9, places=2).map(float)
)
RECORDS = st.builds(
    Record,
    score=st.decimals(0, 1, places=3).map(float),
    counts=st.dictionaries(WORDS, st.integers(-(10**9), 10**9), max_size=3),
    point=st.tuples(st.integers(-50, 50), WORDS),
    pet=PETS,
    color=st.sampled_from(Color),
    note=st.none() | WORDS,
    tags=st.lists(WORDS, max_size=2),
    ids=st.lists(st.integers(-9, 10**6), max_size=4),
    votes=st.dictionaries(WORDS, st.booleans(), min_size=1, max_size=2),
    summary=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=300),
    site=st.none() | st.sampled_from(["https://example.com/a?b=c#d", "mailto:a@b.c", "urn:isbn:0451450523"]),
    home=st.none() | st.sampled_from(["http://127.0.0.1:80/x", "https://example.com/%20a/" + "b" * 2000]),
    price=st.integers(0, 4000).map(lambda n: n / 4),
    step=st.integers(-100, 100).map(lambda n: n * 5),
)


@settings(max_examples=150, deadline=None)
@given(RECORDS, st.sampled_from([None, 2]))
def test_every_instance_pydantic_dumps_is_read_whole(record, indent):
    text = record.model_dump_json(indent=indent)
    assert complete(G.step(G.start, text.encode())), text


@pytest.mark.parametrize("seed", range(4))
def test_every_answer_the_grammar_lets_out_is_valid_to_pydantic(seed):
    rng = random.Random(seed)
    for _ in range(40):
        # (as the client gets it: bytes that are no UTF-8 are decoded to U+FFFD)
        answer = json.loads(walk(G, rng).decode("utf-8", "replace"))
        answer.pop("home", None)  # (its schema says any URI: pydantic's HttpUrl also wants http or https)
        Record.model_validate(answer)  # raises where it is not


def test_out_of_bounds_values_are_not_read():
    good = Record(score=1, counts={"a": 1}, point=(1, "x"), pet=Cat(pet_type="cat", meows=10))
    text = good.model_dump_json()
    assert complete(G.step(G.start, text.encode()))
    assert complete(G.step(G.start, text.replace('"summary":""', f'"summary":"{"a" * 300}"').encode()))
    assert text.endswith('"step":0}') and not complete(G.step(G.start, text.replace('"step":0', '"step":7').encode()))
    for bad in (
        '"score":1.01',
        '"meows":11',
        '"point":[1,"x",2]',
        '"counts":{"a":1.5}',
        f'"summary":"{"a" * 301}"',
        '"price":0.3',
    ):
        key = bad.split(":")[0]
        start = text.index(key)
        end = text.index(",", start) if key != '"point"' else text.index("]", start) + 1
        assert not complete(G.step(G.start, (text[:start] + bad + text[end:]).encode())), bad


TREES = st.deferred(
    lambda: st.builds(Tree, name=st.sampled_from(["a", "b"]), kids=st.lists(TREES, max_size=3), next=st.none() | TREES)
)


@settings(max_examples=100, deadline=None)
@given(TREES)
def test_a_recursive_model_s_instances_are_read_whole(tree):
    text = tree.model_dump_json()  # (compact: pretty-printed, a deep tree passes the 20 indents allowed)
    assert complete(TREE.step(TREE.start, text.encode())), text


def test_every_tree_the_grammar_lets_out_is_valid_to_pydantic():
    rng = random.Random(11)
    depths = set()
    for _ in range(60):
        tree = Tree.model_validate_json(walk(TREE, rng))  # raises where it is not
        depths.add(_depth(tree))
    assert max(depths) >= 3  # (the walks did nest: the stack was used)


def _depth(tree: Tree) -> int:
    return 1 + max([_depth(k) for k in tree.kids] + [_depth(tree.next) if tree.next else 0])


def _days(n: int) -> timedelta:
    return timedelta(days=n)  # (pydantic writes "P3D", RFC 3339's form; "PT1H1S" and "P1Y1D" are not)


KINDS = grammar(json.dumps(Kinds.model_json_schema()))
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)


@settings(max_examples=100, deadline=None)
@given(
    st.uuids(version=4),
    st.datetimes(timezones=st.just(timezone.utc)),
    st.integers(0, 364).map(_days),
    st.ip_addresses(),
    TEXT,
    TEXT,
)
def test_format_types_instances_are_read_whole(ident, at, took, host, secret, blob):
    # (an aware time: RFC 3339's date-time has an offset, where pydantic also writes naive ones bare)
    kinds = Kinds(id=ident, at=at, took=took, host=host, v6=IPv6Address(int(ident)), secret=secret,
                  blob=blob.encode(), where=Path(blob or "."))  # fmt: skip
    text = kinds.model_dump_json()
    assert complete(KINDS.step(KINDS.start, text.encode())), text
    wrong = text.replace(str(ident), str(uuid.UUID(int=int(ident), version=1)))  # (a version-1 id)
    assert not complete(KINDS.step(KINDS.start, wrong.encode())), wrong


def test_every_format_types_answer_the_grammar_lets_out_is_valid_to_pydantic():
    rng = random.Random(12)
    for _ in range(60):
        answer = json.loads(walk(KINDS, rng).decode("utf-8", "replace"))
        answer["took"] = "PT1S"  # (its form is held; its size may pass a timedelta's: test_json_patterns.py)
        Kinds.model_validate(answer)  # raises where it is not
