"""Speculative decoding on real ranks (issue 15): multi-turn chats whose answers repeat (the same
question asked again, so n-gram drafts are mostly right) give exactly the tokens of plain decoding
with `inference_with_reference` on, at TP 1 and 2 (one graph per rank, and Paddle's own ops with
a graph per stage, whose padded attention runs the verifying sequences as a separate pass; and
DeepSeek's MLA at TP 2), with
prefix caching, with a pool small enough to preempt, greedy and seeded sampling alike.

The same with `draft_model`: the served export drafting for itself (every draft of a greedy
request must then be accepted: the draft's K/V, its catch-up and its scratch blocks are right), and
a noisy copy of its weights (some drafts rejected: the rollback and the draft's K/V count after it).
And with `mtp`: deepseek-tiny's MTP layer (its `mtp/` export) drafting at TP 1 and 2, every step (its
random weights draft noise: every rejection path runs), and the trained `chat-deepseek` demo's MTP
layer drafting chat answers: the same tokens, and most of its drafts accepted."""

from __future__ import annotations

import pytest

from tests.support.spec_driver import run_driver

pytestmark = pytest.mark.mpi
SYSTEM = "You are a careful assistant. Repeat your answer when asked again. "
QUESTIONS = [["What is a lantern?", "What is a lantern?"], ["Name a river.", "Name a river."]]
NGRAM = {"speculate_method": "inference_with_reference", "speculate_max_draft_token_num": 4}
DRAFT = {"speculate_method": "draft_model", "speculate_max_draft_token_num": 3}
# a draft of other weights is often wrong: drafting every step (no per-step rule) exercises rejection
OTHER = {**DRAFT, "speculate_min_acceptance": 0.0}
MTP = {"speculate_method": "mtp", "speculate_max_draft_token_num": 3, "speculate_min_acceptance": 0.0}


def settings(method: dict) -> list[dict]:
    return [
        {},  # plain decoding, roomy pool: the reference
        method,
        {**method, "enable_prefix_caching": True, "speculate_max_draft_token_num": 2, "speculate_max_ngram_size": 1},
        {**method, "num_blocks": 12},  # 12 blocks of 16 cannot hold both chats' second turns: preemption
    ]


SETTINGS = settings(NGRAM)


@pytest.fixture(scope="module")
def served_deepseek(tmp_path_factory):
    """deepseek-tiny at TP 2 (the tiny demo's tokenizer): its decode graph runs plain decode steps,
    the general graph the speculative ones."""
    from spmd_serve.export import ensure_demo_model

    return ensure_demo_model("deepseek-tiny", tp=2, root=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def served_deepseek1(tmp_path_factory):
    from spmd_serve.export import ensure_demo_model

    return ensure_demo_model("deepseek-tiny", tp=1, root=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tok(demo_checkpoint):
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

    return ServingTokenizer.from_model_dir(demo_checkpoint)


NOISE = 0.3  # of each weight tensor's standard deviation: the draft agrees with the target, often


@pytest.fixture(scope="module")
def other_weights(demo_checkpoint, tmp_path_factory):
    """The tiny demo with its weights perturbed by noise (the same tokenizer), at TP 1 and 2."""
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    from spmd_serve.export import export_checkpoint

    ckpt = tmp_path_factory.mktemp("ckpt") / "tiny-noisy"
    shutil.copytree(demo_checkpoint, ckpt)
    rng = np.random.default_rng(1)
    weights = load_file(ckpt / "model.safetensors")
    noisy = {k: w + (NOISE * w.std() * rng.standard_normal(w.shape)).astype(w.dtype) for k, w in weights.items()}
    save_file(noisy, str(ckpt / "model.safetensors"))
    out = tmp_path_factory.mktemp("served")
    return {n: export_checkpoint(ckpt, out / f"tp{n}", tp=n, graph_ops="cpp") for n in (1, 2)}


def run(
    n: int, model_dir, tok, tmp_path, params: list[str], setting_list=SETTINGS, draft=None, chats=None, sampling=None
) -> list[list[dict]]:
    """Every setting under each of `params` (PARAMS' names; `sampling` gives them where not PARAMS),
    in one `mpirun`: per name, the settings' results.  `chats`: (system ids, turns ids per chat, EOS
    ids); default SYSTEM and QUESTIONS, no EOS."""
    sampling = sampling or PARAMS
    engine = {"block_size": 16, "num_blocks": 64, "max_num_batched_tokens": 32, "max_num_seqs": 2}
    if chats is None:
        turns = [[tok.encode(" User: " + q + " Assistant:") for q in chat] for chat in QUESTIONS]
        chats = ([tok.bos_token_id] + tok.encode(SYSTEM), turns, [])
    spec = {
        "system": chats[0],
        "turns": chats[1],
        "params": {},
        "engine": {**engine, "eos_token_ids": chats[2], **({"speculate_model_path": str(draft)} if draft else {})},
        # one process for every sampling: a driver's start (MPI, Paddle, the graphs) costs more than a run
        "settings": [{**setting, "params": sampling[p]} for p in params for setting in setting_list],
    }
    results = run_driver(n, "tests.support.spec_driver", model_dir, spec, tmp_path)
    k = len(setting_list)
    return [results[i * k : (i + 1) * k] for i in range(len(params))]


PARAMS = {
    "greedy": {"max_tokens": 40, "min_tokens": 40, "temperature": 0.0},
    "seeded": {"max_tokens": 40, "min_tokens": 40, "temperature": 0.3, "top_k": 3, "top_p": 0.95, "seed": 11},
}


# (deepseek-tiny's sampled answers repeat nothing for the proposer to find: greedy only)
CASES = {"tp1": list(PARAMS), "tp2": list(PARAMS), "tp2_segments": list(PARAMS), "deepseek": ["greedy"]}


@pytest.mark.parametrize("served", list(CASES))
def test_speculation_gives_the_tokens_of_plain_decoding(served, request, tok, tmp_path):
    model_dir = request.getfixturevalue(f"served_{served}")
    for results in run(1 if served == "tp1" else 2, model_dir, tok, tmp_path, CASES[served]):
        check_parity(results, SETTINGS)


def check_parity(
    results: list[dict], setting_list: list[dict], saves_steps: bool = True, accepts: bool = True
) -> list[dict]:
    """Every speculative setting gave the reference's tokens, returned every block, and the small
    pool preempted; the speculative results.  `accepts`: some drafts were right (else: some drafted)."""
    plain, *spec = results
    assert plain["drafts"] == 0 and plain["preemptions"] == 0
    for got, setting in zip(spec, setting_list[1:]):
        assert got["tokens"] == plain["tokens"]
        assert got["accepted"] > 0 if accepts else got["drafts"] > 0  # some drafts were right / made
        assert got["free_blocks"] == setting.get("num_blocks", 64)  # every block back (cached ones are free)
    if saves_steps:  # accepted drafts saved steps
        assert spec[0]["steps"] < plain["steps"] and spec[1]["steps"] < plain["steps"]
    assert spec[2]["preemptions"] > 0  # the small pool preempted, with drafts in flight
    return spec


@pytest.mark.parametrize("served", ["tp1", "tp2", "tp2_segments"])
def test_a_model_drafting_for_itself_gives_the_tokens_of_plain_decoding(served, request, tok, tmp_path):
    model_dir = request.getfixturevalue(f"served_{served}")
    n = 1 if served == "tp1" else 2
    draft_settings = settings(DRAFT)
    for params, results in zip(PARAMS, run(n, model_dir, tok, tmp_path, list(PARAMS), draft_settings, model_dir)):
        spec = check_parity(results, draft_settings)
        # the draft computes what the target does: every greedy draft is right, and a seeded one is
        # drawn on the draw the target verifies it with (up to the float rounding of 1 vs 1 + d query rows)
        share = 1.0 if params == "greedy" else 0.95
        assert all(got["accepted"] >= share * got["drafts"] for got in spec), (params, spec)


@pytest.mark.parametrize("n", [1, 2])
def test_a_draft_of_other_weights_gives_the_tokens_of_plain_decoding(n, other_weights, request, tok, tmp_path):
    model_dir = request.getfixturevalue(f"served_tp{n}")
    draft_settings = settings(OTHER)
    for results in run(n, model_dir, tok, tmp_path, list(PARAMS), draft_settings, other_weights[n]):
        spec = check_parity(results, draft_settings, False)
        assert all(got["accepted"] < got["drafts"] for got in spec), spec  # rejections happened


@pytest.mark.parametrize("n", [1, 2])
def test_the_mtp_layer_drafting_gives_the_tokens_of_plain_decoding(n, request, tok, tmp_path):
    model_dir = request.getfixturevalue("served_deepseek1" if n == 1 else "served_deepseek")
    mtp_settings = settings(MTP)
    for results in run(n, model_dir, tok, tmp_path, list(PARAMS), mtp_settings, model_dir / "mtp"):
        check_parity(results, mtp_settings, saves_steps=False, accepts=False)


# The trained demo's MTP layer drafts every step (no per-step rule), so the acceptance is its own.
TRAINED_MTP = {**MTP, "speculate_max_draft_token_num": 2}
# Measured: 69-71 of 98-100 drafts accepted in each setting (0.70; chance is 1 / 2048), and 37 steps
# instead of 73; the bound keeps a margin for other CPUs' rounding.
TRAINED_MTP_ACCEPTANCE = 0.5


def test_the_trained_mtp_layer_drafts_chat_answers(tmp_path_factory, tmp_path):
    """The `chat-deepseek` demo (export/demo/train.py, weights committed) at TP 1 answering chat
    questions, three turns each: its MTP layer's drafts give the tokens of plain decoding, with
    preemption too, and most are accepted."""
    from spmd_serve.export import ensure_demo_model
    from spmd_serve.export.demo.training_data import chat_pairs, chat_text
    from spmd_serve.frontend.text.tokenizer import ServingTokenizer

    model_dir = ensure_demo_model("chat-deepseek", tp=1, root=tmp_path_factory.mktemp("cache"))
    tok = ServingTokenizer.from_model_dir(model_dir)
    questions = [q for q, _ in chat_pairs()[:6]]
    turns = [[tok.encode(chat_text([("user", q)]) + "<|assistant|>\n") for q in questions[c::2]] for c in range(2)]
    mtp_settings = settings(TRAINED_MTP)
    greedy = {"greedy": {"max_tokens": 48, "temperature": 0.0}}
    chats = ([1], turns, [2, 6])
    (results,) = run(1, model_dir, tok, tmp_path, ["greedy"], mtp_settings, model_dir / "mtp", chats, greedy)
    spec = check_parity(results, mtp_settings)
    assert all(got["accepted"] >= TRAINED_MTP_ACCEPTANCE * got["drafts"] for got in spec), spec
