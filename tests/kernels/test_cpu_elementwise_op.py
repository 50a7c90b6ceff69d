"""`spmd_rms_norm`, `spmd_add_rms_norm` and `spmd_swiglu` (ops/cpu_kernels/elementwise.cc) against
float64 numpy and against the Paddle ops the `--graph-ops paddle` graphs use (layers.add_rms_norm's
elementwise ops, nn.functional.swiglu); odd widths (vector tails), extreme gate values, 1 vs n
threads bit for bit."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def ext():
    from ops import paddle_ext

    paddle_ext.load()
    yield paddle_ext
    paddle_ext.set_num_threads(1)


def run(ext, name, *arrays, attrs=(), threads=1):
    import paddle

    ext.set_num_threads(threads)
    out = ext.run_op(name, *[paddle.to_tensor(a) for a in arrays], *attrs)
    return [o.numpy() for o in out] if isinstance(out, list) else out.numpy()


def rms_ref(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def swiglu_ref(x: np.ndarray) -> np.ndarray:
    g, u = np.split(x.astype(np.float64), 2, axis=-1)
    return g / (1 + np.exp(-g)) * u


@pytest.mark.parametrize("shape", [(1, 64), (3, 37), (513, 2048), (2, 5, 24), (0, 16)])
def test_norms_match_float64_and_paddle(ext, shape):
    import paddle

    from spmd_serve.export.layers import add_rms_norm

    rng = np.random.default_rng(shape[-1])
    h, delta = (rng.standard_normal(shape).astype(np.float32) * 3 for _ in range(2))
    w = (rng.random(shape[-1]) + 0.5).astype(np.float32)
    out, res = run(ext, "spmd_add_rms_norm", h, delta, w, attrs=(1e-5,))
    assert (res == h + delta).all()  # the residual, exactly
    np.testing.assert_allclose(out, rms_ref(h + delta, w, 1e-5), rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(
        run(ext, "spmd_rms_norm", h, w, attrs=(1e-5,)), rms_ref(h, w, 1e-5), rtol=2e-6, atol=1e-6
    )
    if h.size:
        want, want_res = add_rms_norm(paddle.to_tensor(h), paddle.to_tensor(delta), paddle.to_tensor(w), 1e-5)
        np.testing.assert_allclose(out, want.numpy(), rtol=2e-6, atol=1e-6)
        assert (res == want_res.numpy()).all()


@pytest.mark.parametrize("shape", [(1, 2), (4, 74), (300, 3072), (2, 3, 32)])
def test_swiglu_matches_float64_and_paddle(ext, shape):
    import paddle

    x = np.random.default_rng(shape[-1]).standard_normal(shape).astype(np.float32) * 4
    x.reshape(-1)[:6] = [-100.0, 100.0, -88.5, 90.0, 0.0, -1e-30][: x.size]  # exp's clamps, both sides
    y = run(ext, "spmd_swiglu", x)
    assert y.shape == (*shape[:-1], shape[-1] // 2)
    np.testing.assert_allclose(y, swiglu_ref(x), rtol=2e-6, atol=1e-30)
    np.testing.assert_allclose(y, paddle.nn.functional.swiglu(paddle.to_tensor(x)).numpy(), rtol=2e-6, atol=1e-30)


def test_threads_change_no_bit(ext):
    rng = np.random.default_rng(7)
    h, delta = rng.standard_normal((300, 2048), np.float32), rng.standard_normal((300, 2048), np.float32)
    w, gu = rng.random(2048, np.float32), rng.standard_normal((300, 3000), np.float32)
    for name, args, attrs in (
        ("spmd_add_rms_norm", (h, delta, w), (1e-6,)),
        ("spmd_rms_norm", (h, w), (1e-6,)),
        ("spmd_swiglu", (gu,), ()),
    ):
        one = run(ext, name, *args, attrs=attrs)
        for threads in (2, 3):
            assert np.array_equal(np.asarray(run(ext, name, *args, attrs=attrs, threads=threads)), np.asarray(one))


def test_bad_inputs_are_refused_with_a_reason(ext):
    with pytest.raises(Exception, match=r"the weight must be \[H\] = \[8\]"):
        run(ext, "spmd_rms_norm", np.ones((2, 8), np.float32), np.ones(7, np.float32), attrs=(1e-6,))
    with pytest.raises(Exception, match="delta must match h"):
        run(
            ext,
            "spmd_add_rms_norm",
            np.ones((2, 8), np.float32),
            np.ones((1, 8), np.float32),
            np.ones(8, np.float32),
            attrs=(1e-6,),
        )
    with pytest.raises(Exception, match="the last dimension must be even"):
        run(ext, "spmd_swiglu", np.ones((2, 7), np.float32))
