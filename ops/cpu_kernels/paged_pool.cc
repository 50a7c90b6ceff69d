// The paged pool and step tables of spmd_paged_attention (attention.h): the op's checks of its
// tensors, the store of one head's K/V row (fp32, or int8 with its head's scale, clips counted),
// and shape inference.  The attention itself is attention.cc's.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "attention.h"
#include "paddle/extension.h"

namespace spmd {

// Entries clipped by store_row since the library loaded, K then V (every int8 pool of the process).
std::atomic<long> g_kv_int8_clipped[2];

PagedPool pool_of(const char* op, const paddle::Tensor& k_cache, const paddle::Tensor& v_cache, int64_t head_dim,
                  const paddle::Tensor* k_scale, const paddle::Tensor* v_scale) {
  const auto cs = k_cache.shape();
  const bool int8 = k_scale != nullptr;
  const auto dtype = int8 ? paddle::DataType::INT8 : paddle::DataType::FLOAT32;
  PD_CHECK(k_cache.is_cpu() && v_cache.is_cpu(), op, ": CPU tensors only");
  PD_CHECK(k_cache.dtype() == dtype && v_cache.dtype() == dtype, op, ": the K/V pools must be ",
           int8 ? "int8" : "float32");
  PD_CHECK(cs.size() == 4 && cs[3] == head_dim && v_cache.shape() == cs, op,
           ": the K/V pools must both be [num_blocks, kv_heads, block_size, head_dim = ", head_dim, "]");
  PagedPool pool{const_cast<void*>(k_cache.data()), const_cast<void*>(v_cache.data()),   // written in place
                 int8, nullptr, nullptr, cs[0], cs[2], cs[1], cs[3]};
  if (int8) {
    for (const paddle::Tensor* t : {k_scale, v_scale})
      PD_CHECK(t->is_cpu() && t->dtype() == paddle::DataType::FLOAT32 && t->numel() == cs[1], op,
               ": the int8 pool's scales must be float32 [kv_heads] = [", cs[1], "]");
    pool.k_scale = k_scale->data<float>();
    pool.v_scale = v_scale->data<float>();
  }
  return pool;
}

void store_row(const PagedPool& pool, bool is_v, int64_t row, int64_t head, const float* x) {
  const int64_t d = pool.head_dim;
  if (!pool.int8) {
    std::copy_n(x, d, static_cast<float*>(is_v ? pool.v : pool.k) + row);
    return;
  }
  const float s = (is_v ? pool.v_scale : pool.k_scale)[head];
  int8_t* y = static_cast<int8_t*>(is_v ? pool.v : pool.k) + row;
  long clipped = 0;
  for (int64_t c = 0; c < d; ++c) {
    const float q = std::nearbyint(x[c] / s);
    clipped += std::fabs(q) > 127.f;
    y[c] = static_cast<int8_t>(std::clamp(q, -127.f, 127.f));
  }
  if (clipped != 0) g_kv_int8_clipped[is_v].fetch_add(clipped, std::memory_order_relaxed);   // rare: no contention
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
  // qkv [T, heads, d] or [T, heads * d] (d = the pool's head_dim); out [T, (heads - 2 kvh) d]
  const int64_t d = qkv.size() == 3 ? qkv[2] : k_cache[3];
  const int64_t width = qkv.size() == 3 ? (qkv[1] < 0 || d < 0 ? -1 : qkv[1] * d) : qkv[1];
  const bool known = width >= 0 && k_cache[1] >= 0 && d >= 0;   // k_cache [NB, kvh, bs, d]
  return {{qkv[0], known ? width - 2 * k_cache[1] * d : -1}};
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

}  // namespace spmd

// Read by ops/paddle_ext.py through ctypes (spmd_serve:kv_cache_int8_clipped_total in /metrics).
extern "C" long spmd_kv_int8_clipped(int is_v) { return spmd::g_kv_int8_clipped[is_v != 0].load(); }
