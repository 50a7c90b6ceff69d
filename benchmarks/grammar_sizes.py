"""How large and how slow to build a JSON schema's grammar is, for one property of each kind of
string and number the schema keywords make (maxLength, formats, multipleOf), and how many values a
random walk through each format writes that jsonschema-rs (format assertion on) refuses.

    PYTHONPATH=<tree> python benchmarks/grammar_sizes.py [--walks 300]

A kind the tree cannot build prints its refusal; run it at two trees to compare them.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # (after PYTHONPATH: the tree to measure)

from spmd_serve.engine.json_schema import grammar  # noqa: E402
from tests.support.grammar_walk import walk  # noqa: E402

KINDS = [{"type": "string", "maxLength": n} for n in (64, 256, 10_000)] + [
    {"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083},
    *({"type": "string", "format": f} for f in ("date-time", "duration", "ipv6", "hostname", "email", "uri")),
    {"type": "integer", "multipleOf": 5}, {"type": "integer", "multipleOf": 1000},
    {"type": "number", "multipleOf": 0.01}, {"type": "number", "multipleOf": 0.5, "minimum": 0, "maximum": 2},
]  # fmt: skip


def _schema(kind: dict) -> str:
    return json.dumps({"type": "object", "properties": {"v": kind}, "required": ["v"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--walks", type=int, default=300, help="random walks per format")
    args = parser.parse_args()
    import jsonschema_rs

    print(f"{'property':70} {'states':>7} {'build ms':>9} {'refused walks':>22}")
    for kind in KINDS:
        start = time.perf_counter()
        try:
            g = grammar(_schema(kind))
        except ValueError as e:
            print(f"{json.dumps(kind):70} refused: {str(e)[:60]}")
            continue
        ms = (time.perf_counter() - start) * 1000
        bad = ""
        if "format" in kind:
            check, rng = jsonschema_rs.validator_for(kind, validate_formats=True), random.Random(1)
            values = [json.loads(walk(g, rng).decode("utf-8", "replace"))["v"] for _ in range(args.walks)]
            refused = [v for v in values if not check.is_valid(v)]
            long = sum(len(v) > 253 for v in refused)  # (hostname's and email's totals are not held)
            bad = f"{len(refused)} ({long} long) / {args.walks}"
        print(f"{json.dumps(kind):70} {len(g.table):>7} {ms:>9.0f} {bad:>22}")


if __name__ == "__main__":
    main()
