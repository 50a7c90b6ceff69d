// spmd_decode_attention: one decode step's attention (one new token per sequence) over the paged KV
// pool, GQA, as one Paddle CPU custom op.
//
// The decode graph did this with ~15 ops per layer (split, two gather_nd of the past into
// [B, kvh, P, d], two concats with the new K/V, matmul, mask add, softmax, matmul, reshapes): at
// batch 1 each costs more in Paddle's per-op overhead than in arithmetic.  Same inputs as that
// graph (step_tables.py builds them), same result up to float summation order:
//   qkv        [B, nh + 2 kvh, d] f32   after RoPE; q already scaled by 1/sqrt(d)
//   k_cache    [NB, bs, kvh, d]   f32   the pool (read only; the runner writes new K/V after the graph)
//   v_cache    [NB, bs, kvh, d]   f32
//   past_index [B, kvh, P, 3]     i64   (block, offset, kv head) of each past slot
//   attn_mask  [B, 1, 1, P + 1]   f32   additive; NEG_INF (-1e30) marks padding past the context
// Output: [B, nh * d] f32, query head j attending with KV head j / (nh / kvh).
#include <algorithm>
#include <cmath>
#include <vector>

#include "paddle/extension.h"

namespace {

constexpr float kMasked = -1e29f;  // step_tables.NEG_INF is -1e30: such a slot's weight is exactly 0

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

std::vector<paddle::Tensor> DecodeAttentionForward(const paddle::Tensor& qkv, const paddle::Tensor& k_cache,
                                                   const paddle::Tensor& v_cache, const paddle::Tensor& past_index,
                                                   const paddle::Tensor& attn_mask) {
  PD_CHECK(qkv.dtype() == paddle::DataType::FLOAT32 && k_cache.dtype() == paddle::DataType::FLOAT32 &&
               v_cache.dtype() == paddle::DataType::FLOAT32 && attn_mask.dtype() == paddle::DataType::FLOAT32,
           "spmd_decode_attention: qkv, caches and mask must be float32");
  PD_CHECK(past_index.dtype() == paddle::DataType::INT64, "spmd_decode_attention: past_index must be int64");
  const auto qs = qkv.shape(), cs = k_cache.shape(), ps = past_index.shape(), ms = attn_mask.shape();
  PD_CHECK(qs.size() == 3 && cs.size() == 4 && ps.size() == 4 && ms.size() == 4,
           "spmd_decode_attention: expected qkv [B, nh+2kvh, d], caches [NB, bs, kvh, d], "
           "past_index [B, kvh, P, 3], attn_mask [B, 1, 1, P+1]");
  const int64_t B = qs[0], d = qs[2], bs = cs[1], kvh = cs[2], P = ps[2];
  const int64_t nh = qs[1] - 2 * kvh;
  PD_CHECK(cs[3] == d && v_cache.shape() == cs, "spmd_decode_attention: cache shape does not match qkv");
  PD_CHECK(nh > 0 && nh % kvh == 0, "spmd_decode_attention: query heads must be a multiple of KV heads");
  PD_CHECK(ps[0] == B && ps[1] == kvh && ps[3] == 3, "spmd_decode_attention: past_index shape");
  PD_CHECK(ms[0] == B && ms[2] == 1 && ms[3] == P + 1, "spmd_decode_attention: attn_mask must be [B, 1, 1, P+1]");
  const int64_t g = nh / kvh;

  auto out = paddle::empty({B, nh * d}, paddle::DataType::FLOAT32, qkv.place());
  const float* q_all = qkv.data<float>();
  const float* kc = k_cache.data<float>();
  const float* vc = v_cache.data<float>();
  const int64_t* pidx = past_index.data<int64_t>();
  const float* mask = attn_mask.data<float>();
  float* o = out.data<float>();
  std::vector<float> w(P + 1);
  for (int64_t b = 0; b < B; ++b) {
    const float* row = q_all + b * (nh + 2 * kvh) * d;
    const float* m = mask + b * (P + 1);
    for (int64_t h = 0; h < kvh; ++h) {
      const float* k_new = row + (nh + h) * d;
      const float* v_new = row + (nh + kvh + h) * d;
      const int64_t* slots = pidx + (b * kvh + h) * P * 3;   // [P, 3]
      for (int64_t j = 0; j < g; ++j) {
        const float* q = row + (h * g + j) * d;
        float top = -INFINITY;
        for (int64_t p = 0; p <= P; ++p) {
          if (m[p] < kMasked) { w[p] = -INFINITY; continue; }
          const float* k = p < P ? kc + ((slots[3 * p] * bs + slots[3 * p + 1]) * kvh + slots[3 * p + 2]) * d : k_new;
          w[p] = dot(q, k, d) + m[p];
          top = std::max(top, w[p]);
        }
        float sum = 0.f;
        for (int64_t p = 0; p <= P; ++p) {
          w[p] = w[p] == -INFINITY ? 0.f : std::exp(w[p] - top);
          sum += w[p];
        }
        float* dst = o + b * nh * d + (h * g + j) * d;
        std::fill(dst, dst + d, 0.f);
        for (int64_t p = 0; p <= P; ++p) {
          if (w[p] == 0.f) continue;
          const float* v = p < P ? vc + ((slots[3 * p] * bs + slots[3 * p + 1]) * kvh + slots[3 * p + 2]) * d : v_new;
          axpy(w[p] / sum, v, dst, d);
        }
      }
    }
  }
  return {out};
}

std::vector<std::vector<int64_t>> DecodeAttentionShape(const std::vector<int64_t>& qkv, const std::vector<int64_t>& kc,
                                                       const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                       const std::vector<int64_t>&) {
  const int64_t nh = qkv[1] < 0 || kc[2] < 0 ? -1 : qkv[1] - 2 * kc[2];
  return {{qkv[0], nh < 0 || qkv[2] < 0 ? -1 : nh * qkv[2]}};
}

std::vector<paddle::DataType> DecodeAttentionDtype(const paddle::DataType& qkv, const paddle::DataType&,
                                                   const paddle::DataType&, const paddle::DataType&,
                                                   const paddle::DataType&) {
  return {qkv};
}

PD_BUILD_OP(spmd_decode_attention)
    .Inputs({"QKV", "KCache", "VCache", "PastIndex", "AttnMask"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(DecodeAttentionForward))
    .SetInferShapeFn(PD_INFER_SHAPE(DecodeAttentionShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(DecodeAttentionDtype));
