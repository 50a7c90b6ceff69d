// spmd_moe_experts_panels / _bf16 / _f16: spmd_moe_experts (moe_experts.cc) over expert stacks with each
// expert's weight in the panel layout the dense linears read (weights.h Panels<E>;
// spmd_serve/export/panels.py applied to each expert), held in float32, or in bfloat16 or float16 (an
// export's --dtype):
//   x        [T, H] f32          the normed hidden states of the step
//   idx      [T, k] i64          routed experts, relative to this rank's first (others are ignored)
//   weight   [T, k] f32          their combine weights
//   gate_up  [E, H, 2I]          each [H, 2I] in panels
//   down     [E, I, H]           each [I, H] in panels
// The same sums as spmd_moe_experts over the [K, N] stacks (a 16-bit weight is widened exactly in
// registers): the outputs bit for bit.  Its own unit: gemm.h's panel forms compile beside the others.
#include <vector>

#include "moe_grouped.h"
#include "op_build.h"

namespace {

// the op `op` over stacks of Paddle dtype `dt` holding elements E (the same bits)
template <typename E, typename PaddleE>
paddle::Tensor panel_experts(const char* op, const char* name, paddle::DataType dt, const paddle::Tensor& x,
                             const paddle::Tensor& idx, const paddle::Tensor& weight, const paddle::Tensor& gate_up,
                             const paddle::Tensor& down) {
  const auto d = spmd_moe::check(op, x, idx, weight, gate_up.shape(), down.shape(), 1);
  PD_CHECK(gate_up.dtype() == dt && down.dtype() == dt, op, ": the expert weights must be ", name);
  const paddle::Tensor gc = gate_up.contiguous(), dc = down.contiguous();
  const auto* gu = reinterpret_cast<const E*>(gc.data<PaddleE>());
  const auto* dn = reinterpret_cast<const E*>(dc.data<PaddleE>());
  return spmd_moe::grouped(x, idx, weight, d.E, spmd::PanelStack<E>{gu, d.H, 2 * d.I},
                           spmd::PanelStack<E>{dn, d.I, d.H});
}

}  // namespace

std::vector<paddle::Tensor> MoeExpertsPanelsForward(const paddle::Tensor& x, const paddle::Tensor& idx,
                                                    const paddle::Tensor& weight, const paddle::Tensor& gate_up,
                                                    const paddle::Tensor& down) {
  return {panel_experts<float, float>("spmd_moe_experts_panels", "float32", paddle::DataType::FLOAT32, x, idx,
                                      weight, gate_up, down)};
}

std::vector<paddle::Tensor> MoeExpertsBf16Forward(const paddle::Tensor& x, const paddle::Tensor& idx,
                                                  const paddle::Tensor& weight, const paddle::Tensor& gate_up,
                                                  const paddle::Tensor& down) {
  return {panel_experts<spmd::Bf16, paddle::bfloat16>("spmd_moe_experts_bf16", "bfloat16",
                                                      paddle::DataType::BFLOAT16, x, idx, weight, gate_up, down)};
}

std::vector<paddle::Tensor> MoeExpertsF16Forward(const paddle::Tensor& x, const paddle::Tensor& idx,
                                                 const paddle::Tensor& weight, const paddle::Tensor& gate_up,
                                                 const paddle::Tensor& down) {
  return {panel_experts<spmd::F16, paddle::float16>("spmd_moe_experts_f16", "float16", paddle::DataType::FLOAT16, x,
                                                    idx, weight, gate_up, down)};
}

SPMD_OP(spmd_moe_experts_panels, MoeExpertsPanelsForward, MoeExpertsShape, MoeExpertsDtype,
        "X", "Idx", "Weight", "GateUp", "Down");
SPMD_OP(spmd_moe_experts_bf16, MoeExpertsBf16Forward, MoeExpertsShape, MoeExpertsDtype,
        "X", "Idx", "Weight", "GateUp", "Down");
SPMD_OP(spmd_moe_experts_f16, MoeExpertsF16Forward, MoeExpertsShape, MoeExpertsDtype,
        "X", "Idx", "Weight", "GateUp", "Down");
