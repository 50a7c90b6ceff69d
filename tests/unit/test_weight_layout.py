"""export/weight_layout.py against Paddle's own `weight_quantize` CPU kernel: every stored layout the
original tool's weight-only models use (int8 and int4, per channel and per group of 64 / 128 input
rows, packed for SM70 or SM75/80/86/89/90) unpacks to exactly the integers the quantiser computed,
and the layout is told from the weights alone."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from spmd_serve.export.errors import CheckpointError
from spmd_serve.export.weight_layout import (
    dequantize,
    detect_layout,
    holds_qmax,
    scale_groups,
    unpack,
    weight_only_to_float,
)

ARCHS = (70, 75, 80, 86, 89, 90)
SHAPES = ((64, 64), (128, 96), (256, 128), (192, 384))  # [K, N]: input × output, as weight_quantize takes it


def paddle_weight_quantize(w16: np.ndarray, bits: int, arch: int, group: int) -> tuple[np.ndarray, np.ndarray]:
    import paddle
    from paddle.nn.quant import weight_quantize

    algo = "weight_only_int8" if bits == 8 else "weight_only_int4"
    out, scale = weight_quantize(paddle.to_tensor(w16), algo=algo, arch=arch, group_size=group)
    return out.numpy(), scale.numpy().astype(np.float32)


def quantiser_integers(w16: np.ndarray, scale: np.ndarray, bits: int, group: int) -> np.ndarray:
    """What the kernel computes before laying it out: C's round(w / scale), clipped (numpy reference)."""
    qmax = 127 if bits == 8 else 7
    full = scale[None] if group == -1 else np.repeat(scale, group, axis=0)
    v = w16.astype(np.float32) / full
    return np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -qmax, qmax).astype(np.int8)  # half away from zero


@pytest.mark.parametrize("bits,group", [(8, -1), (4, -1), (8, 64), (4, 128)])
def test_unpack_inverts_every_arch(bits, group):
    rng = np.random.default_rng(bits + group)
    for (k, n), arch in itertools.product(SHAPES, ARCHS):
        if group > 0 and k % group:
            continue
        w16 = rng.standard_normal((k, n)).astype(np.float16)
        stored, scale = paddle_weight_quantize(w16, bits, arch, group)
        want = quantiser_integers(w16, scale, bits, group)
        layout = "sm70" if arch == 70 else "sm80"
        assert np.array_equal(unpack(stored, k, n, bits, layout), want), (k, n, arch)
        assert detect_layout("w", stored, scale, k, n, bits) == layout, (k, n, arch)
        g = None if group == -1 else group
        assert scale_groups(scale, k, n) == g
        assert np.array_equal(weight_only_to_float("w", stored, scale, k, n, bits, layout), dequantize(want, scale, g))


def test_a_scrambled_or_foreign_layout_is_refused_naming_the_parameter():
    rng = np.random.default_rng(0)
    w16 = rng.standard_normal((128, 64)).astype(np.float16)
    stored, scale = paddle_weight_quantize(w16, 8, 80, -1)
    shuffled = stored.reshape(-1)[rng.permutation(stored.size)].reshape(stored.shape)
    with pytest.raises(CheckpointError, match=r"fusellama\.3\.ffn2_weight: its int8 weight-only layout is not one"):
        detect_layout("fusellama.3.ffn2_weight", shuffled, scale, 128, 64, 8)
    with pytest.raises(CheckpointError, match=r"fusellama\.3\.ffn2_weight: does not unpack under the sm70 layout"):
        weight_only_to_float("fusellama.3.ffn2_weight", stored, scale, 128, 64, 8, "sm70")
    with pytest.raises(CheckpointError, match=r"fusellama\.3\.ffn2_weight_scale: scale of shape \[3\] fits neither"):
        weight_only_to_float("fusellama.3.ffn2_weight", stored, scale[:3], 128, 64, 8, "sm80")


def test_the_invariant_ignores_all_zero_channels():
    q = np.zeros((64, 4), np.int8)
    q[5, 1], q[7, 3] = -127, 127
    assert holds_qmax(q, np.array([0, 0.5, 0, 0.25], np.float32), 8, None)
    assert not holds_qmax(q, np.array([0.1, 0.5, 0, 0.25], np.float32), 8, None)
