"""Kernel runtime: the one module the kernel wrappers talk to.  Owns kernel element types (dtype
ids, the CUDA prelude that defines `dtype_t`, bf16 conversions), device-array views of framework
tensors, and loading and launching compiled kernels on raw device pointers; re-exports the device
(ops/device.py) and NVRTC (ops/nvrtc.py) layers, so `runtime.X` reaches everything.

The kernel modules (ops/kv_cache_write.py, ops/paged_attention.py, ops/sample*.py) only hold
numpy twins and thin wrappers; their CUDA C lives in ops/kernels/.  Imports only numpy and
cuda-python (`cuda.bindings`), never spmd_serve or Paddle.  Wrappers call `runtime.load_kernel`,
`runtime.scratch` and `runtime.sm_count` through this module, so tests can patch them here.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .device import (
    CudaError,
    _check,
    _current_context,
    device_alloc,
    device_arch,
    device_attribute,
    device_free,
    driver,
    gpu_available,
    nvrtc,
    scratch,
    sm_count,
)
from .nvrtc import KERNEL_DIR, NvrtcError, cache_dir, compile_cubin, include_dirs, kernel_source, nvrtc_version

__all__ = [
    "CUDA_PRELUDE",
    "DTYPE_IDS",
    "KERNEL_DIR",
    "CudaError",
    "DeviceArray",
    "Kernel",
    "NvrtcError",
    "as_device_array",
    "bf16_to_float32",
    "cache_dir",
    "compile_cubin",
    "device_alloc",
    "device_arch",
    "device_attribute",
    "device_free",
    "driver",
    "dtype_name",
    "float32_to_bf16",
    "gpu_available",
    "include_dirs",
    "kernel_source",
    "load_kernel",
    "nvrtc",
    "nvrtc_version",
    "pack_args",
    "scratch",
    "workspace_ptr",
    "sm_count",
    "stream_handle",
]

# ----------------------------------------------------------------------------- dtypes
# Kernels take their element type as -DDTYPE_ID=<n>.  16-bit types are stored as unsigned short and
# converted with the PTX `cvt` instructions that cuda_fp16.h / cuda_bf16.h wrap (ops/kernels/
# prelude.cuh), so the ops kernels compile even where the CUDA headers are not installed (only the
# nvrtc wheel).  bf16 needs sm_80+.
DTYPE_IDS = {"fp32": 0, "fp16": 1, "bf16": 2}
CUDA_PRELUDE = kernel_source("prelude.cuh")


def dtype_name(dtype: Any) -> str:
    """The kernel dtype name (fp32 / fp16 / bf16) of a numpy dtype; uint16 means bfloat16 bits (numpy
    and cupy have no bfloat16, and as_device_array maps Paddle's bfloat16 to uint16)."""
    names = {"float32": "fp32", "float16": "fp16", "uint16": "bf16"}
    try:
        return names[np.dtype(dtype).name]
    except KeyError:
        raise TypeError(f"unsupported dtype {dtype}; expected float32, float16 or uint16 (bf16 bits)") from None


def float32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 bits (uint16), round-to-nearest-even like cvt.rn.bf16.f32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ----------------------------------------------------------------------------- device arrays
@dataclass(frozen=True)
class DeviceArray:
    """A raw device buffer described like numpy: what the GPU wrappers accept besides objects with
    `__cuda_array_interface__` (cupy) and Paddle GPU tensors.  `strides` in bytes (None = C order)."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    strides: tuple[int, ...] | None = None


def as_device_array(x: Any) -> DeviceArray:
    """View a cupy array / __cuda_array_interface__ object / Paddle GPU tensor / DeviceArray."""
    if isinstance(x, DeviceArray):
        return x
    bf16 = "bfloat16" in str(getattr(x, "dtype", ""))  # numpy/cupy have no bf16: its bits go as uint16
    if hasattr(x, "__cuda_array_interface__"):
        cai = x.__cuda_array_interface__
        return DeviceArray(
            int(cai["data"][0]),
            tuple(cai["shape"]),
            np.dtype(np.uint16 if bf16 else cai["typestr"]),
            tuple(cai["strides"]) if cai.get("strides") else None,
        )
    if hasattr(x, "data_ptr") and hasattr(x, "shape"):  # Paddle tensor (assumed contiguous)
        dtype = np.dtype(np.uint16 if bf16 else str(x.dtype).split(".")[-1])
        return DeviceArray(int(x.data_ptr()), tuple(x.shape), dtype)
    raise TypeError(f"not a device array: {type(x).__name__}")


# ----------------------------------------------------------------------------- loading / launching
def workspace_ptr(workspace: Any, need: int) -> int:
    """A kernel's scratch: the caller's `workspace` (ValueError when under `need` bytes), or the
    per-process scratch buffer (safe only while all calls run on one stream)."""
    if workspace is None:
        return scratch(need)
    wa = as_device_array(workspace)
    if int(np.prod(wa.shape)) * wa.dtype.itemsize < need:
        raise ValueError(f"workspace too small: {need} bytes needed (workspace_bytes)")
    return wa.ptr


def stream_handle(stream: Any) -> int:
    """Raw CUstream from an int, a cuda-python CUstream, anything with the CUDA stream protocol
    `__cuda_stream__` (Paddle, cuda.core), a cupy stream (`.ptr`) or a Paddle StreamBase."""
    if stream is None:
        return 0
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    for attr in ("ptr", "cuda_stream", "raw_stream"):
        if isinstance(getattr(stream, attr, None), int):
            return getattr(stream, attr)
    if hasattr(stream, "stream_base"):
        return stream_handle(stream.stream_base)
    return int(stream)


class Kernel:
    """A loaded `extern "C"` kernel; `launch` takes raw device pointers (Python int) and numpy
    scalars (whose dtype fixes the C type: np.int32 -> int, np.float32 -> float, ...)."""

    def __init__(self, function: Any, name: str) -> None:
        self.function, self.name = function, name
        self._resident: dict[int, int] = {}  # resident_per_sm's answers by CTA size

    def resources(self) -> tuple[int, int]:
        """(registers per thread, local-memory bytes per thread: > 0 means spills), for tuning."""
        attr = driver.CUfunction_attribute
        regs = _check(driver.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, self.function), "cuFuncGetAttribute")
        local = _check(
            driver.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, self.function), "cuFuncGetAttribute"
        )
        return int(regs), int(local)

    def resident_per_sm(self, threads: int) -> int:
        """CTAs of `threads` threads (no dynamic shared memory) one multiprocessor holds at once
        (the driver's occupancy calculator; asked once per kernel and CTA size)."""
        if threads not in self._resident:
            n = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.function, int(threads), 0)
            self._resident[threads] = int(_check(n, "cuOccupancyMaxActiveBlocksPerMultiprocessor"))
        return self._resident[threads]

    def launch(self, grid: tuple, block: tuple, args: Sequence[Any], stream: Any = 0, shared_mem: int = 0) -> None:
        params, _holders = pack_args(args, self.name)  # _holders keeps the values alive until the launch
        g = tuple(int(x) for x in grid) + (1,) * (3 - len(grid))
        b = tuple(int(x) for x in block) + (1,) * (3 - len(block))
        _check(
            driver.cuLaunchKernel(
                self.function, *g, *b, int(shared_mem), driver.CUstream(stream_handle(stream)), params.ctypes.data, 0
            ),
            f"cuLaunchKernel({self.name}, grid={g}, block={b})",
        )


# numpy scalar type -> struct code of its C type in one 8-byte slot (kernel parameters are at most
# 8 bytes here; cuLaunchKernel reads each through its own pointer, so a slot's padding is unused)
_SLOT_CODES = {
    np.int8: "b7x",
    np.uint8: "B7x",
    np.int16: "h6x",
    np.uint16: "H6x",
    np.int32: "i4x",
    np.uint32: "I4x",
    np.int64: "q",
    np.uint64: "Q",
    np.float32: "f4x",
    np.float64: "d",
}


def pack_args(args: Sequence[Any], name: str = "kernel") -> tuple[np.ndarray, list[np.ndarray]]:
    """The `void* kernelParams[]` array: one pointer per argument to a copy of its value.  Python ints
    are device pointers (8 bytes); numpy scalars keep their C type (np.int32 -> int, ...).  The values
    go into one buffer by one struct.pack (a numpy array and a ctypes lookup per argument cost
    ~3 us each: most of a sampling step's host time, RESULTS.md)."""
    codes, values = [], []
    for i, a in enumerate(args):
        kind = type(a)
        if kind is int:
            codes.append("Q")
            values.append(a)
        elif kind in _SLOT_CODES:
            codes.append(_SLOT_CODES[kind])
            values.append(a.item())
        elif driver is not None and isinstance(a, driver.CUdeviceptr):
            codes.append("Q")
            values.append(int(a))
        else:
            raise TypeError(
                f"{name}: argument {i} is {kind.__name__}; pass a device pointer (int) "
                f"or a numpy scalar such as np.int32(x) / np.float32(x)"
            )
    try:
        slots = np.frombuffer(bytearray(struct.pack("<" + "".join(codes), *values)), np.uint64)  # [n] values
    except struct.error as e:  # a pointer beyond 64 bits, or negative
        raise TypeError(f"{name}: {e}") from None
    params = slots.ctypes.data + 8 * np.arange(len(codes), dtype=np.uint64)  # [n] pointers into `slots`
    return params, [slots]


_modules: dict[tuple, Any] = {}
_kernels: dict[tuple, Kernel] = {}
_load_lock = threading.Lock()


def load_kernel(source: str, name: str, options: tuple[str, ...] = ()) -> Kernel:
    """Compile `source` for the current device, load it into the current context and return the
    kernel `name`.  Cached per process and context, keyed by the source string itself (Python caches
    a str's hash, so the per-launch lookup stays cheap on the decode path)."""
    ctx = int(_current_context())
    mkey = (source, tuple(options), ctx)
    kernel = _kernels.get((mkey, name))
    if kernel is not None:
        return kernel
    with _load_lock:
        if mkey not in _modules:
            cubin = compile_cubin(source, name, device_arch(), tuple(options))
            _modules[mkey] = _check(driver.cuModuleLoadData(cubin), f"cuModuleLoadData({name})")
        func = _check(driver.cuModuleGetFunction(_modules[mkey], name.encode()), f"cuModuleGetFunction({name})")
        kernel = _kernels[(mkey, name)] = Kernel(func, name)
        return kernel
