// spmd_linear / spmd_linear_int8: x[..., K] fp32 @ W[K, N] for the few rows of a decode step.
//
// At batch 1-4 a linear layer is a pass over its weights: the time is the bytes of W read from
// memory.  Paddle's CPU matmul (oneDNN off, one thread) reads these [K, N] fp32 weights at
// ~18-22 GB/s where memcpy reaches ~26-30 GB/s; and for int8 weights the graph first casts the
// whole of W to fp32 (a weight-sized write and re-read per step).  These kernels read W once per
// call, row by row in long contiguous runs (what the hardware prefetchers follow best), for all T
// rows of x together, and dequantise int8 in registers (4x fewer bytes than fp32).
//
// Layout of the work: the output columns are cut into tiles whose T x tile accumulators (the
// output rows themselves) fit in L1; for each tile, kPassRows rows of W at a time are multiplied
// into them, so every accumulator is loaded and stored once per kPassRows weight vectors.  Columns
// past the last full vector are done by a scalar loop.
//
// Software prefetch, kPrefetchRows rows ahead, one per cache line: without it the int8 kernel read
// only ~11 GB/s (it issues four 16-byte loads per line, so the out-of-order window holds 4x fewer
// lines in flight than fp32's and the hardware prefetchers did not make up for it), although from
// L1 it runs at ~48 G weights/s; with it, ~30-35 GB/s at T=1 (measured, benchmarks/RESULTS.md
// "Speed change 4b").  fp32 at T >= 2 gains too; fp32 at T=1 does not (see tile()).  Rows of x above kMaxRows go to Paddle's own kernels
// (matmul, cast, multiply), which are faster once the work is compute- rather than memory-bound
// (the runner runs such steps on the oneDNN predictor of the general graph anyway).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "paddle/extension.h"

namespace {

constexpr int64_t kMaxRows = 16;            // above: Paddle's kernels (see the header)
constexpr int64_t kAccFloats = 4096;        // T x tile accumulators: 16 KiB of L1
constexpr int64_t kPassRows = 8;            // weight rows per pass over the accumulators
constexpr int64_t kPrefetchRows = 16;       // software prefetch distance, in weight rows

// One SIMD vector of floats: AVX-512, AVX2 + FMA, or a plain array the compiler vectorises.
#if defined(__AVX512F__)
constexpr int64_t kWidth = 16;
using Vec = __m512;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vset1(float v) { return _mm512_set1_ps(v); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vload(const int8_t* p) {  // 16 int8 → 16 fp32
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int64_t kWidth = 8;
using Vec = __m256;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vset1(float v) { return _mm256_set1_ps(v); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline Vec vload(const int8_t* p) {  // 8 int8 → 8 fp32
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec vmul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
#else
constexpr int64_t kWidth = 8;
struct Vec { float v[kWidth]; };
inline Vec vzero() { return Vec{}; }
inline Vec vset1(float s) { Vec r; for (auto& e : r.v) e = s; return r; }
template <typename W>
inline Vec vload(const W* p) { Vec r; for (int64_t i = 0; i < kWidth; ++i) r.v[i] = static_cast<float>(p[i]); return r; }
inline void vstore(float* p, Vec a) { std::memcpy(p, a.v, sizeof a.v); }
inline Vec vfma(Vec a, Vec b, Vec c) { for (int64_t i = 0; i < kWidth; ++i) c.v[i] += a.v[i] * b.v[i]; return c; }
inline Vec vmul(Vec a, Vec b) { for (int64_t i = 0; i < kWidth; ++i) a.v[i] *= b.v[i]; return a; }
#endif

// y[t, n0:n0+nb] = x[t, :] @ w[:, n0:n0+nb] for the T rows of x (nb a multiple of kWidth).
template <int T, typename W>
void tile(const float* x, const W* w, int64_t K, int64_t N, int64_t n0, int64_t nb, float* y) {
  constexpr int64_t kLine = 64 / sizeof(W);  // weights per cache line: one prefetch each
  // fp32 at T=1 (one 64-byte load per line, a short loop) the hardware prefetchers keep up and the
  // prefetches only cost issue slots: 29 vs 26 GB/s without them; int8, or T >= 2, gains with them
  constexpr bool kPrefetch = sizeof(W) == 1 || T > 1;
  for (int t = 0; t < T; ++t)
    for (int64_t j = 0; j < nb; j += kWidth) vstore(y + t * N + n0 + j, vzero());
  int64_t k = 0;
  for (; k + kPassRows <= K; k += kPassRows) {  // kPassRows weight rows per pass over the accumulators
    const W* r = w + k * N + n0;
    // the same columns kPrefetchRows rows on (clamped: re-prefetching the last rows is harmless)
    const W* pf = w + std::min(k + kPrefetchRows, K - kPassRows) * N + n0;
    Vec xb[T][kPassRows];
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < kPassRows; ++i) xb[t][i] = vset1(x[t * K + k + i]);
    for (int64_t j = 0; j < nb; j += kWidth) {
      if (kPrefetch && j % kLine == 0)
        for (int i = 0; i < kPassRows; ++i) __builtin_prefetch(pf + i * N + j);
      Vec wv[kPassRows];
      for (int i = 0; i < kPassRows; ++i) wv[i] = vload(r + i * N + j);
      for (int t = 0; t < T; ++t) {
        float* acc = y + t * N + n0 + j;
        Vec a = vload(acc);
        for (int i = 0; i < kPassRows; ++i) a = vfma(xb[t][i], wv[i], a);  // a chain: a tree was slower
        vstore(acc, a);
      }
    }
  }
  for (; k < K; ++k) {  // the last K % kPassRows rows
    const W* r = w + k * N + n0;
    for (int64_t j = 0; j < nb; j += kWidth) {
      const Vec wv = vload(r + j);
      for (int t = 0; t < T; ++t) {
        float* acc = y + t * N + n0 + j;
        vstore(acc, vfma(vset1(x[t * K + k]), wv, vload(acc)));
      }
    }
  }
}

// y[T, N] = x[T, K] @ w[K, N] (times scale[N] when given), all T rows in one pass over w.
template <int T, typename W>
void rows(const float* x, const W* w, const float* scale, int64_t K, int64_t N, float* y) {
  const int64_t full = N / kWidth * kWidth;
  const int64_t nb = std::max<int64_t>(kWidth, kAccFloats / T / kWidth * kWidth);
  for (int64_t n0 = 0; n0 < full; n0 += nb) tile<T, W>(x, w, K, N, n0, std::min(nb, full - n0), y);
  for (int t = 0; t < T; ++t)  // columns past the last full vector
    for (int64_t n = full; n < N; ++n) {
      float s = 0.f;
      for (int64_t k = 0; k < K; ++k) s += x[t * K + k] * static_cast<float>(w[k * N + n]);
      y[t * N + n] = s;
    }
  if (scale == nullptr) return;
  for (int t = 0; t < T; ++t) {  // int8: per-column dequantisation scale, once per output
    float* yt = y + t * N;
    int64_t n = 0;
    for (; n < full; n += kWidth) vstore(yt + n, vmul(vload(yt + n), vload(scale + n)));
    for (; n < N; ++n) yt[n] *= scale[n];
  }
}

template <typename W>
using RowsFn = void (*)(const float*, const W*, const float*, int64_t, int64_t, float*);

template <typename W, size_t... I>
constexpr std::array<RowsFn<W>, sizeof...(I)> rows_table(std::index_sequence<I...>) {
  return {&rows<static_cast<int>(I) + 1, W>...};
}

// The instantiation for each row count 1..kMaxRows (T is a template argument so that the
// accumulator loop over rows is unrolled and the broadcasts of x stay in registers).
template <typename W>
void run_rows(int64_t T, const float* x, const W* w, const float* scale, int64_t K, int64_t N, float* y) {
  static constexpr auto table = rows_table<W>(std::make_index_sequence<kMaxRows>{});
  table[T - 1](x, w, scale, K, N, y);
}

std::vector<int64_t> out_shape(const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  std::vector<int64_t> out(x.begin(), x.end() - 1);  // [..., K] @ [K, N] → [..., N]
  out.push_back(w[1]);
  return out;
}

void check_shapes(const char* op, const paddle::Tensor& x, const paddle::Tensor& w) {
  const auto xs = x.shape(), ws = w.shape();
  PD_CHECK(x.is_cpu() && w.is_cpu(), op, ": CPU tensors only");
  PD_CHECK(xs.size() >= 1, op, ": x must have at least one dimension, got a scalar");
  PD_CHECK(ws.size() == 2, op, ": the weight must be 2-D [K, N], got ", ws.size(), " dimensions");
  PD_CHECK(xs.back() == ws[0], op, ": x's last dimension (", xs.back(), ") must equal the weight's rows K (",
           ws[0], ")");
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32, op, ": x must be float32");
}

// The op's kernel for fp32 (scale undefined) or int8 weights.
template <typename W>
paddle::Tensor linear(const paddle::Tensor& x, const paddle::Tensor& w, const paddle::Tensor* scale) {
  const int64_t K = w.shape()[0], N = w.shape()[1];
  const int64_t T = K == 0 ? 0 : x.numel() / K;
  if (T > kMaxRows || K == 0) {
    paddle::Tensor wf = scale ? paddle::experimental::cast(w, paddle::DataType::FLOAT32) : w;
    paddle::Tensor y = paddle::experimental::matmul(x, wf);
    return scale ? paddle::experimental::multiply(y, *scale) : y;
  }
  auto y = paddle::empty(out_shape(x.shape(), w.shape()), paddle::DataType::FLOAT32, x.place());
  if (T == 0 || N == 0) return y;
  // contiguous() is a no-op for the dense tensors a graph passes; it guards strided eager views
  const paddle::Tensor xc = x.contiguous(), wc = w.contiguous();
  run_rows<W>(T, xc.data<float>(), wc.data<W>(), scale ? scale->data<float>() : nullptr, K, N, y.data<float>());
  return y;
}

}  // namespace

std::vector<paddle::Tensor> LinearForward(const paddle::Tensor& x, const paddle::Tensor& w) {
  check_shapes("spmd_linear", x, w);
  PD_CHECK(w.dtype() == paddle::DataType::FLOAT32, "spmd_linear: the weight must be float32 (int8: spmd_linear_int8)");
  return {linear<float>(x, w, nullptr)};
}

std::vector<paddle::Tensor> LinearInt8Forward(const paddle::Tensor& x, const paddle::Tensor& q,
                                              const paddle::Tensor& scale) {
  check_shapes("spmd_linear_int8", x, q);
  PD_CHECK(q.dtype() == paddle::DataType::INT8, "spmd_linear_int8: the weight must be int8");
  PD_CHECK(scale.dtype() == paddle::DataType::FLOAT32, "spmd_linear_int8: scale must be float32");
  PD_CHECK(scale.shape().size() == 1 && scale.shape()[0] == q.shape()[1],
           "spmd_linear_int8: scale must be [N] = [", q.shape()[1], "], one per output column");
  const paddle::Tensor sc = scale.contiguous();
  return {linear<int8_t>(x, q, &sc)};
}

std::vector<std::vector<int64_t>> LinearShape(const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  PD_CHECK(w.size() == 2, "spmd_linear: the weight must be 2-D [K, N]");
  return {out_shape(x, w)};
}

std::vector<std::vector<int64_t>> LinearInt8Shape(const std::vector<int64_t>& x, const std::vector<int64_t>& q,
                                                  const std::vector<int64_t>&) {
  return LinearShape(x, q);
}

std::vector<paddle::DataType> LinearDtype(const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

std::vector<paddle::DataType> LinearInt8Dtype(const paddle::DataType&, const paddle::DataType&,
                                              const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(spmd_linear)
    .Inputs({"X", "W"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(LinearForward))
    .SetInferShapeFn(PD_INFER_SHAPE(LinearShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LinearDtype));

PD_BUILD_OP(spmd_linear_int8)
    .Inputs({"X", "Q", "Scale"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(LinearInt8Forward))
    .SetInferShapeFn(PD_INFER_SHAPE(LinearInt8Shape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LinearInt8Dtype));
