// spmd_paged_attention: one attention layer's core for any step — prefill chunks, decodes, or both
// in one step — as one Paddle CPU op: RoPE, the write of the step's K/V into the paged pool, and
// causal GQA attention over the past and the step's own tokens (attention.h), on the op library's
// threads.  The step's tokens are flat (the StepPlan's layout, no padded [B, S] grid):
//
//   qkv           [T, nh + 2 kvh, d] f32   fused q|k|v projections, before RoPE (or [T, (nh + 2 kvh) d]:
//                                          the linear's output as it is, d read from the pool)
//   inv_freq      [d / 2] f32              RoPE frequencies, scaling (e.g. llama3) already applied
//   k/v_cache     [NB, kvh, bs, d]   f32   the pool (head-major): the step's K/V are WRITTEN into it at slot_mapping
//   block_tables  [B, MB] i64, ctx_lens [B] i64 (tokens already in the pool), query_lens [B] i64
//   slot_mapping  [T] i64                  pool slot (block * bs + offset) of each token
//   attr scale    float                    softmax scale (1 / sqrt(d) for Llama)
// Output [T, nh * d] f32; query head j attends with KV head j / (nh / kvh).
//
// spmd_paged_attention_int8: the same over an int8 pool, two more inputs after slot_mapping,
// k_scale and v_scale [kvh] f32 (USE_CACHE_KV_INT8's static scales): the step's K/V are written as
// clip(rint(x / scale[head]), +-127) (ops/kv_cache_write.py's rule), the past read back as q * scale;
// the step's own tokens attend to each other with their fp32 K/V.  Token i of sequence b
// is at position ctx_lens[b] + i (RoPE's angle and the causal limit).
//
// RoPE is the rotate-half form, x * cos + rotate_half(x) * sin on each head of q and k, with
// angles fl(fl(position) * inv_freq) as step_tables.rope_tables computes them, q then times scale.
#include <cmath>
#include <vector>

#include "attention.h"
#include "paddle/extension.h"
#include "simd.h"
#include "tensor_pool.h"
#include "thread_pool.h"

namespace {

constexpr int64_t kRopeTokens = 8;   // tokens per RoPE task

// the op, for an fp32 pool (k_scale null) or an int8 one
std::vector<paddle::Tensor> paged_attention(const char* op, const paddle::Tensor& qkv, const paddle::Tensor& inv_freq,
                                            const paddle::Tensor& k_cache, const paddle::Tensor& v_cache,
                                            const paddle::Tensor& block_tables, const paddle::Tensor& ctx_lens,
                                            const paddle::Tensor& query_lens, const paddle::Tensor& slot_mapping,
                                            float scale, const paddle::Tensor* k_scale, const paddle::Tensor* v_scale) {
  PD_CHECK(qkv.dtype() == paddle::DataType::FLOAT32 && inv_freq.dtype() == paddle::DataType::FLOAT32, op,
           ": qkv and inv_freq must be float32");
  const auto qs = qkv.shape(), cs = k_cache.shape();
  PD_CHECK(cs.size() == 4, op, ": the K/V pools must be [num_blocks, kv_heads, block_size, head_dim]");
  PD_CHECK((qs.size() == 3 || (qs.size() == 2 && qs[1] % cs[3] == 0)) && qs.back() > 0, op,
           ": qkv must be [T, nh + 2 kvh, d] or [T, (nh + 2 kvh) d] with d the pool's head_dim");
  const int64_t T = qs[0], d = qs.size() == 3 ? qs[2] : cs[3], half = d / 2;
  PD_CHECK(d % 2 == 0, op, ": head_dim must be even");
  const spmd::PagedPool pool = spmd::pool_of(op, k_cache, v_cache, d, k_scale, v_scale);
  const int64_t heads = qs.size() == 3 ? qs[1] : qs[1] / d, kvh = pool.kv_heads, nh = heads - 2 * kvh;
  PD_CHECK(kvh > 0 && nh > 0 && nh % kvh == 0, op, ": query heads (", nh, ") must be a multiple of KV heads (", kvh,
           ")");
  PD_CHECK(inv_freq.numel() == half, op, ": inv_freq must be [d / 2] = [", half, "]");
  PD_CHECK(slot_mapping.numel() == T, op, ": one slot per token");
  spmd::StepTokens st = spmd::tokens_of(op, block_tables, ctx_lens, query_lens, slot_mapping);
  spmd::check_tokens(op, st, pool, T);

  const paddle::Tensor xc = qkv.contiguous(), fc = inv_freq.contiguous();
  const float *x_all = xc.data<float>(), *freq = fc.data<float>();
  // the caller thread's scratch, kept from call to call (spmd::grown): no allocation a step
  thread_local std::vector<int64_t> positions;
  thread_local spmd::AlignedVector<float> queries, own_keys, own_values;
  int64_t* const position = spmd::grown(positions, T);
  for (int64_t b = 0; b < st.seqs; ++b)
    for (int64_t t = st.start[b]; t < st.start[b + 1]; ++t) position[t] = st.ctx_lens[b] + t - st.start[b];
  float* const q = spmd::grown(queries, T * nh * d);   // rotated, scaled queries [T, nh, d]
  // an int8 pool's step K/V in fp32 [T, kvh, d] (null for an fp32 pool)
  float* const own_k = pool.int8 ? spmd::grown(own_keys, T * kvh * d) : nullptr;
  float* const own_v = pool.int8 ? spmd::grown(own_values, T * kvh * d) : nullptr;
  spmd::parallel_for((T + kRopeTokens - 1) / kRopeTokens, [&](int64_t task) {
    thread_local spmd::AlignedVector<float> angles, key;   // this task's thread's
    float* const cs = spmd::grown(angles, d);   // cos | sin of this token's angles
    float* const k = spmd::grown(key, d);       // a rotated key
    for (int64_t t = task * kRopeTokens; t < std::min(T, (task + 1) * kRopeTokens); ++t) {
      for (int64_t c = 0; c < half; ++c) {
        const float angle = static_cast<float>(position[t]) * freq[c];
        cs[c] = std::cos(angle);
        cs[half + c] = std::sin(angle);
      }
      const int64_t slot = st.slots[t];
      for (int64_t h = 0; h < heads; ++h) {
        const float* x = x_all + (t * heads + h) * d;
        const int64_t kv = (h - nh) % kvh, row = spmd::pool_row(pool, slot, kv);   // (for k and v heads)
        if (h >= nh + kvh) {                          // v: as it is
          spmd::store_row(pool, true, row, kv, x);
          if (pool.int8) std::copy_n(x, d, own_v + (t * kvh + kv) * d);
          continue;
        }
        float* y = h < nh ? q + (t * nh + h) * d : pool.int8 ? own_k + (t * kvh + kv) * d : k;
        const float s = h < nh ? scale : 1.f;
        for (int64_t c = 0; c < half; ++c) {
          const float lo = x[c] * cs[c] - x[half + c] * cs[half + c];
          const float hi = x[half + c] * cs[c] + x[c] * cs[half + c];
          y[c] = lo * s;
          y[half + c] = hi * s;
        }
        if (h >= nh) spmd::store_row(pool, false, row, kv, y);
      }
    }
  });
  auto out = spmd::new_tensor({T, nh * d});
  spmd::attend(q, nh * d, nh, pool, st, out.data<float>(), {own_k, own_v});
  return {out};
}

}  // namespace

std::vector<paddle::Tensor> PagedAttentionForward(const paddle::Tensor& qkv, const paddle::Tensor& inv_freq,
                                                  const paddle::Tensor& k_cache, const paddle::Tensor& v_cache,
                                                  const paddle::Tensor& block_tables, const paddle::Tensor& ctx_lens,
                                                  const paddle::Tensor& query_lens,
                                                  const paddle::Tensor& slot_mapping, float scale) {
  return paged_attention("spmd_paged_attention", qkv, inv_freq, k_cache, v_cache, block_tables, ctx_lens, query_lens,
                         slot_mapping, scale, nullptr, nullptr);
}

std::vector<paddle::Tensor> PagedAttentionInt8Forward(
    const paddle::Tensor& qkv, const paddle::Tensor& inv_freq, const paddle::Tensor& k_cache,
    const paddle::Tensor& v_cache, const paddle::Tensor& block_tables, const paddle::Tensor& ctx_lens,
    const paddle::Tensor& query_lens, const paddle::Tensor& slot_mapping, const paddle::Tensor& k_scale,
    const paddle::Tensor& v_scale, float scale) {
  return paged_attention("spmd_paged_attention_int8", qkv, inv_freq, k_cache, v_cache, block_tables, ctx_lens,
                         query_lens, slot_mapping, scale, &k_scale, &v_scale);
}

std::vector<std::vector<int64_t>> PagedAttentionShape(
    const std::vector<int64_t>& qkv, const std::vector<int64_t>&, const std::vector<int64_t>& kc,
    const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return spmd::attention_shape(qkv, kc);
}

std::vector<paddle::DataType> PagedAttentionDtype(
    const paddle::DataType& qkv, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&) {
  return {qkv};
}

std::vector<std::vector<int64_t>> PagedAttentionInt8Shape(
    const std::vector<int64_t>& qkv, const std::vector<int64_t>&, const std::vector<int64_t>& kc,
    const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&,
    const std::vector<int64_t>&) {
  return spmd::attention_shape(qkv, kc);
}

std::vector<paddle::DataType> PagedAttentionInt8Dtype(
    const paddle::DataType& qkv, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
    const paddle::DataType&, const paddle::DataType&) {
  return {qkv};
}

PD_BUILD_OP(spmd_paged_attention)
    .Inputs({"QKV", "InvFreq", "KCache", "VCache", "BlockTables", "CtxLens", "QueryLens", "SlotMapping"})
    .Outputs({"Out"})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(PagedAttentionForward))
    .SetInferShapeFn(PD_INFER_SHAPE(PagedAttentionShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(PagedAttentionDtype));

PD_BUILD_OP(spmd_paged_attention_int8)
    .Inputs({"QKV", "InvFreq", "KCache", "VCache", "BlockTables", "CtxLens", "QueryLens", "SlotMapping", "KScale",
             "VScale"})
    .Outputs({"Out"})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(PagedAttentionInt8Forward))
    .SetInferShapeFn(PD_INFER_SHAPE(PagedAttentionInt8Shape))
    .SetInferDtypeFn(PD_INFER_DTYPE(PagedAttentionInt8Dtype));
