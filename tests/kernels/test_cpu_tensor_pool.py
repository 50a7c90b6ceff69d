"""The C++ ops' output tensors come from a free list (ops/cpu_kernels/tensor_pool.cc): a buffer
goes back to it when Paddle drops its tensor and the next op output of that size takes it.  These
tests hold outputs alive across many later calls, drop some, and check that no held output was
handed out again (it would be overwritten), across sizes: 0 elements, small, just over the pooled
limit (4 MB), and enough held at once to pass the list's 64 MB cap and flush it."""

from __future__ import annotations

import gc

import numpy as np
import pytest


@pytest.fixture(scope="module")
def ext():
    from ops import paddle_ext

    paddle_ext.load()
    paddle_ext.set_num_threads(2)
    yield paddle_ext
    paddle_ext.set_num_threads(1)


def swiglu(ext, x: np.ndarray):
    import paddle

    return ext.run_op("spmd_swiglu", paddle.to_tensor(x))


def want(x: np.ndarray) -> np.ndarray:
    g, u = np.split(x.astype(np.float64), 2, axis=-1)
    return (g / (1 + np.exp(-g)) * u).astype(np.float32)


@pytest.mark.parametrize("shape", [(1, 1024), (3, 74), (0, 16), (520, 4096)])  # 520 x 2048 x 4 B > 4 MB
def test_held_outputs_are_never_handed_out_again(ext, shape):
    rng = np.random.default_rng(shape[0] + shape[1])
    inputs = [rng.standard_normal(shape).astype(np.float32) for _ in range(6 if shape[0] > 500 else 120)]
    held = [swiglu(ext, x) for x in inputs]
    for i in range(0, len(held), 2):  # every other one back to the list
        held[i] = None
    gc.collect()
    churn = [swiglu(ext, x) for x in inputs[::2]]  # takes the freed buffers (and more)
    for x, out in zip(inputs, held):
        if out is not None:
            np.testing.assert_allclose(out.numpy(), want(x), rtol=2e-6, atol=1e-30)
    for x, out in zip(inputs[::2], churn):
        np.testing.assert_allclose(out.numpy(), want(x), rtol=2e-6, atol=1e-30)
    if hasattr(held[1], "data_ptr") and held[1].size:
        assert held[1].data_ptr() % 64 == 0  # 64-byte aligned, as paddle::empty's


def test_more_than_the_cap_held_then_freed(ext):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((256, 4096)).astype(np.float32)  # out: 2 MB, pooled
    ref = want(x)
    held = [swiglu(ext, x) for _ in range(40)]  # 80 MB held: back in the list, they pass 64 MB
    del held
    gc.collect()
    other = rng.standard_normal((1, 4096)).astype(np.float32)
    outs = [swiglu(ext, x) for _ in range(3)] + [swiglu(ext, other)]
    for out in outs[:3]:
        np.testing.assert_allclose(out.numpy(), ref, rtol=2e-6, atol=1e-30)
    np.testing.assert_allclose(outs[3].numpy(), want(other), rtol=2e-6, atol=1e-30)
