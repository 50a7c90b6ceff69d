// What the linear ops' two translation units share (linear.cc: fp32 and panels; linear_quant.cc:
// int8 and int4): the shape checks, the [..., K] -> [T, K] view handed to gemm.h, and the shape and
// dtype functions.  Two units so that the build compiles gemm.h's four weight forms on two cores
// (one unit was the library's longest compile: ~25 s of ~60).
#pragma once

#include <cstdint>
#include <vector>

#include "gemm.h"
#include "paddle/extension.h"
#include "tensor_pool.h"

namespace spmd_linear {

inline std::vector<int64_t> out_shape(const std::vector<int64_t>& x, int64_t n) {
  std::vector<int64_t> out(x.begin(), x.end() - 1);  // [..., K] @ [K, N] → [..., N]
  out.push_back(n);
  return out;
}

// K: the weight's input rows (int4 holds two a byte)
inline void check_shapes(const char* op, const paddle::Tensor& x, const paddle::Tensor& w, int64_t K) {
  const auto xs = x.shape(), ws = w.shape();
  PD_CHECK(x.is_cpu() && w.is_cpu(), op, ": CPU tensors only");
  PD_CHECK(xs.size() >= 1, op, ": x must have at least one dimension, got a scalar");
  PD_CHECK(ws.size() == 2, op, ": the weight must be 2-D [K, N], got ", ws.size(), " dimensions");
  PD_CHECK(xs.back() == K, op, ": x's last dimension (", xs.back(), ") must equal the weight's rows K (", K, ")");
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32, op, ": x must be float32");
}

template <typename Src>
paddle::Tensor run(const paddle::Tensor& x, int64_t K, int64_t N, const float* scale, const Src& w) {
  auto y = spmd::new_tensor(out_shape(x.shape(), N));
  int64_t T = 1;                                     // the rows: every dimension of x but the last
  for (size_t i = 0; i + 1 < x.shape().size(); ++i) T *= x.shape()[i];
  // contiguous() is a no-op for the dense tensors a graph passes; it guards strided eager views
  const paddle::Tensor xc = x.contiguous();
  spmd::gemm(xc.data<float>(), w, scale, T, K, N, y.data<float>());
  return y;
}

// Out's shape: x's with the last dimension N (w [K, N]; int4's q [K / 2, N])
inline std::vector<std::vector<int64_t>> shape(const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  PD_CHECK(w.size() == 2, "spmd_linear: the weight must be 2-D [K, N]");
  return {out_shape(x, w[1])};
}

}  // namespace spmd_linear
