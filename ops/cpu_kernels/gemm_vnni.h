// int8 weights, exact (int8_exact.h), for the smallest steps (T <= kVnniRows: decodes of a few
// sequences) with AVX-512 VNNI's byte dot products: the tile unit computes 16 rows whatever T is, and
// at T = 1 ran at half the fp32 GEMV's bandwidth (benchmarks/RESULTS.md "Session 21").
//
// vpdpbusd multiplies unsigned bytes by signed ones: W goes in as W + 128 (its sign bit flipped), the
// digits as they are, and 128 x the row's sum of each digit (one number per row and digit, not per
// column) comes off again: the same integers as the tile unit's signed products.
//
// Tasks as gemm.h's decode GEMV: a chunk of kVnniKC rows of W (whole rows: long contiguous runs) x a
// range of columns; each keeps int32 sums for a pass of columns in L1 and leaves its chunk's exact
// int64 sums in a partial; the last of a column range's chunks to finish adds them (in any order:
// integers) and rounds once.
#pragma once

#include "int8_exact.h"

#ifdef SPMD_HAVE_EXACT_INT8

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "simd.h"
#include "thread_pool.h"

namespace spmd {

constexpr int64_t kVnniRows = 2;       // T at most (above: the tile unit, faster from 3 rows: RESULTS.md)
constexpr int64_t kVnniKC = 1024;      // rows of W per task
constexpr int64_t kVnniAcc = 12288;    // int32 sums per pass, 48 KiB: 3T x columns
constexpr int64_t kVnniPass = 16;      // rows of W per pass over the sums (one pass ahead: prefetched)

// acc[3T][ld] = rows [k0, k1) of (q + 128)[:, n0 : n0 + w] against x's digits: acc[3t + d] row t's
// digit-d sums.  Rows past k1 are read as q = 0 (128: their digits must be zero, i.e. past K).
// Strips of 16 G columns keep their sums in registers for kVnniPass rows; a pass reads those rows
// whole (ld columns).
template <int T>
void vnni_rows(const int8_t* xp, const int8_t* q, int64_t N, int64_t k0, int64_t k1, int64_t n0, int64_t w,
               int64_t ld, int32_t* acc) {
  constexpr int G = 2, S = 3 * T;   // sums, indices, rows: G S + 2 G + 4 of the 32 registers
  const Interleave interleave;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));   // q → q + 128, unsigned
  std::memset(acc, 0, sizeof(int32_t) * S * ld);
  for (int64_t k = k0; k < k1; k += kVnniPass) {
    alignas(64) int32_t xv[kVnniPass / 4][T][3];   // the digits' dwords, broadcast from here
    for (int rg = 0; rg < kVnniPass / 4; ++rg)
      for (int t = 0; t < T; ++t)
        for (int d = 0; d < 3; ++d) std::memcpy(&xv[rg][t][d], digit_at(xp, 1, t, d, k + 4 * rg), 4);
    const bool ahead = k + 2 * kVnniPass <= k1, full = k + kVnniPass <= k1;
    for (int64_t j = 0; j < w; j += 16 * G) {
      if (ahead && j % 64 == 0)
        for (int64_t i = 0; i < kVnniPass; ++i) __builtin_prefetch(q + (k + kVnniPass + i) * N + n0 + j);
      __m512i a[G][S];
      for (int g = 0; g < G; ++g)
        for (int s = 0; s < S; ++s) a[g][s] = _mm512_load_si512(acc + s * ld + j + 16 * g);
      for (int rg = 0; rg < kVnniPass / 4 && k + 4 * rg < k1; ++rg) {
        __m512i row[4];
        if (full && j + 64 <= w)
          for (int i = 0; i < 4; ++i) row[i] = _mm512_loadu_si512(q + (k + 4 * rg + i) * N + n0 + j);
        else
          load_rows(q, N, k + 4 * rg, k1, n0, j, w, row);
        for (int g = 0; g < G; ++g) {
          const __m512i wv = _mm512_xor_si512(interleave(row, g), flip);
          for (int t = 0; t < T; ++t)
            for (int d = 0; d < 3; ++d)
              a[g][3 * t + d] = _mm512_dpbusd_epi32(a[g][3 * t + d], wv, _mm512_set1_epi32(xv[rg][t][d]));
        }
      }
      for (int g = 0; g < G; ++g)
        for (int s = 0; s < S; ++s) _mm512_store_si512(acc + s * ld + j + 16 * g, a[g][s]);
    }
  }
}

// y[T, N] for T <= kVnniRows from x's digits (packed with one row tile)
template <int T>
void vnni_gemm_t(const int8_t* xp, const float* mult, const int8_t* q, const float* scale, int64_t K, int64_t N,
                 float* y) {
  const int64_t threads = num_threads(), chunks = (K + kVnniKC - 1) / kVnniKC;
  const int64_t pass = kVnniAcc / (3 * T) / 64 * 64, vectors = (N + 63) / 64;
  int64_t offset[T];   // 128 x the row's digit sums, combined as S is: what W + 128 added
  for (int t = 0; t < T; ++t) {
    int64_t sum[3] = {0, 0, 0};
    for (int d = 0; d < 3; ++d)
      for (int64_t k = 0; k < K; k += 4)
        for (int i = 0; i < 4; ++i) sum[d] += digit_at(xp, 1, t, d, k)[i];   // past K: zero
    offset[t] = 128 * (sum[2] * 65536 + sum[1] * 256 + sum[0]);
  }
  // column ranges only when the chunks alone give fewer than ~two tasks a thread
  const int64_t groups = std::min(vectors, std::max<int64_t>(1, (2 * threads + chunks - 1) / chunks));
  const int64_t width = (vectors + groups - 1) / groups * 64, ranges = (N + width - 1) / width;
  thread_local std::vector<int64_t> partials;   // the caller's: [chunks][T][N]
  thread_local std::vector<int64_t> finished;   // chunks done, per column range
  grown(partials, chunks * T * N);
  finished.assign(ranges, 0);
  int64_t* const part = partials.data();
  int64_t* const done = finished.data();
  parallel_for(chunks * ranges, [&](int64_t i) {
    const int64_t c = i / ranges, r = i % ranges, c0 = r * width, c1 = std::min(N, c0 + width);
    const int64_t k0 = c * kVnniKC, k1 = std::min(K, k0 + kVnniKC);
    thread_local AlignedVector<int32_t> acc;
    acc.resize(3 * T * pass);
    for (int64_t n0 = c0; n0 < c1; n0 += pass) {
      const int64_t w = std::min(pass, c1 - n0), ld = (w + 63) / 64 * 64;
      vnni_rows<T>(xp, q, N, k0, k1, n0, w, ld, acc.data());
      for (int t = 0; t < T; ++t) {
        const int32_t* s = acc.data() + 3 * t * ld;
        combine_digits(s, s + ld, s + 2 * ld, w, part + (c * T + t) * N + n0);
      }
    }
    // acq_rel: the last sees the other chunks' partials
    if (__atomic_add_fetch(&done[r], 1, __ATOMIC_ACQ_REL) != chunks) return;
    for (int t = 0; t < T; ++t) {
      int64_t* S = part + t * N;   // chunk 0's, summed into in place (integers: any order)
      for (int64_t k = 1; k < chunks; ++k) {
        const int64_t* p = part + (k * T + t) * N;
        int64_t n = c0;
        for (; n + 8 <= c1; n += 8)
          _mm512_storeu_si512(S + n, _mm512_add_epi64(_mm512_loadu_si512(S + n), _mm512_loadu_si512(p + n)));
        for (; n < c1; ++n) S[n] += p[n];
      }
      for (int64_t n = c0; n < c1; ++n) S[n] -= offset[t];
      finish_row(S + c0, mult[t], scale + c0, c1 - c0, y + t * N + c0);
    }
  });
}

inline void vnni_gemm(const int8_t* xp, const float* mult, const int8_t* q, const float* scale, int64_t T, int64_t K,
                      int64_t N, float* y) {
  switch (T) {
    case 1: return vnni_gemm_t<1>(xp, mult, q, scale, K, N, y);
    default: return vnni_gemm_t<2>(xp, mult, q, scale, K, N, y);
  }
}

}  // namespace spmd

#endif
