"""The compiled grammars a process keeps (engine/grammar_cache.py): one grammar per set of arguments
however they are passed, the least recently used dropped past MAX_ENTRIES or past MAX_BYTES of
tables (the newest always kept), a grammar a caller holds unchanged by the drop, and threads
compiling at once all get the one kept."""

from __future__ import annotations

import json
import threading

import pytest

from spmd_serve.engine import grammar_cache
from spmd_serve.engine.grammar_table import complete
from spmd_serve.engine.json_schema import grammar


def _schema(i: int, props: int = 3) -> str:
    return json.dumps({"type": "object", "properties": {f"p{i}_{k}": {"type": "integer"} for k in range(props)}})


def test_one_grammar_per_arguments_however_passed():
    grammar.cache_clear()
    text = _schema(0)
    g = grammar(text)
    assert grammar(text, None) is g and grammar(text, whitespace=None) is g and grammar(text=text) is g
    assert grammar(text, "") is not g and grammar(text, "") is grammar(text, whitespace="")
    assert g.nbytes == g.table.nbytes + g.pushes.nbytes > 0


def test_the_least_recently_used_go_past_the_bytes_or_the_count(monkeypatch: pytest.MonkeyPatch):
    grammar.cache_clear()
    first = grammar(_schema(1))
    monkeypatch.setattr(grammar_cache, "MAX_BYTES", 3 * first.nbytes)
    kept = [first, grammar(_schema(2)), grammar(_schema(3))]
    assert grammar(_schema(1)) is first  # (used again: now the most recent)
    grammar(_schema(4))  # past the bytes: schema 2's goes
    assert grammar(_schema(1)) is first and grammar(_schema(3)) is kept[2]
    assert grammar(_schema(2)) is not kept[1]
    assert complete(kept[1].step(kept[1].start, b'{"p2_0":1}'))  # (a grammar held stays whole)
    monkeypatch.setattr(grammar_cache, "MAX_BYTES", 1)  # the newest is kept whatever its size
    big = grammar(_schema(5, props=40))
    assert grammar(_schema(5, props=40)) is big and grammar(_schema(1)) is not first
    monkeypatch.setattr(grammar_cache, "MAX_BYTES", 1 << 40)
    monkeypatch.setattr(grammar_cache, "MAX_ENTRIES", 2)
    a, b = grammar(_schema(6)), grammar(_schema(7))
    grammar(_schema(8))
    assert grammar(_schema(7)) is b and grammar(_schema(6)) is not a


def test_threads_compiling_at_once_get_the_one_kept():
    grammar.cache_clear()
    text, got, barrier = _schema(9, props=20), [], threading.Barrier(4)

    def compile_() -> None:
        barrier.wait()
        got.append(grammar(text))

    threads = [threading.Thread(target=compile_) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(g is got[0] for g in got) and grammar(text) is got[0]
