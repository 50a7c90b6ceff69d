"""An export reads the checkpoint's tensors when it uses them (export/lazy.py): the checkpoint reader,
a family's HF layout and a rank's shard never hold the weights all at once.  Also the calibration's
fast form: the C++ linears on every core give the int8 KV scales Paddle's ops give.

Before (session 60): a 1B Llama's export held 4.0x its 4 GB float32 checkpoint at its peak and took
12.7 minutes, 10 of them calibrating on one thread; now 1.9x and 4.3 minutes (RESULTS.md)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tests.support.model_zoo import ARCHS, make_weights, write


@pytest.mark.parametrize("fmt", ["hf", "paddlenlp_safetensors", "paddlenlp_pdparams"])
def test_checkpoint_tensors_are_read_when_used(fmt, tmp_path):
    """load_checkpoint reads names and shapes only: a tensor changed on disk after it returned is read
    with the change (PaddleNLP's transposed layout and pickled state dict included), and the others as
    they were."""
    from spmd_serve.export.checkpoint import load_checkpoint

    cfg = dict(ARCHS["llama2"], intermediate_size=320)  # down_proj 80 KB: a pickle frame's 64 KB hold less
    weights = make_weights(cfg)
    ckpt = write(fmt, tmp_path / "ckpt", cfg, weights, None)
    _, _, got, _ = load_checkpoint(ckpt)
    name = "model.layers.0.mlp.down_proj.weight"  # [H, I] in HF's layout, [I, H] in PaddleNLP's
    stored = weights[name] if fmt == "hf" else np.ascontiguousarray(weights[name].T)
    (path,) = [p for p in ckpt.iterdir() if p.suffix in (".safetensors", ".pdparams")]
    data = bytearray(path.read_bytes())
    offset = data.find(stored.tobytes())
    assert offset > 0
    new = np.arange(stored.size, dtype=np.float32).reshape(stored.shape)
    data[offset : offset + new.nbytes] = new.tobytes()
    path.write_bytes(bytes(data))
    assert np.array_equal(got[name], new if fmt == "hf" else new.T)
    other = "model.layers.1.self_attn.q_proj.weight"
    assert np.array_equal(got[other], weights[other])


def _counting(hf):
    """A LazyMap over `hf` that counts the reads of each name."""
    from spmd_serve.export.lazy import LazyMap

    reads: Counter[str] = Counter()

    def read(name: str) -> np.ndarray:
        reads[name] += 1
        return hf[name]

    out = LazyMap()
    for name in hf:
        out.put(name, read, name, shape=np.shape(hf[name]))
    return out, reads


@pytest.mark.parametrize("quant", [None, "weight_only_int8"])
@pytest.mark.parametrize("arch", ["llama2", "deepseek_v3"])
def test_a_rank_reads_each_tensor_when_its_stage_is_built(arch, quant):
    """rank_weights computes nothing; building the rank's stages reads each checkpoint tensor the rank
    uses twice at most (a tied embedding for the table and the head, DeepSeek's kv_b for w_uk and
    w_uv, a quantised row shard for its values and for the unsharded weight's scales)."""
    from spmd_serve.export.families import family_of, parse_model_config

    if arch == "deepseek_v3":
        from tests.support.deepseek_zoo import CONFIGS
        from tests.support.deepseek_zoo import make_weights as make_ds

        cfg = CONFIGS["v3"]
        hf = make_ds(cfg)
    else:
        cfg = ARCHS[arch]
        hf = make_weights(cfg)
    family, mc = parse_model_config(cfg)
    family = family_of(mc.architecture)
    counted, reads = _counting(hf)
    dims = family.shard_dims(mc, 2)
    shard = family.rank_weights(mc, counted, dims, 1, quant, None)
    assert not reads, "rank_weights read weights before they were used"
    family.build_stages(shard, dims, 1)
    assert reads and max(reads.values()) <= 2, reads.most_common(3)
    unused = [k for k in hf if k not in reads and "layers" in k and "mtp" not in k]
    assert not unused or arch == "deepseek_v3", unused[:3]  # (DeepSeek: the other rank's experts)


def test_the_calibration_on_the_cpp_ops_gives_paddles_scales(tmp_path):
    """The export calibrates on the C++ linears and all cores; the scales equal those of Paddle's ops
    on one thread to float32 rounding (the same sums in another order)."""
    from spmd_serve.export.calibrate import calibrate_kv_scales
    from spmd_serve.export.calibration_text import CalibrationWindow
    from spmd_serve.export.families import family_of, parse_model_config
    from spmd_serve.export.layers import dense_weights

    cfg = ARCHS["llama3"]
    hf = make_weights(cfg)
    _, mc = parse_model_config(cfg)
    family = family_of(mc.architecture)
    rng = np.random.default_rng(1)
    windows = [
        CalibrationWindow(0, rng.integers(0, mc.vocab, 96)),
        CalibrationWindow(50, rng.integers(0, mc.vocab, 64)),
    ]
    scales = {}
    for cpp in (False, True):
        with dense_weights(cpp):
            scales[cpp] = calibrate_kv_scales(family, mc, hf, windows, cpp_ops=cpp)
    assert scales[True].keys() == scales[False].keys() == {"k", "v"}
    for t in scales[True]:
        np.testing.assert_allclose(scales[True][t], scales[False][t], rtol=2e-5)


@pytest.mark.parametrize("save", ["hf", "paddlenlp", "paddlenlp_pdparams"])
def test_a_checkpoint_stored_in_bfloat16_is_exported_so_without_reading_it(save, tmp_path):
    """--dtype auto on a checkpoint whose tensors are all stored BF16 (HF, or PaddleNLP's U16 with
    dtype bfloat16, or its pickled uint16 arrays) answers bfloat16 from the files' headers:
    truncated after load_checkpoint, the files are never read.  One float32 tensor among them and
    every value is looked at again."""
    from spmd_serve.export.checkpoint import load_checkpoint
    from spmd_serve.export.pipeline import export_dtype
    from spmd_serve.served_config import AUTO_DTYPE
    from tests.support.paddlenlp_reference import reference_from_weights

    cfg = ARCHS["qwen2_untied"]
    ckpt = tmp_path / "bf16"
    if save == "hf":
        from tests.support.deepseek_zoo import write_bf16

        write_bf16(ckpt, cfg, make_weights(cfg))
    else:
        model = reference_from_weights(cfg, make_weights(cfg))
        model.to(dtype="bfloat16")
        model.save_pretrained(str(ckpt), safe_serialization=save == "paddlenlp")
    files = sorted(ckpt.glob("*.safetensors")) + sorted(ckpt.glob("*.pdparams"))
    assert files
    _, _, weights, _ = load_checkpoint(ckpt)
    for f in files:
        f.write_bytes(f.read_bytes()[:64])  # the header only, cut: any tensor read would fail
    assert export_dtype(AUTO_DTYPE, weights) == "bfloat16"

    from spmd_serve.export.lazy import merged

    with pytest.raises(Exception, match="ends inside a tensor"):  # the scan reads them
        export_dtype(AUTO_DTYPE, merged(weights, {"extra": np.ones(3, np.float32)}))


def test_a_truncated_checkpoint_is_still_refused_in_one_line(tmp_path, capsys):
    """A tensor is read when the export uses it, so a file cut short is found then: the command still
    ends with its one-line error (exit 2) and leaves no output directory."""
    from spmd_serve.export import main

    cfg = ARCHS["llama2"]
    ckpt = write("hf", tmp_path / "ckpt", cfg, make_weights(cfg), None)
    path = ckpt / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    assert main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("spmd_serve export: error: model.safetensors ends inside a tensor") and "\n" not in err
    assert not (tmp_path / "out").exists()
