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
// each task one sequence and up to four of its heads (kHeads: each row read once for them), the
// tasks spread over the op library's threads.
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

// register blocks: 16 sums of AVX-512's 32 registers, 8 of AVX2's 16 (the rest: the loads)
constexpr int64_t kHeads = 4;   // heads a register block serves: the rows are read once for them all
constexpr int64_t kRows = spmd::kVecRegs >= 32 ? 4 : 2;   // scores: rows a block reads at a time
constexpr int64_t kVecs = spmd::kVecRegs >= 32 ? 4 : 2;   // weighted sum: vectors of K a block keeps

// s[g][p] = q[g] . r[p], g < G, p < n: kHeads x kRows dot products a block, so that each loaded
// vector of a row (or a query) feeds kHeads (kRows) independent FMA chains, not one latency-bound
// chain.  Missing heads / rows of a block repeat the last ones (computed, not stored).
void scores(const float* const* q, int64_t G, const float* const* r, int64_t n, int64_t K, float* s, int64_t ld) {
  const int64_t kv = K / kWidth * kWidth;
  for (int64_t p0 = 0; p0 < n; p0 += kRows) {
    const float* rows[kRows];
    const float* qs[kHeads];
    for (int64_t j = 0; j < kRows; ++j) rows[j] = r[std::min(p0 + j, n - 1)];
    for (int64_t g = 0; g < kHeads; ++g) qs[g] = q[std::min(g, G - 1)];
    Vec acc[kHeads][kRows];
    for (auto& a : acc)
      for (auto& v : a) v = spmd::vzero();
    for (int64_t i = 0; i < kv; i += kWidth) {
      Vec rv[kRows];
      for (int64_t j = 0; j < kRows; ++j) rv[j] = spmd::vload(rows[j] + i);
      for (int64_t g = 0; g < kHeads; ++g) {
        const Vec qv = spmd::vload(qs[g] + i);
        for (int64_t j = 0; j < kRows; ++j) acc[g][j] = spmd::vfma(qv, rv[j], acc[g][j]);
      }
    }
    for (int64_t g = 0; g < G && g < kHeads; ++g)
      for (int64_t j = 0; j < kRows && p0 + j < n; ++j) {
        float t = spmd::vsum(acc[g][j]);
        for (int64_t i = kv; i < K; ++i) t += qs[g][i] * rows[j][i];
        s[g * ld + p0 + j] = t;
      }
  }
}

// o[g] = sum_p a[g][p] r[p], g < G: kHeads x kVecs sums in registers over all rows for each
// stretch of kVecs vectors of K (the rows are read once per stretch for all the heads)
void weigh(const float* a, int64_t ld, int64_t G, const float* const* r, int64_t n, int64_t K, float* const* o) {
  const float* ag[kHeads];   // a block's heads' weights (missing heads repeat the last)
  for (int64_t g = 0; g < kHeads; ++g) ag[g] = a + std::min(g, G - 1) * ld;
  int64_t i = 0;
  for (; i + kVecs * kWidth <= K; i += kVecs * kWidth) {
    Vec acc[kHeads][kVecs];
    for (auto& h : acc)
      for (auto& v : h) v = spmd::vzero();
    for (int64_t p = 0; p < n; ++p) {
      Vec rv[kVecs];
      for (int64_t v = 0; v < kVecs; ++v) rv[v] = spmd::vload(r[p] + i + v * kWidth);
      for (int64_t g = 0; g < kHeads; ++g) {
        const Vec w = spmd::vset1(ag[g][p]);
        for (int64_t v = 0; v < kVecs; ++v) acc[g][v] = spmd::vfma(w, rv[v], acc[g][v]);
      }
    }
    for (int64_t g = 0; g < G && g < kHeads; ++g)
      for (int64_t v = 0; v < kVecs; ++v) spmd::vstore(o[g] + i + v * kWidth, acc[g][v]);
  }
  for (int64_t g = 0; g < G && g < kHeads; ++g)   // the last < kVecs vectors of K, then the scalars
    for (int64_t c = i; c < K; ++c) {
      float t = 0.f;
      for (int64_t p = 0; p < n; ++p) t += ag[g][p] * r[p][c];
      o[g][c] = t;
    }
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
  auto out = spmd::new_tensor({H, B, K}, f32);
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
  // a task: one sequence and up to kHeads of its heads (scores, softmax, weighted sum)
  const int64_t groups = (H + kHeads - 1) / kHeads;
  spmd::parallel_for(B * groups, [&](int64_t item) {
    const int64_t b = item / groups, h0 = item % groups * kHeads, G = std::min(kHeads, H - h0);
    const int64_t n = first[b + 1] - first[b];
    const float* const* r = rows.data() + first[b];
    thread_local std::vector<float> w;
    w.resize(kHeads * n);
    const float* q[kHeads];
    float* dst[kHeads];
    for (int64_t g = 0; g < G; ++g) q[g] = q_all + ((h0 + g) * B + b) * K, dst[g] = o + ((h0 + g) * B + b) * K;
    scores(q, G, r, n, K, w.data(), n);
    for (int64_t g = 0; g < G; ++g) {   // softmax, normalised before the sum
      float* s = w.data() + g * n;
      const float top = *std::max_element(s, s + n);
      float sum = 0.f;
      // a weight below e^-69 (~1e-30 of the largest) is taken as 0: it changes no fp32 sum, and the
      // subnormals it would become once normalised cost the FMAs of the weighted sum ~6x (measured)
      for (int64_t p = 0; p < n; ++p) sum += (s[p] = s[p] - top < -69.f ? 0.f : std::exp(s[p] - top));
      for (int64_t p = 0; p < n; ++p) s[p] /= sum;
    }
    weigh(w.data(), n, G, r, n, K, dst);
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
