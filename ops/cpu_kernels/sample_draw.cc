// The CPU sampler's two per-element steps in C, bit for bit those of the numpy twin (ops/sample_twin.py),
// which stays the oracle: `spmd_exp2_weight` is its exp2_weight and `spmd_sample_draw` its _draw.  The
// twin spends ~20 numpy passes over a sampled row's vocabulary (1-4 ms a row at 32k-128k tokens on this
// project's CPU); these make two to four, and a draw without top-k or top logprobs sorts almost
// nothing.  Called through ctypes (ops/sample_native.py), on numpy
// arrays; no Paddle here.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

uint32_t float_key(float x) {  // sample_twin.float_key: order-preserving, -0.0 as +0.0
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

int bucket(uint32_t w) {  // the float32 exponent of the weight: monotone in it, so in the ranking
  const float f = static_cast<float>(w);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<int>(bits >> 23);
}

struct Buckets {  // the positive weights by bucket: mass and count, heaviest (highest exponent) first
  uint64_t mass[256] = {0};
  long count[256] = {0};
  int top = 0;
  long n_pos = 0;
  uint64_t q_all = 0;

  explicit Buckets(const uint32_t* q, long V) {
    for (long i = 0; i < V; ++i) {
      if (!q[i]) continue;
      const int e = bucket(q[i]);
      mass[e] += q[i];
      count[e] += 1;
      top = std::max(top, e);
      q_all += q[i];
      ++n_pos;
    }
  }

  // The first ranks' count whose weights reach `target`: whole buckets (sample_twin._prefix_len;
  // only how much is sorted depends on it, never a result).
  long prefix_len(unsigned __int128 target) const {
    unsigned __int128 cum = 0;
    long n = 0;
    for (int e = top; e >= 0; --e) {
      cum += mass[e];
      n += count[e];
      if (cum >= target) return n;
    }
    return n;
  }
};

uint64_t rank_key(const float* s, long i) {  // ~key << 32 | id: ascending is rank order, all distinct
  return static_cast<uint64_t>(~float_key(s[i])) << 32 | static_cast<uint64_t>(i);
}

// Where the ranked weights' running sum (from `acc`) first satisfies `reach` (monotone in it), among one
// bucket's rank keys `buf` (any order; the bucket's tokens all rank after those `acc` sums): a weighted
// quickselect halves the candidates (the better-ranked half's mass says which half holds the crossing)
// until a few are left to sort, so the twin's ranking decides at O(size) cost.
struct Crossing {
  uint64_t key;  // the rank key there
  uint64_t sum;  // the running sum through it
  long count;    // the bucket's ranks through it
};

template <class Reach>
Crossing cross(std::vector<uint64_t>& buf, const uint32_t* q, uint64_t acc, Reach reach) {
  auto lo = buf.begin(), hi = buf.end();
  long before = 0;
  while (hi - lo > 64) {
    const auto mid = lo + (hi - lo) / 2;
    std::nth_element(lo, mid, hi);  // [lo, mid): the better-ranked half, unordered
    uint64_t half = 0;
    for (auto it = lo; it != mid; ++it) half += q[*it & 0xFFFFFFFFu];
    if (reach(acc + half)) {
      hi = mid;
    } else {
      acc += half;
      before += mid - lo;
      lo = mid;
    }
  }
  std::sort(lo, hi);
  for (auto it = lo; it != hi; ++it) {
    acc += q[*it & 0xFFFFFFFFu];
    ++before;
    if (reach(acc)) return {*it, acc, before};
  }
  return {*(hi - 1), acc, before};  // (never: the caller's bucket passes the mark)
}

// The rank keys of bucket `at`'s tokens (only those ranked at or before `upto`) into `buf`.
void collect(const float* s, const uint32_t* q, long V, int at, uint64_t upto, std::vector<uint64_t>& buf) {
  buf.clear();
  for (long i = 0; i < V; ++i)
    if (q[i] && bucket(q[i]) == at) {
      const uint64_t key = rank_key(s, i);
      if (key <= upto) buf.push_back(key);
    }
}

// The token where the ranked weights' running sum passes t (< the kept mass, which ends at rank key
// `upto` in bucket `last`): every heavier bucket ranks wholly before a lighter one, so only the bucket
// holding t is searched.
long draw_below(const float* s, const uint32_t* q, long V, const Buckets& b, uint64_t t, int last, uint64_t upto,
                std::vector<uint64_t>& buf) {
  uint64_t acc = 0;
  int at = b.top;
  for (; at > last && acc + b.mass[at] <= t; --at) acc += b.mass[at];
  collect(s, q, V, at, at == last ? upto : ~0ull, buf);
  return static_cast<long>(cross(buf, q, acc, [t](uint64_t u) { return u > t; }).key & 0xFFFFFFFFu);
}

// top-p without top-k or top logprobs: the kept ranks end where the running sum first reaches
// need = ceil(top_p * Q); the draw is then below their mass (the twin's loop, without ranking the row).
long draw_top_p(const float* s, const uint32_t* q, long V, const Buckets& b, float top_p, uint64_t x0,
                uint64_t* total, long* kept, std::vector<uint64_t>& buf) {
  const uint64_t need = static_cast<uint64_t>(std::ceil(static_cast<double>(top_p) * static_cast<double>(b.q_all)));
  uint64_t acc = 0;
  long count = 0;
  int at = b.top;
  for (; at > 0 && acc + b.mass[at] < need; --at) {
    acc += b.mass[at];
    count += b.count[at];
  }
  collect(s, q, V, at, ~0ull, buf);
  const Crossing end = cross(buf, q, acc, [need](uint64_t u) { return u >= need; });
  *total = end.sum;
  *kept = count + end.count;
  const uint64_t t = static_cast<uint64_t>((static_cast<unsigned __int128>(x0) * end.sum) >> 32);
  return draw_below(s, q, V, b, t, at, end.key, buf);
}

}  // namespace

// Each float32 operation rounded on its own, as numpy's are: this file is compiled with -ffp-contract=off
// (ops/paddle_ext.py), so no a * b + c becomes an FMA; the loop vectorises.
extern "C" void spmd_exp2_weight(const float* __restrict d, uint32_t* __restrict q, long n) {
  // sample_twin._COEF (ln2^n / n!, n = 0..8) and _LOG2E as exact float32 values (hex), as the CUDA source
  // embeds them (ops/kernels/sample_row.cuh)
  constexpr float c0 = 0x1p+0f, c1 = 0x1.62e43p-1f, c2 = 0x1.ebfbep-3f, c3 = 0x1.c6b08ep-5f, c4 = 0x1.3b2ab6p-7f;
  constexpr float c5 = 0x1.5d87fep-10f, c6 = 0x1.430912p-13f, c7 = 0x1.ffcbfcp-17f, c8 = 0x1.62c022p-20f;
  constexpr float log2e = 0x1.715476p+0f;
  for (long i = 0; i < n; ++i) {
    float y = d[i] * log2e;
    const bool dead = !(y >= -33.0f);
    y = dead ? 0.0f : y;
    const float r = __builtin_rintf(y);  // floor(y), y in [-33, 0]: rint vectorises, floorf does not here
    const float k = r > y ? r - 1.0f : r;
    const float f = y - k;
    float p = f * c8;
    p = (p + c7) * f;
    p = (p + c6) * f;
    p = (p + c5) * f;
    p = (p + c4) * f;
    p = (p + c3) * f;
    p = (p + c2) * f;
    p = (p + c1) * f;
    p = p + c0;  // in [1, 2): a normal float32
    // ldexp(p, k + 31) with k + 31 in [-2, 31]: the exponent field moved, exact as ldexp is
    const int32_t bits = __builtin_bit_cast(int32_t, p) + ((static_cast<int32_t>(k) + 31) << 23);
    const float v = __builtin_rintf(__builtin_bit_cast(float, bits));  // < 2**32: P < 2
    q[i] = dead ? 0u : static_cast<uint32_t>(static_cast<int64_t>(v));
  }
}

// One sampled row (sample_twin._draw): values s[V] and weights q[V] -> the drawn token; the kept weight
// and count (*total, *kept); the first min(n, kept) ranks' ids in ids[] (their number returned).
extern "C" long spmd_sample_draw(const float* s, const uint32_t* q, long V, long top_k, float top_p, uint64_t x0,
                                 long n, long* ids, long* token, uint64_t* total_out, long* kept_out) {
  thread_local std::vector<uint64_t> ranking, cum;
  const Buckets b(q, V);
  const long n_pos = b.n_pos;
  const uint64_t q_all = b.q_all;
  const long k = top_k <= 0 ? n_pos : std::min(top_k, n_pos);
  if (k == n_pos && n == 0) {  // no top-k, no top logprobs: the row is not ranked
    if (top_p < 1.0f) {
      *token = draw_top_p(s, q, V, b, top_p, x0, total_out, kept_out, ranking);
    } else {
      const uint64_t t = static_cast<uint64_t>((static_cast<unsigned __int128>(x0) * q_all) >> 32);
      *token = draw_below(s, q, V, b, t, 0, ~0ull, ranking);
      *total_out = q_all;
      *kept_out = n_pos;
    }
    return 0;
  }
  ranking.clear();
  for (long i = 0; i < V; ++i)
    if (q[i]) ranking.push_back(rank_key(s, i));
  long m;
  if (k < n_pos) {
    m = k;
  } else if (top_p < 1.0f) {
    const double need = std::ceil(static_cast<double>(top_p) * static_cast<double>(q_all));
    m = b.prefix_len(static_cast<unsigned __int128>(need));
  } else {
    m = b.prefix_len(((static_cast<unsigned __int128>(x0) * q_all) >> 32) + 1);
  }
  m = std::min(n_pos, std::max(m, n));
  while (true) {
    if (m < n_pos) std::nth_element(ranking.begin(), ranking.begin() + (m - 1), ranking.end());
    std::sort(ranking.begin(), ranking.begin() + m);
    cum.assign(m, 0);
    uint64_t acc = 0;
    for (long i = 0; i < m; ++i) cum[i] = acc += q[ranking[i] & 0xFFFFFFFFu];
    const uint64_t q_k = k <= m ? cum[k - 1] : q_all;
    long kept = k;
    if (top_p < 1.0f) {
      const double need = std::ceil(static_cast<double>(top_p) * static_cast<double>(q_k));
      const long upto = std::min(k, m);  // searchsorted(cum[:k], need, side="left") + 1
      kept = static_cast<long>(std::lower_bound(cum.begin(), cum.begin() + upto, static_cast<uint64_t>(need)) -
                               cum.begin()) + 1;
      if (kept > m) {
        m = std::min(n_pos, 2 * m);
        continue;
      }
    }
    const uint64_t total = kept <= m ? cum[kept - 1] : q_k;
    const uint64_t t = static_cast<uint64_t>((static_cast<unsigned __int128>(x0) * total) >> 32);
    if (cum[m - 1] <= t) {  // the draw lies beyond the prefix
      m = std::min(n_pos, 2 * m);
      continue;
    }
    const long at = static_cast<long>(std::upper_bound(cum.begin(), cum.end(), t) - cum.begin());
    *token = static_cast<long>(ranking[at] & 0xFFFFFFFFu);
    *total_out = total;
    *kept_out = kept;
    const long out = std::min(n, kept);
    for (long i = 0; i < out; ++i) ids[i] = static_cast<long>(ranking[i] & 0xFFFFFFFFu);
    return out;
  }
}
