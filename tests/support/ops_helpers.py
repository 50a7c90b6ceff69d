"""Shared pieces of the ops kernel tests (tests/kernels/test_ops_*.py): a fresh kernel cache per test module,
the GPU skip mark, host <-> device buffers for GPU tests, kernel storage dtypes, and the NVRTC
compile check every kernel module gets.  Test modules import the fixtures they use by name.
"""

from __future__ import annotations

import numpy as np
import pytest

from ops import runtime

needs_gpu = pytest.mark.skipif(not runtime.gpu_available(), reason="needs an NVIDIA GPU")
ARCHS = ("sm_80", "sm_90")  # every kernel variant compiles for both in CI (NVRTC needs no GPU)


@pytest.fixture(scope="module", autouse=True)
def tmp_kernel_cache(tmp_path_factory):
    """Compile into a fresh cache, not the user's (autouse in every module that imports it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPMD_OPS_CACHE", str(tmp_path_factory.mktemp("ops-cache")))
        yield


def assert_compiles(mod, label: str, arch: str) -> None:
    """Variant `label` of a kernel module (SOURCE, KERNEL_NAMES, VARIANTS) compiles to one cubin
    holding all of the source's kernels."""
    cubin = runtime.compile_cubin(mod.SOURCE, mod.KERNEL_NAMES[0], arch, mod.VARIANTS[label])
    assert cubin
    for name in mod.KERNEL_NAMES:
        assert name.encode() in cubin


def to_storage(x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(array in the kernel's storage dtype, the float32 values it holds) — bf16 as uint16 bits."""
    if dtype == "bf16":
        bits = runtime.float32_to_bf16(x)
        return bits, runtime.bf16_to_float32(bits)
    stored = x.astype(np.float32 if dtype == "fp32" else np.float16)
    return stored, stored.astype(np.float32)


def from_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    return runtime.bf16_to_float32(x) if dtype == "bf16" else x.astype(np.float32)


class Device:
    """Host <-> device copies: raw cuda.bindings allocations (runtime.DeviceArray), or cupy arrays
    when `use_cupy` and cupy imports (the wrappers also take `__cuda_array_interface__` objects)."""

    def __init__(self, use_cupy: bool = False) -> None:
        self.cupy, self.ptrs = None, []
        if use_cupy:
            try:
                import cupy
            except ImportError:
                cupy = None
            self.cupy = cupy

    def put(self, host: np.ndarray):
        host = np.ascontiguousarray(host)
        if self.cupy is not None:
            return self.cupy.asarray(host)
        ptr = runtime.device_alloc(host.nbytes)  # at least one byte, so empty arrays work too
        self.ptrs.append(ptr)
        if host.nbytes:
            runtime._check(runtime.driver.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes), "HtoD")
        return runtime.DeviceArray(ptr, host.shape, host.dtype)

    def empty(self, shape, dtype):
        return self.put(np.zeros(shape, dtype))

    def get(self, dev) -> np.ndarray:
        runtime._check(runtime.driver.cuCtxSynchronize(), "sync")
        if self.cupy is not None:
            return self.cupy.asnumpy(dev)
        host = np.empty(dev.shape, dev.dtype)
        if host.nbytes:
            runtime._check(runtime.driver.cuMemcpyDtoH(host.ctypes.data, dev.ptr, host.nbytes), "DtoH")
        return host

    def free(self) -> None:
        runtime._check(runtime.driver.cuCtxSynchronize(), "sync")
        for p in self.ptrs:
            runtime.device_free(p)


@pytest.fixture
def device():
    """Raw device buffers (runtime.DeviceArray, `.ptr` usable), freed after the test."""
    d = Device()
    yield d
    d.free()


@pytest.fixture
def cupy_device():
    """cupy arrays when cupy is installed, else raw device buffers."""
    d = Device(use_cupy=True)
    yield d
    d.free()
