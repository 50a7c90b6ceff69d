"""What a JSON answer costs rank 0 per step (engine/json_masks.py), at a real vocabulary's size: a
made-up byte-level vocabulary of --vocab tokens (words and word pieces with and without a leading
space, punctuation runs, every single byte), a grammar (json_object, or a pydantic-like schema),
and --answers answers drawn at random among the allowed tokens, each step's `allowed` timed.

    python benchmarks/json_masks.py [--vocab 150000] [--answers 8] [--tokens 200]
        [--schema [--compact] | --gbnf FILE | --structural-tag FILE | --tools N]

Prints the vocabulary's set-up time, the compile time of the schema (or of the GBNF grammar:
guided_grammar; of the structural tag; of tool_choice "required" over N three-property tools), and
per step: the median and p99 of a step whose table state was seen before (a cached mask) and of one
seeing it first (a walk).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

from spmd_serve.engine import gbnf_grammar, structural_tag
from spmd_serve.engine.grammar_table import complete
from spmd_serve.engine.json_masks import JsonVocab
from spmd_serve.engine.json_schema import grammar
from spmd_serve.frontend.openai.tools import parse_tools

SCHEMA = {
    "$defs": {"Pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer"}}}},
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
        "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]}, "score": {"type": "number"},
    },
    "required": ["name", "age"],
}  # fmt: skip


def vocabulary(size: int, rng: random.Random) -> list[bytes]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = {bytes([b]) for b in range(256)} | {p.encode() for p in ('{"', '":', '",', '"}', "},", "],", '["', "\n  ")}
    while len(out) < size:
        word = "".join(rng.choice(letters) for _ in range(rng.randint(1, 9)))
        out.add((rng.choice(["", " ", '"', "_", "."]) + word + rng.choice(["", "", '"', '":', ",", "}"])).encode())
    return sorted(out)


def _tool(i: int) -> dict:
    parameters = {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}, "days": {"type": "integer"}}}  # fmt: skip
    return {"type": "function", "function": {"name": f"tool_{i}", "parameters": parameters}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=150000)
    ap.add_argument("--answers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--schema", action="store_true")
    ap.add_argument("--gbnf", help="a GBNF grammar's file (guided_grammar) instead of a schema")
    ap.add_argument("--structural-tag", help="a structural tag's JSON file (either form) instead of a schema")
    ap.add_argument("--tools", type=int, help='tool_choice "required" over this many three-property tools instead')
    ap.add_argument("--compact", action="store_true", help="the schema's answer without whitespace")
    a = ap.parse_args()
    rng = random.Random(0)
    tokens = vocabulary(a.vocab, rng)
    t0 = time.perf_counter()
    vocab = JsonVocab(tokens)
    t1 = time.perf_counter()
    if a.gbnf:
        g = gbnf_grammar.answer_grammar(Path(a.gbnf).read_text())
    elif a.structural_tag:
        g = structural_tag.answer_grammar(Path(a.structural_tag).read_text())
    elif a.tools:
        g = grammar(parse_tools({"tools": [_tool(i) for i in range(a.tools)], "tool_choice": "required"}, None).schema)
    else:
        g = grammar(json.dumps(SCHEMA) if a.schema else '{"type":"object"}', "" if a.compact else None)
    t2 = time.perf_counter()
    print(f"vocabulary {len(tokens)} tokens: set up {1e3 * (t1 - t0):.0f} ms; grammar {g.table.shape[0]} states, "
          f"compiled in {1e3 * (t2 - t1):.1f} ms")  # fmt: skip
    seen: set[int] = set()
    cached, first, whole = [], [], 0
    for _ in range(a.answers):
        state = g.start
        for _ in range(a.tokens):
            new = state[0] not in seen
            t = time.perf_counter()
            mask = vocab.allowed(g, state)
            (first if new else cached).append(time.perf_counter() - t)
            seen.add(state[0])
            ids = np.flatnonzero(mask)
            if complete(state) or not len(ids):
                whole += complete(state)
                break
            state = g.step(state, tokens[int(ids[rng.randrange(len(ids))])])
    for name, xs in (("cached state", cached), ("first seen", first)):
        ms = np.array(xs) * 1e3
        print(f"{name}: {len(ms)} steps, median {np.median(ms):.2f} ms, p99 {np.percentile(ms, 99):.2f} ms")
    print(f"{whole}/{a.answers} answers whole within {a.tokens} tokens; {len(seen)} table states seen")


if __name__ == "__main__":
    main()
