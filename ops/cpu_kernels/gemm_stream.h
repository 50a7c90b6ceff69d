// The stream path of gemm.h (T <= kStreamRows: decode steps) for the [K, N] layouts (F32W, I8W,
// I4W): a task's chunk of whole rows, T x tile sums in L1, kPassRows rows a pass (gemm.h's top
// comment says how and why; gemm_panels.h is the same path for fp32 in panels).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "gemm_bf16.h"
#include "gemm_blocked.h"
#include "simd.h"
#include "thread_pool.h"
#include "weights.h"

namespace spmd {

constexpr int64_t kAccFloats = 16384;       // stream: T x tile accumulators, 64 KiB (4096: 5-10 % slower at T=1, 8)
constexpr int64_t kPassRows = kChainStreams;  // stream: weight rows per pass over the accumulators, one a run
constexpr int64_t kPrefetchRows = 16;       // stream at T = 1: software prefetch distance, in weight rows
constexpr int64_t kPrefetchBytes = 256;     // stream at T > 1: software prefetch distance along each row

// out[t, 0:nb] = x[t, k0:k1] @ w[k0:k1, n0:n0+nb] for the T rows of x (nb a multiple of kWidth),
// one chain from zero; x's rows are K long, out's ldo.  With `add` (rows ldy apart) the chain is then
// added to add[t, 0:nb] instead: the last pass adds its registers straight into `add` (a sweep of
// the tile fewer than storing and adding again: one thread at T = 8 gained 10-17 %, RESULTS.md)
template <int T, typename Src>
void stream_tile(const float* x, const Src& w, int64_t K, int64_t k0, int64_t k1, int64_t n0, int64_t nb, float* out,
                 int64_t ldo, float* add = nullptr, int64_t ldy = 0) {
  // fp32 at T=1 (one 64-byte load per line, a short loop): the hardware prefetchers keep up and the
  // prefetches only cost issue slots (29 vs 26 GB/s without them); int8, or T >= 2, gain from them.
  // At T = 1 a pass is quick and the prefetch runs kPrefetchRows rows (two passes) ahead; at T > 1
  // a pass takes T times as long, and lines two passes ahead were evicted before their use (an AMD
  // Zen 3's 32 KB L1), so each row is prefetched kPrefetchBytes ahead of its loads, into the next
  // pass's rows at the tile's end (fp32 T = 2-8 there: 1.1-1.55x; int8 level; RESULTS.md "Session 29")
  constexpr bool kPrefetch = Src::kPrefetchOneRow || T > 1;
  constexpr int64_t kAlong = kPrefetchBytes * Src::kLine / 64;   // kPrefetchBytes, in elements
  const bool fused = add != nullptr && k1 - k0 >= kPassRows && (k1 - k0) % kPassRows == 0;
  for (int t = 0; t < T; ++t)
      for (int64_t j = 0; j < nb; j += kWidth) vstore(out + t * ldo + j, vzero());
  // one pass of kPassRows weight rows over the accumulators; kLast: the result goes into `add`.
  // Inlined (GCC kept it a call: 5-15 % slower)
  // k: a chain position (from k0); its rows, kPassRows = kChainStreams runs' next rows, lie far apart
  const int64_t kb = k1 - k0;
  auto pass = [&](int64_t k, auto last) __attribute__((always_inline)) {
    constexpr bool kLast = decltype(last)::value;
    // clamped: re-prefetching is harmless
    const int64_t pf = std::min(k + (T > 1 ? kPassRows : kPrefetchRows), k1 - kPassRows);
    int64_t row[kPassRows], ahead[kPassRows];
    typename Src::Row wr[kPassRows];   // the rows' addresses once a pass, not k * N per load
    for (int i = 0; i < kPassRows; ++i) {
      row[i] = k0 + chain_row(kb, k - k0 + i);
      ahead[i] = k0 + chain_row(kb, pf - k0 + i);
      wr[i] = w.row(row[i]);
    }
    float xs[kPassRows][T];
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < kPassRows; ++i) xs[i][t] = x[t * K + row[i]];
#ifdef SPMD_HAVE_BF16_INT8
    static_assert(kPassRows % 2 == 0);
    float xq[kPassRows / 2][T];   // I8Pairs: x's pairs of the pass's rows, as vdpbf16ps lanes
    if constexpr (std::is_same_v<Src, I8Pairs>)
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < kPassRows; i += 2) xq[i / 2][t] = pair_float(xs[i][t], xs[i + 1][t]);
#endif
    auto prefetch = [&](int64_t j) __attribute__((always_inline)) {
      if (!kPrefetch || j % Src::kLine != 0) return;
      const int64_t c = j + kAlong;
      for (int i = 0; i < kPassRows; ++i)
        __builtin_prefetch(T == 1   ? w.at(ahead[i], n0 + j)
                           : c < nb ? wr[i].at(n0 + c)
                                    : w.at(ahead[i], n0 + c - nb));
    };
    // rows t0 .. t0+G of the tile, V vectors of columns from j: G x V sums in registers over the
    // pass's rows; each weight vector loaded once for the G rows, each broadcast used V times
    auto group = [&](auto g, auto v, int t0, int64_t j) __attribute__((always_inline)) {
      constexpr int G = decltype(g)::value, V = decltype(v)::value;
      Vec a[G][V];
      for (int r = 0; r < G; ++r)
        for (int q = 0; q < V; ++q) a[r][q] = vload(out + (t0 + r) * ldo + j + q * kWidth);
#ifdef SPMD_HAVE_BF16_INT8
      if constexpr (std::is_same_v<Src, I8Pairs>)   // x in bf16: a vdpbf16ps per pair of the pass's rows,
        for (int i = 0; i < kPassRows; i += 2) {      // the same chain (gemm_bf16.h)
          Vec wv[V];
          for (int q = 0; q < V; ++q) {
            wv[q] = pair_lanes(wr[i].vec(n0 + j + q * kWidth), wr[i + 1].vec(n0 + j + q * kWidth));
            if constexpr (G > 1) vpin(wv[q]);
          }
          for (int r = 0; r < G; ++r) {
            Vec b = vset1(xq[i / 2][t0 + r]);
            if constexpr (V > 1) vpin(b);
            for (int q = 0; q < V; ++q) a[r][q] = PairPanel::madd(b, wv[q], a[r][q]);
          }
        }
      else
#endif
      for (int i = 0; i < kPassRows; ++i) {
        Vec wv[V];
        for (int q = 0; q < V; ++q) {
          wv[q] = wr[i].vec(n0 + j + q * kWidth);
          if constexpr (G > 1) vpin(wv[q]);  // in a register: GCC folded the load into each of G fmas
        }
        for (int r = 0; r < G; ++r) {
          Vec b = vset1(xs[i][t0 + r]);
          if constexpr (V > 1) vpin(b);
          for (int q = 0; q < V; ++q) a[r][q] = vfma(b, wv[q], a[r][q]);  // a chain per sum, in pass order
        }
      }
      for (int r = 0; r < G; ++r)
        for (int q = 0; q < V; ++q) {
          const int64_t t = t0 + r, c = j + q * kWidth;
          if constexpr (kLast) {
            float* yt = add + t * ldy + c;
            vstore(yt, vadd(vload(yt), a[r][q]));
          } else {
            vstore(out + t * ldo + c, a[r][q]);
          }
        }
    };
    // the T rows in one group, or two of near-equal size, each of G x 2 sums in kStreamSums registers
    constexpr int kGroups = (T * 2 + kStreamSums - 1) / kStreamSums, kG1 = (T + kGroups - 1) / kGroups;
    static_assert(kGroups <= 2);
    auto step = [&](auto v, int64_t j) __attribute__((always_inline)) {
      group(std::integral_constant<int, kG1>{}, v, 0, j);
      if constexpr (kG1 < T) group(std::integral_constant<int, T - kG1>{}, v, kG1, j);
    };
    int64_t j = 0;
    // int8 at T = 1: each weight widened to fp32 before its fma, 8 chains of 8 fmas a pass;
    // four vectors a step put four chains' fmas side by side (1.09-1.13x; eight: 0.83-0.96x, spills)
    if constexpr (T == 1 && std::is_same_v<Src, I8W>)
      for (; j + 4 * kWidth <= nb; j += 4 * kWidth) {
        for (int q = 0; q < 4; ++q) prefetch(j + q * kWidth);
        step(std::integral_constant<int, 4>{}, j);
      }
    for (; T > 1 && j + 2 * kWidth <= nb; j += 2 * kWidth) {  // fp32 T = 1: memory-bound, one vector (2: 0.93x)
      prefetch(j);
      prefetch(j + kWidth);
      step(std::integral_constant<int, 2>{}, j);
    }
    for (; j < nb; j += kWidth) {
      prefetch(j);
      step(std::integral_constant<int, 1>{}, j);
    }
  };
  int64_t k = k0;
  for (; k + kPassRows <= k1; k += kPassRows)
    fused && k + kPassRows == k1 ? pass(k, std::true_type{}) : pass(k, std::false_type{});
  for (; k < k1; ++k) {  // the range's last rows (past the runs: in order)
    const int64_t r = k0 + chain_row(kb, k - k0);
    for (int64_t j = 0; j < nb; j += kWidth) {
      const Vec wv = w.vec(r, n0 + j);
      for (int t = 0; t < T; ++t) {
        float* acc = out + t * ldo + j;
        vstore(acc, vfma(vset1(x[t * K + r]), wv, vload(acc)));
      }
    }
  }
  if (add != nullptr && !fused)
    for (int t = 0; t < T; ++t)
      for (int64_t j = 0; j < nb; j += kWidth) {
        float* yt = add + t * ldy + j;
        vstore(yt, vadd(vload(yt), vload(out + t * ldo + j)));
      }
}

// y[:, c0:c1] = x[:, k0:k1] @ w[k0:k1, c0:c1] for T rows: tiles of full vectors, then (if c1 is
// past the last one) scalar columns.  `chunked`: this one task sums K's kKC-row chunks from k0 in
// order (each chunk's chain in `tmp`, its last pass added into y: the K split's sum with no partials
// in memory); otherwise [k0, k1) is one chain.
template <int T, typename Src>
void stream_columns(const float* x, const Src& w, int64_t K, int64_t N, int64_t k0, int64_t k1, int64_t c0,
                    int64_t c1, float* y, bool chunked) {
  const int64_t full = std::min(c1, N / kWidth * kWidth), step = chunked ? kKC : std::max<int64_t>(1, k1 - k0);
  const int64_t nb = std::max<int64_t>(kWidth, kAccFloats / T / kWidth * kWidth);
  thread_local AlignedVector<float> tmp;  // one chunk's [T, b] tile (this task's own thread)
  if (k0 + step < k1) grown(tmp, T * nb);
  for (int64_t n0 = c0; n0 < full; n0 += nb) {
    const int64_t b = std::min(nb, full - n0);
    stream_tile<T>(x, w, K, k0, std::min(k1, k0 + step), n0, b, y + n0, N);
    for (int64_t kc = k0 + step; kc < k1; kc += step)
      stream_tile<T>(x, w, K, kc, std::min(k1, kc + step), n0, b, tmp.data(), b, y + n0, N);
  }
  for (int t = 0; t < T; ++t)
    for (int64_t n = std::max(c0, full); n < c1; ++n) {
      float total = 0.f;
      for (int64_t kc = k0; kc < k1; kc += step) {
        float s = 0.f;
        const int64_t len = std::min(k1, kc + step) - kc;
        for (int64_t p = 0; p < len; ++p) {
          const int64_t k = kc + chain_row(len, p);
          s = fmadd(x[t * K + k], w.one(k, n), s);
        }
        total = kc == k0 ? s : total + s;
      }
      y[t * N + n] = total;
    }
}

template <typename Src, int... R>
void stream_dispatch(int64_t T, std::integer_sequence<int, R...>, const float* x, const Src& w, int64_t K,
                     int64_t N, int64_t k0, int64_t k1, int64_t c0, int64_t c1, float* y, bool chunked) {
  // T a template argument: the loops over rows unroll and x's broadcasts stay in registers
  ((T == R + 1 ? stream_columns<R + 1>(x, w, K, N, k0, k1, c0, c1, y, chunked) : void()), ...);
}

// y[:, c0:c1] *= scale[c0:c1]
inline void scale_columns(float* y, const float* scale, int64_t T, int64_t N, int64_t c0, int64_t c1) {
  for (int64_t t = 0; t < T; ++t) {
    float* yt = y + t * N;
    int64_t n = c0;
    for (; n + kWidth <= c1; n += kWidth) vstore(yt + n, vmul(vload(yt + n), vload(scale + n)));
    for (; n < c1; ++n) yt[n] *= scale[n];
  }
}

// The stream paths' tasks for y[T, N] (stream_gemm here, panel_stream_gemm for panels), over N's
// `units` column units of `unit` columns (vectors, panels).  One thread (or one chunk of kKC rows):
// column tasks, each summing every chunk itself: whole(c0, c1).  Else tasks (chunk c, column range):
// part(c, c0, c1, out), out = y for chunk 0 and a scratch partial [T][N] for the others; the range's
// last chunk to finish adds them to y in chunk order (the same sum whoever does it), in this task: no
// second parallel_for (its fork/join was ~3-4 % of a batch-1 step at --demo small, RESULTS.md
// "Session 15"); then summed(c0, c1).
template <typename Whole, typename Part, typename Summed>
void stream_tasks(int64_t T, int64_t K, int64_t N, int64_t units, int64_t unit, float* y, Whole&& whole, Part&& part,
                  Summed&& summed) {
  const int64_t threads = num_threads(), chunks = std::max<int64_t>(1, (K + kKC - 1) / kKC);
  if (threads == 1 || chunks == 1) {
    const int64_t per = threads == 1 ? units : (units + 2 * threads - 1) / (2 * threads);
    parallel_for((units + per - 1) / per,
                 [&](int64_t i) { whole(i * per * unit, std::min(N, (i + 1) * per * unit)); });
    return;
  }
  // column ranges only when the chunks alone give fewer than ~two tasks a thread (a thread that
  // wakes late, or is preempted, leaves its second one to the others)
  const int64_t groups = std::min(units, std::max<int64_t>(1, (2 * threads + chunks - 1) / chunks));
  const int64_t width = (units + groups - 1) / groups, ranges = (units + width - 1) / width;
  thread_local AlignedVector<float> scratch;  // the caller's; the tasks see it through `partial`
  grown(scratch, (chunks - 1) * T * N);
  float* const partial = scratch.data();  // chunks 1.. : [chunks - 1][T][N]
  thread_local std::vector<int64_t> finished;  // chunks done, per column range
  finished.assign(ranges, 0);
  int64_t* const done = finished.data();
  parallel_for(chunks * ranges, [&](int64_t i) {
    const int64_t c = i / ranges, r = i % ranges;
    const int64_t c0 = r * width * unit, c1 = std::min(N, (r + 1) * width * unit);
    part(c, c0, c1, c == 0 ? y : partial + (c - 1) * T * N);
    // acq_rel: the last task sees the other chunks' stores
    if (__atomic_add_fetch(&done[r], 1, __ATOMIC_ACQ_REL) != chunks) return;
    add_partials(y, partial, T, N, chunks, c0, c1);
    summed(c0, c1);
  });
}

// y[T, N] for T <= kStreamRows: tasks (chunk of kKC rows, column range), then the chunks' sum;
// on one thread (or one chunk) column tasks that sum their chunks themselves: the same sum, without
// the partials' memory traffic, which only long runs on several threads repay (RESULTS.md)
template <typename Src>
void stream_gemm(const float* x, const Src& w, const float* scale, int64_t T, int64_t K, int64_t N, float* y) {
  // int8 at T = 7-8: two passes over W, rows 0-3 then the rest.  One pass of 7-8 rows (two groups of
  // sums, each widening every weight vector) ran 0.77-0.89x as fast as the two on --demo 1b's linears,
  // 0.87-0.94x on small's (RESULTS.md "Session 35"): the quarter-size int8 W read twice costs less.
  // A row's sums are the same chains in either pass
  // (I8Pairs, half the dot products: one pass, 1.0-1.2x the two; RESULTS.md "Session 52")
  if constexpr (std::is_same_v<Src, I8W>)
    if (T > 6) {
      stream_gemm(x, w, scale, 4, K, N, y);
      return stream_gemm(x + 4 * K, w, scale, T - 4, K, N, y + 4 * N);
    }
  constexpr auto kRowCounts = std::make_integer_sequence<int, kStreamRows>{};
  auto scaled = [&](int64_t c0, int64_t c1) {   // y's finished columns times the int8 scale
    if (scale != nullptr) scale_columns(y, scale, T, N, c0, c1);
  };
  stream_tasks(
      T, K, N, (N + kWidth - 1) / kWidth, kWidth, y,
      [&](int64_t c0, int64_t c1) {
        stream_dispatch(T, kRowCounts, x, w, K, N, 0, K, c0, c1, y, true);
        scaled(c0, c1);
      },
      [&](int64_t c, int64_t c0, int64_t c1, float* out) {
        stream_dispatch(T, kRowCounts, x, w, K, N, c * kKC, std::min(K, (c + 1) * kKC), c0, c1, out, false);
      },
      scaled);
}

}  // namespace spmd
