// The blocked path of gemm.h (T > kStreamRows: prefill chunks, batched decodes): packing a
// [kKC, kNC] block of W into fp32 micro-panels and the kMR x kNR register-blocked micro-kernel.
// gemm.h owns the task split and the summation order every path shares (see its top comment).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "simd.h"
#include "weights.h"

namespace spmd {

constexpr int64_t kMR = 6;                  // blocked: rows of x per micro-kernel
#if defined(__AVX512F__)
constexpr int64_t kNV = 4;                  // blocked: vectors of columns per micro-kernel (6 x 4 accumulators)
#else
constexpr int64_t kNV = 2;                  // AVX2's 16 registers: 6 x 2 accumulators
#endif
constexpr int64_t kNR = kNV * kWidth;       // blocked: columns per micro-panel
constexpr int64_t kKC = 128;                // both: rows of W per chunk of the sum (blocked: a micro-panel, 32 KiB)
constexpr int64_t kNC = 256;                // blocked: columns per task, at most
constexpr int64_t kPackPrefetchRows = 8;    // blocked: software prefetch distance of the packing

// [kb, nb] block of W from (k0, n0) → fp32 micro-panels dst[nb / kNR rounded up][kb][kNR], zero-padded
template <typename Src>
void pack(const Src& w, int64_t k0, int64_t kb, int64_t n0, int64_t nb, int64_t K, float* dst) {
  const int64_t full = nb / kWidth * kWidth;
  for (int64_t k = 0; k < kb; ++k) {
    // a task reads W in short runs (nb columns of each row): without the prefetch, one row ahead
    // per cache line, the hardware prefetchers leave it latency-bound
    if (k0 + k + kPackPrefetchRows < K)
      for (int64_t j = 0; j < nb; j += Src::kLine) __builtin_prefetch(w.at(k0 + k + kPackPrefetchRows, n0 + j));
    for (int64_t j = 0; j < full; j += kWidth)
      vstore(dst + (j / kNR) * kb * kNR + k * kNR + j % kNR, w.vec(k0 + k, n0 + j));
    for (int64_t j = full; j < (nb + kNR - 1) / kNR * kNR; ++j)
      dst[(j / kNR) * kb * kNR + k * kNR + j % kNR] = j < nb ? w.one(k0 + k, n0 + j) : 0.f;
  }
}

// c[M, kNR] (row stride ldc) = (zero ? 0 : c) + x[M, kb] (row stride ldx) @ panel[kb, kNR], the
// block's product summed from 0 (one chunk of the sum: see the top)
template <int M>
void micro(const float* x, int64_t ldx, const float* panel, int64_t kb, float* c, int64_t ldc, bool zero) {
  Vec acc[M][kNV];
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < kNV; ++v) acc[m][v] = vzero();
  for (int64_t k = 0; k < kb; ++k) {
    Vec wv[kNV];
    for (int v = 0; v < kNV; ++v) wv[v] = vload(panel + k * kNR + v * kWidth);
    for (int m = 0; m < M; ++m) {
      const Vec xb = vset1(x[m * ldx + k]);
      for (int v = 0; v < kNV; ++v) acc[m][v] = vfma(xb, wv[v], acc[m][v]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < kNV; ++v) {
      float* out = c + m * ldc + v * kWidth;
      vstore(out, zero ? acc[m][v] : vadd(vload(out), acc[m][v]));
    }
}

template <int... M>
void micro_dispatch(int64_t m, std::integer_sequence<int, M...>, const float* x, int64_t ldx, const float* panel,
                    int64_t kb, float* c, int64_t ldc, bool zero) {
  ((m == M + 1 ? micro<M + 1>(x, ldx, panel, kb, c, ldc, zero) : void()), ...);
}

// y[:, n0:n0+nb] for all T rows (one task of the blocked path); buf holds kKC x kNC floats
template <typename Src>
void blocked_columns(const float* x, const Src& w, int64_t T, int64_t K, int64_t N, int64_t n0, int64_t nb,
                     float* buf, float* y) {
  constexpr auto kRows = std::make_integer_sequence<int, kMR>{};
  float edge[kMR * kNR];   // the last micro-panel when nb is not a multiple of kNR
  for (int64_t k0 = 0; k0 < K; k0 += kKC) {
    const int64_t kb = std::min(kKC, K - k0);
    pack(w, k0, kb, n0, nb, K, buf);
    for (int64_t j = 0; j < nb; j += kNR) {
      const float* panel = buf + (j / kNR) * kb * kNR;
      const int64_t cols = std::min(kNR, nb - j);
      for (int64_t t0 = 0; t0 < T; t0 += kMR) {
        const int64_t m = std::min(kMR, T - t0);
        float* c = y + t0 * N + n0 + j;
        if (cols == kNR) {
          micro_dispatch(m, kRows, x + t0 * K + k0, K, panel, kb, c, N, k0 == 0);
          continue;
        }
        for (int64_t r = 0; r < m && k0 > 0; ++r) std::copy_n(c + r * N, cols, edge + r * kNR);
        micro_dispatch(m, kRows, x + t0 * K + k0, K, panel, kb, edge, kNR, k0 == 0);
        for (int64_t r = 0; r < m; ++r) std::copy_n(edge + r * kNR, cols, c + r * N);
      }
    }
  }
}

}  // namespace spmd
