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
//
// Keys come in two runs: the past (p < ctx_len, through the block table) and the step's own.  An
// int8 pool's past (E = int8_t) is read the same way, each element converted to fp32 as it is
// loaded, its per-KV-head scales folded into a copy of the queries (K) and into the past's weights
// (V); the step's own keys and values are its fp32 ones (as Paddle's attention did: only what
// comes back from the pool is quantised).  An fp32 pool's own keys are read from the pool.
#include "attention.h"
#include "attention_narrow.h"
#include "attention_prefetch.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "paddle/extension.h"
#include "simd.h"
#include "thread_pool.h"

namespace spmd {
namespace {

constexpr int64_t kTileRows = kWidth;   // query rows (tokens x g) per work item, about: one row block
constexpr int64_t kKeyChains = 8;       // keys scored at once (independent FMA chains)
constexpr int64_t kChunksPerThread = 4; // tasks a thread of attend()'s items (2 and 8 measured alike)

struct Item {
  int64_t seq, head, i0, i1;
};

// the pool row of sequence b's key at position p (past: block table; the step's own: its slot)
inline int64_t key_row(const PagedPool& pool, const StepTokens& st, int64_t b, int64_t p, int64_t h) {
  const int64_t past = st.ctx_lens[b], bs = pool.block_size;
  const int64_t slot = p < past ? st.block_tables[b * st.max_blocks + p / bs] * bs + p % bs
                                : st.slots[st.start[b] + p - past];
  return pool_row(pool, slot, h);
}

// s[p * kWidth + l] = q_l . k_p for p in [0, n): qt [d][kWidth], J keys at a time
template <int J, typename E>
void score_keys(const float* qt, const E* const* k, int64_t d, float* s) {
  Vec acc[J];
  for (int j = 0; j < J; ++j) acc[j] = vzero();
  for (int64_t c = 0; c < d; ++c) {
    const Vec qc = vload(qt + c * kWidth);
    for (int j = 0; j < J; ++j) acc[j] = vfma(qc, vset1(static_cast<float>(k[j][c])), acc[j]);
  }
  for (int j = 0; j < J; ++j) vstore(s + j * kWidth, acc[j]);
}

template <typename E, int... J>
void score_dispatch(int64_t j, std::integer_sequence<int, J...>, const float* qt, const E* const* k, int64_t d,
                    float* s) {
  ((j == J + 1 ? score_keys<J + 1>(qt, k, d, s) : void()), ...);
}

// The weights of weigh and its helpers: key p's for row l at s[p * ps + l * rs] (the wide path's
// lanes: ps = kWidth, rs = 1; the narrow path's rows: ps = 1, rs = its row stride)
struct Weights {
  const float* s;
  int64_t ps, rs;
  float at(int64_t p, int64_t l) const { return s[p * ps + l * rs]; }
};

// o[r][0:NV*kWidth] (+)= sum_p w(p, l0 + r) * v_p for G rows from row l0, keys [0, n); pf stepped
// every kWidth keys
template <int NV, int G, typename E>
void weigh_values(Weights s, int64_t l0, const E* const* v, int64_t n, float* o, int64_t ldo, bool add,
                  PoolPrefetch& pf) {
  Vec acc[G][NV];
  for (int r = 0; r < G; ++r)
    for (int i = 0; i < NV; ++i) acc[r][i] = add ? vload(o + r * ldo + i * kWidth) : vzero();
  for (int64_t p = 0; p < n; ++p) {
    if (p % kWidth == 0) pf.step(std::min(kWidth, n - p));
    Vec vv[NV];
    for (int i = 0; i < NV; ++i) vv[i] = vload(v[p] + i * kWidth);
    for (int r = 0; r < G; ++r) {
      const Vec w = vset1(s.at(p, l0 + r));
      for (int i = 0; i < NV; ++i) acc[r][i] = vfma(w, vv[i], acc[r][i]);
    }
  }
  for (int r = 0; r < G; ++r)
    for (int i = 0; i < NV; ++i) vstore(o + r * ldo + i * kWidth, acc[r][i]);
}

// the same for any d (a row at a time, d not a whole number of vectors)
template <typename E>
void weigh_values_any(Weights s, int64_t l, const E* const* v, int64_t n, int64_t d, float* o, bool add) {
  if (!add) std::fill(o, o + d, 0.f);
  for (int64_t p = 0; p < n; ++p) {
    const float w = s.at(p, l);
    int64_t c = 0;
    for (const Vec vw = vset1(w); c + kWidth <= d; c += kWidth) vstore(o + c, vfma(vw, vload(v[p] + c), vload(o + c)));
    for (; c < d; ++c) o[c] = fmadd(w, static_cast<float>(v[p][c]), o[c]);
  }
}

template <int NV, typename E>
void weigh_rows(Weights s, int64_t lanes, const E* const* v, const int64_t* reach, float* o, int64_t ldo,
                bool add, PoolPrefetch& pf) {
  constexpr int G = NV <= 4 ? 4 : 2;   // G x NV accumulators in registers
  int64_t l = 0;
  for (; l + G <= lanes; l += G) weigh_values<NV, G>(s, l, v, reach[l + G - 1], o + l * ldo, ldo, add, pf);
  if constexpr (G > 2)   // a decode's 2-3 rows (g): each value row read once for two
    for (; l + 2 <= lanes; l += 2) weigh_values<NV, 2>(s, l, v, reach[l + 1], o + l * ldo, ldo, add, pf);
  for (; l < lanes; ++l) weigh_values<NV, 1>(s, l, v, reach[l], o + l * ldo, ldo, add, pf);
}

// o[lanes][d] (+)= the weights s times the values v[p], row l over p < reach[l]
template <typename E>
void weigh(Weights s, int64_t lanes, const E* const* v, const int64_t* reach, int64_t d, float* o, bool add,
           PoolPrefetch& pf) {
  const int64_t nv = d % kWidth == 0 ? d / kWidth : 0;
  if (nv == 1) weigh_rows<1>(s, lanes, v, reach, o, d, add, pf);
  else if (nv == 2) weigh_rows<2>(s, lanes, v, reach, o, d, add, pf);
  else if (nv == 4) weigh_rows<4>(s, lanes, v, reach, o, d, add, pf);
  else if (nv == 8) weigh_rows<8>(s, lanes, v, reach, o, d, add, pf);
  else
    for (int64_t l = 0; l < lanes; ++l) weigh_values_any(s, l, v, reach[l], d, o + l * d, add);
}

// s[p * kWidth ...] for keys [0, n), kKeyChains at a time
template <typename E>
void score(const float* qt, const E* const* k, int64_t n, int64_t d, float* s, PoolPrefetch& pf) {
  for (int64_t p = 0; p < n; p += kKeyChains, pf.step(std::min(kKeyChains, n - p)))
    score_dispatch(std::min(kKeyChains, n - p), std::make_integer_sequence<int, kKeyChains>{}, qt, &k[p], d,
                   s + p * kWidth);
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
template <typename E>
void run_block(const Item& it, int64_t rb, int64_t lanes, const float* q, int64_t q_stride, int64_t nh,
               const PagedPool& pool, const StepTokens& st, const OwnKV& own, float* out, PoolPrefetch& pf) {
  constexpr bool kInt8 = std::is_same_v<E, int8_t>;
  const int64_t d = pool.head_dim, kvh = pool.kv_heads, g = nh / kvh, past = st.ctx_lens[it.seq];
  const int64_t first = st.start[it.seq] + it.i0;          // the item's first token
  auto token = [&](int64_t l) { return it.i0 + (rb + l) / g; };   // lane l's token within its sequence
  const int64_t n = past + token(lanes - 1) + 1;           // keys the block's last row sees
  thread_local AlignedVector<float> qt, qs, s, o;           // qs: an int8 past's queries, times k_scale
  thread_local std::vector<const E*> kp, vp;              // the past in the pool
  thread_local std::vector<const float*> kn, vn;          // the step's own keys and values
  qt.assign(d * kWidth, 0.f);
  for (int64_t l = 0; l < lanes; ++l) {
    const float* qr = q + (first + (rb + l) / g) * q_stride + (it.head * g + (rb + l) % g) * d;
    for (int64_t c = 0; c < d; ++c) qt[c * kWidth + l] = qr[c];
  }
  if constexpr (kInt8) {                                   // q . (k8 * ks) = (q * ks) . k8
    qs.resize(d * kWidth);
    for (int64_t i = 0; i < d * kWidth; ++i) qs[i] = qt[i] * pool.k_scale[it.head];
  }
  kp.resize(past + kKeyChains);
  vp.resize(past);
  // the past block by block (key_row's division by the block size, per key, cost ~a quarter of a decode's item)
  const int64_t bs = pool.block_size;
  const int64_t* table = st.block_tables + it.seq * st.max_blocks;
  for (int64_t p = 0, blk = 0; p < past; ++blk) {
    const int64_t row0 = (table[blk] * kvh + it.head) * bs * d;   // the block's rows of this head, d apart
    for (int64_t o = 0; o < bs && p < past; ++o, ++p) {
      kp[p] = static_cast<const E*>(pool.k) + row0 + o * d;
      vp[p] = static_cast<const E*>(pool.v) + row0 + o * d;
    }
  }
  kn.resize(n - past + kKeyChains);
  vn.resize(n - past);
  for (int64_t p = past; p < n; ++p) {
    const int64_t row = kInt8 ? ((st.start[it.seq] + p - past) * kvh + it.head) * d : key_row(pool, st, it.seq, p,
                                                                                                  it.head);
    kn[p - past] = (kInt8 ? own.k : static_cast<const float*>(pool.k)) + row;
    vn[p - past] = (kInt8 ? own.v : static_cast<const float*>(pool.v)) + row;
  }
  // few rows: keys in the lanes (attention_narrow.h), the scores and weights row by row (row l's keys
  // at s[l * ld ...], room for a vector past n).  With AVX2's 8 lanes too: a decode's g = 2 rows use 2 of
  // the wide path's 8 lanes; on a Zen 3 (AVX2) B = 8 decodes over 192 keys ran 1.1-1.2x warm and
  // 1.05-1.15x cold, g = 4 level (RESULTS.md "Session 76"; session 39's "level" was AVX2 code on a Zen 4)
  const bool narrow = lanes <= kNarrowLanes && (kWidth == 16 || kTransposeInRegisters || kInt8);
  const int64_t ld = (n + kWidth - 1) / kWidth * kWidth + kWidth;
  const int64_t ps = narrow ? 1 : kWidth, rs = narrow ? ld : 1;   // weight (p, l) at s[p * ps + l * rs]
  s.resize(narrow ? lanes * ld : n * kWidth);
  constexpr auto kL = std::make_integer_sequence<int, kNarrowLanes>{};
  if (narrow) {
    thread_local AlignedVector<float> kt;
    kt.resize(d * kWidth);
    narrow_dispatch(lanes, kL, kInt8 ? qs.data() : qt.data(), kp.data(), past, d, s.data(), ld, kt.data(), pf);
    narrow_dispatch(lanes, kL, qt.data(), kn.data(), n - past, d, s.data() + past, ld, kt.data(), pf);
  } else {
    score(kInt8 ? qs.data() : qt.data(), kp.data(), past, d, s.data(), pf);
    score(qt.data(), kn.data(), n - past, d, s.data() + past * kWidth, pf);
  }
  float limit[kWidth], inv[kWidth];
  int64_t reach[kWidth], in_past[kWidth], in_own[kWidth];
  for (int64_t l = 0; l < kWidth; ++l) {
    reach[l] = l < lanes ? past + token(l) + 1 : n;         // absent lanes: any finite weights
    limit[l] = static_cast<float>(reach[l]);
    in_past[l] = past;
    in_own[l] = reach[l] - past;
  }
  if (narrow) softmax_dispatch(lanes, kL, s.data(), ld, n, reach, inv);
  else softmax_lanes(s.data(), n, reach[0], vload(limit), inv);
  if constexpr (kInt8) {                                   // sum w (v8 * vs) = sum (w * vs) v8
    const float vs = pool.v_scale[it.head];
    if (narrow)   // each row's past weights, side by side
      for (int64_t l = 0; l < lanes; ++l)
        for (int64_t p = 0; p < past; ++p) s[l * ld + p] *= vs;
    else
      for (int64_t i = 0; i < past * kWidth; ++i) s[i] *= vs;
  }
  o.resize(lanes * d);
  weigh(Weights{s.data(), ps, rs}, lanes, vp.data(), in_past, d, o.data(), false, pf);
  weigh(Weights{s.data() + past * ps, ps, rs}, lanes, vn.data(), in_own, d, o.data(), true, pf);
  for (int64_t l = 0; l < lanes; ++l) {
    float* dst = out + (first + (rb + l) / g) * nh * d + (it.head * g + (rb + l) % g) * d;
    for (int64_t c = 0; c < d; ++c) dst[c] = o[l * d + c] * inv[l];
  }
}

// the item's rows, a row block at a time; `next`: the item after it in this thread's chunk, if any
template <typename E>
void run_item(const Item& it, const Item* next, const float* q, int64_t q_stride, int64_t nh, const PagedPool& pool,
              const StepTokens& st, const OwnKV& own, float* out) {
  const int64_t rows = (it.i1 - it.i0) * (nh / pool.kv_heads);
  const int64_t keys = st.ctx_lens[it.seq] + it.i1;   // the last row's keys: each block scores and weighs them
  PoolPrefetch pf = next ? PoolPrefetch(pool, st, next->seq, next->head, 2 * keys) : PoolPrefetch();
  for (int64_t rb = 0; rb < rows; rb += kWidth)
    run_block<E>(it, rb, std::min(kWidth, rows - rb), q, q_stride, nh, pool, st, own, out, pf);
}

}  // namespace

void attend(const float* q, int64_t q_stride, int64_t nh, const PagedPool& pool, const StepTokens& st, float* out,
            const OwnKV& own) {
  PD_CHECK(!pool.int8 || (own.k != nullptr && own.v != nullptr), "attend: an int8 pool needs the step's own K/V");
  const int64_t g = nh / pool.kv_heads, tile = std::max<int64_t>(1, kTileRows / g);
  std::vector<Item> items;
  for (int64_t b = 0; b < st.seqs; ++b)
    for (int64_t i0 = 0; i0 < st.query_lens[b]; i0 += tile)
      for (int64_t h = 0; h < pool.kv_heads; ++h) items.push_back({b, h, i0, std::min(i0 + tile, st.query_lens[b])});
  // the most keys first: the tasks are handed out in order, so the long ones do not come last
  std::stable_sort(items.begin(), items.end(), [&](const Item& a, const Item& b) {
    return st.ctx_lens[a.seq] + a.i1 > st.ctx_lens[b.seq] + b.i1;
  });
  // A task is a chunk of consecutive items (kChunksPerThread a thread, for balance), so that each
  // item can prefetch the next one's rows (attention_prefetch.h).  Fewer items than that (a batch
  // of one or two) run one a task: two a thread ran slower there (RESULTS.md "Session 43").
  const int64_t count = static_cast<int64_t>(items.size());
  const int64_t chunk = std::max<int64_t>(1, count / (num_threads() * kChunksPerThread));
  parallel_for((count + chunk - 1) / chunk, [&](int64_t c) {
    const int64_t i1 = std::min(count, (c + 1) * chunk);
    for (int64_t i = c * chunk; i < i1; ++i) {
      const Item* next = i + 1 < i1 ? &items[i + 1] : nullptr;
      if (pool.int8) run_item<int8_t>(items[i], next, q, q_stride, nh, pool, st, own, out);
      else run_item<float>(items[i], next, q, q_stride, nh, pool, st, own, out);
    }
  });
}

}  // namespace spmd
