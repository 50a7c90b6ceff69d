"""The linear ops at every row count (ops/cpu_kernels/gemm.h: the streaming kernel up to 8 rows,
the blocked micro-kernel above) against float64 numpy, with fp32, int8 and packed int4 weights;
and their threading: every output is the same fp32 sum (a chain of fmas per 128 rows of W, the
chains added in order) whatever the thread count or the rows it came with, so results are compared
bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from spmd_serve.export.quant import bf16_bits, from_bf16_bits
from tests.support.linear_weights import int8_input, to_bf16, weights

ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 47, 64, 130, 256, 512)  # every streamed T (its own register
# groups), the blocked path and its edges (6-row micro-kernel)


@pytest.fixture(scope="module")
def ext():
    from ops import paddle_ext

    paddle_ext.load()
    yield paddle_ext
    paddle_ext.set_num_threads(1)


def linear(ext, name: str, x: np.ndarray, *w: np.ndarray, threads: int = 1) -> np.ndarray:
    import paddle

    ext.set_num_threads(threads)
    return ext.run_op(name, *[paddle.to_tensor(a) for a in (x, *w)]).numpy()


def check(y: np.ndarray, ref: np.ndarray) -> None:
    assert y.dtype == np.float32 and y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=2e-4, atol=2e-5 * np.abs(ref).max(initial=1.0))


def reference(name: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """float64 x @ w, x as op `name` takes it (int8 on a bf16 CPU: rounded to bf16)."""
    return (int8_input(x) if name == "spmd_linear_int8" else x).astype(np.float64) @ w


@pytest.mark.parametrize("rows", ROWS)
def test_every_row_count_matches_float64(ext, rows):
    k, n = 72, 131  # N not a multiple of the vector or micro-panel
    x = np.random.default_rng(rows).standard_normal((rows, k), np.float32)
    for name, (args, w) in weights(k, n, rows).items():
        check(linear(ext, name, x, *args), reference(name, x, w))


@pytest.mark.parametrize("k,n", [(1, 1), (2, 15), (130, 17), (258, 64), (300, 257), (16, 1000)])
@pytest.mark.parametrize("rows", (1, 7, 9, 70))
def test_odd_shapes_around_the_blocks_match_float64(ext, k, n, rows):
    # K around the 8-row passes and the 128-row packed blocks, N around 16/64-column panels
    x = np.random.default_rng(k * n).standard_normal((rows, k), np.float32)
    for name, (args, w) in weights(k, n, k + n, group=2).items():
        check(linear(ext, name, x, *args), reference(name, x, w))


@pytest.mark.parametrize(
    "name",
    (
        "spmd_linear",
        "spmd_linear_panels",
        "spmd_linear_bf16",
        "spmd_linear_f16",
        "spmd_linear_int8",
        "spmd_linear_int4",
    ),
)
def test_threads_and_batching_do_not_change_a_bit(ext, name):
    k, n = 264, 700
    x = np.random.default_rng(3).standard_normal((300, k), np.float32)
    args, _ = weights(k, n, 4)[name]
    for rows in (1, 3, 4, 6, 7, 8, 9, 64, 300):
        one = linear(ext, name, x[:rows], *args, threads=1)
        for threads in (2, 3):
            assert np.array_equal(linear(ext, name, x[:rows], *args, threads=threads), one), (rows, threads)
        # a row's output does not depend on the rows it was computed with (either kernel)
        assert np.array_equal(one[-1:], linear(ext, name, x[rows - 1 : rows], *args))


def test_int8_on_amx_is_the_exact_integer_sum(ext):
    """Where the ops take int8's exact path (ops/cpu_kernels/int8_exact.h: x's rows as integers
    X = rint(x * m), m = 2^22 / max|x| in fp32; exact sums X @ q; one rounding of S / m * scale), the
    op's output is that, bit for bit, on both of its kernels (up to 2 rows, and the tile unit's) and
    for an all-zero row; elsewhere the bf16 or fp32 chains, against float64."""
    k, n = 200, 70
    (q, s), w = weights(k, n, 11)["spmd_linear_int8"]
    for rows in (1, 2, 3, 5, 37):
        x = np.random.default_rng(rows).standard_normal((rows, k), np.float32) * np.float32(3)
        x[-1] = 0 if rows in (2, 5) else x[-1]  # an all-zero row, on either kernel
        y = linear(ext, "spmd_linear_int8", x, q, s, threads=2)
        if not ext.int8_exact():
            check(y, reference("spmd_linear_int8", x, w))
            continue
        most = np.abs(x).max(axis=1, keepdims=True)
        m = np.divide(np.float32(4194304), most, out=np.zeros_like(most), where=most > 0)  # fp32, as the op
        big = np.rint(x * m).astype(np.int64) @ q.astype(np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            ref = np.where(m > 0, big / m.astype(np.float64) * s.astype(np.float64), 0.0).astype(np.float32)
        assert np.array_equal(y, ref), rows
        check(y, x.astype(np.float64) @ w)


@pytest.mark.parametrize("bad", (np.inf, -np.inf, np.nan))
def test_int8_a_non_finite_row_stays_non_finite(ext, bad):
    # the exact path scales a row by its largest element: an inf or NaN must not become numbers
    (q, s), w = weights(64, 40, 12)["spmd_linear_int8"]
    x = np.random.default_rng(4).standard_normal((9, 64), np.float32)
    x[3, 5] = bad
    for lo, hi in ((0, 9), (0, 4), (3, 4)):  # both kernels of the exact path, and the fp32 ones
        y = linear(ext, "spmd_linear_int8", x[lo:hi], q, s)
        assert not np.isfinite(y[3 - lo]).any(), (lo, hi)
        others = [i for i in range(hi - lo) if i != 3 - lo]
        check(y[others], reference("spmd_linear_int8", x[lo:hi][others], w))


def test_int8_takes_x_in_bf16_where_the_cpu_has_bf16_dot_products(ext):
    """With AVX-512 BF16 and no AMX (ops/cpu_kernels/gemm_bf16.h) the int8 GEMM rounds x to bf16:
    x and its rounding give the same bits, on the stream kernel (T <= 8) and the blocked one (pairs
    of W's rows; K odd leaves the last row without a partner), and a row's bits do not depend on the
    kernel; elsewhere x's low bits count."""
    k, n = 201, 70
    (q, s), _ = weights(k, n, 13)["spmd_linear_int8"]
    x = np.random.default_rng(13).standard_normal((37, k), np.float32) * np.float32(3)
    assert not np.array_equal(to_bf16(x), x)
    for rows in (1, 5, 37):
        y = linear(ext, "spmd_linear_int8", x[:rows], q, s, threads=2)
        assert np.array_equal(y, linear(ext, "spmd_linear_int8", to_bf16(x[:rows]), q, s)) == ext.int8_bf16(), rows
        assert np.array_equal(y[-1:], linear(ext, "spmd_linear_int8", x[rows - 1 : rows], q, s)), rows


def test_leading_dimensions_zero_rows_and_zero_k(ext):
    args, w = weights(16, 40, 5)["spmd_linear"]
    x = np.random.default_rng(5).standard_normal((2, 3, 4, 16), np.float32)  # [..., K] → [..., N]
    check(linear(ext, "spmd_linear", x, *args), x.astype(np.float64) @ w)
    assert linear(ext, "spmd_linear", x[:0], *args).shape == (0, 3, 4, 40)
    for rows in (1, 20):
        assert (linear(ext, "spmd_linear", np.zeros((rows, 0), np.float32), np.zeros((0, 9), np.float32)) == 0).all()


@pytest.mark.parametrize(
    "arrays,message",
    [
        (lambda x, q, s: (x[:, :-2], q, s), r"x's last dimension \(30\) must equal the weight's rows K \(32\)"),
        (lambda x, q, s: (x, q, s[:, :-1]), r"scale must be \[K / group, N\]"),
        (lambda x, q, s: (x, q, s[:3]), r"scale must be \[K / group, N\]"),  # 32 / 3: no group
        (lambda x, q, s: (x, q.astype(np.int16), s), "the weight must be int8"),
    ],
)
def test_int4_bad_inputs_are_refused_with_a_reason(ext, arrays, message):
    args, _ = weights(32, 24, 6)["spmd_linear_int4"]
    x = np.ones((2, 32), np.float32)
    with pytest.raises(Exception, match=message):
        linear(ext, "spmd_linear_int4", *arrays(x, *args))


@pytest.mark.parametrize("k,n", [(72, 131), (128, 16), (130, 17), (300, 257), (1536, 48)])
def test_the_panel_layout_gives_the_rows_layouts_bits(ext, k, n):
    """spmd_linear_panels on to_panels(w) is spmd_linear on w, bit for bit, at every T (both of its
    kernels, the last partial panel, a last block of K % 128 rows) and thread count."""
    from spmd_serve.export.panels import from_panels, to_panels

    w = np.random.default_rng(k + n).standard_normal((k, n), np.float32)
    p = to_panels(w)
    assert np.array_equal(from_panels(p), w) and (k * n <= 16 or not np.array_equal(p, w))
    for rows in ROWS:
        x = np.random.default_rng(rows).standard_normal((rows, k), np.float32)
        for threads in (1, 2):
            want = linear(ext, "spmd_linear", x, w, threads=threads)
            assert np.array_equal(linear(ext, "spmd_linear_panels", x, p, threads=threads), want), (rows, threads)


@pytest.mark.parametrize("k,n", [(72, 131), (130, 17), (300, 257), (16, 1000)])
def test_bf16_weights_give_the_fp32_ops_bits_on_the_widened_weights(ext, k, n):
    """spmd_linear_bf16 (W's bf16 bits in panels) widens each weight exactly and keeps x in fp32
    (weight-only): its output is spmd_linear's on the widened weights, bit for bit, at every T (both
    kernels, a last partial panel, a last block of K % 128 rows) and thread count."""
    from spmd_serve.export.panels import from_panels, to_panels

    w = np.random.default_rng(k * n).standard_normal((k, n), np.float32)
    w[0, :2] = [np.float32(2.0**-130), np.float32(-3e38)]  # a denormal and a large one stay as they are
    b = bf16_bits(w)
    wide = from_bf16_bits(b)
    assert wide[0, 0] == w[0, 0] and np.array_equal(wide[1:], to_bf16(w[1:])) and not np.array_equal(wide, w)
    p = to_panels(b)
    assert p.dtype == np.uint16 and np.array_equal(from_panels(p), b)
    for rows in ROWS:
        x = np.random.default_rng(rows).standard_normal((rows, k), np.float32)
        for threads in (1, 2):
            want = linear(ext, "spmd_linear", x, wide, threads=threads)
            assert np.array_equal(linear(ext, "spmd_linear_bf16", x, p, threads=threads), want), (rows, threads)


@pytest.mark.parametrize("k,n", [(72, 131), (300, 257)])
def test_f16_weights_give_the_fp32_ops_bits_on_the_widened_weights(ext, k, n):
    """spmd_linear_f16 (float16 weights in panels) likewise: spmd_linear's bits on the widened weights,
    subnormal halves, the largest one and a negative zero included."""
    from spmd_serve.export.panels import to_panels

    w = np.random.default_rng(k).standard_normal((k, n), np.float32).astype(np.float16)
    w[0, :4] = [np.float16(2.0**-24), np.float16(-3 * 2.0**-20), np.float16(65504), np.float16(-0.0)]
    wide = w.astype(np.float32)
    for rows in ROWS:
        x = np.random.default_rng(rows).standard_normal((rows, k), np.float32)
        for threads in (1, 2):
            want = linear(ext, "spmd_linear", x, wide, threads=threads)
            got = linear(ext, "spmd_linear_f16", x, to_panels(w), threads=threads)
            assert np.array_equal(got, want), (rows, threads)
