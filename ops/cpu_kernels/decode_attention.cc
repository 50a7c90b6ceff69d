// spmd_decode_attention: the decode graphs' attention layer core (one new token per sequence), kept
// with its inputs for the exports that call it; since spmd_paged_attention it is that op's core
// with query_lens = 1 and RoPE from per-step tables (attention.h: threaded, over the pool).
//   qkv          [B, nh + 2 kvh, d] f32   fused projections, before RoPE
//   rope_cos/sin [B, nh + 2 kvh, d] f32   x * cos + roll(x, d/2) * sin; q rows carry 1/sqrt(d),
//                                         v rows are the identity (cos 1, sin 0)
//   k/v_cache    [NB, bs, kvh, d]   f32   the pool: the new K/V are WRITTEN into it at slot_mapping
//   block_tables [B, MB] i64, ctx_lens [B] i64 (past tokens), slot_mapping [B] i64 (new token's slot)
// Output: [B, nh * d] f32, query head j attending with KV head j / (nh / kvh).
#include <vector>

#include "attention.h"
#include "paddle/extension.h"
#include "thread_pool.h"

std::vector<paddle::Tensor> DecodeAttentionForward(const paddle::Tensor& qkv, const paddle::Tensor& rope_cos,
                                                   const paddle::Tensor& rope_sin, const paddle::Tensor& k_cache,
                                                   const paddle::Tensor& v_cache, const paddle::Tensor& block_tables,
                                                   const paddle::Tensor& ctx_lens, const paddle::Tensor& slot_mapping) {
  const char* op = "spmd_decode_attention";
  const auto f32 = paddle::DataType::FLOAT32;
  PD_CHECK(qkv.dtype() == f32 && rope_cos.dtype() == f32 && rope_sin.dtype() == f32, op,
           ": qkv and rope tables must be float32");
  const auto qs = qkv.shape();
  PD_CHECK(qs.size() == 3, op, ": expected qkv [B, nh+2kvh, d]");
  PD_CHECK(rope_cos.shape() == qs && rope_sin.shape() == qs, op, ": rope tables must match qkv");
  const int64_t B = qs[0], d = qs[2];
  const spmd::PagedPool pool = spmd::pool_of(op, k_cache, v_cache, d);
  const int64_t kvh = pool.kv_heads, nh = qs[1] - 2 * kvh, heads = qs[1], half = d / 2;
  PD_CHECK(nh > 0 && nh % kvh == 0 && d % 2 == 0, op, ": query heads must be a multiple of KV heads");
  PD_CHECK(slot_mapping.numel() == B, op, ": one slot per sequence");
  const auto i64 = paddle::DataType::INT64;
  PD_CHECK(block_tables.dtype() == i64 && ctx_lens.dtype() == i64 && slot_mapping.dtype() == i64, op,
           ": block_tables, ctx_lens and slot_mapping must be int64");
  const paddle::Tensor ones = paddle::full({B}, 1, i64, qkv.place());
  spmd::StepTokens st = spmd::tokens_of(op, block_tables, ctx_lens, ones, slot_mapping);
  spmd::check_tokens(op, st, pool, B);

  const paddle::Tensor xc = qkv.contiguous(), cc = rope_cos.contiguous(), sc = rope_sin.contiguous();
  const float *x_all = xc.data<float>(), *cos_all = cc.data<float>(), *sin_all = sc.data<float>();
  std::vector<float> q(B * nh * d);
  spmd::parallel_for(B, [&](int64_t b) {
    for (int64_t h = 0; h < heads; ++h) {     // RoPE (roll by d/2 within each head), q → q, k/v → the pool
      const int64_t base = (b * heads + h) * d;
      float* y = h < nh ? q.data() + (b * nh + h) * d
                        : (h < nh + kvh ? pool.k : pool.v) + (st.slots[b] * kvh + (h - nh) % kvh) * d;
      for (int64_t c = 0; c < d; ++c)
        y[c] = x_all[base + c] * cos_all[base + c] + x_all[base + (c + half) % d] * sin_all[base + c];
    }
  });
  auto out = paddle::empty({B, nh * d}, f32, qkv.place());
  spmd::attend(q.data(), nh * d, nh, pool, st, out.data<float>());
  return {out};
}

std::vector<std::vector<int64_t>> DecodeAttentionShape(
    const std::vector<int64_t>& qkv, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>& kc, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return spmd::attention_shape(qkv, kc);
}

std::vector<paddle::DataType> DecodeAttentionDtype(
    const paddle::DataType& qkv, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&) {
  return {qkv};
}

PD_BUILD_OP(spmd_decode_attention)
    .Inputs({"QKV", "RopeCos", "RopeSin", "KCache", "VCache", "BlockTables", "CtxLens", "SlotMapping"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(DecodeAttentionForward))
    .SetInferShapeFn(PD_INFER_SHAPE(DecodeAttentionShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(DecodeAttentionDtype));
