// int8 weights as exact integer sums: gemm.h's int8 GEMM on a machine with AMX (gemm_amx.h for most
// steps, gemm_vnni.h for the smallest; benchmarks/RESULTS.md "Session 21"): what both paths share,
// so that they give the same bits.
//
// x row t is taken as integers: X = round(x * m_t), m_t = 2^22 / max_k |x[t, k]| (|X| <= 2^22; what is
// dropped is below 2^-23 of the row's largest element, against the 2^-8 of the weights' own
// quantisation), in three signed byte digits X = d2 * 2^16 + d1 * 2^8 + d0 (d0, d1 in [-128, 127],
// |d2| <= 65: balanced, so that every digit is a signed byte).
// Digit x weight products are summed in int32 (|sum| < 2^31 for K < 2^16) and the three sums
// combined in int64: exact, so no summation order exists to keep, and y = S * scale[n] / m_t (in
// double, then fp32: finish) is the same for any T, path, tile placement or thread count: a row gets
// the same bits whatever step it came in.  These are not the bits of gemm.h's fp32 FMA chains (no
// FMA sequence reproduces the tile unit's own rounding, hence integers), so on such a machine every
// int8 GEMM of every T runs exact (one kernel family per machine).
//
// x's digits, packed once per call: [k-step of 64][row tile of 16][digit 0, 1, 2][16 rows][64 bytes]
// (one tile unit operand each: 16 rows x 64 bytes = 1 KiB).
#pragma once

#include "simd.h"   // SPMD_SIMD

#if SPMD_SIMD == 512 && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512VBMI__) && \
    defined(__AVX512VNNI__)
#define SPMD_HAVE_EXACT_INT8 1

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace spmd {

constexpr int64_t kAmxRows = 16;    // rows of x per tile
constexpr int64_t kAmxStep = 64;    // rows of K per tile product (a "k-step")
constexpr int64_t kAmxCols = 16;    // columns per tile
constexpr int64_t kAmxTile = 1024;  // bytes per tile

bool amx_enabled();   // the CPU has AMX and the kernel granted this process the tile state (amx_tiles.cc)

// x row t → its digits in xp (columns past K zero) and m_t; rows past T: zero
inline void pack_digits(const float* x, int64_t T, int64_t K, int64_t t, int64_t tiles, int8_t* xp, float* mult) {
  float most = 0.f;
  bool finite = true;   // an inf or NaN in the row makes the whole row NaN (finish_row), not a number
  if (t < T)
    for (int64_t k = 0; k < K; ++k) {
      const float a = std::fabs(x[t * K + k]);
      finite = finite && a <= 3.4028235e38f;
      most = std::max(most, a);
    }
  const float m = !finite ? std::nanf("") : most > 0.f ? 4194304.f / most : 0.f;   // 2^22 / max|x|
  mult[t] = m;
  const __m512 mv = _mm512_set1_ps(finite ? m : 0.f);   // a NaN row's digits: zero
  for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += kAmxStep) {
    int8_t* d = xp + ((k0 / kAmxStep * tiles + t / kAmxRows) * 3) * kAmxTile + t % kAmxRows * 64;
    for (int64_t j = 0; j < kAmxStep; j += 16) {
      const int64_t n = std::clamp<int64_t>(K - k0 - j, 0, 16);
      const __mmask16 mask = t < T ? static_cast<__mmask16>((1u << n) - 1) : 0;
      const __m512i X = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + t * K + k0 + j), mv));
      // d0 = X's low byte read as signed, X1 = (X - d0) / 256 exactly; d1 likewise; d2 what is left
      const __m512i d0 = _mm512_srai_epi32(_mm512_slli_epi32(X, 24), 24);
      const __m512i X1 = _mm512_srai_epi32(_mm512_sub_epi32(X, d0), 8);
      const __m512i d1 = _mm512_srai_epi32(_mm512_slli_epi32(X1, 24), 24);
      const __m512i d2 = _mm512_srai_epi32(_mm512_sub_epi32(X1, d1), 8);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + j), _mm512_cvtepi32_epi8(d0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + kAmxTile + j), _mm512_cvtepi32_epi8(d1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * kAmxTile + j), _mm512_cvtepi32_epi8(d2));
    }
  }
}

// the four digit bytes of row t, digit d at rows k .. k + 3 (k a multiple of 4)
inline const int8_t* digit_at(const int8_t* xp, int64_t tiles, int64_t t, int d, int64_t k) {
  return xp + ((k / kAmxStep * tiles + t / kAmxRows) * 3 + d) * kAmxTile + t % kAmxRows * 64 + k % kAmxStep;
}

// four rows of W (64 columns each, as loaded) → the 16 columns of group g as dwords of their four
// bytes, row 0's lowest: one row of the tile unit's B operand, or a dot-product instruction's
// weights.  Two byte permutes (rows 0, 1 into bytes 0, 1 of each dword; rows 2, 3 into 2, 3) and a
// blend.  The callers keep the permutes' indices in registers (a Interleave local).
struct Interleave {
  __m512i idx[2][4];
  Interleave() {
    for (int lo = 0; lo < 2; ++lo)
      for (int g = 0; g < 4; ++g) {
        alignas(64) int8_t b[64] = {};
        for (int c = 0; c < 16; ++c)
          b[4 * c + 2 * lo] = static_cast<int8_t>(16 * g + c), b[4 * c + 2 * lo + 1] = static_cast<int8_t>(64 + 16 * g + c);
        idx[lo][g] = _mm512_load_si512(b);
      }
  }
  __m512i operator()(const __m512i (&row)[4], int g) const {
    const __m512i lo = _mm512_permutex2var_epi8(row[0], idx[0][g], row[1]);
    const __m512i hi = _mm512_permutex2var_epi8(row[2], idx[1][g], row[3]);
    return _mm512_mask_blend_epi8(0xccccccccccccccccull, lo, hi);
  }
};

// rows k .. k + 3 of q[:, n0 + j : n0 + j + 64] (columns past nb, rows past kend: zero)
inline void load_rows(const int8_t* q, int64_t N, int64_t k, int64_t kend, int64_t n0, int64_t j, int64_t nb,
                      __m512i (&row)[4]) {
  const __mmask64 m = nb - j >= 64 ? ~__mmask64{0} : (__mmask64{1} << (nb - j)) - 1;
  for (int64_t i = 0; i < 4; ++i)
    row[i] = k + i < kend ? _mm512_maskz_loadu_epi8(m, q + (k + i) * N + n0 + j) : _mm512_setzero_si512();
}

// S[n] = s2[n] * 2^16 + s1[n] * 2^8 + s0[n], n < w: the digits' int32 sums → the exact int64 sum
inline void combine_digits(const int32_t* s0, const int32_t* s1, const int32_t* s2, int64_t w, int64_t* S) {
  int64_t n = 0;
  auto ld = [](const int32_t* p) { return _mm512_cvtepi32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); };
  for (; n + 8 <= w; n += 8) {
    const __m512i d2 = ld(s2 + n);
    const __m512i v = _mm512_add_epi64(_mm512_add_epi64(_mm512_slli_epi64(d2, 16), _mm512_slli_epi64(ld(s1 + n), 8)), ld(s0 + n));
    _mm512_storeu_si512(S + n, v);
  }
  for (; n < w; ++n)
    S[n] = static_cast<int64_t>(s2[n]) * 65536 + static_cast<int64_t>(s1[n]) * 256 + s0[n];
}

// y[n] = S[n] * scale[n] / m_t, n < w: the one rounding of the result (S / m in double, times the
// scale in double, then to fp32; the vector and scalar forms are the same IEEE operations)
inline void finish_row(const int64_t* S, float mult, const float* scale, int64_t w, float* y) {
  if (!(mult > 0.f)) return std::fill(y, y + w, mult == 0.f ? 0.f : mult);   // an all-zero row; NaN: see pack_digits
  const __m512d m = _mm512_set1_pd(mult);
  int64_t n = 0;
  for (; n + 8 <= w; n += 8) {
    const __m512d v = _mm512_div_pd(_mm512_cvtepi64_pd(_mm512_loadu_si512(S + n)), m);
    _mm256_storeu_ps(y + n, _mm512_cvtpd_ps(_mm512_mul_pd(v, _mm512_cvtps_pd(_mm256_loadu_ps(scale + n)))));
  }
  for (; n < w; ++n) y[n] = static_cast<float>(static_cast<double>(S[n]) / mult * scale[n]);
}

}  // namespace spmd

#endif
