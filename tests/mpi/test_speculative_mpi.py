"""Speculative decoding on real ranks (issue 15): multi-turn chats whose answers repeat (the same
question asked again, so n-gram drafts are mostly right) give exactly the tokens of plain decoding
with `inference_with_reference` on, at TP 1 and 2 (one graph per rank, and Paddle's own ops with
a graph per stage, whose padded attention runs the verifying sequences as a separate pass; and
DeepSeek's MLA at TP 2), with
prefix caching, with a pool small enough to preempt, greedy and seeded sampling alike."""

from __future__ import annotations

import pytest

from tests.support.spec_driver import run_driver

pytestmark = pytest.mark.mpi
SYSTEM = "You are a careful assistant. Repeat your answer when asked again. "
QUESTIONS = [["What is a lantern?", "What is a lantern?"], ["Name a river.", "Name a river."]]
NGRAM = {"speculate_method": "inference_with_reference", "speculate_max_draft_token_num": 4}
SETTINGS = [
    {},  # plain decoding, roomy pool: the reference
    NGRAM,
    {**NGRAM, "enable_prefix_caching": True, "speculate_max_draft_token_num": 2, "speculate_max_ngram_size": 1},
    {**NGRAM, "num_blocks": 12},  # 12 blocks of 16 cannot hold both chats' second turns: preemption
]


@pytest.fixture(scope="module")
def served_deepseek(tmp_path_factory):
    """deepseek-tiny at TP 2 (the tiny demo's tokenizer): its decode graph runs plain decode steps,
    the general graph the speculative ones."""
    from spmd_serve.export import ensure_demo_model

    return ensure_demo_model("deepseek-tiny", tp=2, root=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tok(demo_checkpoint):
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

    return ServingTokenizer.from_model_dir(demo_checkpoint)


def run(n: int, model_dir, tok, tmp_path, params: dict) -> list[dict]:
    spec = {
        "system": [tok.bos_token_id] + tok.encode(SYSTEM),
        "turns": [[tok.encode(" User: " + q + " Assistant:") for q in chat] for chat in QUESTIONS],
        "params": params,
        "engine": {"block_size": 16, "num_blocks": 64, "max_num_batched_tokens": 32, "max_num_seqs": 2},
        "settings": SETTINGS,
    }
    return run_driver(n, "tests.support.spec_driver", model_dir, spec, tmp_path)


PARAMS = {
    "greedy": {"max_tokens": 40, "min_tokens": 40, "temperature": 0.0},
    "seeded": {"max_tokens": 40, "min_tokens": 40, "temperature": 0.3, "top_k": 3, "top_p": 0.95, "seed": 11},
}


# (deepseek-tiny's sampled answers repeat nothing for the proposer to find: greedy only)
CASES = [(s, p) for s in ("tp1", "tp2", "tp2_segments") for p in PARAMS] + [("deepseek", "greedy")]


@pytest.mark.parametrize("served,params", CASES, ids=[f"{s}-{p}" for s, p in CASES])
def test_speculation_gives_the_tokens_of_plain_decoding(served, params, request, tok, tmp_path):
    model_dir = request.getfixturevalue(f"served_{served}")
    plain, *spec = run(1 if served == "tp1" else 2, model_dir, tok, tmp_path, PARAMS[params])
    assert plain["drafts"] == 0 and plain["preemptions"] == 0
    for got, setting in zip(spec, SETTINGS[1:]):
        assert got["tokens"] == plain["tokens"]
        assert got["accepted"] > 0  # some drafts were right
        assert got["free_blocks"] == setting.get("num_blocks", 64)  # every block back (cached ones are free)
    assert spec[0]["steps"] < plain["steps"] and spec[1]["steps"] < plain["steps"]  # accepted drafts saved steps
    assert spec[2]["preemptions"] > 0  # the small pool preempted, with drafts in flight
