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
#include <vector>

#include "moe_grouped.h"
#include "op_build.h"

using spmd_moe::check;
using spmd::check_scale;
using spmd_moe::grouped;

std::vector<paddle::Tensor> MoeExpertsForward(const paddle::Tensor& x, const paddle::Tensor& idx,
                                              const paddle::Tensor& weight, const paddle::Tensor& gate_up,
                                              const paddle::Tensor& down) {
  const char* op = "spmd_moe_experts";
  const auto d = check(op, x, idx, weight, gate_up.shape(), down.shape(), 1);
  PD_CHECK(gate_up.dtype() == paddle::DataType::FLOAT32 && down.dtype() == paddle::DataType::FLOAT32, op,
           ": the expert weights must be float32");
  const paddle::Tensor gc = gate_up.contiguous(), dc = down.contiguous();
  return {grouped(x, idx, weight, d.E, spmd::F32Stack{gc.data<float>(), d.H, 2 * d.I},
                  spmd::F32Stack{dc.data<float>(), d.I, d.H})};
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
    return {grouped(x, idx, weight, d.E, spmd::I8Stack{gq.data<int8_t>(), gs.data<float>(), d.H, 2 * d.I},
                    spmd::I8Stack{dq.data<int8_t>(), ds.data<float>(), d.I, d.H})};
  return {grouped(x, idx, weight, d.E,
                  spmd::I4Stack{gq.data<int8_t>(), gs.data<float>(), d.H, 2 * d.I, d.H / gu_s.shape()[1]},
                  spmd::I4Stack{dq.data<int8_t>(), ds.data<float>(), d.I, d.H, d.I / dn_s.shape()[1]})};
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

SPMD_OP(spmd_moe_experts, MoeExpertsForward, MoeExpertsShape, MoeExpertsDtype, "X", "Idx", "Weight", "GateUp",
        "Down");
SPMD_OP(spmd_moe_experts_int8, MoeExpertsInt8Forward, MoeExpertsQuantShape, MoeExpertsQuantDtype, "X", "Idx", "Weight",
        "GateUpQ", "GateUpScale", "DownQ", "DownScale");
SPMD_OP(spmd_moe_experts_int4, MoeExpertsInt4Forward, MoeExpertsQuantShape, MoeExpertsQuantDtype, "X", "Idx", "Weight",
        "GateUpQ", "GateUpScale", "DownQ", "DownScale");
