// Scores for a row block of few lanes (attention.cc): a decode's g query heads of one KV head fill
// a few of a vector's W = kWidth lanes (16 with AVX-512, 8 with AVX2), and the wide path (a key's
// element broadcast into all W lanes, one fma per element) spends W lanes of work on those few
// rows.  Here the keys go into the lanes instead: W keys transposed into kt[d][W] (W x W transposes
// in registers), then per row d fmas of the row's query element (broadcast) by W keys' elements.
// Each score is the same chain as the wide path's, acc = fma(q[c], k[c], acc) over c = 0 .. d - 1
// from 0, so the bits are the same and a row does not depend on the block it came in
// (benchmarks/RESULTS.md "Session 38").
//
// The scores stay as they come out, a row's keys side by side (s[l * ld + p]), and so do the
// weights: the softmax (softmax_rows) takes a row's max and exp W keys at a time and sums each
// row in key order from 0, the rows' sums interleaved (independent chains), and weigh reads the
// weights in that layout.  The wide path's operations per score (the max is exact in any order),
// so the weights are its bits too.  (Until session 41 they went back into the wide path's
// layout, s[p * W + l], one scalar at a time: at g = 4 that softmax was half the attention's time.)
//
// An int8 pool's past goes the same way: its keys are widened to fp32 as they are transposed, and
// the row's query is q * k_scale, as in the wide path (the same products, so the same bits).
// AVX2 takes this path too (8 lanes; fp32 as well since session 76).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attention_prefetch.h"
#include "simd.h"

namespace spmd {

// rows a block at most for the narrow path: per W keys it does L x d fmas and ~d shuffles, the wide
// path W x d fmas (measured: RESULTS.md "Session 39")
constexpr int64_t kNarrowLanes = kWidth / 2;

#if SPMD_SIMD == 512 || SPMD_SIMD == 256
constexpr bool kTransposeInRegisters = true;

// e[j] = element c0 + j of the W keys k[0 .. W - 1] (c0 + W <= d): a W x W transpose in registers.
// AVX-512: unpack 32-bit, 64-bit, then 128-bit lanes twice; AVX2: unpack 32-bit, shuffle 64-bit,
// swap 128-bit halves.  E float or int8 (widened as it is loaded)
template <typename E>
inline void transpose_block(const E* const* k, int64_t c0, Vec* e) {
  Vec r[kWidth], t[kWidth];
  for (int j = 0; j < kWidth; ++j) r[j] = vload(k[j] + c0);
#if SPMD_SIMD == 512
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
    e[b] = _mm512_shuffle_f32x4(lo01, lo23, 0x88);
    e[4 + b] = _mm512_shuffle_f32x4(lo01, lo23, 0xdd);
    e[8 + b] = _mm512_shuffle_f32x4(hi01, hi23, 0x88);
    e[12 + b] = _mm512_shuffle_f32x4(hi01, hi23, 0xdd);
  }
#else
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
    e[b] = _mm256_permute2f128_ps(r[b], r[4 + b], 0x20);
    e[4 + b] = _mm256_permute2f128_ps(r[b], r[4 + b], 0x31);
  }
#endif
}
#else
constexpr bool kTransposeInRegisters = false;
template <typename E>
inline void transpose_block(const E* const*, int64_t, Vec*) {}
#endif

// s[l * ld + p] = q_l . k_p for rows l < L (qt [d][W], lane l = row l) and keys p in [0, n), W at a
// time: up to W - 1 keys past n are written too (their scores are 0), so ld must leave room.  A
// whole group of W keys goes W elements at a time through transpose_block's registers; a last,
// partial group (or a plain-C++ build) through kt, a scratch of d x W floats.  pf: the next item's
// prefetch, stepped per group
template <int L, typename E>
void score_narrow(const float* qt, const E* const* k, int64_t n, int64_t d, float* s, int64_t ld, float* kt,
                  PoolPrefetch& pf) {
  for (int64_t p0 = 0; p0 < n; p0 += kWidth) {
    const int64_t m = std::min<int64_t>(kWidth, n - p0);
    pf.step(m);
    Vec acc[L];
    for (int l = 0; l < L; ++l) acc[l] = vzero();
    int64_t c0 = 0;
    if constexpr (kTransposeInRegisters)
      for (; m == kWidth && c0 + kWidth <= d; c0 += kWidth) {
        Vec e[kWidth];
        transpose_block(k + p0, c0, e);
        for (int j = 0; j < kWidth; ++j)
          for (int l = 0; l < L; ++l) acc[l] = vfma(vset1(qt[(c0 + j) * kWidth + l]), e[j], acc[l]);
      }
    if (c0 < d) {   // element c of the W keys (W - m past the end: 0) at kt[c * W]
      for (int64_t c = c0; c < d; ++c)
        for (int64_t j = 0; j < kWidth; ++j) kt[c * kWidth + j] = j < m ? static_cast<float>(k[p0 + j][c]) : 0.f;
      for (int64_t c = c0; c < d; ++c) {
        const Vec kc = vload(kt + c * kWidth);
        for (int l = 0; l < L; ++l) acc[l] = vfma(vset1(qt[c * kWidth + l]), kc, acc[l]);
      }
    }
    for (int l = 0; l < L; ++l) vstore(s + l * ld + p0, acc[l]);
  }
}

// The rows' scores s[l * ld + p] (keys p < n) become their weights, 0 from a row's reach[l] on (keys
// p < reach[l] seen), and inv[l] = 1 / their sum: the max over the seen keys (exact in any order: a
// row of NaN gives NaN either way), exp(x - max) W keys at a time, the sum in key order from 0.
// Past n, up to W - 1 entries are overwritten (ld must leave room).
template <int L>
void softmax_rows(float* s, int64_t ld, int64_t n, const int64_t* reach, float* inv) {
  int64_t r[L], common = n;
  float sum[L];
  for (int l = 0; l < L; ++l) {
    float* row = s + l * ld;
    r[l] = std::min(reach[l], n);
    common = std::min(common, r[l]);
    Vec mv = vset1(-INFINITY);
    int64_t p = 0;
    for (; p + kWidth <= r[l]; p += kWidth) mv = vmax(mv, vload(row + p));
    float m = vhmax(mv);
    for (; p < r[l]; ++p) m = m > row[p] ? m : row[p];
    const Vec ms = vset1(m);
    for (p = 0; p < r[l]; p += kWidth) vstore(row + p, vexp(vsub(vload(row + p), ms)));
    std::fill(row + r[l], row + n, 0.f);
    sum[l] = 0.f;
  }
  for (int64_t p = 0; p < common; ++p)   // the rows' chains side by side: one add's latency a key, not L
    for (int l = 0; l < L; ++l) sum[l] += s[l * ld + p];
  for (int l = 0; l < L; ++l) {
    for (int64_t p = common; p < r[l]; ++p) sum[l] += s[l * ld + p];
    inv[l] = 1.f / sum[l];
  }
}

// score_narrow, softmax_rows for the lanes' count of rows
template <typename E, int... L>
void narrow_dispatch(int64_t lanes, std::integer_sequence<int, L...>, const float* qt, const E* const* k,
                     int64_t n, int64_t d, float* s, int64_t ld, float* kt, PoolPrefetch& pf) {
  ((lanes == L + 1 ? score_narrow<L + 1>(qt, k, n, d, s, ld, kt, pf) : void()), ...);
}

template <int... L>
void softmax_dispatch(int64_t lanes, std::integer_sequence<int, L...>, float* s, int64_t ld, int64_t n,
                      const int64_t* reach, float* inv) {
  ((lanes == L + 1 ? softmax_rows<L + 1>(s, ld, n, reach, inv) : void()), ...);
}

}  // namespace spmd
