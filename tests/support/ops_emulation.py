"""Run the ops/ CUDA sources (kv_cache_write, paged_attention, sample) on the CPU, for CI without a GPU.

The kernels' own code (indexing, shuffles, atomics, merges, radix searches) is compiled with g++
against the shim below (one std::thread per CUDA thread, one CTA at a time, real barriers for
__syncthreads and masked warp shuffles, atomics on host memory, dynamic shared memory filled with
junk) and driven through the real GPU wrappers with host memory standing in for device memory.
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

# The CUDA built-ins the kernels use, for g++: host threads stand in for CUDA threads.
EMU_SHIM = r"""
#include <algorithm>
#include <barrier>
#include <cstdint>
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
struct uint4 { unsigned x, y, z, w; }; struct uint2 { unsigned x, y; }; struct int2 { int x, y; };
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline int2 make_int2(int a, int b) { return {a, b}; }
struct dim3 { unsigned x = 1, y = 1, z = 1; };
thread_local dim3 threadIdx, blockIdx;
dim3 gridDim, blockDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __noinline__ __attribute__((noinline))
#define __align__(n) alignas(n)
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __expf(float x) { return std::exp(x); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline unsigned __float2uint_rn(float f) {  // saturating, NaN -> 0, as the PTX cvt.rni.sat.u32
    if (!(f > 0.f)) return 0u;
    if (f >= 4294967296.f) return 0xffffffffu;
    return (unsigned)std::nearbyint(f);
}
inline float __double2float_rd(double d) {
    float f = (float)d;
    return (double)f > d ? std::nextafter(f, -INFINITY) : f;
}
template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return *p; }
#define SEQ __ATOMIC_SEQ_CST
template <typename T, typename V> inline T atomicAdd(T* p, V v) { return __atomic_fetch_add(p, (T)v, SEQ); }
template <typename T, typename V> inline T atomicOr(T* p, V v) { return __atomic_fetch_or(p, (T)v, SEQ); }
template <typename T, typename V> inline T atomicMax(T* p, V v) {
    T old = __atomic_load_n(p, SEQ);
    while (old < (T)v && !__atomic_compare_exchange_n(p, &old, (T)v, false, SEQ, SEQ)) {}
    return old;
}
inline int atomicCAS(int* p, int expect, int value) {
    __atomic_compare_exchange_n(p, &expect, value, false, SEQ, SEQ);
    return expect;
}
static unsigned char* emu_smem;  // the CTA's dynamic shared memory
static std::barrier<>* cta_barrier;
inline void __syncthreads() { cta_barrier->arrive_and_wait(); }
static std::mutex mu;  // bad_shuffles
struct Warp {          // one per warp, so a shuffle wakes only its own warp's lanes
    std::mutex mu; std::condition_variable cv;
    std::map<unsigned, std::pair<int, int>> barriers;  // mask -> (arrived, generation)
};
static Warp warps[32];
static unsigned long long lanes[32][32];  // each lane's shuffled value, as bits
static int bad_shuffles = 0;
static void lane_barrier(unsigned warp, unsigned mask) {
    Warp& w = warps[warp];
    std::unique_lock<std::mutex> lk(w.mu);
    auto& b = w.barriers[mask]; const int gen = b.second;
    if (++b.first == __builtin_popcount(mask)) { b.first = 0; b.second++; w.cv.notify_all(); }
    else w.cv.wait(lk, [&] { return b.second != gen; });
}
template <typename T> T lane_exchange(unsigned mask, T v, unsigned src) {  // v of lane `src`
    static_assert(sizeof(T) <= 8);
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (!(mask >> lane & 1u) || !(mask >> src & 1u)) { std::lock_guard<std::mutex> l(mu); bad_shuffles++; }
    unsigned long long bits = 0; std::memcpy(&bits, &v, sizeof(T));
    lanes[warp][lane] = bits; lane_barrier(warp, mask);
    bits = lanes[warp][src]; lane_barrier(warp, mask);
    T r; std::memcpy(&r, &bits, sizeof(T));
    return r;
}
template <typename T> T __shfl_xor_sync(unsigned mask, T v, int off) {
    return lane_exchange(mask, v, (threadIdx.x % 32) ^ off);
}
template <typename T> T __shfl_up_sync(unsigned mask, T v, unsigned delta) {
    const unsigned lane = threadIdx.x % 32;
    return lane_exchange(mask, v, lane >= delta ? lane - delta : lane);
}
template <typename... A, size_t... I> void invoke(void (*f)(A...), void** a, std::index_sequence<I...>) {
    f(*static_cast<std::remove_reference_t<A>*>(a[I])...);
}
template <typename... A> void launch(void (*f)(A...), unsigned* g, unsigned bx, unsigned smem, void** a) {
    gridDim = {g[0], g[1], g[2]}; blockDim = {bx, 1, 1};
    std::vector<uint4> shared(smem / 16 + 1);
    for (unsigned z = 0; z < g[2]; ++z) for (unsigned y = 0; y < g[1]; ++y) for (unsigned x = 0; x < g[0]; ++x) {
        std::memset(shared.data(), 0xA5, shared.size() * 16);  // junk: the kernel must initialise it
        emu_smem = reinterpret_cast<unsigned char*>(shared.data());
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
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {  // bytes of (y:x) picked by s's nibbles
    const uint64_t v = ((uint64_t)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
}
// mma.sync m16n8k16 (row.col, fp32 accumulators) as a warp collective: every lane posts its A and
// B fragments, then computes its four outputs from the whole warp's (prelude.cuh's layout).
static unsigned mma_a[32][32][4], mma_b[32][32][2];
template <bool BF16> void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = (int)lane / 4, q = (int)lane % 4;
    std::memcpy(mma_a[warp][lane], a, 16); std::memcpy(mma_b[warp][lane], b, 8);
    lane_barrier(warp, 0xffffffffu);
    auto half = [](unsigned w, int k) { const u16 h = (k & 1) ? (u16)(w >> 16) : (u16)(w & 0xffffu);
                                        return BF16 ? bf16_to_float(h) : fp16_to_float(h); };
    auto A = [&](int r, int k) { return half(mma_a[warp][(r % 8) * 4 + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k); };
    auto B = [&](int k, int n) { return half(mma_b[warp][n * 4 + (k % 8) / 2][k >= 8], k); };
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * q, 2 * q + 1, 2 * q, 2 * q + 1};
    float out[4];
    for (int j = 0; j < 4; ++j) {
        float acc = d[j];
        for (int k = 0; k < 16; ++k) acc += A(rows[j], k) * B(k, cols[j]);
        out[j] = acc;
    }
    lane_barrier(warp, 0xffffffffu);  // every lane has read the fragments before any posts again
    for (int j = 0; j < 4; ++j) d[j] = out[j];
}
inline void mma_16816_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) { mma_16816<false>(d, a, b); }
inline void mma_16816_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) { mma_16816<true>(d, a, b); }
"""


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
