// The attention core of attention.h.
//
// A work item is (sequence, KV head, tile of query tokens): its R = tile x g query rows share every
// key and value they read.  Keys are taken kKeys at a time, transposed into kt[d][kKeys], so that
// one row's kKeys scores are d vector FMAs (no horizontal sums); each row's softmax runs over the
// keys it may see (causal: fewer for earlier rows of the tile); then every value row is read once
// and added into the R output rows it contributes to.  Rows are computed the same way whatever
// thread runs the item or how many threads there are: results are bit-equal for 1 and n threads.
#include "attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "paddle/extension.h"
#include "simd.h"
#include "thread_pool.h"

namespace spmd {
namespace {

constexpr int64_t kKeys = 2 * kWidth;   // keys per transposed block (two vectors of scores per row)
constexpr int64_t kTileRows = 16;       // query rows (tokens x g) per work item, about

struct Item {
  int64_t seq, head, i0, i1;
};

// the pool row of sequence b's key at position p (past: block table; the step's own: its slot)
inline int64_t key_row(const PagedPool& pool, const StepTokens& st, int64_t b, int64_t p, int64_t h) {
  const int64_t past = st.ctx_lens[b], bs = pool.block_size;
  const int64_t slot = p < past ? st.block_tables[b * st.max_blocks + p / bs] * bs + p % bs
                                : st.slots[st.start[b] + p - past];
  return (slot * pool.kv_heads + h) * pool.head_dim;
}

// y[0:d] += a * x[0:d]
inline void axpy(float a, const float* x, float* y, int64_t d) {
  int64_t c = 0;
  for (const Vec va = vset1(a); c + kWidth <= d; c += kWidth) vstore(y + c, vfma(va, vload(x + c), vload(y + c)));
  for (; c < d; ++c) y[c] = fmadd(a, x[c], y[c]);
}

// s[0:n] = exp(s - max s); returns the sum
float softmax_numerators(float* s, int64_t n) {
  Vec vm = vset1(-INFINITY);
  int64_t p = 0;
  for (; p + kWidth <= n; p += kWidth) vm = vmax(vm, vload(s + p));
  float m = vhmax(vm);
  for (; p < n; ++p) m = std::max(m, s[p]);
  Vec vs = vzero();
  const Vec vmx = vset1(m);
  for (p = 0; p + kWidth <= n; p += kWidth) {
    const Vec e = vexp(vsub(vload(s + p), vmx));
    vstore(s + p, e);
    vs = vadd(vs, e);
  }
  float sum = vsum(vs);
  for (; p < n; ++p) sum += (s[p] = std::exp(s[p] - m));
  return sum;
}

void run_item(const Item& it, const float* q, int64_t q_stride, int64_t nh, const PagedPool& pool,
              const StepTokens& st, float* out) {
  const int64_t d = pool.head_dim, g = nh / pool.kv_heads, past = st.ctx_lens[it.seq];
  const int64_t rows = (it.i1 - it.i0) * g, keys = past + it.i1;   // the last row sees `keys` keys
  const int64_t ld = (keys + kKeys - 1) / kKeys * kKeys;
  thread_local std::vector<float> scores, kt, acc;
  scores.resize(rows * ld);
  kt.resize(d * kKeys);
  acc.assign(rows * d, 0.f);
  auto qrow = [&](int64_t r) {   // row r = (token i0 + r / g, query head head * g + r % g)
    return q + (st.start[it.seq] + it.i0 + r / g) * q_stride + (it.head * g + r % g) * d;
  };
  auto first_row = [&](int64_t p) {   // rows that see key p: tokens i >= p - past
    return std::max<int64_t>(0, p - past - it.i0) * g;
  };
  for (int64_t p0 = 0; p0 < keys; p0 += kKeys) {
    for (int64_t j = 0; j < kKeys; ++j) {       // kt[c][j] = K[p0 + j][c], zero past the last key
      const float* k = p0 + j < keys ? pool.k + key_row(pool, st, it.seq, p0 + j, it.head) : nullptr;
      for (int64_t c = 0; c < d; ++c) kt[c * kKeys + j] = k ? k[c] : 0.f;
    }
    for (int64_t r = first_row(p0); r < rows; ++r) {
      const float* qr = qrow(r);
      Vec s0 = vzero(), s1 = vzero();
      for (int64_t c = 0; c < d; ++c) {
        const Vec qc = vset1(qr[c]);
        s0 = vfma(qc, vload(kt.data() + c * kKeys), s0);
        s1 = vfma(qc, vload(kt.data() + c * kKeys + kWidth), s1);
      }
      vstore(scores.data() + r * ld + p0, s0);
      vstore(scores.data() + r * ld + p0 + kWidth, s1);
    }
  }
  std::vector<float> inv(rows);
  for (int64_t r = 0; r < rows; ++r)   // row r sees the keys up to its own position
    inv[r] = 1.f / softmax_numerators(scores.data() + r * ld, past + it.i0 + r / g + 1);
  for (int64_t p = 0; p < keys; ++p) {
    const float* v = pool.v + key_row(pool, st, it.seq, p, it.head);
    for (int64_t r = first_row(p); r < rows; ++r) axpy(scores[r * ld + p], v, acc.data() + r * d, d);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + (st.start[it.seq] + it.i0 + r / g) * nh * d + (it.head * g + r % g) * d;
    for (int64_t c = 0; c < d; ++c) o[c] = acc[r * d + c] * inv[r];
  }
}

}  // namespace

PagedPool pool_of(const char* op, const paddle::Tensor& k_cache, const paddle::Tensor& v_cache, int64_t head_dim) {
  const auto cs = k_cache.shape();
  PD_CHECK(k_cache.is_cpu() && v_cache.is_cpu(), op, ": CPU tensors only");
  PD_CHECK(k_cache.dtype() == paddle::DataType::FLOAT32 && v_cache.dtype() == paddle::DataType::FLOAT32, op,
           ": the K/V pools must be float32");
  PD_CHECK(cs.size() == 4 && cs[3] == head_dim && v_cache.shape() == cs, op,
           ": the K/V pools must both be [num_blocks, block_size, kv_heads, head_dim = ", head_dim, "]");
  // written in place (see attention.h)
  return {const_cast<float*>(k_cache.data<float>()), const_cast<float*>(v_cache.data<float>()), cs[0], cs[1],
          cs[2], cs[3]};
}

StepTokens tokens_of(const char* op, const paddle::Tensor& block_tables, const paddle::Tensor& ctx_lens,
                     const paddle::Tensor& query_lens, const paddle::Tensor& slot_mapping) {
  const auto i64 = paddle::DataType::INT64;
  PD_CHECK(block_tables.dtype() == i64 && ctx_lens.dtype() == i64 && query_lens.dtype() == i64 &&
               slot_mapping.dtype() == i64, op, ": block_tables, ctx_lens, query_lens and slot_mapping must be int64");
  const auto bt = block_tables.shape();
  PD_CHECK(bt.size() == 2 && ctx_lens.numel() == bt[0] && query_lens.numel() == bt[0], op,
           ": one block table row, context length and query length per sequence");
  return {bt[0], query_lens.data<int64_t>(), ctx_lens.data<int64_t>(), block_tables.data<int64_t>(), bt[1],
          slot_mapping.data<int64_t>(), {}};
}

std::vector<std::vector<int64_t>> attention_shape(const std::vector<int64_t>& qkv,
                                                  const std::vector<int64_t>& k_cache) {
  const int64_t nh = qkv[1] < 0 || k_cache[2] < 0 ? -1 : qkv[1] - 2 * k_cache[2];
  return {{qkv[0], nh < 0 || qkv[2] < 0 ? -1 : nh * qkv[2]}};
}

int64_t check_tokens(const char* op, StepTokens& st, const PagedPool& pool, int64_t tokens) {
  const int64_t bs = pool.block_size, capacity = pool.blocks * bs;
  st.start.assign(st.seqs + 1, 0);
  for (int64_t b = 0; b < st.seqs; ++b) {
    const int64_t past = st.ctx_lens[b], len = st.query_lens[b];
    PD_CHECK(past >= 0 && len >= 0, op, ": negative context or query length (sequence ", b, ")");
    PD_CHECK(past <= st.max_blocks * bs, op, ": context longer than its block table (sequence ", b, ")");
    for (int64_t i = 0; i < (past + bs - 1) / bs; ++i) {
      const int64_t blk = st.block_tables[b * st.max_blocks + i];
      PD_CHECK(blk >= 0 && blk < pool.blocks, op, ": block ", blk, " outside the pool (sequence ", b, ")");
    }
    st.start[b + 1] = st.start[b] + len;
  }
  PD_CHECK(st.start[st.seqs] == tokens, op, ": query lengths sum to ", st.start[st.seqs], ", not the ", tokens,
           " tokens of qkv");
  for (int64_t t = 0; t < tokens; ++t)
    PD_CHECK(st.slots[t] >= 0 && st.slots[t] < capacity, op, ": slot outside the pool (token ", t, ")");
  return tokens;
}

void attend(const float* q, int64_t q_stride, int64_t nh, const PagedPool& pool, const StepTokens& st, float* out) {
  const int64_t g = nh / pool.kv_heads, tile = std::max<int64_t>(1, kTileRows / g);
  std::vector<Item> items;
  for (int64_t b = 0; b < st.seqs; ++b)
    for (int64_t i0 = 0; i0 < st.query_lens[b]; i0 += tile)
      for (int64_t h = 0; h < pool.kv_heads; ++h) items.push_back({b, h, i0, std::min(i0 + tile, st.query_lens[b])});
  // the most keys first: the tasks are handed out in order, so the long ones do not come last
  std::stable_sort(items.begin(), items.end(), [&](const Item& a, const Item& b) {
    return st.ctx_lens[a.seq] + a.i1 > st.ctx_lens[b.seq] + b.i1;
  });
  parallel_for(static_cast<int64_t>(items.size()),
               [&](int64_t i) { run_item(items[i], q, q_stride, nh, pool, st, out); });
}

}  // namespace spmd
