"""DeepSeek's C++ graph ops against float64 numpy references (issue 14):

* `spmd_mla_decode` (ops/cpu_kernels/mla_decode.cc): the new latent vectors written into the paged
  pool at their slots, and each head's softmax over the past (block tables, contexts of different
  lengths, 0 included) and the new vector, in latent space;
* `spmd_moe_experts` (ops/cpu_kernels/moe_experts.cc): each local expert's SwiGLU over the tokens
  routed to it, weighted and summed per token; routes to other ranks' experts ignored; its forms over
  stacks in panels (moe_experts_panels.cc: fp32, bf16, f16) compute it bit for bit;
* `spmd_batched_matmul` (ops/cpu_kernels/batched_matmul.cc): MLA's per-head products.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from ops import paddle_ext
from spmd_serve.export.panels import to_panels
from spmd_serve.export.quant import bf16_bits, from_bf16_bits
from tests.support.linear_weights import twin_tolerance


@pytest.fixture(autouse=True, scope="module")
def ops_built():
    reason = paddle_ext.unavailable()
    if reason is not None:
        pytest.skip(f"C++ ops unavailable: {reason}")


def mla_case(heads, k, bs):
    """(query, latent, pool, block tables, context lengths, slots) of three sequences, contexts 0, one
    block and a bit, three blocks less one."""
    rng = np.random.default_rng(heads * 100 + k)
    num_blocks, b = 12, 3
    pool = rng.standard_normal((num_blocks, bs, k)).astype(np.float32)
    query = rng.standard_normal((heads, b, k)).astype(np.float32)
    latent = rng.standard_normal((b, k)).astype(np.float32)
    ctx_lens = np.array([0, bs + 3, 3 * bs - 1], np.int64)
    tables = rng.permutation(num_blocks)[: b * 3].reshape(b, 3).astype(np.int64)
    slots = np.array([tables[i, c // bs] * bs + c % bs for i, c in enumerate(ctx_lens)], np.int64)
    return query, latent, pool, tables, ctx_lens, slots


def run_mla(case, threads=1):
    """(output, pool after) of spmd_mla_decode on a copy of the case's pool."""
    query, latent, pool, tables, ctx_lens, slots = case
    paddle_ext.set_num_threads(threads)
    pool_t = paddle.to_tensor(pool.copy())
    got = paddle_ext.run_op(
        "spmd_mla_decode",
        *(paddle.to_tensor(a) for a in (query, latent)),
        pool_t,
        *(paddle.to_tensor(a) for a in (tables, ctx_lens, slots)),
    ).numpy()
    paddle_ext.set_num_threads(1)
    return got, pool_t.numpy()


# heads around the kernel's blocks of 4, K around its vectors (16 or 8 floats) and stretches of them
@pytest.mark.parametrize("heads,k,bs", [(4, 40, 16), (1, 48, 4), (3, 7, 8), (6, 70, 8), (9, 576, 16)])
def test_mla_decode_matches_reference(heads, k, bs):
    query, latent, pool, tables, ctx_lens, slots = mla_case(heads, k, bs)
    b = len(ctx_lens)
    want_pool = pool.copy()
    want = np.zeros((heads, b, k))
    for i in range(b):
        want_pool[slots[i] // bs, slots[i] % bs] = latent[i]
        rows = np.array([pool[tables[i, p // bs], p % bs] for p in range(ctx_lens[i])] + [latent[i]], np.float64)
        for h in range(heads):
            s = rows @ query[h, i].astype(np.float64)
            w = np.exp(s - s.max())
            want[h, i] = (w / w.sum()) @ rows
    got, got_pool = run_mla((query, latent, pool, tables, ctx_lens, slots))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(got_pool, want_pool)  # written in place


def test_mla_decode_threads_change_no_bit():
    case = mla_case(9, 70, 4)  # three tasks a sequence, the last of one head
    one = run_mla(case)
    for threads in (2, 3):
        assert all(np.array_equal(a, b) for a, b in zip(run_mla(case, threads), one)), threads


def moe_case(t, h, inter, e, k):
    """(x, idx, weight, gate_up, down): t tokens routed to k of e + 2 experts (-1 and e: another rank's)."""
    rng = np.random.default_rng(t * 10 + e)
    x = rng.standard_normal((t, h)).astype(np.float32)
    idx = np.stack([rng.permutation(e + 2)[:k] - 1 for _ in range(t)]).astype(np.int64)  # -1, e: not ours
    weight = rng.random((t, k)).astype(np.float32)
    gate_up = (rng.standard_normal((e, h, 2 * inter)) / np.sqrt(h)).astype(np.float32)
    down = (rng.standard_normal((e, inter, h)) / np.sqrt(inter)).astype(np.float32)
    return x, idx, weight, gate_up, down


def run_moe(case, threads=1):
    paddle_ext.set_num_threads(threads)
    got = paddle_ext.run_op("spmd_moe_experts", *(paddle.to_tensor(a) for a in case)).numpy()
    paddle_ext.set_num_threads(1)
    return got


# one token; more tokens than a round of 64 (150: three rounds); one expert slot a token
@pytest.mark.parametrize(
    "t,h,inter,e,k", [(1, 64, 32, 4, 2), (37, 32, 24, 2, 3), (5, 16, 8, 3, 1), (150, 48, 40, 9, 4)]
)
def test_moe_experts_matches_reference(t, h, inter, e, k):
    x, idx, weight, gate_up, down = moe_case(t, h, inter, e, k)
    want = np.zeros((t, h))
    for i in range(t):
        for j in range(k):
            if 0 <= idx[i, j] < e:
                a = x[i].astype(np.float64) @ gate_up[idx[i, j]]
                g, u = a[:inter], a[inter:]
                want[i] += weight[i, j] * ((g / (1 + np.exp(-g)) * u) @ down[idx[i, j]])
    got = run_moe((x, idx, weight, gate_up, down))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_moe_experts_threads_change_no_bit():
    case = moe_case(150, 48, 40, 9, 4)
    one = run_moe(case)
    for threads in (2, 3):
        assert np.array_equal(run_moe(case, threads), one), threads


@pytest.mark.parametrize("method,group", [("weight_only_int8", None), ("weight_only_int4", 8), ("weight_only_int4", 4)])
@pytest.mark.parametrize("t", [3, 70])
def test_quantised_experts_match_their_dequantised_stacks(method, group, t):
    """spmd_moe_experts_int8 / _int4 over the stacks export/deepseek/batched.py writes: the fp32 op's
    result over the same stacks dequantised (numpy), to fp32 rounding; threads change no bit."""
    from spmd_serve.export.quant import dequantize_stack, quantize_stack

    x, idx, weight, gate_up, down = moe_case(t, 32, 24, 5, 3)
    gu, dn = quantize_stack(gate_up, method, group), quantize_stack(down, method, group)
    op = "spmd_moe_experts_int8" if method == "weight_only_int8" else "spmd_moe_experts_int4"
    args = [paddle.to_tensor(a) for a in (x, idx, weight, gu.q, gu.scale, dn.q, dn.scale)]
    got = paddle_ext.run_op(op, *args).numpy()
    want = run_moe((x, idx, weight, dequantize_stack(gu), dequantize_stack(dn)))
    np.testing.assert_allclose(got, want, **twin_tolerance(method, want, 1e-5, 1e-5))
    assert np.abs(got).max() > 0.1  # routed rows are non-zero: the comparison is not vacuous
    paddle_ext.set_num_threads(2)
    try:
        assert np.array_equal(paddle_ext.run_op(op, *args).numpy(), got)
    finally:
        paddle_ext.set_num_threads(1)


def test_quantised_experts_refuse_a_scale_of_the_wrong_shape():
    from spmd_serve.export.quant import quantize_stack

    x, idx, weight, gate_up, down = moe_case(2, 32, 24, 5, 3)
    gu, dn = quantize_stack(gate_up, "weight_only_int8", None), quantize_stack(down, "weight_only_int8", None)
    args = [paddle.to_tensor(a) for a in (x, idx, weight, gu.q, gu.scale[:, :-1], dn.q, dn.scale)]
    with pytest.raises(Exception, match=r"int8 stack's scale must be \[E, N\]"):
        paddle_ext.run_op("spmd_moe_experts_int8", *args)


PANELS = {  # the stacks' dtype → (the op, a float32 array as that op's stacks hold it, and widened back)
    "float32": ("spmd_moe_experts_panels", lambda v: v, lambda v: v),
    "bfloat16": ("spmd_moe_experts_bf16", bf16_bits, from_bf16_bits),
    "float16": ("spmd_moe_experts_f16", lambda v: v.astype(np.float16), lambda v: v.astype(np.float32)),
}


@pytest.mark.parametrize("dtype", list(PANELS))
@pytest.mark.parametrize("t,h", [(1, 136), (3, 40), (70, 136)])  # h 136: a block of 128 rows and one of 8
def test_panel_experts_compute_the_stacks_they_hold(dtype, t, h):
    """spmd_moe_experts_panels / _bf16 / _f16 over stacks as export/deepseek/batched.py writes them
    (each expert in the panel layout; 16 bits for the latter two): spmd_moe_experts' result over the
    [E, in, out] fp32 stacks they stand for, bit for bit, on one thread and on two."""
    op, held_as, widen = PANELS[dtype]
    x, idx, weight, gate_up, down = moe_case(t, h, 24, 5, 3)
    held = [held_as(s) for s in (gate_up, down)]
    args = [paddle.to_tensor(a) for a in (x, idx, weight, *(np.stack([to_panels(e) for e in s]) for s in held))]
    want = run_moe((x, idx, weight, *(widen(s) for s in held)))
    assert np.abs(want).max() > 0.1  # routed rows are non-zero
    assert dtype == "float32" or not np.array_equal(widen(held[0]), gate_up)  # 16 bits: rounded
    for threads in (1, 2):
        paddle_ext.set_num_threads(threads)
        try:
            assert np.array_equal(paddle_ext.run_op(op, *args).numpy(), want), threads
        finally:
            paddle_ext.set_num_threads(1)
    wrong = paddle.to_tensor(gate_up.astype(np.float16) if dtype == "float32" else gate_up)
    with pytest.raises(Exception, match=f"the expert weights must be {dtype}"):
        paddle_ext.run_op(op, *args[:3], wrong, args[4])


def batched_case(n, t, k, m, transpose_y):
    rng = np.random.default_rng(n * 1000 + t * 10 + k)
    y = rng.standard_normal((n, m, k) if transpose_y else (n, k, m)).astype(np.float32)
    return rng.standard_normal((n, t, k)).astype(np.float32), y


# one slice and several; a decode row, rows around the stream / blocked split, a prefill chunk's
# scores (T = heads x S); K past a block; M 0 (a chunk with no past)
@pytest.mark.parametrize("transpose_y", [False, True])
@pytest.mark.parametrize(
    "n,t,k,m", [(1, 1, 24, 40), (3, 5, 136, 40), (16, 70, 64, 33), (2, 260, 288, 17), (2, 9, 8, 0)]
)
def test_batched_matmul_matches_float64(n, t, k, m, transpose_y):
    """spmd_batched_matmul (ops/cpu_kernels/batched_matmul.cc, MLA's w_uk / w_uv and a chunk's scores
    and weighted sums): x[n] @ y[n] (y[n] transposed) for every n, against float64; bit-equal on 1, 2
    and 3 threads (a slice a task, or the slices in turn)."""
    x, y = batched_case(n, t, k, m, transpose_y)
    args = [paddle.to_tensor(a) for a in (x, y)]
    got = paddle_ext.run_op("spmd_batched_matmul", *args, transpose_y).numpy()
    want = x.astype(np.float64) @ (y.transpose(0, 2, 1) if transpose_y else y).astype(np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    for threads in (2, 3):
        paddle_ext.set_num_threads(threads)
        try:
            assert np.array_equal(paddle_ext.run_op("spmd_batched_matmul", *args, transpose_y).numpy(), got), threads
        finally:
            paddle_ext.set_num_threads(1)


@pytest.mark.parametrize(
    "x,y,transpose_y,message",
    [
        ((2, 3, 8), (3, 8, 4), False, r"x \[2, T, 8\] does not match y \[3, 8, 4\]"),
        ((2, 3, 8), (2, 7, 4), False, r"x \[2, T, 8\] does not match y \[2, 7, 4\]"),
        ((2, 3, 8), (2, 8, 4), True, r"x \[2, T, 8\] does not match y \[2, 8, 4\] \(transposed\)"),
        ((3, 8), (1, 8, 4), False, r"expected x \[N, T, K\]"),
    ],
)
def test_batched_matmul_refuses_shapes_that_do_not_match(x, y, transpose_y, message):
    with pytest.raises(Exception, match=message):
        paddle_ext.run_op("spmd_batched_matmul", paddle.zeros(x), paddle.zeros(y), transpose_y)


@pytest.mark.parametrize("method,group", [("weight_only_int8", None), ("weight_only_int4", 8)])
@pytest.mark.parametrize("n,t", [(3, 1), (16, 9), (1, 70)])
def test_quantised_batched_linear_matches_its_dequantised_stack(method, group, n, t):
    """spmd_batched_linear_int8 / _int4 over a QuantStack (a quantised export's w_uk / w_uv): the fp32
    op's result over the stack dequantised (numpy), to fp32 rounding (int8 here: x in bf16); threads
    change no bit."""
    from spmd_serve.export.quant import dequantize_stack, quantize_stack

    x, y = batched_case(n, t, 32, 24, False)
    stack = quantize_stack(y, method, group)
    op = "spmd_batched_linear_int8" if method == "weight_only_int8" else "spmd_batched_linear_int4"
    args = [paddle.to_tensor(a) for a in (x, stack.q, stack.scale)]
    got = paddle_ext.run_op(op, *args).numpy()
    want = paddle_ext.run_op(
        "spmd_batched_matmul", paddle.to_tensor(x), paddle.to_tensor(dequantize_stack(stack)), False
    )
    np.testing.assert_allclose(got, want.numpy(), **twin_tolerance(method, want.numpy(), 1e-5, 1e-5))
    paddle_ext.set_num_threads(2)
    try:
        assert np.array_equal(paddle_ext.run_op(op, *args).numpy(), got)
    finally:
        paddle_ext.set_num_threads(1)
    with pytest.raises(Exception, match=r"stack's scale must be"):
        paddle_ext.run_op(op, args[0], args[1], paddle.to_tensor(stack.scale[:, :-1]))
