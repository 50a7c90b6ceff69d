// The elementwise parts of a decoder layer between the linear ops, as threaded, vectorised ops:
//
//   spmd_rms_norm(X [..., H] f32, W [H] f32; eps)          -> X * rsqrt(mean(X^2) + eps) * W
//   spmd_add_rms_norm(Hs [..., H], Delta [..., H], W; eps) -> (rms_norm(Hs + Delta) * W, Hs + Delta)
//   spmd_swiglu(X [..., 2I] f32)                           -> silu(X[..., :I]) * X[..., I:]
//
// Paddle's CPU kernels for these are single-threaded and, for swiglu, scalar: at a 512-token step
// of the 1B model one add + RMSNorm and the SwiGLU take 8.5 ms a layer there, 1.7 ms here on one
// thread (malloc tuned as the runner does; `benchmarks/gemm_op.py --elementwise`), against ~290 ms
// of the layer's GEMMs.  Same semantics as the graph's
// fused_rms_norm(delta, w, None, eps, 1, residual=h) and nn.functional.swiglu(x).  Rows are
// independent tasks, each computed the same way whatever the thread: bit-equal for any threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "paddle/extension.h"
#include "simd.h"
#include "tensor_pool.h"
#include "thread_pool.h"

namespace {

using spmd::Vec;
using spmd::kWidth;
constexpr int64_t kTaskFloats = 16384;   // about this many outputs a task

int64_t rows_of(const paddle::Tensor& x) { return x.shape().empty() ? 1 : x.numel() / x.shape().back(); }

// fn(r0, r1) over row ranges, about kTaskFloats outputs each, on the op threads
template <typename F>
void over_rows(int64_t rows, int64_t width, F&& fn) {
  const int64_t per = std::max<int64_t>(1, kTaskFloats / std::max<int64_t>(width, 1));
  spmd::parallel_for((rows + per - 1) / per, [&](int64_t i) { fn(i * per, std::min(rows, (i + 1) * per)); });
}

// y = x * rsqrt(mean(x^2) + eps) * w for one row of n
void norm_row(const float* x, const float* w, float eps, int64_t n, float* y) {
  Vec acc = spmd::vzero();
  int64_t c = 0;
  for (; c + kWidth <= n; c += kWidth) acc = spmd::vfma(spmd::vload(x + c), spmd::vload(x + c), acc);
  float ss = spmd::vsum(acc);
  for (; c < n; ++c) ss = spmd::fmadd(x[c], x[c], ss);
  const float r = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  const Vec vr = spmd::vset1(r);
  for (c = 0; c + kWidth <= n; c += kWidth)
    spmd::vstore(y + c, spmd::vmul(spmd::vmul(spmd::vload(x + c), vr), spmd::vload(w + c)));
  for (; c < n; ++c) y[c] = x[c] * r * w[c];
}

void check_norm(const char* op, const paddle::Tensor& x, const paddle::Tensor& w) {
  PD_CHECK(x.is_cpu() && w.is_cpu() && x.dtype() == paddle::DataType::FLOAT32 &&
               w.dtype() == paddle::DataType::FLOAT32, op, ": float32 CPU tensors only");
  PD_CHECK(!x.shape().empty() && w.numel() == x.shape().back(), op, ": the weight must be [H] = [",
           x.shape().empty() ? 0 : x.shape().back(), "]");
}

}  // namespace

std::vector<paddle::Tensor> RmsNormForward(const paddle::Tensor& x, const paddle::Tensor& w, float eps) {
  check_norm("spmd_rms_norm", x, w);
  const paddle::Tensor xc = x.contiguous(), wc = w.contiguous();
  auto y = spmd::new_tensor(x.shape());
  const int64_t n = x.shape().back();
  const float *xp = xc.data<float>(), *wp = wc.data<float>();
  float* yp = y.data<float>();
  over_rows(rows_of(x), n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) norm_row(xp + r * n, wp, eps, n, yp + r * n);
  });
  return {y};
}

std::vector<paddle::Tensor> AddRmsNormForward(const paddle::Tensor& h, const paddle::Tensor& delta,
                                              const paddle::Tensor& w, float eps) {
  check_norm("spmd_add_rms_norm", h, w);
  PD_CHECK(delta.shape() == h.shape() && delta.dtype() == h.dtype(), "spmd_add_rms_norm: delta must match h");
  const paddle::Tensor hc = h.contiguous(), dc = delta.contiguous(), wc = w.contiguous();
  auto y = spmd::new_tensor(h.shape());
  auto sum = spmd::new_tensor(h.shape());
  const int64_t n = h.shape().back();
  const float *hp = hc.data<float>(), *dp = dc.data<float>(), *wp = wc.data<float>();
  float *yp = y.data<float>(), *sp = sum.data<float>();
  over_rows(rows_of(h), n, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0 * n; i < r1 * n; ++i) sp[i] = hp[i] + dp[i];
    for (int64_t r = r0; r < r1; ++r) norm_row(sp + r * n, wp, eps, n, yp + r * n);
  });
  return {y, sum};
}

std::vector<paddle::Tensor> SwigluForward(const paddle::Tensor& x) {
  PD_CHECK(x.is_cpu() && x.dtype() == paddle::DataType::FLOAT32, "spmd_swiglu: a float32 CPU tensor only");
  PD_CHECK(!x.shape().empty() && x.shape().back() % 2 == 0, "spmd_swiglu: the last dimension must be even");
  const paddle::Tensor xc = x.contiguous();
  std::vector<int64_t> shape = x.shape();
  const int64_t n = shape.back() / 2;
  shape.back() = n;
  auto y = spmd::new_tensor(shape);
  const float* xp = xc.data<float>();
  float* yp = y.data<float>();
  over_rows(rows_of(x), n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *g = xp + r * 2 * n, *u = g + n;
      float* o = yp + r * n;
      int64_t c = 0;
      for (const Vec one = spmd::vset1(1.f); c + kWidth <= n; c += kWidth) {   // g / (1 + e^-g) * u
        const Vec gv = spmd::vload(g + c);
        const Vec sig = spmd::vadd(one, spmd::vexp(spmd::vsub(spmd::vzero(), gv)));
        spmd::vstore(o + c, spmd::vdiv(spmd::vmul(gv, spmd::vload(u + c)), sig));
      }
      for (; c < n; ++c) o[c] = g[c] * u[c] / (1.f + std::exp(-g[c]));   // (the vector body's order)
    }
  });
  return {y};
}

std::vector<std::vector<int64_t>> SameShape(const std::vector<int64_t>& x, const std::vector<int64_t>&) { return {x}; }
std::vector<std::vector<int64_t>> TwoSameShape(const std::vector<int64_t>& x, const std::vector<int64_t>&,
                                               const std::vector<int64_t>&) {
  return {x, x};
}
std::vector<std::vector<int64_t>> HalfShape(const std::vector<int64_t>& x) {
  std::vector<int64_t> out = x;
  if (!out.empty() && out.back() > 0) out.back() /= 2;
  return {out};
}
std::vector<paddle::DataType> OneDtype(const paddle::DataType& x, const paddle::DataType&) { return {x}; }
std::vector<paddle::DataType> TwoDtypes(const paddle::DataType& x, const paddle::DataType&, const paddle::DataType&) {
  return {x, x};
}
std::vector<paddle::DataType> SameDtype(const paddle::DataType& x) { return {x}; }

PD_BUILD_OP(spmd_rms_norm)
    .Inputs({"X", "W"})
    .Outputs({"Out"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(RmsNormForward))
    .SetInferShapeFn(PD_INFER_SHAPE(SameShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(OneDtype));

PD_BUILD_OP(spmd_add_rms_norm)
    .Inputs({"H", "Delta", "W"})
    .Outputs({"Out", "Residual"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(AddRmsNormForward))
    .SetInferShapeFn(PD_INFER_SHAPE(TwoSameShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(TwoDtypes));

PD_BUILD_OP(spmd_swiglu)
    .Inputs({"X"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(SwigluForward))
    .SetInferShapeFn(PD_INFER_SHAPE(HalfShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SameDtype));
