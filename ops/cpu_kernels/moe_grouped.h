// The grouped pass of the MoE expert ops (moe_experts.cc: fp32 [E, K, N], int8, int4 stacks;
// moe_experts_panels.cc: fp32, bf16 and f16 stacks in panels), as templates over the stack's weight
// form (weight_stacks.h): each expert computes SwiGLU(x @ gate|up) @ down over only the tokens routed
// to it, as a task on the op library's threads, and each token's results are added in its slots'
// order afterwards, so the bits do not depend on the thread count (moe_experts.cc says more).  Also
// the ops' shared shape checks.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "gemm.h"
#include "paddle/extension.h"
#include "weight_stacks.h"

namespace spmd_moe {

constexpr int64_t kTokenChunk = 64;  // tokens a round: bounds the routed rows' scratch ([chunk * k, H])

// y [n, N] = x [n, K] @ the stack's expert e
template <typename Stack>
void product(const Stack& s, int64_t e, const float* x, int64_t n, float* y) {
  const auto [w, scale] = s.at(e);
  spmd::gemm(x, w, scale, n, s.K, s.N, y);
}

// One expert's tokens of a round: xe [n, H] = their rows of x; z [n, H] = SwiGLU(xe @ gate_up) *
// router weight, @ down.  gemm.h (inline, as a task of the round: the same bits on any thread)
template <typename Stack>
void run_expert(const float* x, const float* weight, const Stack& gu, const Stack& dn, int64_t e,
                const std::vector<int64_t>& rows, int64_t k, float* z) {
  const int64_t n = static_cast<int64_t>(rows.size()), H = gu.K, I2 = gu.N, I = I2 / 2;
  thread_local spmd::AlignedVector<float> xe, acc, act;
  xe.resize(n * H);
  acc.resize(n * I2);
  act.resize(n * I);
  for (int64_t r = 0; r < n; ++r) std::copy_n(x + rows[r] / k * H, H, xe.data() + r * H);
  product(gu, e, xe.data(), n, acc.data());   // [n, 2I]
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < I; ++j) {  // silu(gate) * up, times the router's weight
      const float g = acc[r * I2 + j];
      act[r * I + j] = g / (1.f + std::exp(-g)) * acc[r * I2 + I + j] * weight[rows[r]];
    }
  product(dn, e, act.data(), n, z);   // [n, H]
}

// The op for x [T, H], idx / weight [T, k], E experts' stacks gate_up [E][H, 2I] and down [E][I, H]
template <typename Stack>
paddle::Tensor grouped(const paddle::Tensor& x, const paddle::Tensor& idx, const paddle::Tensor& weight, int64_t E,
                       const Stack& gu, const Stack& dn) {
  const int64_t T = x.shape()[0], H = gu.K, k = idx.shape()[1];
  auto out = paddle::full({T, H}, 0.f, paddle::DataType::FLOAT32, x.place());
  const paddle::Tensor xc = x.contiguous(), ic = idx.contiguous(), wc = weight.contiguous();
  const float *xp = xc.data<float>(), *wp = wc.data<float>();
  const int64_t* ip = ic.data<int64_t>();
  float* op = out.data<float>();
  std::vector<std::vector<int64_t>> routed(E);  // (token * k + slot) per expert, this round's
  std::vector<int64_t> active, at(kTokenChunk * k);   // at[t * k + s - t0 * k]: the pair's row of z
  std::vector<int64_t> offset(E + 1);
  std::vector<float> z;                               // the pairs' results, expert by expert
  for (int64_t t0 = 0; t0 < T; t0 += kTokenChunk) {
    const int64_t t1 = std::min(T, t0 + kTokenChunk);
    for (auto& r : routed) r.clear();
    for (int64_t p = t0 * k; p < t1 * k; ++p)
      if (ip[p] >= 0 && ip[p] < E) routed[ip[p]].push_back(p);
    active.clear();
    for (int64_t e = 0; e < E; ++e) {
      offset[e + 1] = offset[e] + static_cast<int64_t>(routed[e].size());
      if (!routed[e].empty()) active.push_back(e);
      for (size_t r = 0; r < routed[e].size(); ++r) at[routed[e][r] - t0 * k] = offset[e] + r;
    }
    z.resize(offset[E] * H);
    // the experts with the most rows first: tasks are handed out in order, so the long ones do not come last
    std::stable_sort(active.begin(), active.end(), [&](int64_t a, int64_t b) { return routed[a].size() > routed[b].size(); });
    spmd::parallel_for(static_cast<int64_t>(active.size()), [&](int64_t i) {
      const int64_t e = active[i];
      run_expert(xp, wp, gu, dn, e, routed[e], k, z.data() + offset[e] * H);
    });
    // each token's row: its slots' results added in slot order, from 0 (any thread count: the same sum)
    for (int64_t p = t0 * k; p < t1 * k; ++p) {
      if (ip[p] < 0 || ip[p] >= E) continue;
      const float* src = z.data() + at[p - t0 * k] * H;
      float* dst = op + p / k * H;
      for (int64_t i = 0; i < H; ++i) dst[i] += src[i];
    }
  }
  return out;
}

// x, idx, weight and the stacks' shapes: (T, H, E, I), the op named in every refusal
struct Dims {
  int64_t H, E, I;
};
inline Dims check(const char* op, const paddle::Tensor& x, const paddle::Tensor& idx, const paddle::Tensor& weight,
           const std::vector<int64_t>& gs, const std::vector<int64_t>& ds, int64_t rows_per_byte) {
  const auto f32 = paddle::DataType::FLOAT32;
  PD_CHECK(x.dtype() == f32 && weight.dtype() == f32, op, ": x and weight must be float32");
  PD_CHECK(idx.dtype() == paddle::DataType::INT64, op, ": idx must be int64");
  const auto xs = x.shape(), is = idx.shape();
  PD_CHECK(xs.size() == 2 && is.size() == 2 && gs.size() == 3 && ds.size() == 3, op,
           ": expected x [T, H], idx [T, k], gate_up [E, H, 2I], down [E, I, H]");
  const int64_t H = xs[1], E = gs[0], I2 = gs[2], I = I2 / 2;
  PD_CHECK(is[0] == xs[0] && weight.shape() == is && gs[1] * rows_per_byte == H && ds[0] == E &&
               ds[1] * rows_per_byte == I && ds[2] == H && I2 % 2 == 0,
           op, ": shapes do not agree");
  return {H, E, I};
}

}  // namespace spmd_moe

// the shape and dtype functions of the ops taking (X, Idx, Weight, GateUp, Down): Out is x's
inline std::vector<std::vector<int64_t>> MoeExpertsShape(const std::vector<int64_t>& x, const std::vector<int64_t>&,
                                                  const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                  const std::vector<int64_t>&) {
  return {x};
}

inline std::vector<paddle::DataType> MoeExpertsDtype(const paddle::DataType& x, const paddle::DataType&,
                                              const paddle::DataType&, const paddle::DataType&,
                                              const paddle::DataType&) {
  return {x};
}
