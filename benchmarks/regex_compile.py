"""What a pattern costs to compile (engine/regex_dfa.py): for JSON Schema's `pattern` / `format`
strings and vLLM's guided_regex, the time from the pattern's text to its minimal DFA, and the DFA's
states (each is a grammar state, i.e. one vocabulary walk the first time an answer meets it), or the
refusal and how long it took to come.  Both the HTTP worker (checking a request) and rank 0 (holding
the answer to it) compile a pattern once; each caches 64.

    python benchmarks/regex_compile.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from spmd_serve.engine.json_patterns import FORMATS, WRITABLE
from spmd_serve.engine.regex_dfa import compile_dfa

PATTERNS = {
    **{f"format {k}": v for k, v in FORMATS.items()},
    "yes|no|maybe": r"(yes|no|maybe)",
    "phone": r"\+?[0-9]{1,3}[ -]?\(?[0-9]{3}\)?[ -]?[0-9]{3}[ -]?[0-9]{4}",
    "[a-z]{1,256}": r"[a-z]{1,256}",
    "words {0,50}": r"(\w+\s){0,50}\w+",
    "any but quote {0,100}": r'[^"]{0,100}',
    "any {0,256} (refused)": r".{0,256}",
    "(a{256}){256} (refused)": r"(a{256}){256}",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"{'pattern':28} {'states':>7} {'median ms':>10} {'max ms':>8}")
    for name, pattern in PATTERNS.items():
        times, states = [], "-"
        for _ in range(args.rounds):
            t = time.perf_counter()
            try:
                states = str(len(compile_dfa(pattern, "p", WRITABLE).trans))
            except ValueError:
                states = "refused"
            times.append((time.perf_counter() - t) * 1e3)
        print(f"{name:28} {states:>7} {statistics.median(times):10.1f} {max(times):8.1f}")


if __name__ == "__main__":
    main()
