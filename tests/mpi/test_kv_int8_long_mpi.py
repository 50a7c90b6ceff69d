"""Issue 17 item 5: the int8 KV cache holds at long positions.  The export calibrates its per-head
scales on the demo corpus through the model's tokenizer over the model's whole context, with a
margin (export/calibrate.py, export/calibration_text.py); the calibration it replaced (4 sequences
of 64 random tokens, no margin) is kept here as the baseline the new one must beat.

Model: tests/support/trained_model.py's tiny Qwen2 trained on corpus lines (byte vocabulary,
max_position_embeddings 2048): at long positions it still recites the lines it knows, with real
margins (fp32 top-2 gap median ~3, 5th percentile ~0.3 on these prompts).  12 prompts of
1500..1980 bytes (training lines back to back, cut mid-line), 32 greedy tokens each, so every
compared token is at a position in 1500..2011; the fp32 pool, the int8 pool with the export's
scales and the int8 pool with the old scales run in one `mpirun -n 1`.

Measured (this CPU build, two earlier trainings): text-calibrated scales: agreement 10/12 (both
divergences at fp32 top-2 gaps <= 0.14), logits cosine min 0.9989..0.9992, mean 0.99996; the old
random-token scales: 0/12 and 2/12, min 0.937..0.944, mean 0.9962..0.9967.  The committed
training (tests/support/trained_qwen2.safetensors): 9/12 (divergences at gaps <= 0.127), min
0.99934, mean 0.99995; old scales 1/12, min 0.9486, mean 0.99673 (they clip K and V of
text: in some heads text's largest |K| or |V| is up to 1.4x random tokens').
"""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest

from tests.support.export_parity_driver import run_driver
from tests.support.greedy_agreement import agreement
from tests.support.trained_model import long_prompts

pytestmark = pytest.mark.mpi
NEW_TOKENS = 32


def old_calibration(ckpt, served, out):
    """A copy of `served` whose int8 KV scales are the old calibration's: max |K|, |V| of 4
    random-token sequences of 64 positions, no margin."""
    from spmd_serve.export.calibrate import calibrate_kv_scales
    from spmd_serve.export.calibration_text import CalibrationWindow
    from spmd_serve.export.checkpoint import load_checkpoint
    from spmd_serve.export.families import family_of
    from spmd_serve.manifest import read_manifest, write_manifest

    shutil.copytree(served, out)
    _, mc, weights, _ = load_checkpoint(ckpt)
    family = family_of(mc.architecture)
    rng = np.random.default_rng(0)
    windows = [CalibrationWindow(0, rng.integers(0, mc.vocab, 64)) for _ in range(4)]
    scales = calibrate_kv_scales(family, mc, weights, windows, margin=1.0)
    manifest = read_manifest(out / "rank_0")
    write_manifest(out / "rank_0", replace(manifest, kv_scales=family.rank_kv_scales(mc, manifest.dims, 0, scales)))
    return out


@pytest.fixture(scope="module")
def runs(trained_checkpoint, tmp_path_factory):
    """fp32, int8 (export's scales), int8 (old scales) → (tokens, logits) per prompt."""
    import json

    from spmd_serve.export import export_checkpoint

    root = tmp_path_factory.mktemp("kv8long")
    served = export_checkpoint(trained_checkpoint, root / "served", tp=1)
    record = json.loads((served / "config.json").read_text())["spmd_serve"]["kv_int8_calibration"]
    assert record["text"].startswith("demo corpus") and record["positions"] == [[0, 2047]], record
    old = old_calibration(trained_checkpoint, served, root / "old")
    spec = {
        "models": [str(served), {"dir": str(served), "kv_int8": True}, {"dir": str(old), "kv_int8": True}],
        "prompts": long_prompts(12, 1500, 1980),
        "params": {"max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS, "temperature": 0.0},
        "engine": {"block_size": 16, "num_blocks": 1600, "eos_token_ids": [2], "max_num_batched_tokens": 2048},
    }
    data = run_driver(1, spec, root)
    return [(data[f"tokens_{i}"].tolist(), list(data[f"logits_{i}"])) for i in range(3)]


def test_int8_kv_agrees_with_fp32_at_long_positions(runs):
    fp32, new, old = runs
    a, b = agreement(fp32, new, NEW_TOKENS), agreement(fp32, old, NEW_TOKENS)
    print(f"text-calibrated: {a}\nold calibration: {b}")
    assert a.agreement >= 0.66 and a.mean_cosine >= 0.9999 and a.min_cosine >= 0.998, a
    assert a.agreement > b.agreement + 0.4 and a.mean_cosine > b.mean_cosine, (a, b)
