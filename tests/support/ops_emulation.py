"""Run the ops/ CUDA sources (kv_cache_write, paged_attention, sample) on the CPU, for CI without a GPU.

The kernels' own code (indexing, shuffles, atomics, merges, radix searches) is compiled with g++
against tests/support/ops_emulation_shim.py (one fiber per CUDA thread on the calling thread, one
CTA at a time, real barriers for __syncthreads and masked warp shuffles, atomics on host memory,
dynamic shared memory filled with junk) and driven through the real GPU wrappers with host memory
standing in for device memory.
The round-to-nearest intrinsics are the plain IEEE operations (g++ contracts nothing into FMAs in
ISO C++ mode on x86-64); `__expf` is the exact expf (the GPU's is approximate: logprobs, not tokens).
The `emulated` fixture swaps runtime.load_kernel for that build and returns a host-array -> DeviceArray
view; tests using it skip without g++ >= 12.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from ops import kv_cache_write as kvw
from ops import paged_attention as pa
from ops import runtime, sample_cuda
from tests.support.ops_emulation_shim import EMU_SHIM

DYNAMIC_SMEM = "extern __shared__ __align__(16) unsigned char smem[];"  # sample.cu's, replaced by the CTA's


def _kernel_names(source: str, options: tuple) -> list[str]:
    """The entry points to build for `source`: every kernel of kv_cache_write / paged_attention, or
    the sample kernels of the dtype its DTYPE_ID option names (one build for the whole sequence)."""
    names = [n for mod in (kvw, pa) if mod.SOURCE == source for n in mod.KERNEL_NAMES]
    if source == sample_cuda.CUDA_SOURCE:
        dt = next(d for d in sample_cuda.SAMPLE_KERNELS if sample_cuda.compile_options(d)[0] in options)
        tables = (sample_cuda.SAMPLE_KERNELS, sample_cuda.SCAN_KERNELS, sample_cuda.SPLIT_PASS_KERNELS)
        names = [t[dt] for t in tables] + ["sample_split_zero", "sample_split_plan", "sample_split_want"]
    return names


# (source, options, entry) -> the built library: once per test process (a build is 2-10 s of g++)
_BUILT: dict[tuple, ctypes.CDLL] = {}


@functools.cache
def _build_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="ops-emulation-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _emulated_loader():
    """A stand-in for runtime.load_kernel that builds the source (minus its device prelude) on the CPU."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    built = _BUILT

    def load_kernel(source, name, options=()):
        key = (source, tuple(options))
        if key not in built:
            device_prelude = runtime.CUDA_PRELUDE[: runtime.CUDA_PRELUDE.index("#if DTYPE_ID")]
            body = source.replace(device_prelude, "")  # keep the DTYPE_ID dispatch, drop the PTX helpers
            body = body.replace(DYNAMIC_SMEM, "unsigned char* smem = emu_smem;")
            signature = "unsigned* g, unsigned b, unsigned s, void** a"
            entries = "".join(
                f'extern "C" void emu_{n}({signature}) {{ launch({n}, g, b, s, a); }}\n'
                for n in _kernel_names(source, tuple(options))
            )
            cpp = _build_dir() / f"emu{len(built)}.cpp"
            cpp.write_text(EMU_SHIM + body + entries + 'extern "C" int emu_bad_shuffles() { return bad_shuffles; }\n')
            so = cpp.with_suffix(".so")
            cmd = ["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-w", *options, str(cpp), "-o", str(so), "-lpthread"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                pytest.skip(f"host compiler cannot build the emulation: {done.stderr[-500:]}")
            built[key] = ctypes.CDLL(str(so))
        lib = built[key]

        class EmulatedKernel:
            def resident_per_sm(self, threads: int) -> int:
                return 6  # what an H200 said for the tensor-core attention at 64 threads

            def launch(self, grid, block, args, stream=0, shared_mem=0):
                params, _holders = runtime.pack_args(args, name)  # the same packing as a real launch
                g = (ctypes.c_uint * 3)(*(tuple(grid) + (1,) * (3 - len(grid))))
                smem = ctypes.c_uint(shared_mem)
                getattr(lib, f"emu_{name}")(g, ctypes.c_uint(block[0]), smem, ctypes.c_void_p(params.ctypes.data))
                assert lib.emu_bad_shuffles() == 0, "a warp shuffle named a lane outside its mask"

        return EmulatedKernel()

    return load_kernel


@pytest.fixture
def emulated(monkeypatch):
    """Kernels run through the CPU build; returns a view of a host array as a runtime.DeviceArray."""
    monkeypatch.setattr(runtime, "load_kernel", _emulated_loader())
    monkeypatch.setattr(runtime, "sm_count", lambda: 132)
    monkeypatch.setattr(sample_cuda, "_dynamic_smem_limit", lambda kernel: 227 * 1024)  # an H100's opt-in
    keep: list = []

    def scratch(nbytes: int) -> int:  # NaN-filled, so a partition the reduce should not read shows up
        keep.append(np.full(nbytes // 4 + 1, np.nan, np.float32))
        return keep[-1].ctypes.data

    monkeypatch.setattr(runtime, "scratch", scratch)
    return lambda a: runtime.DeviceArray(a.ctypes.data, a.shape, a.dtype, a.strides)


class HostDevice:
    """A GPU test's put / empty / get on host memory, for the emulated kernels (`view`: the
    `emulated` fixture's host-array -> DeviceArray)."""

    def __init__(self, view) -> None:
        self.view, self.keep = view, {}

    def put(self, a: np.ndarray) -> runtime.DeviceArray:
        host = np.ascontiguousarray(a).copy()
        dev = self.view(host)
        self.keep[dev.ptr] = host
        return dev

    def empty(self, shape, dtype) -> runtime.DeviceArray:
        return self.put(np.full(shape, -7, dtype))  # junk, not zeros: every output must be written

    def get(self, dev: runtime.DeviceArray) -> np.ndarray:
        return self.keep[dev.ptr].copy() if dev.ptr in self.keep else np.zeros(dev.shape, dev.dtype)
