"""Issue 14, must show: DeepSeek-V2 and V3 served greedy tokens equal PaddleNLP's own
`DeepseekV2ForCausalLM` / `DeepseekV3ForCausalLM` on the same weights at 1, 2 and 4 ranks (4
oversubscribed), max |logit - reference| <= 1e-4, through the real engine under mpirun (one job per
TP degree for every model: tests/support/export_parity_driver.py); and a checkpoint in the
published fp8 layout serves the same greedy tokens as its bf16 twin.

Configs (tests/support/deepseek_zoo.py): V3 with q_lora_rank, noaux_tc routing, sigmoid scoring, a
correction bias, normalised and scaled weights, YaRN, a dense first layer and an MTP layer
(served from PaddleNLP's own save_pretrained, MTP weights included); V2 without q_lora_rank,
group-limited greedy routing, softmax scoring, YaRN with mscale != mscale_all_dim, a dense first
layer (served from sharded HF safetensors).  At TP 2 and 4 attention and shared experts are
split by heads / units and the routed experts by rank (expert parallelism).  int8 and int4
exports of V3 at TP 2 serve their TP 1 tokens (every rank holds the TP 1 integers; that the
quantised graphs compute their dequantised weights is test_deepseek_export.py's).  The fp8 checkpoint
and its bf16 twin hold bf16 values, so --dtype auto exports both in bfloat16 (experts, dense linears,
embedding; tests/graphs/test_deepseek_weight_forms.py): the twin serves the 16-bit DeepSeek graphs
against PaddleNLP at 1, 2 and 4 ranks.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.deepseek_zoo import CONFIGS, make_weights, write, write_bf16, write_fp8
from tests.support.export_parity_driver import run_driver
from tests.support.paddlenlp_reference import reference_logits

pytestmark = pytest.mark.mpi
NEW_TOKENS = 10
EOS = 2
TPS = (1, 2, 4)
SERVED_FROM = {"v3": "paddlenlp_safetensors", "v2": "hf_sharded"}
# the longest prompt crosses two KV blocks (block_size 16) and YaRN's original context (32, 64)
PROMPT_LENS = (5, 70)
QUANTS = ("weight_only_int8", "weight_only_int4")


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [[1] + rng.integers(3, 512, n - 1).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """name → (reference model, {tp: served dir}); "fp8" and "bf16" are the V3 fp8 checkpoint and
    its bf16 twin (DeepSeek's fp8 → bf16 cast), served at TP 2 (the twin at every TP too)."""
    from spmd_serve.export import export_checkpoint
    from tests.support.deepseek_reference import assert_drops_nothing, reference_from_weights

    root = tmp_path_factory.mktemp("deepseek")
    out = {}
    for name, cfg in CONFIGS.items():
        weights = make_weights(cfg)
        ref = reference_from_weights(cfg, weights)
        assert_drops_nothing(ref)
        ckpt = write(SERVED_FROM[name], root / f"{name}-ckpt", cfg, weights)
        out[name] = (ref, {tp: export_checkpoint(ckpt, root / f"{name}-tp{tp}", tp=tp) for tp in TPS})
        if name == "v3":  # quantised: every rank holds the TP=1 integers
            for q in QUANTS:
                out[q] = (None, {tp: export_checkpoint(ckpt, root / f"{q}-tp{tp}", tp=tp, quant=q) for tp in (1, 2)})
    cfg = CONFIGS["v3"]
    fp8_dir, decoded = write_fp8(root / "fp8-ckpt", cfg, make_weights(cfg, seed=1))
    bf16_dir = write_bf16(root / "bf16-ckpt", cfg, decoded)
    ref = reference_from_weights(cfg, decoded)
    out["fp8"] = (ref, {2: export_checkpoint(fp8_dir, root / "fp8-tp2", tp=2)})
    out["bf16"] = (ref, {tp: export_checkpoint(bf16_dir, root / f"bf16-tp{tp}", tp=tp) for tp in TPS})
    for name in ("fp8", "bf16"):  # --dtype auto: the weights are bf16 values (power-of-two block scales)
        assert json.loads((out[name][1][2] / "config.json").read_text())["spmd_serve"]["dtype"] == "bfloat16"
    return out


@pytest.fixture(scope="module")
def served(zoo, prompts, tmp_path_factory) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]:
    """(name, tp) → (tokens [P, N], logits [P, N, V]): one mpirun per TP degree for every model."""
    tmp = tmp_path_factory.mktemp("runs")
    res = {}
    for tp in TPS:
        names = [n for n in zoo if tp in zoo[n][1]]
        spec = {
            "models": [str(zoo[n][1][tp]) for n in names],
            "prompts": prompts,
            "params": {"max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS, "temperature": 0.0},
            # small token budget: the long prompt is prefilled in chunks next to decodes
            "engine": {"block_size": 16, "num_blocks": 64, "max_num_batched_tokens": 32, "eos_token_ids": [EOS]},
        }
        data = run_driver(tp, spec, tmp)
        for i, n in enumerate(names):
            res[n, tp] = data[f"tokens_{i}"], data[f"logits_{i}"]
    return res


def _check_against_reference(name: str, tp: int, ref_model, tokens, logits, prompts) -> float:
    """max |logit diff| over every prompt.  Each served token is PaddleNLP's greedy choice after
    the same prefix (EOS excluded: the requests set min_tokens = max_tokens), or a near-tie of
    PaddleNLP's own logits, shown by its gap."""
    worst = 0.0
    for p, toks, ours in zip(prompts, tokens.tolist(), logits):
        ref = reference_logits(ref_model, p, toks)  # [N, V]: one cache-free pass over prompt + ours
        worst = max(worst, float(np.abs(ours - ref).max()))
        choice = ref.copy()
        choice[:, EOS] = -np.inf
        for i, (a, b) in enumerate(zip(toks, choice.argmax(axis=1).tolist())):
            gap = float(ref[i][b] - ref[i][a])
            where = f"{name} TP={tp} prompt len {len(p)} token {i}"
            assert a == b or gap < 1e-4, f"{where}: ours {a}, PaddleNLP {b} ({gap=:.1e})"
    print(f"{name} TP={tp}: max |logit diff| vs PaddleNLP {worst:.2e}")
    return worst


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("name", [*CONFIGS, "bf16"])
def test_served_greedy_tokens_equal_paddlenlp(name, tp, zoo, served, prompts):
    tokens, logits = served[name, tp]
    worst = _check_against_reference(name, tp, zoo[name][0], tokens, logits, prompts)
    assert worst <= 1e-4, f"{name} TP={tp}: max |logit diff| {worst:.2e}"


@pytest.mark.parametrize("name", [*CONFIGS, "bf16"])
def test_every_tp_serves_the_same_tokens(name, served):
    assert served[name, 1][0].tolist() == served[name, 2][0].tolist() == served[name, 4][0].tolist()


@pytest.mark.parametrize("quant", QUANTS)
def test_tp2_quantised_export_serves_the_tp1_tokens(quant, served):
    assert served[quant, 2][0].tolist() == served[quant, 1][0].tolist()
    assert float(np.abs(served[quant, 2][1] - served[quant, 1][1]).max()) < 1e-4


def test_fp8_checkpoint_serves_the_tokens_of_its_bf16_twin(zoo, served, prompts):
    """The fp8 export serves PaddleNLP's tokens on the dequantised weights, and its bf16 twin (DeepSeek's
    fp8 → bf16 cast, exact here: power-of-two block scales) the same tokens and logits."""
    fp8_tokens, fp8_logits = served["fp8", 2]
    worst = _check_against_reference("fp8", 2, zoo["fp8"][0], fp8_tokens, fp8_logits, prompts)
    assert worst <= 1e-4
    bf16_tokens, bf16_logits = served["bf16", 2]
    assert bf16_tokens.tolist() == fp8_tokens.tolist()
    assert float(np.abs(bf16_logits - fp8_logits).max()) <= 1e-5
