"""ops.kv_cache_write.

CI (no GPU): the numpy twin against a plain per-token loop (padding slots included) and the int8
round trip; every dtype x int8-KV variant compiles with NVRTC for sm_80 and sm_90; the CUDA source
run on the CPU emulation (tests/support/ops_emulation.py) equals the twin.
GPU (marked `gpu`, skipped without one): the kernel equals its twin bit for bit, on dense and
strided (fused-QKV slice) inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from ops import kv_cache_write as kvw
from ops import runtime
from tests.support.ops_emulation import emulated  # noqa: F401  (pytest fixture, used by name)
from tests.support.ops_helpers import (  # noqa: F401  (pytest fixtures)
    ARCHS,
    assert_compiles,
    cupy_device,
    from_storage,
    needs_gpu,
    tmp_kernel_cache,
    to_storage,
)


# ----------------------------------------------------------------------------- twin
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_kv_cache_write_twin_matches_loop(dtype) -> None:
    rng = np.random.default_rng(1)
    nb, bs, kvh, hd, t = 6, 4, 2, 16, 9
    key = rng.standard_normal((t, kvh, hd)).astype(dtype)
    value = rng.standard_normal((t, kvh, hd)).astype(dtype)
    slots = rng.permutation(nb * bs)[:t].astype(np.int32)
    slots[3] = -1  # padding token: not stored
    kc, vc = np.zeros((nb, kvh, bs, hd), dtype), np.zeros((nb, kvh, bs, hd), dtype)
    kvw.kv_cache_write(key, value, kc, vc, slots)  # numpy input: dispatches to the twin
    ek, ev = np.zeros_like(kc), np.zeros_like(vc)
    for i, s in enumerate(slots):
        if s >= 0:
            ek[s // bs, :, s % bs], ev[s // bs, :, s % bs] = key[i], value[i]  # [NB, kvh, bs, hd]
    np.testing.assert_array_equal(kc, ek)
    np.testing.assert_array_equal(vc, ev)


def test_kv_cache_write_int8_round_trip_error_within_half_scale() -> None:
    rng = np.random.default_rng(2)
    nb, bs, kvh, hd, t = 4, 8, 3, 32, 20
    key = rng.standard_normal((t, kvh, hd)).astype(np.float32) * np.array([0.5, 2.0, 8.0])[:, None]
    value = rng.standard_normal((t, kvh, hd)).astype(np.float32)
    k_scale = (np.abs(key).max(axis=(0, 2)) / 127).astype(np.float32)
    v_scale = (np.abs(value).max(axis=(0, 2)) / 127).astype(np.float32)
    kc, vc = np.zeros((nb, kvh, bs, hd), np.int8), np.zeros((nb, kvh, bs, hd), np.int8)
    slots = np.arange(5, 5 + t, dtype=np.int32)
    kvw.kv_cache_write_cpu(key, value, kc, vc, slots, k_scale, v_scale)
    for pool, new, scale in ((kc, key, k_scale), (vc, value, v_scale)):
        back = kvw.slot_rows(pool)[slots].astype(np.float32) * scale[:, None]
        assert np.all(np.abs(back - new) <= scale[:, None] / 2 * (1 + 1e-6))
    big = np.full((1, kvh, hd), 1e6, np.float32)  # out of range: clipped, not wrapped
    assert np.all(kvw.quantize_int8(big, k_scale) == 127) and np.all(kvw.quantize_int8(-big, k_scale) == -127)


def test_kv_cache_write_int8_counts_what_it_clips() -> None:
    """The writer returns how many K and V entries it clipped (/metrics' kv_cache_int8_clipped):
    those with |x / scale| past 127.5, padding slots not counted, none for a float pool."""
    rng = np.random.default_rng(3)
    kvh, hd, t = 2, 16, 12
    key, value = (rng.standard_normal((t, kvh, hd)).astype(np.float32) for _ in range(2))
    scale = np.array([1.5, 2.5], np.float32) / 127  # clips |x| > 1.5 in head 0, > 2.5 in head 1
    slots = np.arange(t, dtype=np.int64)
    slots[3] = -1  # a padding token: neither stored nor counted
    kept = slots >= 0
    want = [int((np.abs(x[kept]) > np.array([1.5, 2.5])[:, None] * 127.5 / 127).sum()) for x in (key, value)]
    assert min(want) > 0
    kc, vc = np.zeros((2, kvh, 8, hd), np.int8), np.zeros((2, kvh, 8, hd), np.int8)
    assert kvw.kv_cache_write_cpu(key, value, kc, vc, slots, scale, scale) == tuple(want)
    assert kvw.count_clipped(key[kept], scale) == want[0]
    kf, vf = np.zeros((2, kvh, 8, hd), np.float32), np.zeros((2, kvh, 8, hd), np.float32)
    assert kvw.kv_cache_write_cpu(key * 1e3, value, kf, vf, slots) == (0, 0)


# ----------------------------------------------------------------------------- NVRTC compile (CI)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("label", list(kvw.VARIANTS))
def test_every_kernel_compiles(label, arch) -> None:
    assert_compiles(kvw, label, arch)


# ----------------------------------------------------------------------------- GPU: kernel == twin
@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("kv_int8", [False, True])
@pytest.mark.parametrize("strided", [False, True])
def test_kv_cache_write_gpu_equals_twin(cupy_device, dtype, kv_int8, strided) -> None:
    device = cupy_device  # cupy arrays when cupy is installed, else raw buffers
    rng = np.random.default_rng(7)
    nb, bs, kvh, hd, t = 9, 16, 4, 128, 37
    qkv = rng.standard_normal((t, 3 * kvh, hd)).astype(np.float32)  # strided: K/V are slices of QKV
    stored, values = to_storage(qkv, dtype)
    pool_dtype = np.int8 if kv_int8 else stored.dtype
    scale = (np.abs(values).max(axis=(0, 2))[:kvh] / 127).astype(np.float32)
    scales = [scale, scale * 2] if kv_int8 else [None, None]
    slots = rng.permutation(nb * bs)[:t].astype(np.int32)
    slots[[0, 10]] = -1
    if strided:  # views into one device QKV buffer: row stride 3 * kvh * hd
        qkv_dev = device.put(stored)  # held: the views below keep no cupy array alive (it would be freed)
        base, item = runtime.as_device_array(qkv_dev), stored.dtype.itemsize
        key, value = (
            runtime.DeviceArray(
                base.ptr + i * kvh * hd * item, (t, kvh, hd), stored.dtype, (3 * kvh * hd * item, hd * item, item)
            )
            for i in (1, 2)
        )
    else:
        key, value = device.put(stored[:, kvh : 2 * kvh]), device.put(stored[:, 2 * kvh :])
    kc, vc = device.put(np.zeros((nb, kvh, bs, hd), pool_dtype)), device.put(np.zeros((nb, kvh, bs, hd), pool_dtype))
    d_scales = [device.put(s) if s is not None else None for s in scales]
    kvw.kv_cache_write_gpu(key, value, kc, vc, device.put(slots), *d_scales)
    ek = np.zeros((nb, kvh, bs, hd), np.int8 if kv_int8 else np.float32)
    ev = np.zeros_like(ek)
    kvw.kv_cache_write_cpu(values[:, kvh : 2 * kvh], values[:, 2 * kvh :], ek, ev, slots, *scales)
    for got, want in ((device.get(kc), ek), (device.get(vc), ev)):
        np.testing.assert_array_equal(got if kv_int8 else from_storage(got, dtype), want)


# ----------------------------------------------------------------------------- CUDA source on the CPU
@pytest.mark.parametrize("dtype,kv_int8", [("fp16", False), ("bf16", True)])
def test_kv_cache_write_source_emulated(emulated, dtype, kv_int8) -> None:
    rng = np.random.default_rng(9)
    nb, bs, kvh, hd, t = 5, 4, 2, 16, 7
    stored, values = to_storage(rng.standard_normal((t, 3 * kvh, hd)).astype(np.float32), dtype)
    scales = [np.array([0.01, 0.03], np.float32)] * 2 if kv_int8 else [None, None]
    slots = rng.permutation(nb * bs)[:t].astype(np.int32)
    slots[2] = -1
    pools = [np.zeros((nb, kvh, bs, hd), np.int8 if kv_int8 else stored.dtype) for _ in range(2)]
    kvw.kv_cache_write_gpu(
        emulated(stored[:, kvh : 2 * kvh]),
        emulated(stored[:, 2 * kvh :]),
        *map(emulated, pools),
        emulated(slots),
        *[emulated(s) if s is not None else None for s in scales],
    )
    want = [np.zeros((nb, kvh, bs, hd), np.int8 if kv_int8 else np.float32) for _ in range(2)]
    kvw.kv_cache_write_cpu(values[:, kvh : 2 * kvh], values[:, 2 * kvh :], *want, slots, *scales)
    for got, w in zip(pools, want):
        np.testing.assert_array_equal(got if kv_int8 else from_storage(got, dtype), w)
