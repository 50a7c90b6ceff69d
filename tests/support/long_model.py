"""A request that is still in flight whenever a test acts on it (test helper).

Tests of cancels, hang-ups, duplicate ids, killed workers and drain timeouts need a request that
cannot end on its own before the test has acted.  On the tiny demo model (2,048 positions) the
longest request is ~2,000 tokens: ~1-3 s at ~0.5-1.5 ms a token, and in CI (2 cores, other test
lanes beside) a test that was descheduled for that long saw its request finish first (sessions 17
and 19).  So such tests serve the same tiny weights with a context of `CONTEXT` positions (RoPE is
computed from the positions, so the graphs have no position limit of their own) and ask for `TOKENS`
tokens: minutes of decoding, as every step's attention grows with the context.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CONTEXT = 1 << 17
TOKENS = 120_000
# The server settings that let one request of TOKENS tokens run: BLOCK_BS=2 keeps the KV pool at two
# such sequences (~60 MB a rank at TP=2) instead of the default 50.
SERVER_ENV = {"MAX_DEC_LEN": str(TOKENS), "BLOCK_BS": "2"}


def write_long_checkpoint(source: Path, out_dir: Path) -> Path:
    """A copy of the checkpoint `source` with max_position_embeddings = CONTEXT."""
    ckpt = Path(shutil.copytree(source, out_dir))
    config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    config["max_position_embeddings"] = CONTEXT
    (ckpt / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return ckpt
