// spmd_batched_matmul: N independent products, out[n] = x[n] @ y[n] (y[n] transposed when
// `transpose_y`), and its weight-only quantised forms, as Paddle CPU ops:
//
//   spmd_batched_matmul(X [N, T, K] f32, Y [N, K, M] f32, transpose_y=false) -> [N, T, M] f32
//   spmd_batched_matmul(X [N, T, K] f32, Y [N, M, K] f32, transpose_y=true)  -> [N, T, M] f32
//   spmd_batched_linear_int8(X [N, T, K], Q [N, K, M] int8, Scale [N, M])    -> [N, T, M] f32
//   spmd_batched_linear_int4(X [N, T, K], Q [N, K / 2, M] int8, Scale [N, K / group, M]) -> [N, T, M]
//     (export/quant.py's QuantStack: each slice the layout spmd_linear_int8 / _int4 read)
//
// DeepSeek's MLA (export/deepseek/mla.py) in every graph with the C++ ops: the absorbed per-head
// projections (w_uk: N heads of [nope, kv_lora_rank]; w_uv: [kv_lora_rank + rope, v]), fp32 or
// quantised, and, in a prefill chunk, each sequence's scores against its cached vectors (transposed)
// and their weighted sum.  Paddle's batched matmul ran these single-threaded at ~12-18 GFLOP/s: ~40 %
// of a prefill chunk's time, and a quantised stack was dequantised whole first, every step
// (benchmarks/RESULTS.md "Session 59").  Each slice is gemm.h's product (a transposed y[n] is copied
// as [K, M] first, K x M floats beside its T x K x M multiply-adds): with at least as many slices as
// threads a task owns a slice (its gemm runs inline), else the slices run in turn, each gemm on the
// threads.  gemm's sums do not depend on the thread count or the path, so the output is bit-equal
// either way.
#include <cstdint>
#include <utility>
#include <vector>

#include "gemm.h"
#include "op_build.h"
#include "paddle/extension.h"
#include "tensor_pool.h"
#include "weight_stacks.h"

namespace {

// y [N, M, K] as a stack of [K, M] weights: at(n) copies y[n] transposed into this thread's scratch
// (valid until the thread's next at(): the slice's gemm, inline or on the threads, has ended by then)
struct TransposedStack {
  const float* y;
  int64_t K, M;
  std::pair<spmd::F32W, const float*> at(int64_t n) const {
    thread_local spmd::AlignedVector<float> t;
    float* tw = spmd::grown(t, K * M);
    const float* src = y + n * M * K;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) tw[k * M + m] = src[m * K + k];
    return {{tw, M}, nullptr};
  }
};

// out[n] [T, M] = x[n] [T, K] @ the stack's weight n (and its scale), for every n
template <typename Stack>
paddle::Tensor batched(const paddle::Tensor& x, int64_t M, const Stack& s) {
  const int64_t N = x.shape()[0], T = x.shape()[1], K = x.shape()[2];
  auto out = spmd::new_tensor({N, T, M});
  const paddle::Tensor xc = x.contiguous();
  const float* xp = xc.data<float>();
  float* op = out.data<float>();
  const auto slice = [&](int64_t n) {
    const auto [w, scale] = s.at(n);
    spmd::gemm(xp + n * T * K, w, scale, T, K, M, op + n * T * M);
  };
  if (N >= spmd::num_threads())
    spmd::parallel_for(N, slice);
  else
    for (int64_t n = 0; n < N; ++n) slice(n);
  return out;
}

// x [N, T, K] against a stack of N weights with `rows` rows (K, or K / 2 packed int4) and M columns
void check_x(const char* op, const paddle::Tensor& x, const paddle::Tensor& y, int64_t rows, int64_t M, bool t) {
  const auto xs = x.shape(), ys = y.shape();
  PD_CHECK(x.is_cpu() && y.is_cpu(), op, ": CPU tensors only");
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32, op, ": x must be float32");
  PD_CHECK(xs.size() == 3 && ys.size() == 3, op, ": expected x [N, T, K] and y [N, K, M] (transposed: [N, M, K])");
  PD_CHECK(ys[0] == xs[0] && rows == xs[2] && M >= 0, op, ": x [", xs[0], ", T, ", xs[2], "] does not match y [",
           ys[0], ", ", ys[1], ", ", ys[2], "]", t ? " (transposed)" : "");
}

}  // namespace

std::vector<paddle::Tensor> BatchedMatmulForward(const paddle::Tensor& x, const paddle::Tensor& y, bool transpose_y) {
  const char* op = "spmd_batched_matmul";
  const auto ys = y.shape();
  const int64_t K = ys.size() == 3 ? ys[transpose_y ? 2 : 1] : -1, M = ys.size() == 3 ? ys[transpose_y ? 1 : 2] : -1;
  check_x(op, x, y, K, M, transpose_y);
  PD_CHECK(y.dtype() == paddle::DataType::FLOAT32, op, ": y must be float32");
  const paddle::Tensor yc = y.contiguous();
  if (transpose_y) return {batched(x, M, TransposedStack{yc.data<float>(), K, M})};
  return {batched(x, M, spmd::F32Stack{yc.data<float>(), K, M})};
}

// int8 (per-column scales [N, M]) or int4 (two a byte along K, group scales [N, K / group, M]) stacks
std::vector<paddle::Tensor> batched_quant(bool int4, const paddle::Tensor& x, const paddle::Tensor& q,
                                          const paddle::Tensor& s) {
  const char* op = int4 ? "spmd_batched_linear_int4" : "spmd_batched_linear_int8";
  const auto qs = q.shape();
  const int64_t K = qs.size() == 3 ? qs[1] * (int4 ? 2 : 1) : -1, M = qs.size() == 3 ? qs[2] : -1;
  check_x(op, x, q, K, M, false);
  PD_CHECK(q.dtype() == paddle::DataType::INT8, op, ": the weights must be int8");
  spmd::check_scale(op, s, qs[0], K, M, int4);
  const paddle::Tensor qc = q.contiguous(), sc = s.contiguous();
  if (!int4) return {batched(x, M, spmd::I8Stack{qc.data<int8_t>(), sc.data<float>(), K, M})};
  return {batched(x, M, spmd::I4Stack{qc.data<int8_t>(), sc.data<float>(), K, M, K / s.shape()[1]})};
}

std::vector<paddle::Tensor> BatchedInt8Forward(const paddle::Tensor& x, const paddle::Tensor& q,
                                               const paddle::Tensor& s) {
  return batched_quant(false, x, q, s);
}

std::vector<paddle::Tensor> BatchedInt4Forward(const paddle::Tensor& x, const paddle::Tensor& q,
                                               const paddle::Tensor& s) {
  return batched_quant(true, x, q, s);
}

std::vector<std::vector<int64_t>> BatchedMatmulShape(const std::vector<int64_t>& x, const std::vector<int64_t>& y,
                                                     bool transpose_y) {
  PD_CHECK(x.size() == 3 && y.size() == 3, "spmd_batched_matmul: expected x [N, T, K] and y [N, K, M]");
  return {{x[0], x[1], transpose_y ? y[1] : y[2]}};
}

std::vector<std::vector<int64_t>> BatchedQuantShape(const std::vector<int64_t>& x, const std::vector<int64_t>& q,
                                                    const std::vector<int64_t>&) {
  PD_CHECK(x.size() == 3 && q.size() == 3, "spmd_batched_linear_int8 / _int4: expected x [N, T, K] and q [N, K, M]");
  return {{x[0], x[1], q[2]}};
}

std::vector<paddle::DataType> BatchedMatmulDtype(const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

std::vector<paddle::DataType> BatchedQuantDtype(const paddle::DataType&, const paddle::DataType&,
                                                const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(spmd_batched_matmul)
    .Inputs({"X", "Y"})
    .Outputs({"Out"})
    .Attrs({"transpose_y: bool"})
    .SetKernelFn(PD_KERNEL(BatchedMatmulForward))
    .SetInferShapeFn(PD_INFER_SHAPE(BatchedMatmulShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(BatchedMatmulDtype));

SPMD_OP(spmd_batched_linear_int8, BatchedInt8Forward, BatchedQuantShape, BatchedQuantDtype, "X", "Q", "Scale");
SPMD_OP(spmd_batched_linear_int4, BatchedInt4Forward, BatchedQuantShape, BatchedQuantDtype, "X", "Q", "Scale");
