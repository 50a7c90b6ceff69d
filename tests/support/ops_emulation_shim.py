"""The C++ shim that stands in for CUDA when tests/support/ops_emulation.py builds the ops/ kernel
sources with g++: dim3 and the built-ins, IEEE intrinsics, atomics on host memory, and one fiber
(ucontext) per CUDA thread of a CTA with real barriers for __syncthreads and masked warp shuffles."""

# The CUDA built-ins the kernels use, for g++: fibers on one host thread stand in for CUDA threads.
EMU_SHIM = r"""
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <map>
#include <functional>
#include <sys/mman.h>
#include <ucontext.h>
#include <type_traits>
#include <utility>
#include <vector>
using std::min; using std::max;
struct uint4 { unsigned x, y, z, w; }; struct uint2 { unsigned x, y; }; struct int2 { int x, y; };
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline int2 make_int2(int a, int b) { return {a, b}; }
struct dim3 { unsigned x = 1, y = 1, z = 1; };
dim3 threadIdx, blockIdx;  // the running fiber's (set at every switch)
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
// One fiber (ucontext) per CUDA thread of the CTA, all on the calling OS thread: a thread runs until
// it waits at a barrier, then the next one runs (a CTA's threads in turn, the order reversed every
// other CTA so that a read missing its barrier meets junk either way).  Waiting is cheap (a context
// switch, no kernel scheduler): ~10x faster than an OS thread per CUDA thread on two cores.
struct Fiber { ucontext_t ctx; char* stack = nullptr; bool done = false; };
static const size_t EMU_STACK = 1 << 20, EMU_GUARD = 1 << 12;  // a PROT_NONE page under each stack
static std::vector<Fiber> fibers;
static ucontext_t emu_main;
static unsigned emu_cur, cta_size, cta_arrived, cta_gen;
static unsigned long long emu_progress;  // barrier arrivals: a round of the CTA without any is a deadlock
static std::function<void()> emu_body;
static void emu_yield() { swapcontext(&fibers[emu_cur].ctx, &emu_main); }
static void emu_entry() { emu_body(); fibers[emu_cur].done = true; emu_progress++; emu_yield(); }
inline void __syncthreads() {
    const unsigned gen = cta_gen; emu_progress++;
    if (++cta_arrived == cta_size) { cta_arrived = 0; cta_gen++; return; }
    while (cta_gen == gen) emu_yield();
}
struct Warp { std::map<unsigned, std::pair<int, int>> barriers; };  // mask -> (arrived, generation)
static Warp warps[32];
static unsigned long long lanes[32][32];  // each lane's shuffled value, as bits
static int bad_shuffles = 0;
static void lane_barrier(unsigned warp, unsigned mask) {
    auto& b = warps[warp].barriers[mask]; const int gen = b.second; emu_progress++;
    if (++b.first == __builtin_popcount(mask)) { b.first = 0; b.second++; return; }
    while (b.second == gen) emu_yield();
}
template <typename T> T lane_exchange(unsigned mask, T v, unsigned src) {  // v of lane `src`
    static_assert(sizeof(T) <= 8);
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (!(mask >> lane & 1u) || !(mask >> src & 1u)) bad_shuffles++;
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
static void run_cta(unsigned bx, dim3 block, bool reversed, std::function<void()> body) {
    if (fibers.size() < bx) fibers.resize(bx);
    emu_body = std::move(body); cta_size = bx; cta_arrived = 0; blockIdx = block;
    for (unsigned t = 0; t < bx; ++t) {
        Fiber& fb = fibers[t];
        if (!fb.stack) {
            void* m = mmap(nullptr, EMU_STACK + EMU_GUARD, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED) { std::fprintf(stderr, "emulation: no memory for a fiber stack\n"); std::abort(); }
            mprotect(m, EMU_GUARD, PROT_NONE);
            fb.stack = static_cast<char*>(m);
        }
        fb.done = false;
        getcontext(&fb.ctx);
        fb.ctx.uc_stack.ss_sp = fb.stack + EMU_GUARD; fb.ctx.uc_stack.ss_size = EMU_STACK; fb.ctx.uc_link = nullptr;
        makecontext(&fb.ctx, emu_entry, 0);
    }
    for (unsigned live = bx; live > 0;) {
        const unsigned long long before = emu_progress;
        for (unsigned i = 0; i < bx; ++i) {
            const unsigned t = reversed ? bx - 1 - i : i;
            if (fibers[t].done) continue;
            emu_cur = t; threadIdx = {t, 0, 0};
            swapcontext(&emu_main, &fibers[t].ctx);
            live -= fibers[t].done;
        }
        if (live > 0 && emu_progress == before) {
            std::fprintf(stderr, "emulation: every live thread of the CTA waits at a barrier no other will reach\n");
            std::abort();
        }
    }
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
        run_cta(bx, {x, y, z}, (x + y + z) % 2 == 1, [=] { invoke(f, a, std::index_sequence_for<A...>{}); });
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
