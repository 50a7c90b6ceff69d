"""kv_cache_write: store the K and V of T new tokens into the paged block pool at `slot_mapping`,
optionally quantising to int8 with per-KV-head fp32 scales.

Owns the kernel's source (`SOURCE`: CUDA C in ops/kernels/kv_cache_write.cu after the dtype prelude),
its numpy twin (`kv_cache_write_cpu`: the CPU path and the test oracle) and the GPU wrapper
(`kv_cache_write_gpu`).  Layout as spmd_serve/worker/kv_cache.py: the pool of one layer is
[num_blocks, kv_heads, block_size, head_dim] for K and V separately (head-major: a KV head's rows of
a block lie together); slot = block * block_size + offset.  A negative slot means "padding token, do
not store" (vLLM's convention).
int8: q = clip(round_half_even(x / scale[head]), -127, 127), dequantised as q * scale[head].
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import runtime

KERNEL_NAMES = ("kv_cache_write",)

SOURCE = runtime.kernel_source("prelude.cuh", "kv_cache_write.cu")


def compile_options(dtype: str, kv_int8: bool = False) -> tuple[str, ...]:
    return (f"-DDTYPE_ID={runtime.DTYPE_IDS[dtype]}", f"-DKV_INT8={int(kv_int8)}")


# Every compiled variant (label -> NVRTC options); the CI compile test iterates over these.
VARIANTS = {f"{dt}{'-int8kv' if q else ''}": compile_options(dt, q) for dt in runtime.DTYPE_IDS for q in (False, True)}


def quantize_int8(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """[..., kv_heads, head_dim] floats -> int8 with per-head scales (fp32 math, as the kernel)."""
    q = np.rint(np.asarray(x, np.float32) / np.asarray(scale, np.float32)[:, None])
    return np.clip(q, -127, 127).astype(np.int8)


def count_clipped(x: np.ndarray, scale: np.ndarray) -> int:
    """How many entries of x [..., kv_heads, head_dim] `quantize_int8` clips (|rint(x / scale)| > 127)."""
    return int(
        np.count_nonzero(np.abs(np.rint(np.asarray(x, np.float32) / np.asarray(scale, np.float32)[:, None])) > 127)
    )


def slot_rows(pool: np.ndarray) -> np.ndarray:
    """A pool [NB, kv_heads, block_size, head_dim] (or some of its blocks) as its slots' rows
    [NB * block_size, kv_heads, head_dim], slot = block * block_size + offset (a copy)."""
    nb, kvh, bs, hd = pool.shape
    return pool.transpose(0, 2, 1, 3).reshape(nb * bs, kvh, hd)


def kv_cache_write_cpu(
    key: np.ndarray,
    value: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    slot_mapping: np.ndarray,
    k_scale: np.ndarray | None = None,
    v_scale: np.ndarray | None = None,
) -> tuple[int, int]:
    """numpy twin: key/value [T, kv_heads, head_dim] written in place into the pools at the slots.
    Returns how many K and V entries an int8 pool clipped to +-127 ((0, 0) for a float pool)."""
    bs = k_cache.shape[2]  # [NB, kvh, bs, hd]
    slots = np.asarray(slot_mapping).astype(np.int64)
    keep = slots >= 0
    blocks, offsets = slots[keep] // bs, slots[keep] % bs
    clipped = []
    for new, pool, scale in ((key, k_cache, k_scale), (value, v_cache, v_scale)):
        rows = np.asarray(new)[keep]  # [n, kvh, hd]; pool[blocks, :, offsets] is [n, kvh, hd] too
        pool[blocks, :, offsets] = rows if scale is None else quantize_int8(rows, scale)
        clipped.append(0 if scale is None else count_clipped(rows, scale))
    return clipped[0], clipped[1]


def int8_scale_ptrs(kv_int8: bool, k_scale: Any, v_scale: Any) -> tuple[int, int]:
    """Device pointers of an int8 pool's per-KV-head k/v scales ((0, 0) for a float pool); the GPU
    wrappers of every kernel that reads or writes the pool take its scales through this."""
    if not kv_int8:
        return 0, 0
    if k_scale is None or v_scale is None:
        raise ValueError("an int8 KV pool needs k_scale and v_scale [kv_heads] float32")
    return runtime.as_device_array(k_scale).ptr, runtime.as_device_array(v_scale).ptr


def kv_cache_write_gpu(
    key: Any,
    value: Any,
    k_cache: Any,
    v_cache: Any,
    slot_mapping: Any,
    k_scale: Any = None,
    v_scale: Any = None,
    *,
    stream: Any = 0,
) -> None:
    """The kernel on device arrays (cupy arrays, Paddle GPU tensors or runtime.DeviceArray), in the
    twin's argument order; runs asynchronously on `stream`."""
    k, v, kc, vc, sm = (runtime.as_device_array(a) for a in (key, value, k_cache, v_cache, slot_mapping))
    nb, kvh, bs, hd = kc.shape
    t = k.shape[0]
    dtype = runtime.dtype_name(k.dtype)
    kv_int8 = kc.dtype == np.int8
    ks, vs = int8_scale_ptrs(kv_int8, k_scale, v_scale)
    if not kv_int8 and kc.dtype != k.dtype:
        raise TypeError(f"KV pool dtype {kc.dtype} does not match key dtype {k.dtype}")
    if hd % 8 or k.shape[1:] != (kvh, hd) or v.shape != k.shape or vc.shape != kc.shape or sm.shape != (t,):
        raise ValueError(
            f"bad shapes: key {k.shape} value {v.shape} pools {kc.shape}/{vc.shape} "
            f"slots {sm.shape} (head_dim must be a multiple of 8)"
        )
    if sm.dtype != np.int32:
        raise TypeError("slot_mapping must be int32")
    item = k.dtype.itemsize
    strides = []
    for a in (k, v):  # rows may be strided, but each row's (kv_heads, head_dim) must be dense
        if a.strides is not None and a.strides[1:] != (hd * item, item):
            raise ValueError("key/value must be dense within a token row")
        strides.append((a.strides[0] // item) if a.strides is not None else kvh * hd)
    if any(a.ptr % 16 for a in (k, v, kc, vc)) or strides[0] % 8 or strides[1] % 8:
        raise ValueError("key/value/pools must be 16-byte aligned, row strides multiples of 8 (vector access)")
    if t == 0:
        return
    kernel = runtime.load_kernel(SOURCE, "kv_cache_write", compile_options(dtype, kv_int8))
    total = t * kvh * (hd // 8)
    grid = (min((total + 255) // 256, 65535),)
    kernel.launch(
        grid,
        (256,),
        [
            k.ptr,
            v.ptr,
            kc.ptr,
            vc.ptr,
            sm.ptr,
            ks,
            vs,
            np.int32(t),
            np.int32(kvh),
            np.int32(bs),
            np.int32(hd),
            np.int64(strides[0]),
            np.int64(strides[1]),
        ],
        stream=stream,
    )


def kv_cache_write(key: Any, *args: Any, **kwargs: Any) -> tuple[int, int] | None:
    """Dispatch: numpy inputs take the CPU twin, device arrays the CUDA kernel."""
    if isinstance(key, np.ndarray):
        return kv_cache_write_cpu(key, *args, **kwargs)
    kv_cache_write_gpu(key, *args, **kwargs)
    return None
