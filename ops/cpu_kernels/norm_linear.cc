// spmd_norm_linear / _panels / _bf16 / _f16 / _int8 / _int4: a decoder layer's residual add + RMSNorm, the linear it feeds
// and (attr swiglu) the SwiGLU after it, as ONE Paddle op:
//
//   spmd_norm_linear(H [..., K], Delta [..., K], NormW [K], W [K, N]; eps, swiglu)
//       -> (Out = [swiglu](rms_norm(H + Delta) * NormW @ W)  [..., N or N / 2],  Sum = H + Delta)
//   spmd_norm_linear_panels(H, Delta, NormW, W [K, N] in panels; eps, swiglu)   (linear.cc)
//   spmd_norm_linear_bf16 / _f16(H, Delta, NormW, W [K, N] bf16 / f16 in panels; eps, swiglu) (linear_half.cc)
//   spmd_norm_linear_int8(H, Delta, NormW, Q [K, N] i8, Scale [N]; eps, swiglu)
//   spmd_norm_linear_int4(H, Delta, NormW, Q [K/2, N] i8, Scale [K/group, N]; eps, swiglu)
//
// Why: at batch 1 Paddle's fixed cost per op is ~9 us (the smallest ops' minimum, benchmarks/
// RESULTS.md "Session 13"), and a Llama layer ran 8 ops; these make it 5 (norm+qkv, attention, o,
// norm+gate|up+SwiGLU, down).  Each op is the composition of the separate ops' own functions
// (elementwise.cc, linear.cc), so its outputs equal theirs bit for bit, whatever the threads.
#include <vector>

#include "op_kernels.h"
#include "paddle/extension.h"

namespace {

// (linear(norm) [swiglu'd], sum) for `linear` one of the linear ops' kernels on the normed rows
template <typename Linear>
std::vector<paddle::Tensor> fused(const paddle::Tensor& h, const paddle::Tensor& delta, const paddle::Tensor& norm_w,
                                  float eps, bool swiglu, Linear&& linear) {
  std::vector<paddle::Tensor> normed_sum = AddRmsNormForward(h, delta, norm_w, eps);   // {norm, h + delta}
  paddle::Tensor out = linear(normed_sum[0]);
  if (swiglu) out = SwigluForward(out)[0];
  return {out, normed_sum[1]};
}

}  // namespace

std::vector<paddle::Tensor> NormLinearForward(const paddle::Tensor& h, const paddle::Tensor& delta,
                                              const paddle::Tensor& norm_w, const paddle::Tensor& w, float eps,
                                              bool swiglu) {
  return fused(h, delta, norm_w, eps, swiglu, [&](const paddle::Tensor& x) { return LinearForward(x, w)[0]; });
}

std::vector<paddle::Tensor> NormLinearPanelsForward(const paddle::Tensor& h, const paddle::Tensor& delta,
                                                    const paddle::Tensor& norm_w, const paddle::Tensor& w, float eps,
                                                    bool swiglu) {
  return fused(h, delta, norm_w, eps, swiglu, [&](const paddle::Tensor& x) { return LinearPanelsForward(x, w)[0]; });
}

std::vector<paddle::Tensor> NormLinearBf16Forward(const paddle::Tensor& h, const paddle::Tensor& delta,
                                                  const paddle::Tensor& norm_w, const paddle::Tensor& w, float eps,
                                                  bool swiglu) {
  return fused(h, delta, norm_w, eps, swiglu, [&](const paddle::Tensor& x) { return LinearBf16Forward(x, w)[0]; });
}

std::vector<paddle::Tensor> NormLinearF16Forward(const paddle::Tensor& h, const paddle::Tensor& delta,
                                                 const paddle::Tensor& norm_w, const paddle::Tensor& w, float eps,
                                                 bool swiglu) {
  return fused(h, delta, norm_w, eps, swiglu, [&](const paddle::Tensor& x) { return LinearF16Forward(x, w)[0]; });
}

std::vector<paddle::Tensor> NormLinearInt8Forward(const paddle::Tensor& h, const paddle::Tensor& delta,
                                                  const paddle::Tensor& norm_w, const paddle::Tensor& q,
                                                  const paddle::Tensor& scale, float eps, bool swiglu) {
  return fused(h, delta, norm_w, eps, swiglu,
               [&](const paddle::Tensor& x) { return LinearInt8Forward(x, q, scale)[0]; });
}

std::vector<paddle::Tensor> NormLinearInt4Forward(const paddle::Tensor& h, const paddle::Tensor& delta,
                                                  const paddle::Tensor& norm_w, const paddle::Tensor& q,
                                                  const paddle::Tensor& scale, float eps, bool swiglu) {
  return fused(h, delta, norm_w, eps, swiglu,
               [&](const paddle::Tensor& x) { return LinearInt4Forward(x, q, scale)[0]; });
}

namespace {

// Out [..., N or N / 2] (N: the weight's columns), Sum as H
std::vector<std::vector<int64_t>> out_and_sum(const std::vector<int64_t>& h, int64_t n, bool swiglu) {
  PD_CHECK(!swiglu || n % 2 == 0, "spmd_norm_linear: swiglu needs an even number of columns (gate | up)");
  std::vector<int64_t> out(h.begin(), h.end() - (h.empty() ? 0 : 1));
  out.push_back(swiglu ? n / 2 : n);
  return {out, h};
}

}  // namespace

std::vector<std::vector<int64_t>> NormLinearShape(const std::vector<int64_t>& h, const std::vector<int64_t>&,
                                                  const std::vector<int64_t>&, const std::vector<int64_t>& w, float,
                                                  bool swiglu) {
  PD_CHECK(w.size() == 2, "spmd_norm_linear: the weight must be 2-D [K, N]");
  return out_and_sum(h, w[1], swiglu);
}

std::vector<std::vector<int64_t>> NormLinearQuantShape(const std::vector<int64_t>& h, const std::vector<int64_t>&,
                                                       const std::vector<int64_t>&, const std::vector<int64_t>& q,
                                                       const std::vector<int64_t>&, float, bool swiglu) {
  PD_CHECK(q.size() == 2, "spmd_norm_linear: the weight must be 2-D");
  return out_and_sum(h, q[1], swiglu);
}

std::vector<paddle::DataType> NormLinearDtype(const paddle::DataType&, const paddle::DataType&,
                                              const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

std::vector<paddle::DataType> NormLinearQuantDtype(const paddle::DataType&, const paddle::DataType&,
                                                   const paddle::DataType&, const paddle::DataType&,
                                                   const paddle::DataType&) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

// one op's registration: its name, kernel, shape and dtype functions, and inputs
#define SPMD_NORM_LINEAR(name, fn, shape, dtype, ...)  \
  PD_BUILD_OP(name)                                    \
      .Inputs({__VA_ARGS__})                           \
      .Outputs({"Out", "Sum"})                         \
      .Attrs({"eps: float", "swiglu: bool"})           \
      .SetKernelFn(PD_KERNEL(fn))                      \
      .SetInferShapeFn(PD_INFER_SHAPE(shape))          \
      .SetInferDtypeFn(PD_INFER_DTYPE(dtype))

SPMD_NORM_LINEAR(spmd_norm_linear, NormLinearForward, NormLinearShape, NormLinearDtype, "H", "Delta", "NormW", "W");
SPMD_NORM_LINEAR(spmd_norm_linear_panels, NormLinearPanelsForward, NormLinearShape, NormLinearDtype, "H", "Delta",
                 "NormW", "W");
SPMD_NORM_LINEAR(spmd_norm_linear_bf16, NormLinearBf16Forward, NormLinearShape, NormLinearDtype, "H", "Delta",
                 "NormW", "W");
SPMD_NORM_LINEAR(spmd_norm_linear_f16, NormLinearF16Forward, NormLinearShape, NormLinearDtype, "H", "Delta", "NormW",
                 "W");
SPMD_NORM_LINEAR(spmd_norm_linear_int8, NormLinearInt8Forward, NormLinearQuantShape, NormLinearQuantDtype, "H",
                 "Delta", "NormW", "Q", "Scale");
SPMD_NORM_LINEAR(spmd_norm_linear_int4, NormLinearInt4Forward, NormLinearQuantShape, NormLinearQuantDtype, "H",
                 "Delta", "NormW", "Q", "Scale");
