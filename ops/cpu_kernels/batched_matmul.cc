// spmd_batched_matmul: N independent products, out[n] = x[n] @ y[n] (y[n] transposed when
// `transpose_y`), as a Paddle CPU op:
//
//   spmd_batched_matmul(X [N, T, K] f32, Y [N, K, M] f32, transpose_y=false) -> [N, T, M] f32
//   spmd_batched_matmul(X [N, T, K] f32, Y [N, M, K] f32, transpose_y=true)  -> [N, T, M] f32
//
// DeepSeek's MLA (export/deepseek/mla.py) in every graph with the C++ ops: the absorbed per-head
// projections (w_uk: N heads of [nope, kv_lora_rank]; w_uv: [kv_lora_rank + rope, v]) and, in a
// prefill chunk, each sequence's scores against its cached vectors (transposed) and their weighted
// sum.  Paddle's batched matmul ran these single-threaded at ~12-18 GFLOP/s: ~40 % of a prefill
// chunk's time (benchmarks/RESULTS.md "Session 59").  Each slice is gemm.h's product (F32W; a
// transposed y[n] is copied as [K, M] first, K x M floats beside its T x K x M multiply-adds): with
// at least as many slices as threads a task owns a slice (its gemm runs inline), else the slices run
// in turn, each gemm on the threads.  gemm's sums do not depend on the thread count or the path, so
// the output is bit-equal either way.
#include <cstdint>
#include <vector>

#include "gemm.h"
#include "paddle/extension.h"
#include "tensor_pool.h"

std::vector<paddle::Tensor> BatchedMatmulForward(const paddle::Tensor& x, const paddle::Tensor& y, bool transpose_y) {
  const char* op = "spmd_batched_matmul";
  const auto xs = x.shape(), ys = y.shape();
  PD_CHECK(x.is_cpu() && y.is_cpu(), op, ": CPU tensors only");
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32 && y.dtype() == paddle::DataType::FLOAT32, op,
           ": x and y must be float32");
  PD_CHECK(xs.size() == 3 && ys.size() == 3, op, ": expected x [N, T, K] and y [N, K, M] (transposed: [N, M, K])");
  const int64_t N = xs[0], T = xs[1], K = xs[2], M = transpose_y ? ys[1] : ys[2];
  PD_CHECK(ys[0] == N && (transpose_y ? ys[2] : ys[1]) == K, op, ": x [", N, ", T, ", K, "] does not match y [",
           ys[0], ", ", ys[1], ", ", ys[2], "]", transpose_y ? " (transposed)" : "");
  auto out = spmd::new_tensor({N, T, M});
  const paddle::Tensor xc = x.contiguous(), yc = y.contiguous();
  const float *xp = xc.data<float>(), *yp = yc.data<float>();
  float* op_out = out.data<float>();
  const auto slice = [&](int64_t n) {  // out[n] [T, M] = x[n] [T, K] @ y[n] [K, M]
    const float* w = yp + n * K * M;
    if (transpose_y) {  // y[n] [M, K] → [K, M]
      thread_local spmd::AlignedVector<float> t;
      float* tw = spmd::grown(t, K * M);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k) tw[k * M + m] = w[m * K + k];
      w = tw;
    }
    spmd::gemm(xp + n * T * K, spmd::F32W{w, M}, nullptr, T, K, M, op_out + n * T * M);
  };
  if (N >= spmd::num_threads())
    spmd::parallel_for(N, slice);
  else
    for (int64_t n = 0; n < N; ++n) slice(n);
  return {out};
}

std::vector<std::vector<int64_t>> BatchedMatmulShape(const std::vector<int64_t>& x, const std::vector<int64_t>& y,
                                                     bool transpose_y) {
  PD_CHECK(x.size() == 3 && y.size() == 3, "spmd_batched_matmul: expected x [N, T, K] and y [N, K, M]");
  return {{x[0], x[1], transpose_y ? y[1] : y[2]}};
}

std::vector<paddle::DataType> BatchedMatmulDtype(const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(spmd_batched_matmul)
    .Inputs({"X", "Y"})
    .Outputs({"Out"})
    .Attrs({"transpose_y: bool"})
    .SetKernelFn(PD_KERNEL(BatchedMatmulForward))
    .SetInferShapeFn(PD_INFER_SHAPE(BatchedMatmulShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(BatchedMatmulDtype));
