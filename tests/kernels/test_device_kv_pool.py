"""The GPU runner's device KV pool (worker/device_kv.py) without a GPU: its pointers and stream reach the
ops/ kernels, run on their CPU emulation (tests/support/ops_emulation.py) with host memory standing in
for device memory, and the pool ends up holding exactly what the CPU runner's pool (worker/kv_cache.py,
the numpy twins) holds after the same steps; decode attention over it equals the twin's.

This proves the plumbing (which pointer per layer, slots, scales, stream, workspace) without a GPU;
the `gpu`-marked test runs the same steps in real device memory on a real non-default stream."""

from __future__ import annotations

import numpy as np
import pytest

from ops import device as ops_device
from ops import paged_attention as pa
from ops import runtime
from spmd_serve.kv_layout import KVLayout
from spmd_serve.worker.device_kv import DeviceKVPool
from spmd_serve.worker.kv_cache import KVCachePool
from tests.support.ops_emulation import emulated  # noqa: F401  (pytest fixture, used by name)
from tests.support.ops_helpers import device, needs_gpu, tmp_kernel_cache  # noqa: F401  (pytest fixtures)

LAYERS, NB, BS, KVH, HD, QH = 2, 6, 4, 2, 32, 4


class HostMemory:
    """`DeviceMemory` over host arrays (kept alive here), seen by the kernels as runtime.DeviceArrays."""

    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []

    def view(self, a: np.ndarray) -> runtime.DeviceArray:
        self.arrays.append(a)
        return runtime.DeviceArray(a.ctypes.data, a.shape, a.dtype, a.strides)

    def zeros(self, shape, dtype):
        return self.view(np.zeros(shape, dtype))

    def upload(self, host):
        return self.view(np.array(host, copy=True))

    def host(self, d: runtime.DeviceArray) -> np.ndarray:
        return next(a for a in self.arrays if a.ctypes.data == d.ptr)


class PaddleLikeStream:
    """What Paddle's stream objects expose: the CUDA stream protocol."""

    def __cuda_stream__(self):
        return (0, 0x5EED)


@pytest.fixture
def launches(emulated, monkeypatch):  # noqa: F811  (the fixture imported above)
    """Every kernel launch's (name, raw stream handle), through the emulated loader."""
    seen: list[tuple[str, int]] = []
    load = runtime.load_kernel

    def recording(source, name, options=()):
        kernel = load(source, name, options)

        class Recorded:
            def launch(self, grid, block, args, stream=0, shared_mem=0):
                seen.append((name, runtime.stream_handle(stream)))
                kernel.launch(grid, block, args, stream, shared_mem)

        return Recorded()

    monkeypatch.setattr(runtime, "load_kernel", recording)
    return seen


class GpuMemory:
    """`DeviceMemory` over real device allocations (tests/support/ops_helpers.Device)."""

    def __init__(self, device) -> None:
        self.device = device

    def view(self, a: np.ndarray):
        return self.device.put(a)

    def zeros(self, shape, dtype):
        return self.device.put(np.zeros(shape, dtype))

    def upload(self, host):
        return self.device.put(host)

    def host(self, d) -> np.ndarray:
        return self.device.get(d)


class CudaStream:
    """A real non-default CUDA stream, seen through the stream protocol as Paddle's are."""

    def __init__(self) -> None:
        ops_device._current_context()  # the stream belongs to the context the allocations use
        self.handle = runtime._check(runtime.driver.cuStreamCreate(1), "cuStreamCreate")  # non-blocking

    def __cuda_stream__(self):
        return (0, int(self.handle))

    def close(self) -> None:
        runtime._check(runtime.driver.cuStreamSynchronize(self.handle), "cuStreamSynchronize")
        runtime._check(runtime.driver.cuStreamDestroy(self.handle), "cuStreamDestroy")


def check_pool_against_cpu(mem, stream, int8: bool) -> None:
    """Two steps written through DeviceKVPool on `mem` / `stream` leave the pool holding what
    KVCachePool holds after the same steps; decode attention over it equals the twin's."""
    rng = np.random.default_rng(3)
    layout = KVLayout.kv_heads(LAYERS, KVH, HD)
    scales = None
    if int8:
        scales = {t: [rng.uniform(0.02, 0.05, KVH).astype(np.float32) for _ in range(LAYERS)] for t in ("k", "v")}
    dev = DeviceKVPool(layout, NB, BS, mem, scales)
    cpu = KVCachePool(layout, NB, BS, scales)
    # two steps: a prefill of 6 tokens (one padding slot) into blocks 2-3, then a decode of 2 sequences
    for slots in (np.array([8, 9, 10, 11, -1, 12], np.int32), np.array([13, 1], np.int32)):
        for layer in range(LAYERS):
            k, v = (rng.standard_normal((len(slots), KVH, HD)).astype(np.float32) for _ in range(2))
            dev.write(layer, mem.view(k), mem.view(v), mem.view(slots), stream)
            cpu.write(layer, slots, k, v)
    for layer in range(LAYERS):  # each layer's pointer got its own entries, bit for bit
        np.testing.assert_array_equal(mem.host(dev.k[layer]), cpu.k[layer])
        np.testing.assert_array_equal(mem.host(dev.v[layer]), cpu.v[layer])
    assert dev.nbytes == cpu.nbytes and dev.int8 == cpu.int8 == int8

    q = rng.standard_normal((2, QH, HD)).astype(np.float32)
    tables = np.array([[2, 3, 0], [0, 1, 0]], np.int32)
    lens = np.array([6, 2], np.int32)
    scale_args = (cpu.scales["k"][1], cpu.scales["v"][1]) if int8 else ()
    want = pa.paged_attention_cpu(q, cpu.k[1], cpu.v[1], tables, lens, *scale_args)
    for parts in (0, 1):  # single pass, and split-K with the rank's own workspace
        out = mem.view(np.zeros_like(q))
        ws = np.zeros(pa.workspace_bytes(2, QH, HD, 3) // 4, np.float32)
        dev.attend(
            1,
            mem.view(q),
            mem.view(tables),
            mem.view(lens),
            out,
            stream,
            max_context_len=3 * BS,
            workspace=mem.view(ws) if parts else None,
            partition_blocks=parts,
        )
        np.testing.assert_allclose(mem.host(out), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("int8", [False, True])
def test_device_pool_equals_cpu_pool_and_attention_equals_twin(launches, int8):
    check_pool_against_cpu(HostMemory(), PaddleLikeStream(), int8)
    assert launches and {h for _, h in launches} == {0x5EED}  # every launch on the predictors' stream
    assert {n for n, _ in launches} == {
        "kv_cache_write",
        "paged_attention",
        "paged_attention_split",
        "paged_attention_reduce",
    }


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("int8", [False, True])
def test_device_pool_on_a_gpu_equals_cpu_pool(device, int8):  # noqa: F811  (the fixture imported above)
    """The same steps in real device memory on a real non-default stream."""
    stream = CudaStream()
    try:
        check_pool_against_cpu(GpuMemory(device), stream, int8)
    finally:
        stream.close()


def test_device_pool_refuses_the_mla_layout():
    from spmd_serve.config import ConfigError

    with pytest.raises(ConfigError, match="kv_heads layout only"):
        DeviceKVPool(KVLayout.mla_latent(2, 64, 16), NB, BS, HostMemory())
