"""The CUDA device as the driver API sees it: the cuda-python bindings, driver error checking, GPU
detection, the current context, device attributes and raw device memory (allocations and the
per-context scratch buffer).

Imports only cuda-python (`cuda.bindings`).  Without an NVIDIA driver `cuInit` raises
(cuda-python cannot load libcuda) instead of returning an error code: `gpu_available()` turns that
into False so callers pick the numpy path; every other call here then raises a clear RuntimeError.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

try:
    from cuda.bindings import driver, nvrtc
except ImportError:  # the numpy CPU path works without cuda-python
    driver = nvrtc = None


class CudaError(RuntimeError):
    """A CUDA driver call that returned an error code."""


def _check(result: tuple, what: str) -> Any:
    """Unpack a cuda-python `(err, *values)` tuple, raising CudaError on a non-success code."""
    err, *values = result
    if int(err) != 0:
        name = driver.cuGetErrorName(err)[1] if isinstance(err, driver.CUresult) else b"?"
        raise CudaError(f"{what} failed: {err!r} ({name.decode() if isinstance(name, bytes) else name})")
    return values[0] if len(values) == 1 else (tuple(values) if values else None)


# ----------------------------------------------------------------------------- device detection
@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """True when a CUDA driver is present and sees at least one device; never raises (cached)."""
    try:
        if driver is None:
            return False
        (err,) = driver.cuInit(0)
        if int(err) != 0:
            return False
        err, count = driver.cuDeviceGetCount()
        return int(err) == 0 and count > 0
    except Exception:  # no libcuda: cuda-python raises while loading it, not an error code
        return False


_ctx_lock = threading.Lock()


def _current_context() -> Any:
    """The calling thread's CUDA context; if none is current (no framework made one), device 0's
    primary context is retained and made current, which is the context Paddle/cupy share too."""
    if not gpu_available():
        raise RuntimeError("no CUDA GPU available (cuInit failed or no device); use the CPU path")
    ctx = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(ctx) == 0:
        with _ctx_lock:
            dev = _check(driver.cuDeviceGet(0), "cuDeviceGet")
            ctx = _check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


@functools.cache
def _attr(name: str, device: int) -> int:
    attr = getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return int(_check(driver.cuDeviceGetAttribute(attr, device), f"cuDeviceGetAttribute({name})"))


def device_attribute(name: str) -> int:
    """A CU_DEVICE_ATTRIBUTE_<name> of the current context's device (cached; requires a GPU)."""
    _current_context()
    return _attr(name, int(_check(driver.cuCtxGetDevice(), "cuCtxGetDevice")))


def device_arch() -> str:
    """`sm_XY` of the current device."""
    return f"sm_{device_attribute('COMPUTE_CAPABILITY_MAJOR')}{device_attribute('COMPUTE_CAPABILITY_MINOR')}"


def sm_count() -> int:
    """Streaming multiprocessors of the current device (launch heuristics)."""
    return device_attribute("MULTIPROCESSOR_COUNT")


# ----------------------------------------------------------------------------- device memory
def device_alloc(nbytes: int) -> int:
    """cuMemAlloc (for scratch space and tests); free with device_free."""
    _current_context()
    return int(_check(driver.cuMemAlloc(max(int(nbytes), 1)), "cuMemAlloc"))


def device_free(ptr: int) -> None:
    _check(driver.cuMemFree(ptr), "cuMemFree")


_scratch: dict[int, tuple[int, int]] = {}  # context -> (ptr, nbytes)


def scratch(nbytes: int) -> int:
    """A grow-only per-context scratch buffer (split-K workspaces).  Reused by every call, so it is
    only safe while its users run on one stream; pass an explicit workspace otherwise."""
    ctx = int(_current_context())
    ptr, size = _scratch.get(ctx, (0, 0))
    if size < nbytes:
        if ptr:
            _check(driver.cuCtxSynchronize(), "cuCtxSynchronize")  # a queued kernel may still use it
            device_free(ptr)
        ptr, size = device_alloc(nbytes), nbytes
        _scratch[ctx] = (ptr, size)
    return ptr
