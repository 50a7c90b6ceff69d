// spmd_linear_int8 / spmd_linear_int4: x[..., K] fp32 @ dequant(Q) as Paddle CPU ops, with gemm.h's
// int8 and int4 kernels (the fp32 ops and the shared checks: linear.cc, linear_op.h).
//
//   spmd_linear_int8(X, Q [K, N] i8, Scale [N] f32)                         -> (X @ Q) * Scale
//   spmd_linear_int4(X, Q [K/2, N] i8 packed, Scale [K/group, N] f32)       -> X @ dequant(Q, Scale)
//     (group = K / Scale.shape[0]; the nibble layout of models/quant.py)
#include <cstdint>
#include <vector>

#include "linear_op.h"

extern "C" int spmd_int8_exact();   // amx_tiles.cc

using spmd_linear::check_shapes;
using spmd_linear::run;

std::vector<paddle::Tensor> LinearInt8Forward(const paddle::Tensor& x, const paddle::Tensor& q,
                                              const paddle::Tensor& scale) {
  check_shapes("spmd_linear_int8", x, q, q.shape().empty() ? -1 : q.shape()[0]);
  PD_CHECK(q.dtype() == paddle::DataType::INT8, "spmd_linear_int8: the weight must be int8");
  PD_CHECK(scale.dtype() == paddle::DataType::FLOAT32, "spmd_linear_int8: scale must be float32");
  PD_CHECK(scale.shape().size() == 1 && scale.shape()[0] == q.shape()[1],
           "spmd_linear_int8: scale must be [N] = [", q.shape()[1], "], one per output column");
  const paddle::Tensor qc = q.contiguous(), sc = scale.contiguous();
  const int64_t K = q.shape()[0], N = q.shape()[1];
  return {run(x, K, N, sc.data<float>(), spmd::I8W{qc.data<int8_t>(), N})};
}

std::vector<paddle::Tensor> LinearInt4Forward(const paddle::Tensor& x, const paddle::Tensor& q,
                                              const paddle::Tensor& scale) {
  const int64_t K = q.shape().empty() ? -1 : 2 * q.shape()[0];
  check_shapes("spmd_linear_int4", x, q, K);
  PD_CHECK(q.dtype() == paddle::DataType::INT8, "spmd_linear_int4: the weight must be int8 (two int4 a byte)");
  PD_CHECK(scale.dtype() == paddle::DataType::FLOAT32, "spmd_linear_int4: scale must be float32");
  const auto ss = scale.shape();
  const int64_t N = q.shape()[1];
  PD_CHECK(ss.size() == 2 && ss[1] == N && ss[0] > 0 && K % ss[0] == 0 && (K / ss[0]) % 2 == 0,
           "spmd_linear_int4: scale must be [K / group, N] with an even group dividing K = ", K, ", N = ", N);
  const paddle::Tensor qc = q.contiguous(), sc = scale.contiguous();
  return {run(x, K, N, nullptr, spmd::I4W{qc.data<int8_t>(), sc.data<float>(), N, K / ss[0]})};
}

std::vector<std::vector<int64_t>> LinearQuantShape(const std::vector<int64_t>& x, const std::vector<int64_t>& q,
                                                   const std::vector<int64_t>&) {
  return spmd_linear::shape(x, q);
}

std::vector<paddle::DataType> LinearQuantDtype(const paddle::DataType&, const paddle::DataType&,
                                               const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

// 1 when int8 weights take gemm_bf16.h's bf16 paths here (not AMX's exact ones), for the tests and the logs
extern "C" int spmd_int8_bf16() {
#ifdef SPMD_HAVE_BF16_INT8
  return spmd_int8_exact() ? 0 : 1;
#else
  return 0;
#endif
}

PD_BUILD_OP(spmd_linear_int8)
    .Inputs({"X", "Q", "Scale"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(LinearInt8Forward))
    .SetInferShapeFn(PD_INFER_SHAPE(LinearQuantShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LinearQuantDtype));

PD_BUILD_OP(spmd_linear_int4)
    .Inputs({"X", "Q", "Scale"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(LinearInt4Forward))
    .SetInferShapeFn(PD_INFER_SHAPE(LinearQuantShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LinearQuantDtype));
