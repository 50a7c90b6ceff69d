// spmd_moe_experts: this rank's routed experts of a MoE layer in one grouped pass (DeepSeek): each
// expert computes SwiGLU(x @ gate|up) @ down over only the tokens routed to it, and each result is
// added into its token's row weighted by the router.  The Paddle fallback (one batched matmul over
// every local expert and every token, masked by the combine weights) does E_local / k times the
// arithmetic; here the weights are streamed once per block of an expert's rows.
//   x        [T, H] f32          the normed hidden states of the step
//   idx      [T, k] i64          routed experts, relative to this rank's first (others are ignored)
//   weight   [T, k] f32          their combine weights (normalised, scaled)
//   gate_up  [E, H, 2I] f32      this rank's experts: gate | up columns
//   down     [E, I, H] f32
// Output: [T, H] f32, this rank's partial sum of the routed experts (zero for tokens it has none of).
#include <algorithm>
#include <cmath>
#include <vector>

#include "paddle/extension.h"

namespace {

constexpr int64_t kRows = 8;  // rows computed together: each weight row is read once per block

inline void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
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
  const float *xp = x.data<float>(), *wp = weight.data<float>(), *gu = gate_up.data<float>(), *dn = down.data<float>();
  const int64_t* ip = idx.data<int64_t>();
  float* op = out.data<float>();
  std::vector<std::vector<int64_t>> routed(E);  // (token * k + slot) per expert
  for (int64_t t = 0; t < T * k; ++t)
    if (ip[t] >= 0 && ip[t] < E) routed[ip[t]].push_back(t);
  std::vector<float> acc(kRows * I2), act(kRows * I);
  for (int64_t e = 0; e < E; ++e) {
    const float *W1 = gu + e * H * I2, *W2 = dn + e * I * H;
    const auto& rows = routed[e];
    for (size_t r0 = 0; r0 < rows.size(); r0 += kRows) {
      const int64_t n = std::min<int64_t>(kRows, rows.size() - r0);
      std::fill(acc.begin(), acc.begin() + n * I2, 0.f);
      for (int64_t i = 0; i < H; ++i)  // [n, H] @ [H, 2I]: row i of W1 once for the block
        for (int64_t r = 0; r < n; ++r) axpy(xp[rows[r0 + r] / k * H + i], W1 + i * I2, acc.data() + r * I2, I2);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < I; ++j) {  // silu(gate) * up, times the router's weight
          const float g = acc[r * I2 + j];
          act[r * I + j] = g / (1.f + std::exp(-g)) * acc[r * I2 + I + j] * wp[rows[r0 + r]];
        }
      for (int64_t j = 0; j < I; ++j)  // += act @ down: row j of W2 once for the block
        for (int64_t r = 0; r < n; ++r) axpy(act[r * I + j], W2 + j * H, op + rows[r0 + r] / k * H, H);
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
