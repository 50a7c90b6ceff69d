// int8 weights with x in bfloat16, on a CPU with AVX-512 BF16 and no AMX (AMD Zen 4, Intel Cooper
// Lake): what gemm.h's int8 paths share there.  vdpbf16ps does 32 multiply-adds where an fp32 FMA
// does 16, at the same rate on a Zen 4 core (benchmarks/RESULTS.md "Session 38"), so the compute-
// bound steps (prefill chunks, batched decodes) run up to twice as fast; llama.cpp's Q8_0 gets the
// same from VNNI with its activations rounded to 8 bits, PaddleNLP's weight-only int8 from a bf16
// model's activations.  Here x is rounded to bf16 (8 significant bits, 2^-9 relative: the weights'
// own quantisation step is 2^-8 of a column's largest); an int8 weight is exact in bf16, their
// product exact in fp32, and the sums stay fp32.
//
// The same bits on every path (gemm.h's top comment): vdpbf16ps adds a lane's two products to its
// sum one at a time, the high half's first, each rounded (measured bit for bit on a Zen 4: as Intel's
// pseudocode has it).  A product being exact, one such add is an FMA of bf16(x) and w.  So pairs of chain
// positions (2j, 2j + 1) with 2j in the high half make gemm.h's chain, in its order: the blocked
// path packs W and x so, the stream path (T = 2 .. kStreamRows) pairs its pass's rows so, and T = 1
// runs gemm_stream.h's FMAs on widened weights and x rounded to bf16.  (vdpbf16ps flushes denormal sums to zero where an FMA would not: sums below 2^-126.)
#pragma once

#include "simd.h"

#if SPMD_SIMD == 512 && defined(__AVX512BF16__)
#define SPMD_HAVE_BF16_INT8 1

#include <cstdint>
#include <cstring>

#include "gemm_blocked.h"
#include "weights.h"

namespace spmd {

// out[0:n] = x[0:n] rounded to bf16 (to nearest even; denormals to zero, as vcvtneps2bf16), as fp32
inline void round_bf16(const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i)));
    _mm512_mask_storeu_ps(out + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
}

// fp32 a (high) and b (low), both already bf16 values, as one vdpbf16ps lane held in a float's bits
inline float pair_float(float a, float b) {
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  const uint32_t v = (ua & 0xFFFF0000u) | (ub >> 16);
  float f;
  std::memcpy(&f, &v, 4);
  return f;
}

// vdpbf16ps lanes of two of W's rows, hi (the high halves: its products are added first) and lo,
// each widened to fp32 (an int8 is exact in bf16: the top half of its fp32)
inline Vec pair_lanes(Vec hi, Vec lo) {
  const __m512i l = _mm512_srli_epi32(_mm512_castps_si512(lo), 16);
  return _mm512_castsi512_ps(_mm512_mask_blend_epi16(0x55555555, _mm512_castps_si512(hi), l));
}

// The blocked micro-kernel's W: a pack_pairs micro-panel [pairs][kNR] of lanes, one step a pair
struct PairPanel {
  const float* p;   // uint32 lanes, read as vectors
  const float* at(int64_t k, int v) const { return p + k * kNR + v * kWidth; }
  static Vec madd(Vec x, Vec w, Vec acc) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(x), reinterpret_cast<__m512bh>(w));
  }
};

// [kb, nb] block of W from (k0, n0) → micro-panels dst[nb / kNR rounded up][(kb + 1) / 2][kNR] of
// lanes (chain position 2j high, 2j + 1 low; zero past kb and nb)
inline void pack_pairs(const I8Pairs& w, int64_t k0, int64_t kb, int64_t n0, int64_t nb, int64_t K, float* dst) {
  const int64_t pairs = (kb + 1) / 2, full = nb / kWidth * kWidth, padded = (nb + kNR - 1) / kNR * kNR;
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t j = 0; j < pairs; ++j) {
    const int64_t hi = k0 + chain_row(kb, 2 * j), lo = 2 * j + 1 < kb ? k0 + chain_row(kb, 2 * j + 1) : -1;
    prefetch_pack_row(w, k0, kb, 2 * j, n0, nb, K);
    float* row = dst + j * kNR;
    for (int64_t c = 0; c < full; c += kWidth)
      _mm512_storeu_ps(row + (c / kNR) * pairs * kNR + c % kNR,
                       pair_lanes(w.vec(hi, n0 + c), lo >= 0 ? w.vec(lo, n0 + c) : zero));
    for (int64_t c = full; c < padded; ++c)
      row[(c / kNR) * pairs * kNR + c % kNR] = c < nb ? pair_float(w.one(hi, n0 + c), lo >= 0 ? w.one(lo, n0 + c) : 0.f)
                                                      : 0.f;
  }
}

// x[T, K] (already bf16 values) → pair micro-panels, per block of kKC rows a contiguous
// [Tiles(T).count][(kb + 1) / 2][kMR] of lanes (pack_rows' layout, a pair a step); this fills one tile
inline void pack_pair_rows(const float* x, int64_t T, int64_t K, int64_t tile, float* xp) {
  const Tiles tl(T);
  const int64_t tiles = tl.count, t0 = tl.start(tile), rows = tl.rows(tile);
  for (int64_t k0 = 0; k0 < K; k0 += kKC) {
    const int64_t kb = std::min(kKC, K - k0), pairs = (kb + 1) / 2;
    float* dst = xp + k0 / 2 * tiles * kMR + tile * pairs * kMR;
    for (int64_t j = 0; j < pairs; ++j) {
      const int64_t hi = k0 + chain_row(kb, 2 * j), lo = 2 * j + 1 < kb ? k0 + chain_row(kb, 2 * j + 1) : -1;
      for (int64_t m = 0; m < kMR; ++m) {
        const float* xr = x + (t0 + m) * K;
        dst[j * kMR + m] = m < rows ? pair_float(xr[hi], lo >= 0 ? xr[lo] : 0.f) : 0.f;
      }
    }
  }
}

template <>
struct BlockedKernel<I8Pairs> {
  using Panel = PairPanel;
  static int64_t steps(int64_t kb) { return (kb + 1) / 2; }
  static void pack_w(const I8Pairs& w, int64_t k0, int64_t kb, int64_t n0, int64_t nb, int64_t K, float* dst) {
    pack_pairs(w, k0, kb, n0, nb, K, dst);
  }
  static void pack_x(const float* x, int64_t T, int64_t K, int64_t tile, float* xp) {
    pack_pair_rows(x, T, K, tile, xp);
  }
};

}  // namespace spmd

#endif
