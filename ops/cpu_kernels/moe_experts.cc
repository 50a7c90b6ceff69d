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
// spmd_moe_experts_int8 / _int4 take each stack as (Q, Scale) in export/deepseek/batched.py's
// layouts, each expert's slice the layout spmd_linear_int8 / _int4 read: int8 Q [E, H, 2I] with
// Scale [E, 2I]; int4 Q [E, H / 2, 2I] (two a byte along H) with Scale [E, H / group, 2I].
#include <algorithm>
#include <cmath>
#include <vector>

#include "gemm.h"
#include "paddle/extension.h"

namespace {

constexpr int64_t kTokenChunk = 64;  // tokens a round: bounds the routed rows' scratch ([chunk * k, H])

// A stack of E [K, N] weights in one of gemm.h's layouts; at(e) is expert e's (weights.h) and its
// per-column scale (int8) or null
struct F32Stack {
  const float* w;
  int64_t K, N;
  std::pair<spmd::F32W, const float*> at(int64_t e) const { return {{w + e * K * N, N}, nullptr}; }
};
struct I8Stack {
  const int8_t* q;
  const float* scale;   // [E, N]
  int64_t K, N;
  std::pair<spmd::I8W, const float*> at(int64_t e) const { return {{q + e * K * N, N}, scale + e * N}; }
};
struct I4Stack {
  const int8_t* q;      // [E, K / 2, N]
  const float* scale;   // [E, K / group, N]
  int64_t K, N, group;
  std::pair<spmd::I4W, const float*> at(int64_t e) const {
    return {{q + e * K / 2 * N, scale + e * K / group * N, N, group}, nullptr};
  }
};

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
Dims check(const char* op, const paddle::Tensor& x, const paddle::Tensor& idx, const paddle::Tensor& weight,
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

// a per-column scale [E, N] (int8) or a group scale [E, K / group, N] (int4) of a stack
void check_scale(const char* op, const paddle::Tensor& s, int64_t E, int64_t K, int64_t N, bool grouped_scale) {
  PD_CHECK(s.dtype() == paddle::DataType::FLOAT32, op, ": scales must be float32");
  const auto ss = s.shape();
  if (!grouped_scale)
    PD_CHECK(ss.size() == 2 && ss[0] == E && ss[1] == N, op, ": an int8 stack's scale must be [E, N]");
  else
    PD_CHECK(ss.size() == 3 && ss[0] == E && ss[2] == N && ss[1] > 0 && K % ss[1] == 0 && (K / ss[1]) % 2 == 0, op,
             ": an int4 stack's scale must be [E, K / group, N] with an even group dividing K");
}

}  // namespace

std::vector<paddle::Tensor> MoeExpertsForward(const paddle::Tensor& x, const paddle::Tensor& idx,
                                              const paddle::Tensor& weight, const paddle::Tensor& gate_up,
                                              const paddle::Tensor& down) {
  const char* op = "spmd_moe_experts";
  const auto d = check(op, x, idx, weight, gate_up.shape(), down.shape(), 1);
  PD_CHECK(gate_up.dtype() == paddle::DataType::FLOAT32 && down.dtype() == paddle::DataType::FLOAT32, op,
           ": the expert weights must be float32");
  const paddle::Tensor gc = gate_up.contiguous(), dc = down.contiguous();
  return {grouped(x, idx, weight, d.E, F32Stack{gc.data<float>(), d.H, 2 * d.I},
                  F32Stack{dc.data<float>(), d.I, d.H})};
}

// int8 (per-column scales [E, N]) or int4 (two a byte along K, group scales [E, K / group, N]) stacks
std::vector<paddle::Tensor> moe_quant(bool int4, const paddle::Tensor& x, const paddle::Tensor& idx,
                                      const paddle::Tensor& weight, const paddle::Tensor& gu_q,
                                      const paddle::Tensor& gu_s, const paddle::Tensor& dn_q,
                                      const paddle::Tensor& dn_s) {
  const char* op = int4 ? "spmd_moe_experts_int4" : "spmd_moe_experts_int8";
  const auto d = check(op, x, idx, weight, gu_q.shape(), dn_q.shape(), int4 ? 2 : 1);
  PD_CHECK(gu_q.dtype() == paddle::DataType::INT8 && dn_q.dtype() == paddle::DataType::INT8, op,
           ": the expert weights must be int8");
  check_scale(op, gu_s, d.E, d.H, 2 * d.I, int4);
  check_scale(op, dn_s, d.E, d.I, d.H, int4);
  const paddle::Tensor gq = gu_q.contiguous(), gs = gu_s.contiguous(), dq = dn_q.contiguous(), ds = dn_s.contiguous();
  if (!int4)
    return {grouped(x, idx, weight, d.E, I8Stack{gq.data<int8_t>(), gs.data<float>(), d.H, 2 * d.I},
                    I8Stack{dq.data<int8_t>(), ds.data<float>(), d.I, d.H})};
  return {grouped(x, idx, weight, d.E,
                  I4Stack{gq.data<int8_t>(), gs.data<float>(), d.H, 2 * d.I, d.H / gu_s.shape()[1]},
                  I4Stack{dq.data<int8_t>(), ds.data<float>(), d.I, d.H, d.I / dn_s.shape()[1]})};
}

std::vector<paddle::Tensor> MoeExpertsInt8Forward(const paddle::Tensor& x, const paddle::Tensor& idx,
                                                  const paddle::Tensor& weight, const paddle::Tensor& gu_q,
                                                  const paddle::Tensor& gu_s, const paddle::Tensor& dn_q,
                                                  const paddle::Tensor& dn_s) {
  return moe_quant(false, x, idx, weight, gu_q, gu_s, dn_q, dn_s);
}

std::vector<paddle::Tensor> MoeExpertsInt4Forward(const paddle::Tensor& x, const paddle::Tensor& idx,
                                                  const paddle::Tensor& weight, const paddle::Tensor& gu_q,
                                                  const paddle::Tensor& gu_s, const paddle::Tensor& dn_q,
                                                  const paddle::Tensor& dn_s) {
  return moe_quant(true, x, idx, weight, gu_q, gu_s, dn_q, dn_s);
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

std::vector<std::vector<int64_t>> MoeExpertsQuantShape(const std::vector<int64_t>& x, const std::vector<int64_t>&,
                                                       const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                       const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                       const std::vector<int64_t>&) {
  return {x};
}

std::vector<paddle::DataType> MoeExpertsQuantDtype(const paddle::DataType& x, const paddle::DataType&,
                                                   const paddle::DataType&, const paddle::DataType&,
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

PD_BUILD_OP(spmd_moe_experts_int8)
    .Inputs({"X", "Idx", "Weight", "GateUpQ", "GateUpScale", "DownQ", "DownScale"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(MoeExpertsInt8Forward))
    .SetInferShapeFn(PD_INFER_SHAPE(MoeExpertsQuantShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(MoeExpertsQuantDtype));

PD_BUILD_OP(spmd_moe_experts_int4)
    .Inputs({"X", "Idx", "Weight", "GateUpQ", "GateUpScale", "DownQ", "DownScale"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(MoeExpertsInt4Forward))
    .SetInferShapeFn(PD_INFER_SHAPE(MoeExpertsQuantShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(MoeExpertsQuantDtype));
