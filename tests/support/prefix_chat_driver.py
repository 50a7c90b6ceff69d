"""Runs the same multi-turn chats twice in one `mpirun`, without and with prefix caching (test helper).

    mpirun -n N python -m tests.support.prefix_chat_driver MODEL_DIR SPEC.json OUT.json

SPEC: {"system": [ids], "turns": [[[ids] per turn] per chat], "params": {...}, "engine": {...}}.
Every rank opens its shard once; rank 0 runs one engine per setting over the same ranks (the
workers stay in their plan loop throughout: tests/support/spec_driver.py) and writes, per setting,
each request's tokens, its cached prompt tokens and the run's preemptions and prefix-cache counts.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tests.support.spec_driver import drive_settings


def _record(engine: Any, rounds: list) -> dict[str, Any]:
    reg = engine.metrics.registry
    queries, hits = (reg.get_sample_value(f"spmd_serve:prefix_cache_{k}_total") for k in ("queries", "hits"))
    reqs = [r for rnd in rounds for r in rnd]
    return {
        "tokens": [[r.output_token_ids for r in rnd] for rnd in rounds],
        "prompt_lens": [[r.num_prompt_tokens for r in rnd] for rnd in rounds],
        "cached": [[r.num_cached_tokens for r in rnd] for rnd in rounds],
        "preemptions": sum(r.num_preemptions for r in reqs),
        "queries": queries,
        "hits": hits,
    }


def main(model_dir: str, spec_path: str, out_path: str) -> int:
    spec = json.loads(open(spec_path).read())
    settings = [{"enable_prefix_caching": False}, {"enable_prefix_caching": True}]
    out = drive_settings(model_dir, spec, settings, _record)
    if out is not None:
        with open(out_path, "w") as f:
            json.dump(dict(zip(("plain", "caching"), out)), f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
