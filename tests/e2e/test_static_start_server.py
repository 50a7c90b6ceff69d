"""Issue 17 item 1, must show: what `download_model` fetches — the original tool's static inference
model — downloaded, converted once and served by `start_server`, with the original checkpoint's
greedy tokens; the next start serves the conversion without converting again.

The original checkpoint is the demo tiny Llama (real SentencePiece tokenizer) whose weights are
snapped to the int8 grid (tests/support/static_models.py `snap_to_int8_grid`): every linear,
embedding and lm_head row is q * s with fp16 scales, so the static exporter's fp16 cast and
weight_quantize, and our re-quantisation, keep every number.  Its static models (fp32, and
weight_only_int8 in fp16 as the exporter's CPU kernel takes it) are made by PaddleNLP's own
inference classes; the reference is PaddleNLP's dygraph `LlamaForCausalLM` on the original weights.
Any token that differs is then a conversion error, not rounding.  With the demo weights as they are
(not snapped) the converted int8 model agrees with `spmd_serve export --quant weight_only_int8` of the
original on 7 of 8 prompts over 24 tokens: the one miss is a near-tie flipped by the exporter's
fp16 scales; fp32 agrees on 8 of 8.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import requests

from spmd_serve.export.pipeline import AUX_FILES
from spmd_serve.launcher.convert import converted_path
from tests.support.launcher_process import always_stopped, launcher_env, processes_of, run
from tests.support.model_site import publish, serving
from tests.support.static_models import snap_to_int8_grid, write_static_model

pytestmark = pytest.mark.timeout(900)
NAME = "demo-org/tiny-static"
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def original(demo_checkpoint) -> tuple[dict, dict[str, np.ndarray], list[list[int]], list[list[int]]]:
    """(config, snapped weights, prompts, PaddleNLP's greedy tokens for them)."""
    from spmd_serve.export.checkpoint import load_checkpoint
    from tests.support.paddlenlp_reference import reference_from_weights, reference_greedy

    cfg, _, weights, _ = load_checkpoint(demo_checkpoint)
    weights = snap_to_int8_grid(weights)
    model = reference_from_weights(cfg, weights)
    rng = np.random.default_rng(3)
    prompts = [[1, *rng.integers(7, cfg["vocab_size"], int(n)).tolist()] for n in (3, 9, 17)]
    return cfg, weights, prompts, [reference_greedy(model, p, NEW_TOKENS)[0] for p in prompts]


def greedy(env: dict[str, str], prompt: list[int]) -> list[int]:
    body = {"input_ids": prompt, "max_dec_len": NEW_TOKENS, "min_dec_len": NEW_TOKENS, "temperature": 0}
    res = requests.post(f"http://127.0.0.1:{env['SERVICE_HTTP_PORT']}/v1/chat/completions", json=body, timeout=120)
    assert res.status_code == 200, res.text
    return res.json()["tokens_all_ids"]


@pytest.mark.parametrize("quant", [None, "weight_only_int8"])
def test_downloaded_static_model_is_converted_once_and_serves_the_originals_tokens(
    original, demo_checkpoint, tmp_path, quant
):
    cfg, weights, prompts, want = original
    static = write_static_model(tmp_path / "static", cfg, weights, quant)
    for name in AUX_FILES:  # the tokenizer files, as the published model carries them
        if (demo_checkpoint / name).is_file():
            shutil.copy2(demo_checkpoint / name, static / name)
    models = tmp_path / "models"
    converted = converted_path(models / NAME, 1)
    stale = models / f"{NAME}.spmd_serve-tp1-v2"  # what an earlier version converted: named, with its size
    stale.mkdir(parents=True)
    (stale / "model.pdiparams").write_bytes(bytes(3 << 20))
    with serving(tmp_path / "site") as site:
        publish(static, site.root, NAME)
        env = launcher_env(tmp_path / "log", MODEL_DIR=str(models), MODEL_BASE_URL=site.base, MP_NUM="1")
        with always_stopped(env, tmp_path):
            first = run("start_server", NAME, env=env, cwd=tmp_path, timeout=600)
            assert first.returncode == 0, first.stderr[-4000:] + first.stdout
            assert f"converting the static inference model {models / NAME}" in first.stderr
            assert f"serving {converted}" in first.stderr and str(converted) in first.stdout
            assert f"{stale} (3 MiB) is an earlier version's conversion" in first.stderr
            assert [greedy(env, p) for p in prompts] == want
            assert run("stop_server", env=env, cwd=tmp_path, timeout=120).returncode == 0
            again = run("start_server", NAME, env=env, cwd=tmp_path, timeout=600)
            assert again.returncode == 0, again.stderr[-4000:]
            assert f"serving {converted}, converted earlier" in again.stderr and "converting" not in again.stderr
            assert greedy(env, prompts[0]) == want[0]
            assert run("stop_server", env=env, cwd=tmp_path, timeout=120).returncode == 0
    assert processes_of(tmp_path / "log") == []
    served = json.loads((converted / "config.json").read_text())["spmd_serve"]
    assert (served["quant"] or {}).get("method") == quant and served["source"]["format"] == "paddlenlp-static"
