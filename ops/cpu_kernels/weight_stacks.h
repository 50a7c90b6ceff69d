// A stack of E weights [K, N] in one of gemm.h's layouts (weights.h), as the ops over stacks read them:
// DeepSeek's routed experts (moe_grouped.h) and MLA's absorbed per-head projections (batched_matmul.cc).
// at(e) is weight e and its per-column scale (int8) or null, for spmd::gemm; check_scale checks a
// quantised stack's scales.
#pragma once

#include <cstdint>
#include <utility>

#include "paddle/extension.h"
#include "weights.h"

namespace spmd {

struct F32Stack {
  const float* w;
  int64_t K, N;
  std::pair<F32W, const float*> at(int64_t e) const { return {{w + e * K * N, N}, nullptr}; }
};
struct I8Stack {
  const int8_t* q;
  const float* scale;   // [E, N]
  int64_t K, N;
  std::pair<I8W, const float*> at(int64_t e) const { return {{q + e * K * N, N}, scale + e * N}; }
};
struct I4Stack {
  const int8_t* q;      // [E, K / 2, N]
  const float* scale;   // [E, K / group, N]
  int64_t K, N, group;
  std::pair<I4W, const float*> at(int64_t e) const {
    return {{q + e * K / 2 * N, scale + e * K / group * N, N, group}, nullptr};
  }
};
// fp32, bf16 or f16 (simd.h Bf16, F16): each weight's [K, N] in weights.h's panels (Panels<E>; 16 bits
// widened exactly in registers): the sums of the F32Stack of the (widened) weights, bit for bit
template <typename E>
struct PanelStack {
  const E* w;
  int64_t K, N;
  std::pair<Panels<E>, const float*> at(int64_t e) const { return {{w + e * K * N, K, N}, nullptr}; }
};

// a per-column scale [E, N] (int8) or a group scale [E, K / group, N] (int4) of a stack
inline void check_scale(const char* op, const paddle::Tensor& s, int64_t E, int64_t K, int64_t N, bool grouped_scale) {
  PD_CHECK(s.dtype() == paddle::DataType::FLOAT32, op, ": scales must be float32");
  const auto ss = s.shape();
  if (!grouped_scale)
    PD_CHECK(ss.size() == 2 && ss[0] == E && ss[1] == N, op, ": an int8 stack's scale must be [E, N]");
  else
    PD_CHECK(ss.size() == 3 && ss[0] == E && ss[2] == N && ss[1] > 0 && K % ss[1] == 0 && (K / ss[1]) % 2 == 0, op,
             ": an int4 stack's scale must be [E, K / group, N] with an even group dividing K");
}

}  // namespace spmd
