"""The original tool's static inference models → our checkpoint weights (issue 17 item 1).

Each directory is made by PaddleNLP's own inference classes (tests/support/static_models.py: their
`set_state_dict` fuses, names and, through Paddle's `weight_quantize`, packs the parameters; their
tensor-parallel mappings cut the ranks' shards) from a model_zoo checkpoint.  The converter must give
back exactly what the static model holds, tensor by tensor: the original weights cast to the model's
dtype, and for weight-only models each rank's per-channel quantisation (numpy's model of the
exporter's fp16 cast and quantiser below).  Then `--quant source` re-quantises int8 to the very same
integers and scales; a layout or model it cannot convert is an error naming the parameter.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from spmd_serve.export.checkpoint import load_checkpoint
from spmd_serve.export.errors import CheckpointError
from spmd_serve.export.families import family_of
from tests.support.model_zoo import ARCHS, make_weights
from tests.support.static_models import write_static_model

pytestmark = pytest.mark.timeout(900)
WIDE = dict(hidden_size=128, intermediate_size=256)  # tp 2: the CPU weight_quantize needs K % 64 per rank
# name → (model_zoo arch, quant, tp, arch weight_quantize packs for, program file, dtype, config changes)
CASES = {
    "llama3-int8": ("llama3", "weight_only_int8", 1, 80, "json", None, {}),
    "qwen2_tied-int4": ("qwen2_tied", "weight_only_int4", 1, 90, "json", None, {}),
    "qwen2-fp32-paddle2": ("qwen2_untied", None, 1, 80, "pdmodel", None, {}),
    "llama2-bf16": ("llama2", None, 1, 80, "json", "bfloat16", {}),
    "llama2-int8-tp2-sm70": ("llama2", "weight_only_int8", 2, 70, "json", None, WIDE),
}
ROW_PARALLEL = ("o_proj", "down_proj")  # each rank quantises its own input rows


@pytest.fixture(scope="module")
def static_dirs(tmp_path_factory) -> dict[str, tuple[Path, dict, dict[str, np.ndarray]]]:
    """name → (static model dir, its original HF config, original HF weights)."""
    root = tmp_path_factory.mktemp("static")
    out = {}
    for name, (arch, quant, tp, sm, program, dtype, changes) in CASES.items():
        cfg = dict(ARCHS[arch], **changes)
        if name == "qwen2_tied-int4":  # as PaddleNLP names the class it exported from
            cfg["architectures"] = ["Qwen2ForCausalLMBlockInferenceModel"]
        weights = make_weights(dict(cfg, architectures=ARCHS[arch]["architectures"]), 0)
        out[name] = write_static_model(root / name, cfg, weights, quant, tp, dtype, sm, program), cfg, weights
    return out


def round_half_away(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.floor(np.abs(x) + 0.5)  # C's round(), which the quantiser uses


def quantised(w_hf: np.ndarray, bits: int, shards: int) -> tuple[np.ndarray, np.ndarray]:
    """(q, scale) of an HF [out, in] fp16 weight as weight_quantize makes them, per output channel of
    each of `shards` input slices: scale = fp16(absmax / qmax), q = round(w / scale)."""
    qmax = 127 if bits == 8 else 7
    parts = np.split(w_hf.astype(np.float16).astype(np.float32), shards, axis=1)
    scales = [(np.abs(p).max(axis=1, keepdims=True) / qmax).astype(np.float16).astype(np.float32) for p in parts]
    q = [np.clip(round_half_away(p / s), -qmax, qmax) for p, s in zip(parts, scales)]
    return np.concatenate(q, axis=1), np.concatenate([np.broadcast_to(s, p.shape) for s, p in zip(scales, parts)], 1)


def bf16(w: np.ndarray) -> np.ndarray:
    u = w.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)  # round to nearest even


def held(name: str, w: np.ndarray, quant: str | None, tp: int, dtype: str | None) -> np.ndarray:
    """What the static model holds for HF tensor `name`, in float32."""
    if quant is None:
        return bf16(w) if dtype == "bfloat16" else w
    if w.ndim == 2 and name.endswith("_proj.weight"):
        q, s = quantised(w, 8 if quant == "weight_only_int8" else 4, tp if name.split(".")[-2] in ROW_PARALLEL else 1)
        return q * s
    return w.astype(np.float16).astype(np.float32)


@pytest.mark.parametrize("name", CASES)
def test_conversion_gives_back_what_the_static_model_holds(static_dirs, name):
    static, cfg, weights = static_dirs[name]
    _, quant, tp, sm, _, dtype, _ = CASES[name]
    served_cfg, mc, got, source = load_checkpoint(static)
    assert sorted(got) == sorted(weights)
    # converted when read (export/lazy.py): what the export checks is known without converting
    assert all(got.known_shape(k) == w.shape for k, w in weights.items())
    for k, w in weights.items():
        assert np.array_equal(got[k], held(k, w, quant, tp, dtype)), k
    assert source["format"] == "paddlenlp-static" and source["tp"] == tp and source["quant"] == quant
    assert source["weight_layout"] == (None if quant is None else "sm70" if sm == 70 else "sm80")
    assert mc.architecture == ARCHS[CASES[name][0]]["architectures"][0]
    assert "quant_type" not in served_cfg and "tensor_parallel_degree" not in served_cfg


def test_int8_reexport_keeps_the_static_integers_and_scales(static_dirs):
    """`--quant source` maps the static int8 weights straight into ours: dequantised then re-quantised
    per output channel, every integer and scale comes back unchanged (absmax = 127 scale exactly)."""
    static, _, weights = static_dirs["llama3-int8"]
    _, mc, hf, _ = load_checkpoint(static)
    family = family_of(mc.architecture)
    shard = family.rank_weights(mc, hf, family.shard_dims(mc, 1), 0, "weight_only_int8", None)
    for i in range(mc.num_layers):
        for ours, proj in {"q": "self_attn.q_proj", "o": "self_attn.o_proj", "down": "mlp.down_proj"}.items():
            q, s = quantised(weights[f"model.layers.{i}.{proj}.weight"], 8, 1)
            assert np.array_equal(shard[f"layers.{i}.{ours}"].q, q.T.astype(np.int8)), (i, ours)
            assert np.array_equal(shard[f"layers.{i}.{ours}"].scale, s[:, 0]), (i, ours)


def test_int4_reexport_is_exact_where_our_group_spans_the_input(static_dirs):
    """The static int4 scales are per output channel; ours per group of input rows (64 here): exact
    where the group is the whole input (q/k/v/o/gate/up: 64), re-rounded for down_proj (128 inputs)."""
    static, _, weights = static_dirs["qwen2_tied-int4"]
    _, mc, hf, _ = load_checkpoint(static)
    family = family_of(mc.architecture)
    dims = family.shard_dims(mc, 1)
    group = family.quant_group(mc, dims, None)
    shard = family.rank_weights(mc, hf, dims, 0, "weight_only_int4", group)
    from spmd_serve.export.quant import dequantize

    same = {}
    for ours, proj in {"q": "self_attn.q_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}.items():
        w = hf[f"model.layers.0.{proj}.weight"].T
        same[ours] = float(np.mean(dequantize(shard[f"layers.0.{ours}"]) == w))
    print(f"int4 group {group}: share of weights unchanged by the re-export: {same}")
    assert group == 64 and same["q"] == same["up"] == 1.0 and same["down"] < 1.0


def test_cli_keeps_the_quantisation_unless_told(static_dirs, tmp_path):
    static = static_dirs["llama3-int8"][0]
    for flag, want in (([], "weight_only_int8"), (["--quant", "none"], None)):
        out = tmp_path / f"out{len(flag)}"
        cmd = [sys.executable, "-m", "spmd_serve", "export", "--checkpoint", str(static), "--out", str(out), *flag]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        assert f"quant={want}" in res.stdout
        served = json.loads((out / "config.json").read_text())["spmd_serve"]
        assert (served["quant"] or {}).get("method") == want
        assert served["source"]["format"] == "paddlenlp-static" and served["source"]["weight_layout"] == "sm80"


def _copy(static_dirs, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(static_dirs[name][0], tmp_path / name))


def _edit_config(d: Path, **changes) -> None:
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(cfg, **changes)))


def _scramble(d: Path, rank: int, param: str) -> None:
    """Shuffle the bytes of one parameter inside the rank's .pdiparams (as a foreign layout would)."""
    from spmd_serve.export.static_files import read_params

    raw = read_params(d / f"rank_{rank}")[param].tobytes()
    path = d / f"rank_{rank}" / "model.pdiparams"
    blob = bytearray(path.read_bytes())
    at = blob.find(raw)
    shuffled = np.frombuffer(raw, np.uint8)[np.random.default_rng(0).permutation(len(raw))]
    blob[at : at + len(raw)] = shuffled.tobytes()
    path.write_bytes(bytes(blob))


@pytest.mark.parametrize(
    "case",
    ["a8w8", "missing parameter", "scrambled weight", "config disagrees", "unmapped fused parameter", "missing rank"],
)
def test_what_cannot_be_converted_names_the_parameter_and_why(static_dirs, tmp_path, case):
    name = {"unmapped fused parameter": "qwen2_tied-int4", "missing rank": "llama2-int8-tp2-sm70"}.get(case)
    d = _copy(static_dirs, name or "llama3-int8", tmp_path)
    if case == "a8w8":
        _edit_config(d, quant_type="a8w8")
        want = r"quant_type='a8w8': only unquantised and weight-only .* quantises activations"
    elif case == "missing parameter":  # renamed in the program only: sorts where it was, so the file still reads
        program = d / "rank_0" / "model.json"
        program.write_text(program.read_text().replace('"fusellama.0.ffn2_weight"', '"fusellama.0.ffn2_weigh"'))
        want = r"rank_0/model.pdiparams: parameter fusellama.0.ffn2_weight is missing"
    elif case == "scrambled weight":
        _scramble(d, 0, "fusellama.1.ffn2_weight")
        want = r"rank_0/model.pdiparams: fusellama.1.ffn2_weight: does not unpack under the sm80 layout"
    elif case == "config disagrees":
        _edit_config(d, intermediate_size=96)
        want = r"fusellama.0.ffn1_weight is int8 \[256, 64\], which is neither the int8 \(\[192, 64\]\)"
    elif case == "unmapped fused parameter":
        _edit_config(d, attention_bias=False)
        want = r"fuseqwen2.0.qkv_bias is not a parameter the llama family's conversion knows"
    else:
        shutil.rmtree(d / "rank_1")
        want = r"tensor_parallel_degree=2 but .* holds 1 rank folder"
    if case == "scrambled weight":  # a weight is converted when the export reads it (export/lazy.py)
        from spmd_serve.export import ExportError, export_checkpoint

        with pytest.raises(ExportError, match=want):
            export_checkpoint(d, tmp_path / "out", kv_int8=False)
        assert not (tmp_path / "out").exists()
        return
    with pytest.raises(CheckpointError, match=want):
        load_checkpoint(d)
