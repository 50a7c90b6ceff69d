"""Run the kv_cache_write / paged_attention CUDA sources on the CPU, for CI without a GPU.

The kernels' own code (indexing, shuffles, merges) is compiled with g++ against the shim below (one
std::thread per CUDA thread, one CTA at a time, real barriers for __syncthreads and masked warp
shuffles) and driven through the real GPU wrappers with host memory standing in for device memory.
The `emulated` fixture swaps runtime.load_kernel for that build and returns a host-array -> DeviceArray
view; tests using it skip without g++ >= 12.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from ops import kv_cache_write as kvw
from ops import paged_attention as pa
from ops import runtime

# The CUDA built-ins the kernels use, for g++: host threads stand in for CUDA threads.
EMU_SHIM = r"""
#include <algorithm>
#include <barrier>
#include <condition_variable>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>
using std::min; using std::max;
struct uint4 { unsigned x, y, z, w; }; struct uint2 { unsigned x, y; };
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
struct dim3 { unsigned x = 1, y = 1, z = 1; };
thread_local dim3 threadIdx, blockIdx;
dim3 gridDim, blockDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static std::barrier<>* cta_barrier;
inline void __syncthreads() { cta_barrier->arrive_and_wait(); }
static std::mutex mu; static std::condition_variable cv;
// (warp, mask) -> (arrived, generation)
static std::map<std::pair<unsigned, unsigned>, std::pair<int, int>> lane_barriers;
static float lanes[64][32];
static int bad_shuffles = 0;
static void lane_barrier(unsigned warp, unsigned mask) {
    std::unique_lock<std::mutex> lk(mu);
    auto& b = lane_barriers[{warp, mask}]; const int gen = b.second;
    if (++b.first == __builtin_popcount(mask)) { b.first = 0; b.second++; cv.notify_all(); }
    else cv.wait(lk, [&] { return b.second != gen; });
}
inline float __shfl_xor_sync(unsigned mask, float v, int off) {
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (!(mask >> lane & 1u) || !(mask >> (lane ^ off) & 1u)) { std::lock_guard<std::mutex> l(mu); bad_shuffles++; }
    lanes[warp][lane] = v; lane_barrier(warp, mask);
    const float r = lanes[warp][lane ^ off]; lane_barrier(warp, mask);
    return r;
}
template <typename... A, size_t... I> void invoke(void (*f)(A...), void** a, std::index_sequence<I...>) {
    f(*static_cast<std::remove_reference_t<A>*>(a[I])...);
}
template <typename... A> void launch(void (*f)(A...), unsigned* g, unsigned bx, void** a) {
    gridDim = {g[0], g[1], g[2]}; blockDim = {bx, 1, 1};
    for (unsigned z = 0; z < g[2]; ++z) for (unsigned y = 0; y < g[1]; ++y) for (unsigned x = 0; x < g[0]; ++x) {
        std::barrier<> bar(bx); cta_barrier = &bar;
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < bx; ++t)
            ts.emplace_back([=] {
                threadIdx = {t, 0, 0}; blockIdx = {x, y, z};
                invoke(f, a, std::index_sequence_for<A...>{});
            });
        for (auto& th : ts) th.join();
    }
}
typedef unsigned short u16;
inline float fp16_to_float(u16 h) { _Float16 f; std::memcpy(&f, &h, 2); return (float)f; }
inline u16 float_to_fp16(float x) { _Float16 f = (_Float16)x; u16 h; std::memcpy(&h, &f, 2); return h; }
inline float bf16_to_float(u16 b) { return __uint_as_float(((unsigned)b) << 16); }
inline u16 float_to_bf16(float f) {
    unsigned u; std::memcpy(&u, &f, 4); return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
"""


def _emulated_loader(tmp_path):
    """A stand-in for runtime.load_kernel that builds the source (minus its device prelude) on the CPU."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    built: dict = {}

    def load_kernel(source, name, options=()):
        key = (source, tuple(options))
        if key not in built:
            device_prelude = runtime.CUDA_PRELUDE[: runtime.CUDA_PRELUDE.index("#if DTYPE_ID")]
            body = source.replace(device_prelude, "")  # keep the DTYPE_ID dispatch, drop the PTX helpers
            names = [n for mod in (kvw, pa) if mod.SOURCE == source for n in mod.KERNEL_NAMES]
            entries = "".join(
                f'extern "C" void emu_{n}(unsigned* g, unsigned b, void** a) {{ launch({n}, g, b, a); }}\n'
                for n in names
            )
            cpp = tmp_path / f"emu{len(built)}.cpp"
            cpp.write_text(EMU_SHIM + body + entries + 'extern "C" int emu_bad_shuffles() { return bad_shuffles; }\n')
            so = cpp.with_suffix(".so")
            cmd = ["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-w", *options, str(cpp), "-o", str(so), "-lpthread"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                pytest.skip(f"host compiler cannot build the emulation: {done.stderr[-500:]}")
            built[key] = ctypes.CDLL(str(so))
        lib = built[key]

        class EmulatedKernel:
            def launch(self, grid, block, args, stream=0, shared_mem=0):
                params, _holders = runtime.pack_args(args, name)  # the same packing as a real launch
                g = (ctypes.c_uint * 3)(*(tuple(grid) + (1,) * (3 - len(grid))))
                getattr(lib, f"emu_{name}")(g, ctypes.c_uint(block[0]), ctypes.c_void_p(params.ctypes.data))
                assert lib.emu_bad_shuffles() == 0, "a warp shuffle named a lane outside its mask"

        return EmulatedKernel()

    return load_kernel


@pytest.fixture
def emulated(tmp_path, monkeypatch):
    """Kernels run through the CPU build; returns a view of a host array as a runtime.DeviceArray."""
    monkeypatch.setattr(runtime, "load_kernel", _emulated_loader(tmp_path))
    monkeypatch.setattr(runtime, "sm_count", lambda: 132)
    keep: list = []

    def scratch(nbytes: int) -> int:  # NaN-filled, so a partition the reduce should not read shows up
        keep.append(np.full(nbytes // 4 + 1, np.nan, np.float32))
        return keep[-1].ctypes.data

    monkeypatch.setattr(runtime, "scratch", scratch)
    return lambda a: runtime.DeviceArray(a.ctypes.data, a.shape, a.dtype, a.strides)
