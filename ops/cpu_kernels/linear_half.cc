// spmd_linear_bf16 / spmd_linear_f16: x[..., K] fp32 @ W[K, N] held in bfloat16 or float16 (an
// export's --dtype), as Paddle CPU ops with gemm.h's kernels (the fp32 ops: linear.cc; the shared
// checks: linear_op.h).
//
//   spmd_linear_bf16(X [..., K] f32, W [K, N] bf16 in panels)              -> [..., N] f32
//   spmd_linear_f16(X [..., K] f32, W [K, N] f16 in panels)                -> [..., N] f32
//     (weights.h's B16P / F16P: F32P's order, spmd_serve/export/panels.py)
//
// Weight-only: x stays fp32 and each weight is widened exactly to fp32 in registers, so the output
// is spmd_linear's on the widened weights, bit for bit (the same chains, weights.h).  A decode step
// reads half the bytes of an fp32 weight: the batch-1 linears of --demo 1b ran 2.3x as fast in bf16
// (benchmarks/RESULTS.md "Session 58").  Their own unit: gemm.h's instantiations for two more weight
// forms compile beside the others on a second core.
#include <cstdint>
#include <vector>

#include "linear_op.h"
#include "op_build.h"

namespace {

// x @ W for W of Paddle dtype `dt` holding elements E (the same 16 bits)
template <typename E, typename PaddleE>
paddle::Tensor half_linear(const char* op, const char* name, paddle::DataType dt, const paddle::Tensor& x,
                           const paddle::Tensor& w) {
  spmd_linear::check_shapes(op, x, w, w.shape().empty() ? -1 : w.shape()[0]);
  PD_CHECK(w.dtype() == dt, op, ": the weight must be ", name);
  const paddle::Tensor wc = w.contiguous();
  const int64_t K = w.shape()[0], N = w.shape()[1];
  const auto* bits = reinterpret_cast<const E*>(wc.data<PaddleE>());
  return spmd_linear::run(x, K, N, nullptr, spmd::Panels<E>{bits, K, N});
}

}  // namespace

std::vector<paddle::Tensor> LinearBf16Forward(const paddle::Tensor& x, const paddle::Tensor& w) {
  return {half_linear<spmd::Bf16, paddle::bfloat16>("spmd_linear_bf16", "bfloat16", paddle::DataType::BFLOAT16, x, w)};
}

std::vector<paddle::Tensor> LinearF16Forward(const paddle::Tensor& x, const paddle::Tensor& w) {
  return {half_linear<spmd::F16, paddle::float16>("spmd_linear_f16", "float16", paddle::DataType::FLOAT16, x, w)};
}

std::vector<std::vector<int64_t>> LinearHalfShape(const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  return spmd_linear::shape(x, w);
}

std::vector<paddle::DataType> LinearHalfDtype(const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

SPMD_OP(spmd_linear_bf16, LinearBf16Forward, LinearHalfShape, LinearHalfDtype, "X", "W");
SPMD_OP(spmd_linear_f16, LinearF16Forward, LinearHalfShape, LinearHalfDtype, "X", "W");
