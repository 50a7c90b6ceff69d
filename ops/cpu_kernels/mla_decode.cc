// spmd_mla_decode: a decode step's Multi-head Latent Attention core (DeepSeek) over the paged
// latent pool, in the absorbed form: one new token per sequence, its query already taken into
// latent space (q_nope @ W_UK per head, concatenated with its roped q_pe; softmax scale folded),
// scored by one dot product against every cached `latent | rope key` vector, and the weighted sum
// of cached vectors returned for W_UV (applied by the graph after this op).  The new token's
// vector is WRITTEN into the pool first (like spmd_decode_attention: the pool is the runner's
// buffer bound zero-copy, so the graph has no latent output and the runner skips these layers).
//   query        [h, B, K] f32   K = kv_lora_rank + rope dim
//   latent       [B, K]    f32   this step's cached vectors (normed latent | roped key)
//   cache        [NB, bs, K] f32 the pool of this layer
//   block_tables [B, MB] i64, ctx_lens [B] i64 (past tokens), slot_mapping [B] i64
// Output: [h, B, K] f32, softmax(query . [past..., new]) @ [past..., new] per head and sequence,
// the (sequence, head) pairs spread over the op library's threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "paddle/extension.h"
#include "thread_pool.h"

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {0.f};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0.f;
  for (int l = 0; l < 16; ++l) s += acc[l];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

std::vector<paddle::Tensor> MlaDecodeForward(const paddle::Tensor& query, const paddle::Tensor& latent,
                                             const paddle::Tensor& cache, const paddle::Tensor& block_tables,
                                             const paddle::Tensor& ctx_lens, const paddle::Tensor& slot_mapping) {
  const auto f32 = paddle::DataType::FLOAT32, i64 = paddle::DataType::INT64;
  PD_CHECK(query.dtype() == f32 && latent.dtype() == f32 && cache.dtype() == f32,
           "spmd_mla_decode: query, latent and cache must be float32");
  PD_CHECK(block_tables.dtype() == i64 && ctx_lens.dtype() == i64 && slot_mapping.dtype() == i64,
           "spmd_mla_decode: block_tables, ctx_lens and slot_mapping must be int64");
  const auto qs = query.shape(), cs = cache.shape(), bts = block_tables.shape();
  PD_CHECK(qs.size() == 3 && cs.size() == 3 && bts.size() == 2,
           "spmd_mla_decode: expected query [h, B, K], cache [NB, bs, K], block_tables [B, MB]");
  const int64_t H = qs[0], B = qs[1], K = qs[2], NB = cs[0], bs = cs[1], MB = bts[1];
  PD_CHECK(cs[2] == K && latent.shape() == std::vector<int64_t>({B, K}), "spmd_mla_decode: K differs");
  PD_CHECK(bts[0] == B && ctx_lens.numel() == B && slot_mapping.numel() == B,
           "spmd_mla_decode: one block table, context length and slot per sequence");
  auto out = paddle::empty({H, B, K}, f32, query.place());
  const float *q_all = query.data<float>(), *lat = latent.data<float>();
  float* pool = const_cast<float*>(cache.data<float>());  // written in place (see above)
  const int64_t *tables = block_tables.data<int64_t>(), *ctx = ctx_lens.data<int64_t>();
  const int64_t* slots = slot_mapping.data<int64_t>();
  float* o = out.data<float>();
  // the writes first, then every (sequence, head) as a task on the op library's threads: each reads
  // only other slots and its own query, and computes as one thread would, so the bits do not depend
  // on the thread count
  std::vector<int64_t> first(B + 1, 0);   // sequence b's keys: rows[first[b] .. first[b + 1])
  for (int64_t b = 0; b < B; ++b) {
    PD_CHECK(ctx[b] >= 0 && ctx[b] <= MB * bs, "spmd_mla_decode: context longer than its block table");
    PD_CHECK(slots[b] >= 0 && slots[b] < NB * bs, "spmd_mla_decode: slot outside the pool");
    std::copy_n(lat + b * K, K, pool + slots[b] * K);
    first[b + 1] = first[b] + ctx[b] + 1;
  }
  std::vector<const float*> rows(first[B]);   // the past through the block table, then the new vector
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* table = tables + b * MB;
    for (int64_t p = 0; p < ctx[b]; ++p) rows[first[b] + p] = pool + (table[p / bs] * bs + p % bs) * K;
    rows[first[b] + ctx[b]] = lat + b * K;
  }
  spmd::parallel_for(B * H, [&](int64_t item) {
    const int64_t b = item / H, h = item % H, n = first[b + 1] - first[b];
    const float* const* r = rows.data() + first[b];
    thread_local std::vector<float> w;
    w.resize(n);
    const float* q = q_all + (h * B + b) * K;
    float top = -INFINITY;
    for (int64_t p = 0; p < n; ++p) top = std::max(top, w[p] = dot(q, r[p], K));
    float sum = 0.f;
    for (int64_t p = 0; p < n; ++p) sum += (w[p] = std::exp(w[p] - top));
    float* dst = o + (h * B + b) * K;
    std::fill(dst, dst + K, 0.f);
    for (int64_t p = 0; p < n; ++p) {
      const float a = w[p] / sum, *x = r[p];
      for (int64_t i = 0; i < K; ++i) dst[i] += a * x[i];
    }
  });
  return {out};
}

std::vector<std::vector<int64_t>> MlaDecodeShape(const std::vector<int64_t>& q, const std::vector<int64_t>&,
                                                 const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                 const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return {q};
}

std::vector<paddle::DataType> MlaDecodeDtype(const paddle::DataType& q, const paddle::DataType&,
                                             const paddle::DataType&, const paddle::DataType&,
                                             const paddle::DataType&, const paddle::DataType&) {
  return {q};
}

PD_BUILD_OP(spmd_mla_decode)
    .Inputs({"Query", "Latent", "Cache", "BlockTables", "CtxLens", "SlotMapping"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(MlaDecodeForward))
    .SetInferShapeFn(PD_INFER_SHAPE(MlaDecodeShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(MlaDecodeDtype));
