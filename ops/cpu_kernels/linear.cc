// spmd_linear / spmd_linear_int8 / spmd_linear_int4: x[..., K] fp32 @ W[K, N] as Paddle CPU ops,
// for every number of rows T (decode steps, batched decodes, prefill chunks), on the op library's
// thread pool (spmd_set_num_threads).  The kernels are gemm.h's; the weights are read in the layout
// the export stores (weights.h), so a graph keeps one copy of them and no kernel is chosen by size.
//
//   spmd_linear(X [..., K] f32, W [K, N] f32)                               -> [..., N] f32
//   spmd_linear_panels(X, W [K, N] f32 in panels)                           -> X @ W
//     (weights.h's F32P: W's elements in the order spmd_serve/export/panels.py writes; the same sums)
//   spmd_linear_int8(X, Q [K, N] i8, Scale [N] f32)                         -> (X @ Q) * Scale
//   spmd_linear_int4(X, Q [K/2, N] i8 packed, Scale [K/group, N] f32)       -> X @ dequant(Q, Scale)
//     (group = K / Scale.shape[0]; the nibble layout of models/quant.py)
//
// Why not Paddle's matmul: at T <= 16 it reads fp32 W at ~18-22 GB/s where one pass can reach
// ~26-30 GB/s, and the graph cast int8 W to fp32 first (a weight-sized write and re-read per
// step); above, its oneDNN kernel needs a second, reordered copy of the weights (the oneDNN
// predictor) and is single-threaded here unless the whole of Paddle's math library is threaded.
#include <cstdint>
#include <vector>

#include "gemm.h"
#include "paddle/extension.h"

namespace {

std::vector<int64_t> out_shape(const std::vector<int64_t>& x, int64_t n) {
  std::vector<int64_t> out(x.begin(), x.end() - 1);  // [..., K] @ [K, N] → [..., N]
  out.push_back(n);
  return out;
}

// K: the weight's input rows (int4 holds two a byte)
void check_shapes(const char* op, const paddle::Tensor& x, const paddle::Tensor& w, int64_t K) {
  const auto xs = x.shape(), ws = w.shape();
  PD_CHECK(x.is_cpu() && w.is_cpu(), op, ": CPU tensors only");
  PD_CHECK(xs.size() >= 1, op, ": x must have at least one dimension, got a scalar");
  PD_CHECK(ws.size() == 2, op, ": the weight must be 2-D [K, N], got ", ws.size(), " dimensions");
  PD_CHECK(xs.back() == K, op, ": x's last dimension (", xs.back(), ") must equal the weight's rows K (", K, ")");
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32, op, ": x must be float32");
}

template <typename Src>
paddle::Tensor run(const paddle::Tensor& x, int64_t K, int64_t N, const float* scale, const Src& w) {
  auto y = paddle::empty(out_shape(x.shape(), N), paddle::DataType::FLOAT32, x.place());
  int64_t T = 1;                                     // the rows: every dimension of x but the last
  for (size_t i = 0; i + 1 < x.shape().size(); ++i) T *= x.shape()[i];
  // contiguous() is a no-op for the dense tensors a graph passes; it guards strided eager views
  const paddle::Tensor xc = x.contiguous();
  spmd::gemm(xc.data<float>(), w, scale, T, K, N, y.data<float>());
  return y;
}

}  // namespace

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

std::vector<std::vector<int64_t>> LinearShape(const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  PD_CHECK(w.size() == 2, "spmd_linear: the weight must be 2-D [K, N]");
  return {out_shape(x, w[1])};
}

std::vector<std::vector<int64_t>> LinearQuantShape(const std::vector<int64_t>& x, const std::vector<int64_t>& q,
                                                   const std::vector<int64_t>&) {
  return LinearShape(x, q);
}

std::vector<paddle::DataType> LinearDtype(const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

std::vector<paddle::DataType> LinearQuantDtype(const paddle::DataType&, const paddle::DataType&,
                                               const paddle::DataType&) {
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

// The kernels' vector: lanes (16 AVX-512, 8 AVX2 or the plain array) x 1000 + 1 when it is the plain
// array (simd.h SPMD_SIMD 0, which SPMD_EMULATE_WIDTH builds): what a test checks it built.
extern "C" int spmd_simd_lanes() { return static_cast<int>(spmd::kWidth) * 1000 + (SPMD_SIMD == 0 ? 1 : 0); }
