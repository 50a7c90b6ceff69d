"""`spmd_norm_linear` / `_int8` / `_int4` (ops/cpu_kernels/norm_linear.cc): the residual add +
RMSNorm, the linear it feeds and optionally the SwiGLU after it as one op.  Against float64 numpy,
and bit for bit against the separate ops it stands for (`spmd_add_rms_norm`, the weight form's
linear, `spmd_swiglu`), at 1 and 2 threads, decode and prefill row counts; bad shapes refused."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.linear_weights import int8_input, weights

EPS = 1e-6


@pytest.fixture(scope="module")
def ext():
    from ops import paddle_ext

    paddle_ext.load()
    yield paddle_ext
    paddle_ext.set_num_threads(1)


def run(ext, name: str, *args, threads: int = 1) -> list[np.ndarray]:
    import paddle

    ext.set_num_threads(threads)
    tensors = [paddle.to_tensor(a) if isinstance(a, np.ndarray) else a for a in args]
    out = ext.run_op(name, *tensors)
    return [o.numpy() for o in out] if isinstance(out, list) else [out.numpy()]


def gemm_input(name: str, x: np.ndarray) -> np.ndarray:
    """x as op `name`'s GEMM takes it (int8 on a bf16 CPU: rounded to bf16), in float64."""
    return (int8_input(x.astype(np.float32)) if name.endswith("int8") else x).astype(np.float64)


def reference(name, h, delta, norm_w, w64, swiglu: bool) -> tuple[np.ndarray, np.ndarray]:
    s = h.astype(np.float64) + delta
    y = gemm_input(name, s / np.sqrt((s * s).mean(-1, keepdims=True) + EPS) * norm_w) @ w64
    if swiglu:
        g, u = np.split(y, 2, axis=-1)
        y = g / (1 + np.exp(-g)) * u
    return y, s


@pytest.mark.parametrize("rows", (1, 3, 17))  # the streaming GEMV, and the blocked kernel above 8 rows
@pytest.mark.parametrize("swiglu", (False, True))
def test_equals_the_separate_ops_bit_for_bit_and_float64(ext, rows, swiglu):
    k, n = 72, 130  # even N (gate | up), not a multiple of the vector width
    rng = np.random.default_rng(rows + 10 * swiglu)
    h, delta = rng.standard_normal((2, rows, k), np.float32)
    norm_w = (rng.random(k, np.float32) + 0.5).astype(np.float32)
    for name, (wargs, w64) in weights(k, n, rows).items():
        fused = name.replace("spmd_linear", "spmd_norm_linear")
        for threads in (1, 2):
            out, total = run(ext, fused, h, delta, norm_w, *wargs, EPS, swiglu, threads=threads)
            normed, want_sum = run(ext, "spmd_add_rms_norm", h, delta, norm_w, EPS, threads=threads)
            (want,) = run(ext, name, normed, *wargs, threads=threads)
            if swiglu:
                (want,) = run(ext, "spmd_swiglu", want, threads=threads)
            assert np.array_equal(out, want) and np.array_equal(total, want_sum), (name, threads)
        ref, ref_sum = reference(name, h, delta, norm_w, w64, swiglu)
        assert out.shape == ref.shape and out.dtype == np.float32
        np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-5 * np.abs(ref).max())
        np.testing.assert_allclose(total, ref_sum, rtol=1e-6)


def test_swiglu_needs_gate_and_up_halves(ext):
    rng = np.random.default_rng(0)
    h, delta = rng.standard_normal((2, 1, 8), np.float32)
    with pytest.raises(Exception, match="must be even"):  # (eagerly: the SwiGLU step says it)
        run(ext, "spmd_norm_linear", h, delta, np.ones(8, np.float32), np.ones((8, 5), np.float32), EPS, True)
    with pytest.raises(Exception, match="x's last dimension"):  # the linear's own checks still speak
        run(ext, "spmd_norm_linear", h, delta, np.ones(8, np.float32), np.ones((6, 4), np.float32), EPS, False)


@pytest.mark.parametrize("rows", (1, 3, 17))
@pytest.mark.parametrize("swiglu", (False, True))
def test_linear_norm_linear_equals_the_separate_ops_bit_for_bit(ext, rows, swiglu):
    """`spmd_linear_norm_linear*` (ops/cpu_kernels/linear_norm_linear.cc): the row-shard linear before
    it, then `spmd_norm_linear*`; `reduce` False (the all-reduce is the MPI tests' part)."""
    k1, k, n = 40, 72, 130
    rng = np.random.default_rng(rows + 10 * swiglu + 100)
    x = rng.standard_normal((rows, k1), np.float32)
    h = rng.standard_normal((rows, k), np.float32)
    norm_w = (rng.random(k, np.float32) + 0.5).astype(np.float32)
    firsts, seconds = weights(k1, k, rows + 1), weights(k, n, rows)
    for name, (wargs, w64) in seconds.items():
        w1args, w164 = firsts[name]
        fused = name.replace("spmd_linear", "spmd_linear_norm_linear")
        for threads in (1, 2):
            out, total = run(ext, fused, x, *w1args, h, norm_w, *wargs, EPS, swiglu, False, threads=threads)
            (delta,) = run(ext, name, x, *w1args, threads=threads)
            want, want_sum = run(
                ext,
                name.replace("spmd_linear", "spmd_norm_linear"),
                h,
                delta,
                norm_w,
                *wargs,
                EPS,
                swiglu,
                threads=threads,
            )
            assert np.array_equal(out, want) and np.array_equal(total, want_sum), (name, threads)
        ref, ref_sum = reference(name, h, gemm_input(name, x) @ w164, norm_w, w64, swiglu)
        assert out.shape == ref.shape and total.shape == h.shape
        np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-5 * np.abs(ref).max())
        np.testing.assert_allclose(total, ref_sum, rtol=1e-4, atol=1e-5 * np.abs(ref_sum).max())


def test_linear_norm_linear_refuses_mismatched_shapes(ext):
    rng = np.random.default_rng(1)
    x, h = rng.standard_normal((2, 6), np.float32), rng.standard_normal((2, 8), np.float32)
    norm_w, w2 = np.ones(8, np.float32), np.ones((8, 4), np.float32)
    with pytest.raises(Exception, match="x's last dimension"):  # the first linear's own check speaks
        run(ext, "spmd_linear_norm_linear", x, np.ones((5, 8), np.float32), h, norm_w, w2, EPS, False, False)
    with pytest.raises(Exception, match="must be even"):
        run(
            ext,
            "spmd_linear_norm_linear",
            x,
            np.ones((6, 8), np.float32),
            h,
            norm_w,
            np.ones((8, 5), np.float32),
            EPS,
            True,
            False,
        )
