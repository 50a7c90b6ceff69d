// export/panels.py's to_panels in C++, for the GEMM benchmarks: a [K, N] fp32 weight → weights.h's
// F32P layout (per block of kKC rows, panels of 16 columns, each holding the block's rows in the
// chain's order).
#pragma once

#include <algorithm>
#include <cstdint>

#include "gemm_blocked.h"

inline void to_panels(const float* w, int64_t K, int64_t N, float* out) {
  using spmd::chain_row;
  using spmd::kKC;
  for (int64_t k0 = 0; k0 < K; k0 += kKC) {
    const int64_t kb = std::min(kKC, K - k0);
    for (int64_t p = 0; p * 16 < N; ++p) {
      const int64_t wp = std::min<int64_t>(16, N - p * 16);
      float* dst = out + k0 * N + p * 16 * kb;
      for (int64_t k = 0; k < kb; ++k)
        for (int64_t c = 0; c < wp; ++c) dst[k * wp + c] = w[(k0 + chain_row(kb, k)) * N + p * 16 + c];
    }
  }
}
