"""`spmd_serve export` reads what users have, and refuses the rest in one clear line (no MPI).

* every format of every architecture (tests/support/model_zoo.py: HF single/sharded safetensors, PaddleNLP
  pdparams/sharded pdparams/safetensors written by PaddleNLP's own save_pretrained) reads back to
  exactly the HF weights the checkpoint was made from — so test_export_parity_mpi.py's served
  tokens hold for every (architecture, format) pair;
* BF16 and F16 safetensors (numpy has no bfloat16) read as the same values in float32;
* Llama-3.1 rope scaling equals PaddleNLP's Llama3RotaryEmbedding, and the tiny config exercises
  all three bands (kept, blended, divided);
* refused: PaddleNLP static-exporter directories (fused GPU ops), served directories, unsupported
  architectures / rope scalings / activations, float16/bfloat16 on this CPU build (export and
  start-up), incomplete shard sets.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from tests.support.model_zoo import ARCHS, FORMATS, make_weights, write


@pytest.fixture(scope="module")
def sources():
    from tests.support.paddlenlp_reference import reference_from_weights

    return {
        arch: (cfg, make_weights(cfg), reference_from_weights(cfg, make_weights(cfg))) for arch, cfg in ARCHS.items()
    }


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_format_reads_back_the_same_weights(arch, fmt, sources, tmp_path):
    from spmd_serve.export.checkpoint import load_checkpoint

    cfg, weights, ref = sources[arch]
    ckpt = write(fmt, tmp_path / "ckpt", cfg, weights, ref)
    _, mc, got, source = load_checkpoint(ckpt)
    assert source["format"] == ("huggingface" if fmt.startswith("hf") else "paddlenlp")
    assert len(source["files"]) > 1 if fmt.endswith("sharded") else len(source["files"]) == 1
    assert (mc.architecture, mc.attention_bias, mc.tie_word_embeddings) == (
        cfg["architectures"][0],
        arch.startswith("qwen2"),
        cfg["tie_word_embeddings"],
    )
    assert mc.rope_scaling == cfg.get("rope_scaling") and mc.rope_theta == cfg["rope_theta"]
    assert sorted(got) == sorted(weights)
    for name, arr in weights.items():
        assert np.array_equal(got[name], arr), name


def _write_st_raw(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """safetensors by hand: (dtype tag, raw little-endian array) per tensor."""
    header, blobs, off = {}, [], 0
    for name, (tag, raw) in tensors.items():
        b = raw.tobytes()
        header[name] = {"dtype": tag, "shape": list(raw.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_bf16_and_f16_safetensors_read_as_float32(tmp_path):
    from spmd_serve.export.weight_files import read_safetensors

    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    bf16 = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation to bfloat16
    _write_st_raw(tmp_path / "m.safetensors", {"a": ("BF16", bf16), "b": ("F16", x.astype(np.float16))})
    got = read_safetensors(tmp_path / "m.safetensors")
    assert got["a"].dtype == np.float32 and np.array_equal(got["a"], (bf16.astype(np.uint32) << 16).view(np.float32))
    assert np.abs(got["a"] - x).max() <= np.abs(x).max() * 2**-7
    assert np.array_equal(got["b"], x.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("safe", [False, True], ids=["pdparams", "safetensors"])
def test_bfloat16_paddlenlp_checkpoints_read_exactly(tmp_path, safe):
    """PaddleNLP stores bfloat16 as uint16 (pdparams) and U16 (safetensors): read as the same values."""
    from spmd_serve.export.checkpoint import load_checkpoint
    from tests.support.paddlenlp_reference import reference_from_weights

    cfg = ARCHS["qwen2_untied"]
    model = reference_from_weights(cfg, make_weights(cfg))
    model.to(dtype="bfloat16")
    model.save_pretrained(str(tmp_path), safe_serialization=safe)
    _, _, got, source = load_checkpoint(tmp_path)
    assert source["source_dtype"] == "bfloat16"
    want = model.state_dict()
    for hf, pd, t in (
        ("model.layers.1.self_attn.k_proj.weight", "qwen2.layers.1.self_attn.k_proj.weight", True),
        ("model.layers.0.self_attn.q_proj.bias", "qwen2.layers.0.self_attn.q_proj.bias", False),
        ("lm_head.weight", "lm_head.weight", True),
    ):
        ref = want[pd].astype("float32").numpy()
        assert np.array_equal(got[hf], ref.T if t else ref), hf


def test_llama3_rope_scaling_equals_paddlenlp():
    from paddlenlp.transformers.llama.modeling import Llama3RotaryEmbedding

    from spmd_serve.export.llama.config import ModelConfig

    cfg = ARCHS["llama3"]
    mc = ModelConfig.from_hf(cfg)
    s = cfg["rope_scaling"]
    ref = Llama3RotaryEmbedding(
        mc.head_dim,
        128,
        cfg["rope_theta"],
        s["factor"],
        s["low_freq_factor"],
        s["high_freq_factor"],
        s["original_max_position_embeddings"],
    ).inv_freq.numpy()
    ours, plain = mc.inv_freq(), ModelConfig.from_hf(dict(cfg, rope_scaling=None)).inv_freq()
    np.testing.assert_allclose(ours, ref, rtol=1e-6)
    ratio = plain / ours
    assert ratio[0] == 1 and ratio[-1] == pytest.approx(s["factor"]) and ((ratio > 1.01) & (ratio < 7.9)).any(), ratio


# ---------------------------------------------------------------- refusals


def _one_line_refusal(capsys, argv: list[str], *needles: str) -> str:
    from spmd_serve.export import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("spmd_serve export: error:") and err.count("\n") == 1, err
    assert all(n in err for n in needles), err
    return err


@pytest.mark.parametrize(
    "files,needle",
    [
        (("rank_0/model.pdmodel", "rank_0/model.pdiparams"), "rank_0/model.pdmodel is not a Paddle program"),
        (("rank_0/model.json", "rank_0/model.pdiparams"), "rank_0/model.json is unreadable"),
        (("rank_0/inference.json", "rank_0/inference.pdiparams"), "rank_0/inference.pdiparams) but not the"),
    ],
)
def test_unreadable_static_export_is_explained(tmp_path, capsys, files, needle):
    """A static inference model is converted (tests/graphs/test_static_models.py); one whose program
    cannot be read, or in a layout other than the original tool's, is refused naming the file."""
    ckpt = tmp_path / "static"
    (ckpt / "rank_0").mkdir(parents=True)
    cfg = dict(ARCHS["llama2"], use_fused_rope=True, use_fused_rms_norm=True, fuse_attention_qkv=False)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    for f in files:
        (ckpt / f).write_bytes(b"\0")
    _one_line_refusal(capsys, ["--checkpoint", str(ckpt), "--out", str(tmp_path / "out")], needle)
    assert not (tmp_path / "out").exists()


def test_served_directory_is_not_re_exported(tmp_path, capsys, served_tp1):
    _one_line_refusal(
        capsys, ["--checkpoint", str(served_tp1), "--out", str(tmp_path / "o")], "already a served directory"
    )


@pytest.mark.parametrize(
    "change,needles",
    [
        ({"architectures": ["MistralForCausalLM"]}, ["MistralForCausalLM", "LlamaForCausalLM", "Qwen2ForCausalLM"]),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, ["'yarn'", "llama3"]),
        ({"hidden_act": "gelu"}, ["hidden_act='gelu'"]),
        ({"use_sliding_window": True}, ["use_sliding_window"]),
        ({"rope_scaling_type": "ntk"}, ["rope_scaling_type='ntk'"]),
    ],
)
def test_unsupported_models_are_refused(tmp_path, capsys, change, needles):
    cfg = dict(ARCHS["llama2"], **change)
    write("hf", tmp_path / "ckpt", cfg, make_weights(ARCHS["llama2"]))
    _one_line_refusal(capsys, ["--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out")], *needles)


def test_incomplete_sharded_checkpoint_is_refused(tmp_path, capsys):
    cfg = ARCHS["qwen2_untied"]
    ckpt = write("hf_sharded", tmp_path / "ckpt", cfg, make_weights(cfg))
    (ckpt / "model-00002-of-00003.safetensors").unlink()
    _one_line_refusal(
        capsys,
        ["--checkpoint", str(ckpt), "--out", str(tmp_path / "out")],
        "model-00002-of-00003.safetensors",
        "incomplete download",
    )


def test_float16_beyond_its_range_is_refused_with_what_to_use(tmp_path, capsys):
    cfg = ARCHS["qwen2_untied"]
    weights = make_weights(cfg)
    weights["model.layers.1.mlp.down_proj.weight"][0, 0] = 7e4  # inf in float16
    ckpt = write("hf", tmp_path / "ckpt", cfg, weights)
    _one_line_refusal(
        capsys,
        ["--checkpoint", str(ckpt), "--out", str(tmp_path / "out"), "--dtype", "float16"],
        "beyond float16's range (65504)",
        "use --dtype bfloat16",
    )
    assert not (tmp_path / "out").exists()


def test_a_bfloat16_checkpoint_is_exported_in_bfloat16_by_default(tmp_path, capsys):
    """--dtype auto: bfloat16 where every weight is a bfloat16 value (PaddleNLP's own bf16 save here;
    DeepSeek's too), float16 where every one is a float16 value, float32 where one is neither."""
    from spmd_serve.export import main
    from spmd_serve.export.quant import bf16_valued
    from tests.support import deepseek_zoo
    from tests.support.paddlenlp_reference import reference_from_weights

    def exported(ckpt, name) -> str:
        assert main(["--checkpoint", str(ckpt), "--out", str(tmp_path / name)]) == 0
        dtype = json.loads((tmp_path / name / "config.json").read_text())["spmd_serve"]["dtype"]
        assert f"dtype={dtype}," in capsys.readouterr().out
        return dtype

    cfg = ARCHS["qwen2_untied"]
    model = reference_from_weights(cfg, make_weights(cfg))
    model.to(dtype="bfloat16")
    model.save_pretrained(str(tmp_path / "bf16"), safe_serialization=True)
    assert exported(tmp_path / "bf16", "a") == "bfloat16"
    model = reference_from_weights(cfg, make_weights(cfg, seed=1))
    model.to(dtype="float16")
    model.save_pretrained(str(tmp_path / "f16"), safe_serialization=True)
    assert exported(tmp_path / "f16", "f") == "float16"
    assert exported(write("hf", tmp_path / "f32", cfg, make_weights(cfg)), "b") == "float32"
    ds = {k: np.float32(0.5) * np.sign(v) for k, v in deepseek_zoo.make_weights(deepseek_zoo.CONFIGS["v2"]).items()}
    assert bf16_valued(ds.values()) and not bf16_valued([np.float32([1, 2, 3, 4, 1 + 2**-20])], chunk=2)
    assert exported(deepseek_zoo.write("hf", tmp_path / "ds", deepseek_zoo.CONFIGS["v2"], ds), "c") == "bfloat16"


def test_half_dtype_kernels_are_missing_on_cpu():
    """The measurement behind the refusal: no float16/bfloat16 CPU matmul in this build."""
    import paddle

    if paddle.is_compiled_with_cuda():
        pytest.skip("CPU build only")
    for dtype in ("float16", "bfloat16"):
        x = paddle.ones([2, 2], dtype="float32").astype(dtype)
        with pytest.raises(Exception):  # noqa: B017  (Paddle raises its own error types)
            paddle.matmul(x, x)


def test_startup_checks_what_the_export_recorded(served_tp1):
    from spmd_serve.config import ConfigError
    from spmd_serve.worker.capacity import check_served_model

    cfg = json.loads((served_tp1 / "config.json").read_text())
    assert cfg["spmd_serve"]["dtype"] == "float32" and cfg["spmd_serve"]["source"]["format"] == "huggingface"
    check_served_model(cfg)
    for change, needle in (
        ({"dtype": "float64"}, "'float64' is not one of float32, float16, bfloat16"),
        ({"format": 99}, "re-export"),
        ({"quant": "weight_only_int8"}, "weight_only_int8"),
    ):
        bad = dict(cfg, spmd_serve=dict(cfg["spmd_serve"], **change))
        with pytest.raises(ConfigError, match=needle) as e:
            check_served_model(bad, str(served_tp1))
        assert "\n" not in str(e.value) and str(e.value).startswith(f"{served_tp1}/config.json: ")
