// spmd_linear / spmd_linear_panels (here) and spmd_linear_int8 / spmd_linear_int4 (linear_quant.cc):
// x[..., K] fp32 @ W[K, N] as Paddle CPU ops,
// for every number of rows T (decode steps, batched decodes, prefill chunks), on the op library's
// thread pool (spmd_set_num_threads).  The kernels are gemm.h's; the weights are read in the layout
// the export stores (weights.h), so a graph keeps one copy of them and no kernel is chosen by size.
//
//   spmd_linear(X [..., K] f32, W [K, N] f32)                               -> [..., N] f32
//   spmd_linear_panels(X, W [K, N] f32 in panels)                           -> X @ W
//     (weights.h's F32P: W's elements in the order spmd_serve/export/panels.py writes; the same sums)
//
// Why not Paddle's matmul: at T <= 16 it reads fp32 W at ~18-22 GB/s where one pass can reach
// ~26-30 GB/s, and the graph cast int8 W to fp32 first (a weight-sized write and re-read per
// step); above, its oneDNN kernel needs a second, reordered copy of the weights (the oneDNN
// predictor) and is single-threaded here unless the whole of Paddle's math library is threaded.
#include <cstdint>
#include <vector>

#include "linear_op.h"

using spmd_linear::check_shapes;
using spmd_linear::run;

std::vector<paddle::Tensor> LinearForward(const paddle::Tensor& x, const paddle::Tensor& w) {
  check_shapes("spmd_linear", x, w, w.shape().empty() ? -1 : w.shape()[0]);
  PD_CHECK(w.dtype() == paddle::DataType::FLOAT32, "spmd_linear: the weight must be float32 (int8: spmd_linear_int8)");
  const paddle::Tensor wc = w.contiguous();
  const int64_t K = w.shape()[0], N = w.shape()[1];
  return {run(x, K, N, nullptr, spmd::F32W{wc.data<float>(), N})};
}

std::vector<paddle::Tensor> LinearPanelsForward(const paddle::Tensor& x, const paddle::Tensor& w) {
  check_shapes("spmd_linear_panels", x, w, w.shape().empty() ? -1 : w.shape()[0]);
  PD_CHECK(w.dtype() == paddle::DataType::FLOAT32, "spmd_linear_panels: the weight must be float32");
  const paddle::Tensor wc = w.contiguous();
  const int64_t K = w.shape()[0], N = w.shape()[1];
  return {run(x, K, N, nullptr, spmd::F32P{wc.data<float>(), K, N})};
}

std::vector<std::vector<int64_t>> LinearShape(const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  return spmd_linear::shape(x, w);
}

std::vector<paddle::DataType> LinearDtype(const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(spmd_linear)
    .Inputs({"X", "W"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(LinearForward))
    .SetInferShapeFn(PD_INFER_SHAPE(LinearShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LinearDtype));

PD_BUILD_OP(spmd_linear_panels)
    .Inputs({"X", "W"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(LinearPanelsForward))
    .SetInferShapeFn(PD_INFER_SHAPE(LinearShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LinearDtype));

// The kernels' vector: lanes (16 AVX-512, 8 AVX2 or the plain array) x 1000 + 1 when it is the plain
// array (simd.h SPMD_SIMD 0, which SPMD_EMULATE_WIDTH builds): what a test checks it built.
extern "C" int spmd_simd_lanes() { return static_cast<int>(spmd::kWidth) * 1000 + (SPMD_SIMD == 0 ? 1 : 0); }
