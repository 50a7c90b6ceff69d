// The three layouts of a linear layer's [K, N] weight the GEMM (gemm.h) reads, as one interface:
// element (k, n) as fp32, kWidth consecutive columns of a row as a Vec, and its address (for
// prefetching).  The int8/int4 layouts are spmd_serve's quantised exports (models/quant.py):
//   F32W  float32 [K, N]
//   I8W   int8 [K, N]; the per-column scale is applied to the output (gemm.h), not here
//   F32P  float32 [K, N] in panels (models/panels.py): per block of kKC rows (k0 = 0, kKC, ...; kb rows,
//         the last one K - k0) at w + k0 * N, the columns in panels of kPanel (the last one N % kPanel
//         when that is not 0), panel p at + p * kPanel * kb holding the block's rows in the chain's
//         order (gemm_blocked.h, chain_row), each row `width(p)` floats.  A task's share of a block
//         is then one contiguous run of memory (gemm_panels.h says why).
//   B16P  bfloat16 (simd.h Bf16) in F32P's panels (an export's --dtype bfloat16), widened exactly in
//         registers: the chains of F32P over the widened weights, bit for bit
//   F16P  float16 (simd.h F16) in the same panels (--dtype float16), likewise
//   I4W   int8 [K/2, N], two signed nibbles a byte (row 2i low, 2i+1 high), times the fp32 scale
//         [K/group, N] of its group of input rows: an element is fl(q * scale), as the graph's
//         dequantisation computes it.
#pragma once

#include <cstdint>

#include "simd.h"

namespace spmd {

// One row of an unscaled layout (F32W, I8W) at its address, computed once (a pass's loop then does
// no k * N per load)
template <typename E>
struct PlainRow {
  const E* p;
  const void* at(int64_t n) const { return p + n; }
  Vec vec(int64_t n) const { return vload(p + n); }
};

struct F32W {
  const float* w;
  int64_t N;
  static constexpr int64_t kLine = 16;             // elements per 64-byte cache line
  static constexpr bool kPrefetchOneRow = false;   // see gemm.h, stream_tile
  const void* at(int64_t k, int64_t n) const { return w + k * N + n; }
  Vec vec(int64_t k, int64_t n) const { return vload(w + k * N + n); }
  float one(int64_t k, int64_t n) const { return w[k * N + n]; }
  using Row = PlainRow<float>;
  Row row(int64_t k) const { return {w + k * N}; }
};

// F32P and B16P: the panel layout of [K, N] elements E (float, Bf16)
template <typename E>
struct Panels {
  using Elem = E;
  const E* w;
  int64_t K, N;
  static constexpr int64_t kPanel = 16;   // columns per panel: a row is one 64-byte line in fp32, on every CPU
  // panel p of the block whose first row is k0 (kb rows)
  const E* panel(int64_t k0, int64_t kb, int64_t p) const { return w + k0 * N + p * kPanel * kb; }
  int64_t width(int64_t p) const { return N - p * kPanel < kPanel ? N - p * kPanel : kPanel; }
};
using F32P = Panels<float>;
using B16P = Panels<Bf16>;
using F16P = Panels<F16>;

template <typename Src>
inline constexpr bool kIsPanels = false;
template <typename E>
inline constexpr bool kIsPanels<Panels<E>> = true;

struct I8W {
  const int8_t* q;
  int64_t N;
  static constexpr int64_t kLine = 64;
  static constexpr bool kPrefetchOneRow = true;
  const void* at(int64_t k, int64_t n) const { return q + k * N + n; }
  Vec vec(int64_t k, int64_t n) const { return vload(q + k * N + n); }
  float one(int64_t k, int64_t n) const { return static_cast<float>(q[k * N + n]); }
  using Row = PlainRow<int8_t>;
  Row row(int64_t k) const { return {q + k * N}; }
};

// I8W read by gemm.h's paths as bf16 pairs of rows (gemm_bf16.h; the same bytes)
struct I8Pairs : I8W {};

// kWidth signed nibbles (the high ones if `high`) of kWidth bytes → fp32
inline Vec vload_nibbles(const int8_t* p, bool high) {
#if SPMD_SIMD == 512
  const __m512i b = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtepi32_ps(high ? _mm512_srai_epi32(b, 4) : _mm512_srai_epi32(_mm512_slli_epi32(b, 28), 28));
#elif SPMD_SIMD == 256
  const __m256i b = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_cvtepi32_ps(high ? _mm256_srai_epi32(b, 4) : _mm256_srai_epi32(_mm256_slli_epi32(b, 28), 28));
#else
  Vec r;
  for (int64_t i = 0; i < kWidth; ++i)
    r.v[i] = static_cast<float>(high ? p[i] >> 4 : static_cast<int8_t>(static_cast<uint8_t>(p[i]) << 4) >> 4);
  return r;
#endif
}

struct I4W {
  const int8_t* q;
  const float* scale;   // [K / group, N]
  int64_t N, group;
  static constexpr int64_t kLine = 64;
  static constexpr bool kPrefetchOneRow = true;
  const void* at(int64_t k, int64_t n) const { return q + (k >> 1) * N + n; }
  Vec vec(int64_t k, int64_t n) const {
    return vmul(vload_nibbles(q + (k >> 1) * N + n, k & 1), vload(scale + k / group * N + n));
  }
  struct Row {
    const int8_t* p;
    const float* s;
    bool high;
    const void* at(int64_t n) const { return p + n; }
    Vec vec(int64_t n) const { return vmul(vload_nibbles(p + n, high), vload(s + n)); }
  };
  Row row(int64_t k) const { return {q + (k >> 1) * N, scale + k / group * N, (k & 1) != 0}; }
  float one(int64_t k, int64_t n) const {
    const int8_t b = q[(k >> 1) * N + n];
    const int v = k & 1 ? b >> 4 : static_cast<int8_t>(static_cast<uint8_t>(b) << 4) >> 4;
    return static_cast<float>(v) * scale[k / group * N + n];
  }
};

}  // namespace spmd
