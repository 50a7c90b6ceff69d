// spmd_moe_experts: this rank's routed experts of a MoE layer in one grouped pass (DeepSeek): each
// expert computes SwiGLU(x @ gate|up) @ down over only the tokens routed to it, and each result is
// added into its token's row weighted by the router.  The Paddle fallback (one batched matmul over
// every local expert and every token, masked by the combine weights) does E_local / k times the
// arithmetic; here each expert is a task on the op library's threads, its two products gemm.h's
// over just its tokens (weights read once per round of kTokenChunk tokens), and a token's results
// are added in its slots' order afterwards, so the bits do not depend on the thread count.
//   x        [T, H] f32          the normed hidden states of the step
//   idx      [T, k] i64          routed experts, relative to this rank's first (others are ignored)
//   weight   [T, k] f32          their combine weights (normalised, scaled)
//   gate_up  [E, H, 2I] f32      this rank's experts: gate | up columns
//   down     [E, I, H] f32
// Output: [T, H] f32, this rank's partial sum of the routed experts (zero for tokens it has none of).
#include <algorithm>
#include <cmath>
#include <vector>

#include "gemm.h"
#include "paddle/extension.h"

namespace {

constexpr int64_t kTokenChunk = 64;  // tokens a round: bounds the routed rows' scratch ([chunk * k, H])

// One expert's tokens of a round: xe [n, H] = their rows of x; z [n, H] = SwiGLU(xe @ gate_up) *
// router weight, @ down.  gemm.h (inline, as a task of the round: the same bits on any thread)
void run_expert(const float* x, const float* weight, const float* gu, const float* dn, const std::vector<int64_t>& rows,
                int64_t k, int64_t H, int64_t I, float* z) {
  const int64_t n = static_cast<int64_t>(rows.size()), I2 = 2 * I;
  thread_local spmd::AlignedVector<float> xe, acc, act;
  xe.resize(n * H);
  acc.resize(n * I2);
  act.resize(n * I);
  for (int64_t r = 0; r < n; ++r) std::copy_n(x + rows[r] / k * H, H, xe.data() + r * H);
  spmd::gemm(xe.data(), spmd::F32W{gu, I2}, nullptr, n, H, I2, acc.data());   // [n, 2I]
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < I; ++j) {  // silu(gate) * up, times the router's weight
      const float g = acc[r * I2 + j];
      act[r * I + j] = g / (1.f + std::exp(-g)) * acc[r * I2 + I + j] * weight[rows[r]];
    }
  spmd::gemm(act.data(), spmd::F32W{dn, H}, nullptr, n, I, H, z);   // [n, H]
}

}  // namespace

std::vector<paddle::Tensor> MoeExpertsForward(const paddle::Tensor& x, const paddle::Tensor& idx,
                                              const paddle::Tensor& weight, const paddle::Tensor& gate_up,
                                              const paddle::Tensor& down) {
  const auto f32 = paddle::DataType::FLOAT32;
  PD_CHECK(x.dtype() == f32 && weight.dtype() == f32 && gate_up.dtype() == f32 && down.dtype() == f32,
           "spmd_moe_experts: x, weight and the expert weights must be float32");
  PD_CHECK(idx.dtype() == paddle::DataType::INT64, "spmd_moe_experts: idx must be int64");
  const auto xs = x.shape(), is = idx.shape(), gs = gate_up.shape(), ds = down.shape();
  PD_CHECK(xs.size() == 2 && is.size() == 2 && gs.size() == 3 && ds.size() == 3,
           "spmd_moe_experts: expected x [T, H], idx [T, k], gate_up [E, H, 2I], down [E, I, H]");
  const int64_t T = xs[0], H = xs[1], k = is[1], E = gs[0], I2 = gs[2], I = I2 / 2;
  PD_CHECK(is[0] == T && weight.shape() == is && gs[1] == H && ds[0] == E && ds[1] == I && ds[2] == H && I2 % 2 == 0,
           "spmd_moe_experts: shapes do not agree");
  auto out = paddle::full({T, H}, 0.f, f32, x.place());
  const paddle::Tensor xc = x.contiguous(), ic = idx.contiguous(), wc = weight.contiguous();
  const paddle::Tensor gc = gate_up.contiguous(), dc = down.contiguous();
  const float *xp = xc.data<float>(), *wp = wc.data<float>(), *gu = gc.data<float>(), *dn = dc.data<float>();
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
      run_expert(xp, wp, gu + e * H * I2, dn + e * I * H, routed[e], k, H, I, z.data() + offset[e] * H);
    });
    // each token's row: its slots' results added in slot order, from 0 (any thread count: the same sum)
    for (int64_t p = t0 * k; p < t1 * k; ++p) {
      if (ip[p] < 0 || ip[p] >= E) continue;
      const float* src = z.data() + at[p - t0 * k] * H;
      float* dst = op + p / k * H;
      for (int64_t i = 0; i < H; ++i) dst[i] += src[i];
    }
  }
  return {out};
}

std::vector<std::vector<int64_t>> MoeExpertsShape(const std::vector<int64_t>& x, const std::vector<int64_t>&,
                                                  const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                  const std::vector<int64_t>&) {
  return {x};
}

std::vector<paddle::DataType> MoeExpertsDtype(const paddle::DataType& x, const paddle::DataType&,
                                              const paddle::DataType&, const paddle::DataType&,
                                              const paddle::DataType&) {
  return {x};
}

PD_BUILD_OP(spmd_moe_experts)
    .Inputs({"X", "Idx", "Weight", "GateUp", "Down"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(MoeExpertsForward))
    .SetInferShapeFn(PD_INFER_SHAPE(MoeExpertsShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(MoeExpertsDtype));
