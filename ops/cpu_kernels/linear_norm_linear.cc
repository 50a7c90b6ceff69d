// spmd_linear_norm_linear / _panels / _bf16 / _f16 / _int8 / _int4: a row-shard linear (a layer's o_proj or down),
// the all-reduce of its partial output at TP > 1, and the residual add + RMSNorm + linear (+ SwiGLU)
// that consume it (norm_linear.cc), as ONE Paddle op:
//
//   spmd_linear_norm_linear(X [T, K1], W1 [K1, K2], H [T, K2], NormW [K2], W2 [K2, N]; eps, swiglu, reduce)
//       -> (Out = [swiglu](rms_norm(H + D) * NormW @ W2)  [T, N or N / 2],  Sum = H + D)
//       where D = X @ W1, summed over the MPI ranks when `reduce`
//   _panels: W1, W2 in panels; _bf16 / _f16: W1, W2 in bfloat16 / float16; _int8 / _int4: (Q1, Scale1), (Q2, Scale2) for W1, W2.
//
// Why: every op costs Paddle's executor a few us at batch 1, on the rank's one thread at TP > 1, and
// a Llama layer ran 5 ops at TP = 1 (7 with the all-reduces).  With these it runs 3: norm + qkv
// (fused with the previous layer's down), attention, o + norm + gate|up + SwiGLU.  TP = 2 batch 1
// 1.06x, TP = 1 level (benchmarks/RESULTS.md "Session 48").  The op is the composition of the separate ops'
// own functions, so its outputs equal theirs bit for bit, whatever the threads.
#include <vector>

#include "op_kernels.h"
#include "paddle/extension.h"

namespace {

// The first linear's output, all-reduced when `reduce` (a row shard's partial sum)
paddle::Tensor partial(paddle::Tensor d, bool reduce) { return reduce ? AllReduceForward(d)[0] : d; }

}  // namespace

std::vector<paddle::Tensor> LinearNormLinearForward(const paddle::Tensor& x, const paddle::Tensor& w1,
                                                    const paddle::Tensor& h, const paddle::Tensor& norm_w,
                                                    const paddle::Tensor& w2, float eps, bool swiglu, bool reduce) {
  return NormLinearForward(h, partial(LinearForward(x, w1)[0], reduce), norm_w, w2, eps, swiglu);
}

std::vector<paddle::Tensor> LinearNormLinearPanelsForward(const paddle::Tensor& x, const paddle::Tensor& w1,
                                                          const paddle::Tensor& h, const paddle::Tensor& norm_w,
                                                          const paddle::Tensor& w2, float eps, bool swiglu,
                                                          bool reduce) {
  return NormLinearPanelsForward(h, partial(LinearPanelsForward(x, w1)[0], reduce), norm_w, w2, eps, swiglu);
}

std::vector<paddle::Tensor> LinearNormLinearBf16Forward(const paddle::Tensor& x, const paddle::Tensor& w1,
                                                        const paddle::Tensor& h, const paddle::Tensor& norm_w,
                                                        const paddle::Tensor& w2, float eps, bool swiglu, bool reduce) {
  return NormLinearBf16Forward(h, partial(LinearBf16Forward(x, w1)[0], reduce), norm_w, w2, eps, swiglu);
}

std::vector<paddle::Tensor> LinearNormLinearF16Forward(const paddle::Tensor& x, const paddle::Tensor& w1,
                                                       const paddle::Tensor& h, const paddle::Tensor& norm_w,
                                                       const paddle::Tensor& w2, float eps, bool swiglu, bool reduce) {
  return NormLinearF16Forward(h, partial(LinearF16Forward(x, w1)[0], reduce), norm_w, w2, eps, swiglu);
}

std::vector<paddle::Tensor> LinearNormLinearInt8Forward(const paddle::Tensor& x, const paddle::Tensor& q1,
                                                        const paddle::Tensor& s1, const paddle::Tensor& h,
                                                        const paddle::Tensor& norm_w, const paddle::Tensor& q2,
                                                        const paddle::Tensor& s2, float eps, bool swiglu,
                                                        bool reduce) {
  return NormLinearInt8Forward(h, partial(LinearInt8Forward(x, q1, s1)[0], reduce), norm_w, q2, s2, eps, swiglu);
}

std::vector<paddle::Tensor> LinearNormLinearInt4Forward(const paddle::Tensor& x, const paddle::Tensor& q1,
                                                        const paddle::Tensor& s1, const paddle::Tensor& h,
                                                        const paddle::Tensor& norm_w, const paddle::Tensor& q2,
                                                        const paddle::Tensor& s2, float eps, bool swiglu,
                                                        bool reduce) {
  return NormLinearInt4Forward(h, partial(LinearInt4Forward(x, q1, s1)[0], reduce), norm_w, q2, s2, eps, swiglu);
}

namespace {

// Out [..., N or N / 2] (N: the second weight's columns), Sum as H
std::vector<std::vector<int64_t>> out_and_sum(const std::vector<int64_t>& h, const std::vector<int64_t>& w2,
                                              bool swiglu) {
  PD_CHECK(w2.size() == 2, "spmd_linear_norm_linear: the second weight must be 2-D");
  PD_CHECK(!swiglu || w2[1] % 2 == 0, "spmd_linear_norm_linear: swiglu needs an even number of columns (gate | up)");
  std::vector<int64_t> out(h.begin(), h.end() - (h.empty() ? 0 : 1));
  out.push_back(swiglu ? w2[1] / 2 : w2[1]);
  return {out, h};
}

using Shape = std::vector<int64_t>;
using DType = paddle::DataType;

}  // namespace

std::vector<Shape> LinearNormLinearShape(const Shape&, const Shape&, const Shape& h, const Shape&, const Shape& w2,
                                         float, bool swiglu, bool) {
  return out_and_sum(h, w2, swiglu);
}

std::vector<Shape> LinearNormLinearQuantShape(const Shape&, const Shape&, const Shape&, const Shape& h, const Shape&,
                                              const Shape& q2, const Shape&, float, bool swiglu, bool) {
  return out_and_sum(h, q2, swiglu);
}

std::vector<DType> LinearNormLinearDtype(const DType&, const DType&, const DType&, const DType&, const DType&) {
  return {DType::FLOAT32, DType::FLOAT32};
}

std::vector<DType> LinearNormLinearQuantDtype(const DType&, const DType&, const DType&, const DType&, const DType&,
                                              const DType&, const DType&) {
  return {DType::FLOAT32, DType::FLOAT32};
}

#define SPMD_LINEAR_NORM_LINEAR(name, fn, shape, dtype, ...) \
  PD_BUILD_OP(name)                                          \
      .Inputs({__VA_ARGS__})                                 \
      .Outputs({"Out", "Sum"})                               \
      .Attrs({"eps: float", "swiglu: bool", "reduce: bool"}) \
      .SetKernelFn(PD_KERNEL(fn))                            \
      .SetInferShapeFn(PD_INFER_SHAPE(shape))                \
      .SetInferDtypeFn(PD_INFER_DTYPE(dtype))

SPMD_LINEAR_NORM_LINEAR(spmd_linear_norm_linear, LinearNormLinearForward, LinearNormLinearShape,
                        LinearNormLinearDtype, "X", "W1", "H", "NormW", "W2");
SPMD_LINEAR_NORM_LINEAR(spmd_linear_norm_linear_panels, LinearNormLinearPanelsForward, LinearNormLinearShape,
                        LinearNormLinearDtype, "X", "W1", "H", "NormW", "W2");
SPMD_LINEAR_NORM_LINEAR(spmd_linear_norm_linear_bf16, LinearNormLinearBf16Forward, LinearNormLinearShape,
                        LinearNormLinearDtype, "X", "W1", "H", "NormW", "W2");
SPMD_LINEAR_NORM_LINEAR(spmd_linear_norm_linear_f16, LinearNormLinearF16Forward, LinearNormLinearShape,
                        LinearNormLinearDtype, "X", "W1", "H", "NormW", "W2");
SPMD_LINEAR_NORM_LINEAR(spmd_linear_norm_linear_int8, LinearNormLinearInt8Forward, LinearNormLinearQuantShape,
                        LinearNormLinearQuantDtype, "X", "Q1", "Scale1", "H", "NormW", "Q2", "Scale2");
SPMD_LINEAR_NORM_LINEAR(spmd_linear_norm_linear_int4, LinearNormLinearInt4Forward, LinearNormLinearQuantShape,
                        LinearNormLinearQuantDtype, "X", "Q1", "Scale1", "H", "NormW", "Q2", "Scale2");
