"""How `python -m ops.bench` times a kernel: device time from CUDA events around calls queued
behind a spin kernel (Python's launch cost reported apart), device buffers freed together, and
the copy bandwidth every row is compared with."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import runtime


@dataclass
class Result:
    name: str
    shape: str
    seconds: float
    nbytes: int  # bytes the kernel has to read + write at minimum
    host_seconds: float  # Python's cost of one call (launch, argument packing)
    note: str = ""  # e.g. a variant's registers and spills


class Buffers:
    """Device allocations of one benchmark, freed together."""

    def __init__(self) -> None:
        self.ptrs: list[int] = []

    def upload(self, host: np.ndarray) -> runtime.DeviceArray:
        host = np.ascontiguousarray(host)
        ptr = runtime.device_alloc(host.nbytes)
        self.ptrs.append(ptr)
        runtime._check(runtime.driver.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
        return runtime.DeviceArray(ptr, host.shape, host.dtype)

    def empty(self, shape: tuple[int, ...], dtype: type) -> runtime.DeviceArray:
        dt: np.dtype[Any] = np.dtype(dtype)
        ptr = runtime.device_alloc(int(np.prod(shape)) * dt.itemsize)
        self.ptrs.append(ptr)
        return runtime.DeviceArray(ptr, tuple(shape), dt)

    def free(self) -> None:
        runtime._check(runtime.driver.cuCtxSynchronize(), "cuCtxSynchronize")
        for p in self.ptrs:
            runtime.device_free(p)
        self.ptrs.clear()


# A one-thread kernel that holds stream 0 busy while the timed calls are queued behind it, so the
# events measure the kernels back to back, not Python's launch cost (which is reported apart).
_SPIN = (
    'extern "C" __global__ void spin_wait(long long cycles) '
    "{ const long long t0 = clock64(); while (clock64() - t0 < cycles) {} }"
)


def spin(seconds: float) -> None:
    """Hold stream 0 busy for about `seconds` (calls queued meanwhile then run back to back)."""
    cycles = int(runtime.device_attribute("CLOCK_RATE") * 1e3 * seconds)
    runtime.load_kernel(_SPIN, "spin_wait").launch((1,), (1,), [np.int64(cycles)])


def event() -> Any:
    """A CUDA event with timing (cuEventDestroy it after use)."""
    return runtime._check(runtime.driver.cuEventCreate(0), "cuEventCreate")


def time_per_call(fn: Callable[[], object], iters: int = 20, warmup: int = 3) -> tuple[float, float]:
    """(device, host) mean seconds per call: device from CUDA events around `iters` back-to-back
    calls on stream 0 queued behind a spin kernel (so host launch overhead is hidden), host from
    the wall clock of the warm-up calls."""
    drv, chk = runtime.driver, runtime._check
    for _ in range(warmup):
        fn()
    chk(drv.cuCtxSynchronize(), "cuCtxSynchronize")
    t0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    host = (time.perf_counter() - t0) / warmup  # launch cost (the GPU may overlap it)
    chk(drv.cuCtxSynchronize(), "cuCtxSynchronize")
    spin_s = 0.005 + 3 * iters * host  # long enough to queue every timed call behind it
    start, end = event(), event()
    spin(spin_s)
    chk(drv.cuEventRecord(start, drv.CUstream(0)), "cuEventRecord")
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    queued = time.perf_counter() - t0
    chk(drv.cuEventRecord(end, drv.CUstream(0)), "cuEventRecord")
    chk(drv.cuEventSynchronize(end), "cuEventSynchronize")
    ms = chk(drv.cuEventElapsedTime(start, end), "cuEventElapsedTime")
    for e in (start, end):
        drv.cuEventDestroy(e)
    if queued > spin_s:  # the spin ended before all calls were queued
        print(f"warning: queueing took {queued * 1e3:.1f} ms, longer than the spin: host time in", file=sys.stderr)
    return ms / 1e3 / iters, host


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted)."""
    bufs = Buffers()
    src, dst = bufs.empty((nbytes,), np.uint8), bufs.empty((nbytes,), np.uint8)
    sec, _ = time_per_call(lambda: runtime._check(runtime.driver.cuMemcpyDtoD(dst.ptr, src.ptr, nbytes), "DtoD"))
    bufs.free()
    return 2 * nbytes / sec
