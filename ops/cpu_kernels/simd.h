// One SIMD vector of floats for the op kernels: AVX-512, AVX2 + FMA, or a plain array the compiler
// vectorises (so the library builds on any CPU; it is compiled with -march=native on the machine
// that runs it).  Every kernel is written once against these few functions.
//
// SPMD_SIMD says which: 512, 256 or 0 (the plain array).  -DSPMD_EMULATE_WIDTH=16 builds the plain
// array with AVX-512's geometry (16 lanes, 32 registers: the tiles, panels and tails of that path)
// on any CPU, so that a machine without AVX-512 tests the kernels' logic at that width
// (ops/paddle_ext.py SPMD_OPS_EMULATE_WIDTH, tests/kernels/test_cpu_simd_widths.py).
//
// fmadd / vfma is a fused multiply-add wherever the CPU has one: the GEMM paths rely on every
// output being the same chain of fmas over k in order, whatever the path, tile or thread that
// computes it (linear.cc), so the scalar tails use the same operation as the vector bodies.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

namespace spmd {

// Scratch whose vector loads and stores must not straddle cache lines: std::vector's storage is only
// 16-byte aligned (glibc malloc), so every 64-byte load from the GEMM's packed W panels split two
// lines; aligned, the blocked GEMM ran 5-18 % faster (RESULTS.md "Session 18").  Paddle's tensors
// are 64-byte aligned already.
template <typename T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <typename U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <typename U>
  bool operator==(const Aligned64<U>&) const { return true; }
  template <typename U>
  bool operator!=(const Aligned64<U>&) const { return false; }
};
template <typename T>
using AlignedVector = std::vector<T, Aligned64<T>>;

// A thread's scratch of at least n elements, contents undefined: v only ever grows.  Resizing it to
// each call's size would zero-fill the tail again whenever a smaller call came between two larger
// ones (a decode step's linears alternate sizes: the memset was ~0.5 % of its main thread)
template <typename V>
auto* grown(V& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// A bfloat16 number: the high half of a float32's bits (weights exported with --dtype bfloat16).
// Widening is exact (the low half zero), so a GEMM over bf16 weights is the fp32 GEMM's chain over
// the widened weights, bit for bit (weights.h B16W).
struct Bf16 {
  uint16_t bits;
  explicit operator float() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
};

// An IEEE half (float16) number (weights exported with --dtype float16), widened exactly: every
// half is a float32 (subnormals included), so a GEMM over them is the fp32 chain over the widened
// weights, as for Bf16.
struct F16 {
  uint16_t bits;
  explicit operator float() const {
    const uint32_t sign = (bits & 0x8000u) << 16, exp = (bits >> 10) & 0x1Fu, man = bits & 0x3FFu;
    uint32_t u = sign;
    if (exp == 0x1F) {
      u |= 0x7F800000u | (man << 13);              // inf, NaN
    } else if (exp != 0) {
      u |= ((exp + 112) << 23) | (man << 13);      // normal: rebias 15 -> 127
    } else if (man != 0) {
      const float f = static_cast<float>(man) * 5.9604644775390625e-8f;   // subnormal: man * 2^-24, exact
      uint32_t v;
      std::memcpy(&v, &f, sizeof v);
      u |= v;
    }
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
};

#if defined(SPMD_EMULATE_WIDTH)
#define SPMD_SIMD 0
#elif defined(__AVX512F__)
#define SPMD_SIMD 512
#elif defined(__AVX2__) && defined(__FMA__)
#define SPMD_SIMD 256
#else
#define SPMD_SIMD 0
#endif

#if SPMD_SIMD == 512
constexpr int64_t kWidth = 16;
using Vec = __m512;
constexpr int kVecRegs = 32;
// v materialised in a register: GCC otherwise folds a load used by several fmas into each of them
inline void vpin(Vec& v) { asm("" : "+v"(v)); }
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vset1(float v) { return _mm512_set1_ps(v); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vload(const int8_t* p) {  // 16 int8 → 16 fp32
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline Vec vload(const Bf16* p) {  // 16 bf16 → 16 fp32: each into a float's high half
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline Vec vload(const F16* p) {  // 16 halves → 16 fp32 (vcvtph2ps: exact)
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec vdiv(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec vmin(Vec a, Vec b) { return _mm512_min_ps(a, b); }
inline float vsum(Vec a) { return _mm512_reduce_add_ps(a); }
inline float vhmax(Vec a) { return _mm512_reduce_max_ps(a); }
inline Vec vround(Vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec vpow2i(Vec p, Vec n) { return _mm512_scalef_ps(p, n); }  // p * 2^n, n integral
inline Vec vselect_lt(Vec a, Vec b, Vec x, Vec y) {  // per lane: a < b ? x : y
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x);
}
#elif SPMD_SIMD == 256
constexpr int64_t kWidth = 8;
using Vec = __m256;
constexpr int kVecRegs = 16;
inline void vpin(Vec& v) { asm("" : "+x"(v)); }
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vset1(float v) { return _mm256_set1_ps(v); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline Vec vload(const int8_t* p) {  // 8 int8 → 8 fp32
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline Vec vload(const Bf16* p) {  // 8 bf16 → 8 fp32: each into a float's high half
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline Vec vload(const F16* p) {  // 8 halves → 8 fp32
#ifdef __F16C__
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  alignas(32) float f[8];
  for (int i = 0; i < 8; ++i) f[i] = static_cast<float>(p[i]);
  return _mm256_load_ps(f);
#endif
}
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec vmul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec vdiv(Vec a, Vec b) { return _mm256_div_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec vmin(Vec a, Vec b) { return _mm256_min_ps(a, b); }
inline float vsum(Vec a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float vhmax(Vec a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
inline Vec vround(Vec a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec vselect_lt(Vec a, Vec b, Vec x, Vec y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
inline Vec vpow2i(Vec p, Vec n) {  // p * 2^n for integral n in [-126, 127]: n into the exponent bits
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#else
#if defined(SPMD_EMULATE_WIDTH)
static_assert(SPMD_EMULATE_WIDTH == 8 || SPMD_EMULATE_WIDTH == 16, "SPMD_EMULATE_WIDTH: 8 (AVX2) or 16 (AVX-512)");
constexpr int64_t kWidth = SPMD_EMULATE_WIDTH;
#else
constexpr int64_t kWidth = 8;
#endif
struct Vec { float v[kWidth]; };
constexpr int kVecRegs = kWidth == 16 ? 32 : 16;
inline void vpin(Vec&) {}
inline Vec vzero() { return Vec{}; }
inline Vec vset1(float s) { Vec r; for (auto& e : r.v) e = s; return r; }
template <typename W>
inline Vec vload(const W* p) {
  Vec r;
  for (int64_t i = 0; i < kWidth; ++i) r.v[i] = static_cast<float>(p[i]);
  return r;
}
inline void vstore(float* p, Vec a) { std::memcpy(p, a.v, sizeof a.v); }
#define SPMD_LANES(expr) do { for (int64_t i = 0; i < kWidth; ++i) expr; } while (0)
inline float fmadd(float a, float b, float c);
// the scalar fmadd's one rounding (or two) in every lane: vector bodies and scalar tails make one chain
inline Vec vfma(Vec a, Vec b, Vec c) { SPMD_LANES(c.v[i] = fmadd(a.v[i], b.v[i], c.v[i])); return c; }
inline Vec vmul(Vec a, Vec b) { SPMD_LANES(a.v[i] *= b.v[i]); return a; }
inline Vec vdiv(Vec a, Vec b) { SPMD_LANES(a.v[i] /= b.v[i]); return a; }
inline Vec vsub(Vec a, Vec b) { SPMD_LANES(a.v[i] -= b.v[i]); return a; }
inline Vec vadd(Vec a, Vec b) { SPMD_LANES(a.v[i] += b.v[i]); return a; }
inline Vec vmax(Vec a, Vec b) { SPMD_LANES(a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i]); return a; }
inline Vec vmin(Vec a, Vec b) { SPMD_LANES(a.v[i] = a.v[i] < b.v[i] ? a.v[i] : b.v[i]); return a; }
inline float vsum(Vec a) { float s = 0.f; SPMD_LANES(s += a.v[i]); return s; }
inline float vhmax(Vec a) { float s = a.v[0]; SPMD_LANES(s = s > a.v[i] ? s : a.v[i]); return s; }
inline Vec vround(Vec a) { SPMD_LANES(a.v[i] = std::nearbyint(a.v[i])); return a; }
inline Vec vpow2i(Vec p, Vec n) { SPMD_LANES(p.v[i] = std::ldexp(p.v[i], static_cast<int>(n.v[i]))); return p; }
inline Vec vselect_lt(Vec a, Vec b, Vec x, Vec y) { SPMD_LANES(x.v[i] = a.v[i] < b.v[i] ? x.v[i] : y.v[i]); return x; }
#undef SPMD_LANES
#endif

// a * b + c with the rounding of the vector bodies (one rounding where the CPU has FMA)
inline float fmadd(float a, float b, float c) {
#if defined(__FMA__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// exp(x): Cephes' expf polynomial on x - n ln 2, times 2^n; relative error ~2e-7.  x is clamped
// to [-87, 88]: below gives ~1e-38 (not denormals), above ~1.6e38 (not inf).
inline Vec vexp(Vec x) {
  x = vmax(x, vset1(-87.0f));
  x = vmin(x, vset1(88.0f));
  const Vec n = vround(vmul(x, vset1(1.44269504088896341f)));
  Vec r = vfma(n, vset1(-0.693359375f), x);                 // x - n ln2, in two parts
  r = vfma(n, vset1(2.12194440e-4f), r);
  Vec p = vset1(1.9875691500e-4f);
  p = vfma(p, r, vset1(1.3981999507e-3f));
  p = vfma(p, r, vset1(8.3334519073e-3f));
  p = vfma(p, r, vset1(4.1665795894e-2f));
  p = vfma(p, r, vset1(1.6666665459e-1f));
  p = vfma(p, r, vset1(5.0000001201e-1f));
  p = vfma(p, vmul(r, r), vadd(r, vset1(1.0f)));
  return vpow2i(p, n);
}

}  // namespace spmd
