"""worker/pdiparams.py: the index of a parameter file Paddle wrote (types, dims, where the bytes
are), the graph names in the order Paddle hands the tensors out, the skeleton, and a clear error for
a file that does not fit its graph."""

from __future__ import annotations

import numpy as np
import pytest

from spmd_serve.config import ConfigError
from spmd_serve.worker.pdiparams import graph_params, read_index, write_skeleton
from tests.support.saved_graphs import save_tensors

TENSORS = {  # every type an export writes and some it does not; a scalar; odd sizes
    "w": np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32),
    "q": np.arange(-12, 12, dtype=np.int8).reshape(4, 6),
    "z": np.arange(3, dtype=np.int64),
    "h": np.full((2, 3), 1.5, np.float16),
    "s": np.array(2.5, np.float32),
    "u": np.arange(9, dtype=np.uint8).reshape(3, 3),
    "i": np.arange(-2, 3, dtype=np.int32),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_tensors(tmp_path_factory.mktemp("pdiparams"), TENSORS)


def values(file, entries) -> list[np.ndarray]:
    raw = file.read_bytes()
    return [np.frombuffer(raw, e.dtype, int(np.prod(e.dims)), e.offset).reshape(e.dims) for e in entries]


def test_the_index_finds_every_tensor_paddle_wrote(saved) -> None:
    entries = read_index(saved)
    names = graph_params(saved.with_suffix(".json"), entries)
    assert len(names) == len(TENSORS)
    got = dict(zip(names, values(saved, entries)))
    for want in TENSORS.values():  # Paddle renames buffers: find each by its value
        match = [n for n, v in got.items() if v.dtype == want.dtype and v.shape == want.shape and (v == want).all()]
        assert len(match) == 1, want
    assert entries[-1].offset + entries[-1].nbytes == saved.stat().st_size  # nothing after the last


def test_the_skeleton_has_the_types_and_one_element_each(saved, tmp_path) -> None:
    entries = read_index(saved)
    write_skeleton(entries, tmp_path / "s.pdiparams")
    small = read_index(tmp_path / "s.pdiparams")
    assert [e.code for e in small] == [e.code for e in entries]
    assert {e.dims for e in small} == {(1,)}


def test_a_file_cut_short_or_of_another_format_is_refused_by_name(saved, tmp_path) -> None:
    cut = tmp_path / "cut.pdiparams"
    cut.write_bytes(saved.read_bytes()[:-3])
    with pytest.raises(ConfigError, match="cut.pdiparams: cut short"):
        read_index(cut)
    junk = tmp_path / "junk.pdiparams"
    junk.write_bytes(b"PK\x03\x04" + bytes(40))
    with pytest.raises(ConfigError, match="junk.pdiparams: not a Paddle parameter file"):
        read_index(junk)


def test_a_graph_that_does_not_fit_its_file_is_refused_by_name(saved, tmp_path) -> None:
    entries = read_index(saved)
    with pytest.raises(ConfigError, match="has 7 parameters, its parameter file 6"):
        graph_params(saved.with_suffix(".json"), entries[:-1])
    other = save_tensors(tmp_path, {k: v.T.copy() if v.ndim == 2 else v for k, v in TENSORS.items()})
    with pytest.raises(ConfigError, match=r"parameter .* in the graph but .* in its parameter file"):
        graph_params(other.with_suffix(".json"), entries)
