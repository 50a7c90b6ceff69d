"""Paddle's pickled state dicts read lazily and safely (export/pdparams.py): every form paddle.save and
PaddleNLP's save_pretrained write gives the arrays paddle.load gives (as float32), the bytes are read
when a tensor is used, and a pickle naming anything but those forms' globals is refused unrun.
(PaddleNLP's own files: tests/graphs/test_export_formats.py and test_lazy_export.py.)"""

from __future__ import annotations

import collections
import pickle
from pathlib import Path

import numpy as np
import pytest

from spmd_serve.export.errors import CheckpointError
from spmd_serve.export.pdparams import read_pdparams


class _DenseTensor:
    """Pickles as Paddle's DenseTensor reduction does: eval('data', {'data': array})."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __reduce__(self):
        return (eval, ("data", {"data": self.a}))


def _save(path: Path, obj, protocol: int = 4) -> Path:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)
    return path


def _arrays(rng) -> dict[str, np.ndarray]:
    return {
        "big": rng.standard_normal((300, 257)).astype(np.float32),  # outside the pickle's frames
        "small": rng.standard_normal(7).astype(np.float32),  # inside a frame
        "half": rng.standard_normal((64, 33)).astype(np.float16),
        "fortran": np.asfortranarray(rng.standard_normal((90, 130)).astype(np.float32)),
        "wide": rng.standard_normal((3, 5)),  # float64
        "scalar": np.array(2.5, np.float32),
    }


@pytest.mark.parametrize("protocol", [2, 3, 4])
@pytest.mark.parametrize("form", ["arrays", "tensors", "dense", "ordered"])
def test_every_saved_form_reads_as_paddle_loads_it(form, protocol, tmp_path):
    want = _arrays(np.random.default_rng(protocol))
    obj = {
        "arrays": want,
        "tensors": {k: (f"param_{i}", a) for i, (k, a) in enumerate(want.items())},  # Tensor: (name, array)
        "dense": {k: _DenseTensor(a) for k, a in want.items()},
        "ordered": collections.OrderedDict(want),
    }[form]
    got = read_pdparams(_save(tmp_path / "m.pdparams", obj, protocol))
    assert list(got) == list(want)
    for k, a in want.items():
        assert got.known_shape(k) == a.shape and not got.known_bfloat16(k)
        assert got[k].dtype == np.float32 and np.array_equal(got[k], a.astype(np.float32)), k


def test_bfloat16_is_widened_and_known(tmp_path):
    """Paddle stores bfloat16 as uint16: widened exactly, and known as bfloat16 without reading it."""
    want = np.random.default_rng(1).standard_normal((40, 600)).astype(np.float32)
    bits = (want.view(np.uint32) >> 16).astype(np.uint16)
    got = read_pdparams(_save(tmp_path / "m.pdparams", {"w": bits}))
    assert got.known_bfloat16("w") and got.all_bfloat16()
    assert np.array_equal(got["w"], (bits.astype(np.uint32) << 16).view(np.float32))


def test_arrays_are_read_from_the_file_when_used(tmp_path):
    """Names and shapes come from the pickle; an array changed on disk afterwards is read changed, and
    a file cut short is found when the array past its end is read."""
    want = _arrays(np.random.default_rng(2))
    path = _save(tmp_path / "m.pdparams", want)
    got = read_pdparams(path)
    data = bytearray(path.read_bytes())
    at = data.find(want["big"].tobytes())
    assert at > 0
    new = np.arange(want["big"].size, dtype=np.float32).reshape(want["big"].shape)
    data[at : at + new.nbytes] = new.tobytes()
    path.write_bytes(bytes(data))
    assert np.array_equal(got["big"], new) and np.array_equal(got["fortran"], want["fortran"])
    path.write_bytes(bytes(data[: at + 100]))
    with pytest.raises(CheckpointError, match="m.pdparams ends inside a tensor"):
        got["big"]
    with pytest.raises(CheckpointError, match="m.pdparams ends inside a tensor"):
        read_pdparams(path)


def test_an_array_saved_in_slices_is_joined(tmp_path):
    """Protocols 2 and 3 save an array over 1 GiB flattened in slices, listed under Paddle's key."""
    whole = np.arange(35, dtype=np.float32).reshape(5, 7)
    flat = whole.ravel()
    obj = {
        "x@@.0": flat[:16].copy(),
        "x@@.1": flat[16:].copy(),
        "y": np.ones(3, np.float32),
        "UnpackBigParamInfor@@": {"x": {"OriginShape": (5, 7), "slices": ["x@@.0", "x@@.1"]}},
    }
    got = read_pdparams(_save(tmp_path / "m.pdparams", obj, protocol=2))
    assert sorted(got) == ["x", "y"] and got.known_shape("x") == (5, 7)
    assert np.array_equal(got["x"], whole)


class _Touch:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


class _Eval:
    def __reduce__(self):
        return (eval, ("__import__('os').getpid()", {}))


@pytest.mark.parametrize("bad", ["global", "eval", "not_a_dict", "not_an_array", "garbage"])
def test_anything_else_is_refused_and_never_run(bad, tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "m.pdparams"
    if bad == "garbage":
        path.write_bytes(b"\x80\x04not a pickle at all")
    else:
        obj = {
            "global": {"w": np.ones(3, np.float32), "x": _Touch(marker)},
            "eval": {"w": _Eval()},
            "not_a_dict": [np.ones(3, np.float32)],
            "not_an_array": {"w": np.ones(3, np.float32), "step": 7},
        }[bad]
        _save(path, obj)
    want = {
        "global": "m.pdparams: the pickle names pathlib.Path.touch, which a Paddle state dict does not",
        "eval": "m.pdparams: the pickle evaluates",
        "not_a_dict": "m.pdparams holds a list, not a state dict",
        "not_an_array": "m.pdparams: step is a int, not an array",
        "garbage": "m.pdparams is not a readable Paddle state dict",
    }[bad]
    with pytest.raises(CheckpointError, match=want.replace(".", r"\.")):
        read_pdparams(path)
    assert not marker.exists()
