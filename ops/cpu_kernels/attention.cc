// The attention core of attention.h.
//
// A work item is (sequence, KV head, tile of query tokens): its rows (tile x g query heads) share
// every key and value they read.  Rows go kWidth at a time into the lanes of a vector ("a row
// block"): q is transposed into qt[d][kWidth] once, so a key's kWidth scores are d FMAs with the
// key's elements broadcast (keys read as they lie in the pool, 8 at a time for independent
// chains); the softmax runs across lanes, keys past a lane's causal limit masked to weight 0; then
// each value row is read once per group of rows and accumulated in registers.  Every lane's
// arithmetic is its own row's, in key order, whatever the block, item or thread: results are
// bit-equal for 1 and n threads, and a row does not depend on the rows it is computed with.
#include "attention.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "paddle/extension.h"
#include "simd.h"
#include "thread_pool.h"

namespace spmd {
namespace {

constexpr int64_t kTileRows = kWidth;   // query rows (tokens x g) per work item, about: one row block
constexpr int64_t kKeyChains = 8;       // keys scored at once (independent FMA chains)

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

// s[p * kWidth + l] = q_l . k_p for p in [0, n): qt [d][kWidth], J keys at a time
template <int J>
void score_keys(const float* qt, const float* const* k, int64_t d, float* s) {
  Vec acc[J];
  for (int j = 0; j < J; ++j) acc[j] = vzero();
  for (int64_t c = 0; c < d; ++c) {
    const Vec qc = vload(qt + c * kWidth);
    for (int j = 0; j < J; ++j) acc[j] = vfma(qc, vset1(k[j][c]), acc[j]);
  }
  for (int j = 0; j < J; ++j) vstore(s + j * kWidth, acc[j]);
}

template <int... J>
void score_dispatch(int64_t j, std::integer_sequence<int, J...>, const float* qt, const float* const* k, int64_t d,
                    float* s) {
  ((j == J + 1 ? score_keys<J + 1>(qt, k, d, s) : void()), ...);
}

// o[r][0:NV*kWidth] = sum_p s[p * kWidth + l0 + r] * v_p for G rows from lane l0, keys [0, n)
template <int NV, int G>
void weigh_values(const float* s, int64_t l0, const float* const* v, int64_t n, float* o, int64_t ldo) {
  Vec acc[G][NV];
  for (int r = 0; r < G; ++r)
    for (int i = 0; i < NV; ++i) acc[r][i] = vzero();
  for (int64_t p = 0; p < n; ++p) {
    Vec vv[NV];
    for (int i = 0; i < NV; ++i) vv[i] = vload(v[p] + i * kWidth);
    for (int r = 0; r < G; ++r) {
      const Vec w = vset1(s[p * kWidth + l0 + r]);
      for (int i = 0; i < NV; ++i) acc[r][i] = vfma(w, vv[i], acc[r][i]);
    }
  }
  for (int r = 0; r < G; ++r)
    for (int i = 0; i < NV; ++i) vstore(o + r * ldo + i * kWidth, acc[r][i]);
}

// the same for any d (a row at a time, d not a whole number of vectors)
void weigh_values_any(const float* s, int64_t l, const float* const* v, int64_t n, int64_t d, float* o) {
  std::fill(o, o + d, 0.f);
  for (int64_t p = 0; p < n; ++p) {
    const float w = s[p * kWidth + l];
    int64_t c = 0;
    for (const Vec vw = vset1(w); c + kWidth <= d; c += kWidth) vstore(o + c, vfma(vw, vload(v[p] + c), vload(o + c)));
    for (; c < d; ++c) o[c] = fmadd(w, v[p][c], o[c]);
  }
}

template <int NV>
void weigh_rows(const float* s, int64_t lanes, const float* const* v, const int64_t* reach, float* o, int64_t ldo) {
  constexpr int G = NV <= 4 ? 4 : 2;   // G x NV accumulators in registers
  int64_t l = 0;
  for (; l + G <= lanes; l += G) weigh_values<NV, G>(s, l, v, reach[l + G - 1], o + l * ldo, ldo);
  for (; l < lanes; ++l) weigh_values<NV, 1>(s, l, v, reach[l], o + l * ldo, ldo);
}

// softmax across lanes over keys [0, n): lane l sees keys p < limit[l] (all see [0, common));
// s becomes the weights (0 past a lane's limit), inv[l] = 1 / their sum
void softmax_lanes(float* s, int64_t n, int64_t common, const Vec limit, float* inv) {
  const Vec none = vset1(-INFINITY);
  Vec m = none;
  for (int64_t p = 0; p < n; ++p) {
    const Vec x = vload(s + p * kWidth);
    m = vmax(m, p < common ? x : vselect_lt(vset1(static_cast<float>(p)), limit, x, none));
  }
  Vec sum = vzero();
  for (int64_t p = 0; p < n; ++p) {
    Vec e = vexp(vsub(vload(s + p * kWidth), m));
    if (p >= common) e = vselect_lt(vset1(static_cast<float>(p)), limit, e, vzero());
    vstore(s + p * kWidth, e);
    sum = vadd(sum, e);
  }
  vstore(inv, sum);
  for (int64_t l = 0; l < kWidth; ++l) inv[l] = 1.f / inv[l];
}

// the rows [rb, rb + lanes) of an item
void run_block(const Item& it, int64_t rb, int64_t lanes, const float* q, int64_t q_stride, int64_t nh,
               const PagedPool& pool, const StepTokens& st, float* out) {
  const int64_t d = pool.head_dim, g = nh / pool.kv_heads, past = st.ctx_lens[it.seq];
  const int64_t first = st.start[it.seq] + it.i0;          // the item's first token
  auto token = [&](int64_t l) { return it.i0 + (rb + l) / g; };   // lane l's token within its sequence
  const int64_t n = past + token(lanes - 1) + 1;           // keys the block's last row sees
  thread_local std::vector<float> qt, s, o;
  thread_local std::vector<const float*> k, v;
  qt.assign(d * kWidth, 0.f);
  for (int64_t l = 0; l < lanes; ++l) {
    const float* qr = q + (first + (rb + l) / g) * q_stride + (it.head * g + (rb + l) % g) * d;
    for (int64_t c = 0; c < d; ++c) qt[c * kWidth + l] = qr[c];
  }
  k.resize(n + kKeyChains);
  v.resize(n);
  for (int64_t p = 0; p < n; ++p) {
    const int64_t row = key_row(pool, st, it.seq, p, it.head);
    k[p] = pool.k + row;
    v[p] = pool.v + row;
  }
  s.resize(n * kWidth);
  for (int64_t p = 0; p < n; p += kKeyChains)
    score_dispatch(std::min(kKeyChains, n - p), std::make_integer_sequence<int, kKeyChains>{}, qt.data(), &k[p], d,
                   s.data() + p * kWidth);
  float limit[kWidth], inv[kWidth];
  int64_t reach[kWidth];
  for (int64_t l = 0; l < kWidth; ++l) {
    reach[l] = l < lanes ? past + token(l) + 1 : n;         // absent lanes: any finite weights
    limit[l] = static_cast<float>(reach[l]);
  }
  softmax_lanes(s.data(), n, reach[0], vload(limit), inv);
  o.resize(lanes * d);
  const int64_t nv = d % kWidth == 0 ? d / kWidth : 0;
  if (nv == 1) weigh_rows<1>(s.data(), lanes, v.data(), reach, o.data(), d);
  else if (nv == 2) weigh_rows<2>(s.data(), lanes, v.data(), reach, o.data(), d);
  else if (nv == 4) weigh_rows<4>(s.data(), lanes, v.data(), reach, o.data(), d);
  else if (nv == 8) weigh_rows<8>(s.data(), lanes, v.data(), reach, o.data(), d);
  else
    for (int64_t l = 0; l < lanes; ++l) weigh_values_any(s.data(), l, v.data(), reach[l], d, o.data() + l * d);
  for (int64_t l = 0; l < lanes; ++l) {
    float* dst = out + (first + (rb + l) / g) * nh * d + (it.head * g + (rb + l) % g) * d;
    for (int64_t c = 0; c < d; ++c) dst[c] = o[l * d + c] * inv[l];
  }
}

void run_item(const Item& it, const float* q, int64_t q_stride, int64_t nh, const PagedPool& pool,
              const StepTokens& st, float* out) {
  const int64_t rows = (it.i1 - it.i0) * (nh / pool.kv_heads);
  for (int64_t rb = 0; rb < rows; rb += kWidth)
    run_block(it, rb, std::min(kWidth, rows - rb), q, q_stride, nh, pool, st, out);
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
  // qkv [T, heads, d] or [T, heads * d] (d = the pool's head_dim); out [T, (heads - 2 kvh) d]
  const int64_t d = qkv.size() == 3 ? qkv[2] : k_cache[3];
  const int64_t width = qkv.size() == 3 ? (qkv[1] < 0 || d < 0 ? -1 : qkv[1] * d) : qkv[1];
  const bool known = width >= 0 && k_cache[2] >= 0 && d >= 0;
  return {{qkv[0], known ? width - 2 * k_cache[2] * d : -1}};
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
