// spmd_decode_attention: one decode step's attention layer core (one new token per sequence) as
// one Paddle CPU custom op: RoPE, writing the new K/V into the paged pool, attention over the
// past (GQA) and the new token.
//
// The decode graph did this with ~20 Paddle ops a layer (RoPE's multiply/roll/add, split, two
// gathers of the past into [B, kvh, P, d], concats, matmuls, mask, softmax), and the runner then
// copied K/V out of the graph and into the pool: at batch 1 each op costs more in overhead than in
// arithmetic.  Inputs (step_tables.py builds the tables; the pool is bound zero-copy):
//   qkv          [B, nh + 2 kvh, d] f32   fused projections, before RoPE
//   rope_cos/sin [B, nh + 2 kvh, d] f32   x * cos + roll(x, d/2) * sin; q rows carry 1/sqrt(d),
//                                         v rows are the identity (cos 1, sin 0)
//   k/v_cache    [NB, bs, kvh, d]   f32   the pool: the new K/V are WRITTEN into it at slot_mapping
//   block_tables [B, MB] i64, ctx_lens [B] i64 (past tokens), slot_mapping [B] i64 (new token's slot)
// Output: [B, nh * d] f32, query head j attending with KV head j / (nh / kvh).
// The pool write is a side effect the graph does not see: the op is never pruned (its output is
// used) and the pool is an external buffer, so the runner must not write these layers again.
#include <algorithm>
#include <cmath>
#include <vector>

#include "paddle/extension.h"

namespace {

// row of [NB * bs * kvh, d] holding past token p of a sequence (its block table), KV head h
inline int64_t slot_row(const int64_t* table, int64_t p, int64_t bs, int64_t kvh, int64_t h) {
  return (table[p / bs] * bs + p % bs) * kvh + h;
}

// 16 independent lanes: the compiler vectorises them (a single running sum it may not reorder)
inline float dot(const float* a, const float* b, int64_t d) {
  float acc[16] = {0.f};
  int64_t i = 0;
  for (; i + 16 <= d; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0.f;
  for (int l = 0; l < 16; ++l) s += acc[l];
  for (; i < d; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float w, const float* x, float* y, int64_t d) {
  for (int64_t i = 0; i < d; ++i) y[i] += w * x[i];
}

}  // namespace

std::vector<paddle::Tensor> DecodeAttentionForward(const paddle::Tensor& qkv, const paddle::Tensor& rope_cos,
                                                   const paddle::Tensor& rope_sin, const paddle::Tensor& k_cache,
                                                   const paddle::Tensor& v_cache, const paddle::Tensor& block_tables,
                                                   const paddle::Tensor& ctx_lens, const paddle::Tensor& slot_mapping) {
  const auto f32 = paddle::DataType::FLOAT32, i64 = paddle::DataType::INT64;
  PD_CHECK(qkv.dtype() == f32 && rope_cos.dtype() == f32 && rope_sin.dtype() == f32 && k_cache.dtype() == f32 &&
               v_cache.dtype() == f32, "spmd_decode_attention: qkv, rope tables and caches must be float32");
  PD_CHECK(block_tables.dtype() == i64 && ctx_lens.dtype() == i64 && slot_mapping.dtype() == i64,
           "spmd_decode_attention: block_tables, ctx_lens and slot_mapping must be int64");
  const auto qs = qkv.shape(), cs = k_cache.shape(), bts = block_tables.shape();
  PD_CHECK(qs.size() == 3 && cs.size() == 4 && bts.size() == 2,
           "spmd_decode_attention: expected qkv [B, nh+2kvh, d], caches [NB, bs, kvh, d], block_tables [B, MB]");
  const int64_t B = qs[0], d = qs[2], NB = cs[0], bs = cs[1], kvh = cs[2], MB = bts[1];
  const int64_t nh = qs[1] - 2 * kvh;
  PD_CHECK(rope_cos.shape() == qs && rope_sin.shape() == qs, "spmd_decode_attention: rope tables must match qkv");
  PD_CHECK(cs[3] == d && v_cache.shape() == cs, "spmd_decode_attention: cache shape does not match qkv");
  PD_CHECK(nh > 0 && nh % kvh == 0 && d % 2 == 0, "spmd_decode_attention: query heads must be a multiple of KV heads");
  PD_CHECK(bts[0] == B && ctx_lens.numel() == B && slot_mapping.numel() == B,
           "spmd_decode_attention: one block table, context length and slot per sequence");
  const int64_t g = nh / kvh, heads = nh + 2 * kvh, half = d / 2;

  auto out = paddle::empty({B, nh * d}, f32, qkv.place());
  const float *x_all = qkv.data<float>(), *cos_all = rope_cos.data<float>(), *sin_all = rope_sin.data<float>();
  // the pool is written in place: it is the runner's buffer, shared with the graph (see above)
  float* kc = const_cast<float*>(k_cache.data<float>());
  float* vc = const_cast<float*>(v_cache.data<float>());
  const int64_t *tables = block_tables.data<int64_t>(), *ctx = ctx_lens.data<int64_t>();
  const int64_t* slots = slot_mapping.data<int64_t>();
  float* o = out.data<float>();
  std::vector<float> roped(heads * d), w;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t base = b * heads * d, past = ctx[b];
    PD_CHECK(past >= 0 && past <= MB * bs, "spmd_decode_attention: context longer than its block table");
    PD_CHECK(slots[b] >= 0 && slots[b] < NB * bs, "spmd_decode_attention: slot outside the pool");
    for (int64_t i = 0; i < heads * d; ++i) {   // RoPE: roll by d/2 within each head
      const int64_t j = i - i % d + (i % d + half) % d;
      roped[i] = x_all[base + i] * cos_all[base + i] + x_all[base + j] * sin_all[base + i];
    }
    for (int64_t h = 0; h < kvh; ++h) {         // the new K/V into the pool
      const int64_t at = slots[b] * kvh + h;   // slot = block * bs + offset: row of [NB * bs * kvh, d]
      std::copy_n(roped.data() + (nh + h) * d, d, kc + at * d);
      std::copy_n(roped.data() + (nh + kvh + h) * d, d, vc + at * d);
    }
    w.resize(past + 1);
    for (int64_t h = 0; h < kvh; ++h) {
      const float* k_new = roped.data() + (nh + h) * d;
      const float* v_new = roped.data() + (nh + kvh + h) * d;
      for (int64_t j = 0; j < g; ++j) {
        const float* q = roped.data() + (h * g + j) * d;
        float top = -INFINITY;
        for (int64_t p = 0; p <= past; ++p) {
          w[p] = dot(q, p < past ? kc + slot_row(tables + b * MB, p, bs, kvh, h) * d : k_new, d);
          top = std::max(top, w[p]);
        }
        float sum = 0.f;
        for (int64_t p = 0; p <= past; ++p) sum += (w[p] = std::exp(w[p] - top));
        float* dst = o + b * nh * d + (h * g + j) * d;
        std::fill(dst, dst + d, 0.f);
        for (int64_t p = 0; p <= past; ++p)
          axpy(w[p] / sum, p < past ? vc + slot_row(tables + b * MB, p, bs, kvh, h) * d : v_new, dst, d);
      }
    }
  }
  return {out};
}

std::vector<std::vector<int64_t>> DecodeAttentionShape(
    const std::vector<int64_t>& qkv, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>& kc, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&) {
  const int64_t nh = qkv[1] < 0 || kc[2] < 0 ? -1 : qkv[1] - 2 * kc[2];
  return {{qkv[0], nh < 0 || qkv[2] < 0 ? -1 : nh * qkv[2]}};
}

std::vector<paddle::DataType> DecodeAttentionDtype(const paddle::DataType& qkv, const paddle::DataType&,
                                                   const paddle::DataType&, const paddle::DataType&,
                                                   const paddle::DataType&, const paddle::DataType&,
                                                   const paddle::DataType&, const paddle::DataType&) {
  return {qkv};
}

PD_BUILD_OP(spmd_decode_attention)
    .Inputs({"QKV", "RopeCos", "RopeSin", "KCache", "VCache", "BlockTables", "CtxLens", "SlotMapping"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(DecodeAttentionForward))
    .SetInferShapeFn(PD_INFER_SHAPE(DecodeAttentionShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(DecodeAttentionDtype));
