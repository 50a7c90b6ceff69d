"""Issue 7 item 2, must show: quantised exports and the int8 KV cache, served by the real engine
under `mpirun`, against the fp32 export of the same checkpoint.

Model: tests/support/trained_model.py's tiny Qwen2 (q/k/v biases, GQA 4/2 heads, hidden 64, byte vocab
320) *trained* on demo-corpus lines (~40 s), so its greedy margins are those of a model that knows
its text (fp32 top-2 gap: median 5.2, 5th percentile 1.4); a random-weight model has near-ties
at most steps (measured there: int8 agreement 13/20, divergences all at fp32 gaps < 0.03).
20 prompts are 4..24-byte prefixes of training lines, 32 greedy tokens each, one engine run per
model.  Every export quantises q/k/v/o/gate/up/down, lm_head and the embedding table.  Figures:

* cosine: of the full-vocab logits rows of the quantised run and the fp32 run, over every decode
  row whose context is still identical (up to and including the first differing token);
* agreement: share of the 20 prompts whose first 32 greedy tokens equal the fp32 run's.

Measured on this CPU build (the asserts are the issue's targets where it sets them, else floors
that a broken path fails):
| run | min cosine (per row) | mean cosine | agreement |
|---|---|---|---|
| weight_only_int8 | 0.99822 | 0.99990 | 20/20 (an earlier training: 19/20, the divergence at a top-2 gap of 0.009) |
| weight_only_int4 (group 32) | 0.699 | 0.978 | 11/20 |
| --dtype bfloat16 (weights only) | 0.99987 | 0.99999 | 19/20 (the divergence at a top-2 gap of 0.001) |
| fp32 weights + USE_CACHE_KV_INT8 | 0.99401 (0.9856 with the old random-token scales) | 0.99985 | 18/20 |
| int8 weights + USE_CACHE_KV_INT8 | 0.99684 (0.980 before) | 0.99977 | 18/20 |

(the committed training, tests/support/trained_qwen2.safetensors; so these are the same every run)
int8 meets the issue's "cosine ≥ 0.999" as the mean over rows; its worst single row is 0.9982
(per-channel int8 of 64-wide rows is a 0.6 % weight error; this model amplifies it to ~4 % of a
logits row at a few steps).  Without lm_head and embedding quantised the worst row was 0.99900.
The int8-KV scales come from export-time calibration on the demo corpus through the model's
tokenizer (its byte tokenizer.json) over its whole context, margin 1.25 (long positions:
test_kv_int8_long_mpi.py).
TP=2 exports of int8 and int4 serve the same greedy tokens as their TP=1 exports (scales come
from the unsharded weights, so every rank holds the TP=1 integers, vocab-parallel tables too).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.export_parity_driver import run_driver
from tests.support.greedy_agreement import agreement
from tests.support.trained_model import corpus_prompts

pytestmark = pytest.mark.mpi
NEW_TOKENS = 32
NUM_PROMPTS = 20
GROUP = 32  # int4 group: divides every per-rank input size at TP 1 and 2 (o_proj: 32 at TP 2)
# name → (quant or the export's --dtype, tp, kv_int8)
RUNS = {
    "fp32": (None, 1, False),
    "int8": ("weight_only_int8", 1, False),
    "int4": ("weight_only_int4", 1, False),
    "bf16": ("bfloat16", 1, False),
    "kv8": (None, 1, True),
    "int8+kv8": ("weight_only_int8", 1, True),
    "int8-tp2": ("weight_only_int8", 2, False),
    "int4-tp2": ("weight_only_int4", 2, False),
    "bf16-tp2": ("bfloat16", 2, False),
}


@pytest.fixture(scope="module")
def served(trained_checkpoint, tmp_path_factory) -> dict[str, tuple[list[list[int]], list[np.ndarray]]]:
    """run name → (tokens per prompt, logits [n, V] per prompt); one mpirun per TP degree."""
    from spmd_serve.export import export_checkpoint

    root = tmp_path_factory.mktemp("quant")
    ckpt = trained_checkpoint
    dirs = {}
    for quant, tp in {(q, tp) for q, tp, _ in RUNS.values()}:
        how = {"dtype": quant} if quant == "bfloat16" else {"quant": quant, "quant_group": GROUP}
        dirs[quant, tp] = str(export_checkpoint(ckpt, root / f"{quant}-tp{tp}", tp=tp, **how))
    prompts = corpus_prompts(NUM_PROMPTS)
    res = {}
    for tp in (1, 2):
        names = [n for n, (_, t, _) in RUNS.items() if t == tp]
        spec = {
            "models": [{"dir": dirs[RUNS[n][0], tp], "kv_int8": RUNS[n][2]} for n in names],
            "prompts": prompts,
            "params": {"max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS, "temperature": 0.0},
            "engine": {"block_size": 16, "num_blocks": 128, "eos_token_ids": [2]},
        }
        data = run_driver(tp, spec, root)
        for i, n in enumerate(names):
            res[n] = data[f"tokens_{i}"].tolist(), list(data[f"logits_{i}"])
    return res


def compare(served, name: str) -> tuple[float, float, float, float]:
    """(min cosine, mean cosine, agreement, widest fp32 top-2 gap at a divergence) of run `name`
    against fp32 (see the module docstring)."""
    a = agreement(served["fp32"], served[name], NEW_TOKENS)
    print(f"{name}: {a}")
    return a.min_cosine, a.mean_cosine, a.agreement, a.widest_gap


def test_int8_weights_match_fp32(served):
    """Must show: greedy agreement ≥ 90 % of 20 prompts over 32 tokens, logits cosine ≥ 0.999."""
    lo, mean, agree, gap = compare(served, "int8")
    assert agree >= 0.9 and mean >= 0.999 and lo >= 0.997, (lo, mean, agree, gap)


def test_int4_weights_close_to_fp32(served):
    """Measured: see the module docstring; the floor fails a broken unpack or group layout."""
    lo, mean, agree, _ = compare(served, "int4")
    assert mean >= 0.97 and agree >= 0.4, (lo, mean, agree)


@pytest.mark.parametrize("name", ("kv8", "int8+kv8"))
def test_int8_kv_cache_close_to_fp32(served, name):
    """USE_CACHE_KV_INT8: calibrated static per-head scales (export); measured in the docstring."""
    lo, mean, agree, gap = compare(served, name)
    assert mean >= 0.999 and lo >= 0.97 and agree >= 0.85, (lo, mean, agree, gap)


def test_bf16_weights_match_fp32(served):
    """--dtype bfloat16 (the linears' weights rounded to bf16, computing in fp32): a 2^-9 relative
    weight error, half int8's worst."""
    lo, mean, agree, gap = compare(served, "bf16")
    assert agree >= 0.9 and mean >= 0.9999 and lo >= 0.999, (lo, mean, agree, gap)


@pytest.mark.parametrize("quant", ("int8", "int4", "bf16"))
def test_tp2_quantised_export_serves_the_tp1_tokens(served, quant):
    assert served[f"{quant}-tp2"][0] == served[quant][0]


def test_server_with_int8_kv_cache_answers(served_tp2, tmp_path):
    """USE_CACHE_KV_INT8=1 through the real server (TP=2): it starts, serves a greedy request of
    exact length, and its stream equals its non-streaming answer."""
    import requests

    from tests.support.server_process import ServerProcess

    with ServerProcess(2, served_tp2, tmp_path / "server.log", USE_CACHE_KV_INT8="1") as srv:
        body = {"text": "Hello, how are you?", "max_dec_len": 12, "min_dec_len": 12, "temperature": 0}
        whole = requests.post(srv.url, json=body, timeout=60).json()
        assert whole["error_code"] == 0 and whole["tokens_all_num"] == 12
        res = requests.post(srv.url, json={**body, "stream": True}, stream=True, timeout=60)
        frames = [json.loads(line) for line in res.iter_lines()]
        assert frames[-1]["tokens_all_ids"] == whole["tokens_all_ids"]
