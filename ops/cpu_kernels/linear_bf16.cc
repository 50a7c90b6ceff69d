// spmd_linear_bf16: x[..., K] fp32 @ W[K, N] held in bfloat16 (an export's --dtype bfloat16), as a
// Paddle CPU op with gemm.h's kernels (the fp32 ops: linear.cc; the shared checks: linear_op.h).
//
//   spmd_linear_bf16(X [..., K] f32, W [K, N] bf16 in panels)              -> [..., N] f32
//     (weights.h's B16P: F32P's order, spmd_serve/export/panels.py)
//
// Weight-only: x stays fp32 and each weight is widened exactly to fp32 in registers, so the output
// is spmd_linear's on the widened weights, bit for bit (the same chains, weights.h B16P).  A decode
// step reads half the bytes of an fp32 weight: the batch-1 GEMV ran 1.87-1.98x as fast with the
// weights held so (benchmarks/RESULTS.md "Session 57").  Its own unit: gemm.h's instantiation for
// one more weight form compiles beside the other two on a second core.
#include <cstdint>
#include <vector>

#include "linear_op.h"

std::vector<paddle::Tensor> LinearBf16Forward(const paddle::Tensor& x, const paddle::Tensor& w) {
  spmd_linear::check_shapes("spmd_linear_bf16", x, w, w.shape().empty() ? -1 : w.shape()[0]);
  PD_CHECK(w.dtype() == paddle::DataType::BFLOAT16, "spmd_linear_bf16: the weight must be bfloat16");
  const paddle::Tensor wc = w.contiguous();
  const int64_t K = w.shape()[0], N = w.shape()[1];
  const auto* bits = reinterpret_cast<const spmd::Bf16*>(wc.data<paddle::bfloat16>());
  return {spmd_linear::run(x, K, N, nullptr, spmd::B16P{bits, K, N})};
}

std::vector<std::vector<int64_t>> LinearBf16Shape(const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  return spmd_linear::shape(x, w);
}

std::vector<paddle::DataType> LinearBf16Dtype(const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(spmd_linear_bf16)
    .Inputs({"X", "W"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(LinearBf16Forward))
    .SetInferShapeFn(PD_INFER_SHAPE(LinearBf16Shape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LinearBf16Dtype));
