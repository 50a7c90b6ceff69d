"""ops.philox: Philox4x32-10 against the Random123 known-answer vectors and the (seed, index) word
layout (CI); the same vectors through the CUDA device function (GPU, marked `gpu`).
"""

from __future__ import annotations

import numpy as np
import pytest

from ops import philox, runtime
from tests.support.ops_helpers import device, needs_gpu, tmp_kernel_cache  # noqa: F401  (pytest fixtures)
from tests.support.ops_sample_reference import M32

RANDOM123_KAT = [  # Random123 tests/kat_vectors: philox4x32 10 <ctr x4> <key x2> -> <out x4>
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M32,) * 4, (M32,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def test_philox_known_answers() -> None:
    for ctr, key, want in RANDOM123_KAT:
        assert tuple(int(w) for w in philox.philox4x32_10(np.array(ctr), np.array(key))) == want
    ctrs, keys, wants = (np.array([case[i] for case in RANDOM123_KAT]) for i in range(3))
    np.testing.assert_array_equal(philox.philox4x32_10(ctrs, keys), wants)  # vectorised


def test_philox_first_word_layout() -> None:
    seeds = np.array([0, 1, 0xDEADBEEF12345678, 2**64 - 1], np.uint64)
    idx = np.array([0, 7, 2**33 + 5, 2**40], np.int64)
    got = philox.philox_first_word(seeds, idx)
    for s, i, g in zip(seeds, idx, got):
        s, i = int(s), int(i)
        assert philox.philox4x32_10(np.array([i & M32, i >> 32, 0, 0]), np.array([s & M32, s >> 32]))[0] == g
    u = philox.philox_uniform(seeds, idx)
    assert ((u >= 0) & (u < 1)).all()


def test_one_draw_takes_the_scalar_path_with_the_same_word() -> None:
    """A single (seed, index) is computed on Python ints; it equals the vectorised word, negative
    indices included (two's complement, as the kernel), in the caller's shape."""
    rng = np.random.default_rng(3)
    seeds = np.concatenate([rng.integers(0, 2**63, 40, dtype=np.uint64) * np.uint64(2), np.uint64([0, 2**64 - 1])])
    idx = np.concatenate([rng.integers(-(2**40), 2**40, 40), [0, -1]]).astype(np.int64)
    batch = philox.philox_first_word(seeds, idx)
    for s, i, w in zip(seeds, idx, batch):
        one = philox.philox_first_word(s, i)
        assert one.shape == () and one.dtype == np.uint32 and int(one) == int(w)
    assert philox.philox_first_word(seeds[:1], idx[:1]).shape == (1,)
    assert philox.philox_uniform(seeds[0], idx[0]) == float(batch[0]) * 2.0**-32


@pytest.mark.gpu
@needs_gpu
def test_gpu_philox_known_answers(device) -> None:
    kernel = runtime.load_kernel(philox.KAT_SOURCE, philox.KAT_KERNEL)
    ctr = device.put(np.array([c for c, _, _ in RANDOM123_KAT], np.uint32))
    key = device.put(np.array([k for _, k, _ in RANDOM123_KAT], np.uint32))
    out = device.empty((3, 4), np.uint32)
    kernel.launch((1,), (32,), [ctr.ptr, key.ptr, out.ptr, np.int32(3)])
    np.testing.assert_array_equal(device.get(out), np.array([w for _, _, w in RANDOM123_KAT], np.uint32))
