// Scores for a row block of few lanes (attention.cc): a decode's g query heads of one KV head fill
// a few of a vector's W = kWidth lanes (16 with AVX-512, 8 with AVX2), and the wide path (a key's
// element broadcast into all W lanes, one fma per element) spends W lanes of work on those few
// rows.  Here the keys go into the lanes instead: W keys transposed into kt[d][W] (W x W transposes
// in registers), then per row d fmas of the row's query element (broadcast) by W keys' elements.
// Each score is the same chain as the wide path's, acc = fma(q[c], k[c], acc) over c = 0 .. d - 1
// from 0, so the bits are the same and a row does not depend on the block it came in
// (benchmarks/RESULTS.md "Session 38").
//
// The softmax of such a block goes row by row for the same reason (softmax_narrow): exp W keys at a
// time, the max and the sum over keys in the wide path's order, so the weights are its bits too.
//
// An int8 pool's past goes the same way: its keys are widened to fp32 as they are transposed, and
// the row's query is q * k_scale, as in the wide path (the same products, so the same bits).  With
// AVX2's 8 lanes attention.cc takes this path for an int8 past only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "simd.h"

namespace spmd {

// rows a block at most for the narrow path: per W keys it does L x d fmas and ~d shuffles, the wide
// path W x d fmas (measured: RESULTS.md "Session 39")
constexpr int64_t kNarrowLanes = kWidth / 2;

// kt[c * W + j] = k[j][c] for keys j < m (W - m keys past the end: 0), c < d; E float or int8 (as float)
template <typename E>
void transpose_keys(const E* const* k, int64_t m, int64_t d, float* kt) {
  int64_t c0 = 0;
#if SPMD_SIMD == 512
  for (; m == 16 && c0 + 16 <= d; c0 += 16) {   // 16 x 16 in registers: unpack 32-bit, 64-bit, then 128-bit lanes twice
    __m512 r[16], t[16];
    for (int j = 0; j < 16; ++j) r[j] = vload(k[j] + c0);
    for (int j = 0; j < 16; j += 2) {
      t[j] = _mm512_unpacklo_ps(r[j], r[j + 1]);
      t[j + 1] = _mm512_unpackhi_ps(r[j], r[j + 1]);
    }
    for (int j = 0; j < 16; j += 4)
      for (int i = 0; i < 2; ++i) {
        const __m512d a = _mm512_castps_pd(t[j + i]), b = _mm512_castps_pd(t[j + i + 2]);
        r[j + i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[j + i + 2] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
      }
    // r[4a + pos[b]] holds, per 128-bit lane L, element c0 + 4L + b of keys 4a .. 4a + 3
    constexpr int pos[4] = {0, 2, 1, 3};
    for (int a = 0; a < 4; ++a)
      for (int b = 0; b < 4; ++b) t[4 * a + b] = r[4 * a + pos[b]];
    for (int b = 0; b < 4; ++b) {
      // gather lane L of t[b], t[4 + b], t[8 + b], t[12 + b] into element c0 + 4L + b's 16 keys
      const __m512 lo01 = _mm512_shuffle_f32x4(t[b], t[4 + b], 0x44), hi01 = _mm512_shuffle_f32x4(t[b], t[4 + b], 0xee);
      const __m512 lo23 = _mm512_shuffle_f32x4(t[8 + b], t[12 + b], 0x44), hi23 = _mm512_shuffle_f32x4(t[8 + b], t[12 + b], 0xee);
      _mm512_storeu_ps(kt + (c0 + b) * 16, _mm512_shuffle_f32x4(lo01, lo23, 0x88));
      _mm512_storeu_ps(kt + (c0 + 4 + b) * 16, _mm512_shuffle_f32x4(lo01, lo23, 0xdd));
      _mm512_storeu_ps(kt + (c0 + 8 + b) * 16, _mm512_shuffle_f32x4(hi01, hi23, 0x88));
      _mm512_storeu_ps(kt + (c0 + 12 + b) * 16, _mm512_shuffle_f32x4(hi01, hi23, 0xdd));
    }
  }
#elif SPMD_SIMD == 256
  for (; m == 8 && c0 + 8 <= d; c0 += 8) {   // 8 x 8 in registers: unpack 32-bit, shuffle 64-bit, swap 128-bit halves
    __m256 r[8], t[8];
    for (int j = 0; j < 8; ++j) r[j] = vload(k[j] + c0);
    for (int j = 0; j < 8; j += 2) {
      t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);       // per half: k_j[0] k_j+1[0] k_j[1] k_j+1[1]
      t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);   // per half: elements 2 and 3
    }
    for (int j = 0; j < 8; j += 4)
      for (int i = 0; i < 2; ++i) {   // per half: element 2i (then 2i + 1) of keys j .. j + 3
        r[j + 2 * i] = _mm256_shuffle_ps(t[j + i], t[j + i + 2], 0x44);
        r[j + 2 * i + 1] = _mm256_shuffle_ps(t[j + i], t[j + i + 2], 0xee);
      }
    for (int b = 0; b < 4; ++b) {   // low halves: element c0 + b of the 8 keys; high halves: c0 + 4 + b
      _mm256_storeu_ps(kt + (c0 + b) * 8, _mm256_permute2f128_ps(r[b], r[4 + b], 0x20));
      _mm256_storeu_ps(kt + (c0 + 4 + b) * 8, _mm256_permute2f128_ps(r[b], r[4 + b], 0x31));
    }
  }
#endif
  for (int64_t c = c0; c < d; ++c)
    for (int64_t j = 0; j < kWidth; ++j) kt[c * kWidth + j] = j < m ? static_cast<float>(k[j][c]) : 0.f;
}

// s[p * W + l] = q_l . k_p for lanes l < L (qt [d][W], lane l = row l) and keys p in [0, n);
// lanes L .. W - 1 of s: 0.  kt: scratch of d x W floats
template <int L, typename E>
void score_narrow(const float* qt, const E* const* k, int64_t n, int64_t d, float* s, float* kt) {
  std::fill_n(s, n * kWidth, 0.f);   // the absent lanes' scores: finite (a plain memset, not W - L stores a key)
  for (int64_t p0 = 0; p0 < n; p0 += kWidth) {
    const int64_t m = std::min<int64_t>(kWidth, n - p0);
    transpose_keys(k + p0, m, d, kt);
    Vec acc[L];
    for (int l = 0; l < L; ++l) acc[l] = vzero();
    for (int64_t c = 0; c < d; ++c) {
      const Vec kc = vload(kt + c * kWidth);   // element c of the W keys
      for (int l = 0; l < L; ++l) acc[l] = vfma(vset1(qt[c * kWidth + l]), kc, acc[l]);
    }
    alignas(64) float lane[L][kWidth];
    for (int l = 0; l < L; ++l) vstore(lane[l], acc[l]);
    for (int64_t j = 0; j < m; ++j)
      for (int l = 0; l < L; ++l) s[(p0 + j) * kWidth + l] = lane[l][j];
  }
}

// attention.cc's softmax_lanes for the rows l < lanes of s (scores s[p * W + l], keys p < reach[l]
// seen, increasing in l) one row at a time: s becomes the weights (0 past a row's reach), inv[l] = 1 /
// their sum.  The same operations per score as the wide path (max from -inf in key order, exp(x - m),
// the sum in key order from 0), hence the same bits.
inline void softmax_narrow(float* s, int64_t n, int64_t lanes, const int64_t* reach, float* inv) {
  thread_local AlignedVector<float> row;   // one row's scores, then weights, keys side by side
  row.resize(n + kWidth);
  for (int64_t l = 0; l < lanes; ++l) {
    const int64_t r = std::min(reach[l], n);
    float m = -INFINITY;
    for (int64_t p = 0; p < r; ++p) {
      row[p] = s[p * kWidth + l];
      m = m > row[p] ? m : row[p];   // vmax's rule
    }
    const Vec mv = vset1(m);
    for (int64_t p = 0; p < r; p += kWidth) vstore(row.data() + p, vexp(vsub(vload(row.data() + p), mv)));   // past r: unused
    float sum = 0.f;
    for (int64_t p = 0; p < r; ++p) {
      sum += row[p];
      s[p * kWidth + l] = row[p];
    }
    for (int64_t p = r; p < n; ++p) s[p * kWidth + l] = 0.f;
    inv[l] = 1.f / sum;
  }
}

template <typename E, int... L>
void narrow_dispatch(int64_t lanes, std::integer_sequence<int, L...>, const float* qt, const E* const* k,
                     int64_t n, int64_t d, float* s, float* kt) {
  ((lanes == L + 1 ? score_narrow<L + 1>(qt, k, n, d, s, kt) : void()), ...);
}

}  // namespace spmd
