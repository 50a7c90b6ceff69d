// The stream path of gemm.h (T <= kStreamRows: decode steps) for weights in panels (weights.h,
// F32P).  A task owns a range of panels of one block of kKC rows (several threads) or of every block
// in turn (one thread), and its share of a block is one contiguous run of memory: it reads S panels
// at a time, each the start of its own linear run (a stream), their sums in registers.  In the
// [K, N] layout a task's rows are N floats apart, which the blocked path's pack read at ~5 GB/s; in
// panels the blocked GEMM ran 1.2-1.5x at T = 12-32 (RESULTS.md "Session 33").
// Every sum is the chain of gemm.h's top comment: bit-equal to the [K, N] layout's result.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "gemm_blocked.h"
#include "gemm_stream.h"
#include "simd.h"
#include "thread_pool.h"
#include "weights.h"

namespace spmd {

constexpr int64_t kPanelVecs = F32P::kPanel / kWidth;   // vectors of a panel's row
// at most this many panels (streams) read at a time: at T = 1, 4 read 1.04-1.10x of 6, 2-3 and 8 less
constexpr int kPanelStreams = 4;
// sums in registers, as many as there are registers: GCC spills some at T = 6-8, yet a row of W loaded
// once and a broadcast per row in registers (no spills) read 0.8-0.9x at T = 4, 7, 8
constexpr int kPanelSums = kVecRegs;
// software prefetch along each stream: at T = 2-3 this far into L1, at T >= 4 one panel (8 KB) ahead
// into L2 (T = 8: 1.22-1.26x of 512 B into L1 on two threads; T = 2: 0.85-0.95x); at T = 1 none
// (8 KB into L2: 0.84-0.93x)
constexpr int64_t kPanelPrefetchNear = 512, kPanelPrefetchFar = 8192;

// y[g0 .. g0 + G rows, S panels' columns] (rows ldy apart; += when `add`) = the chains of the block's kb
// rows: x's rows in the chain's order xc[kb][T], panel s at pp[s] (col[s]: its first column; the
// first `live` are real).  The sums stay in registers; kFetch: prefetch along each panel (the first
// group of a step reads memory, the others the same panels from L1).
template <int T, int G, int S, bool kFetch, typename E>
void panel_group(const float* xc, const E* const* pp, const int64_t* col, int live, int64_t kb, int g0,
                 float* y, int64_t ldy, bool add) {
  Vec a[S][G][kPanelVecs];
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < G; ++r)
      for (int v = 0; v < kPanelVecs; ++v) a[s][r][v] = vzero();
  for (int64_t k = 0; k < kb; ++k) {
    Vec xb[G];
    for (int r = 0; r < G; ++r) xb[r] = vset1(xc[k * T + g0 + r]);
    for (int s = 0; s < S; ++s) {
      if constexpr (kFetch && T >= 4)
        __builtin_prefetch(pp[s] + k * F32P::kPanel + kPanelPrefetchFar / sizeof(E), 0, 2);
      else if constexpr (kFetch && T > 1)
        __builtin_prefetch(pp[s] + k * F32P::kPanel + kPanelPrefetchNear / sizeof(E), 0, 3);
      for (int v = 0; v < kPanelVecs; ++v) {
        Vec wv = vload(pp[s] + k * F32P::kPanel + v * kWidth);
        if constexpr (G > 1) vpin(wv);   // in a register: GCC folded the load into each of G fmas
        for (int r = 0; r < G; ++r) a[s][r][v] = vfma(xb[r], wv, a[s][r][v]);
      }
    }
  }
  for (int s = 0; s < live; ++s)
    for (int r = 0; r < G; ++r)
      for (int v = 0; v < kPanelVecs; ++v) {
        float* yt = y + (g0 + r) * ldy + col[s] + v * kWidth;
        vstore(yt, add ? vadd(vload(yt), a[s][r][v]) : a[s][r][v]);
      }
}

// AVX2 at T = 8 (a panel row is two vectors): the rows as two groups of 4 rows x 2 vectors of sums, 8
// of the 16 registers each (one group of 16 sums spilled: ~50 GFLOP/s a core in L2 against ~90), that
// take turns every kTurnRows rows of the block, the first group reading (and prefetching) memory and the
// second the same lines from L1.  Whole blocks in turn (0.8-0.9x of the spilling group from memory)
// bunched the memory reads into half of the time; turns of 16 rows spread them.  --demo small's linears
// at T = 8 on a Zen 3, two threads: 1.17-1.25x; T = 5-7 the same way 0.85-1.15x, not taken (RESULTS.md
// "Session 76").  Each group's sums are carried from turn to turn: the same chains.
constexpr int64_t kTurnRows = 16;

// rows [k0, k1) of the panel at p into the sums st of the G rows from G0 of x's T (xc: [kb][T])
template <int T, int G, int G0, bool kFetch, typename E>
inline __attribute__((always_inline)) void turn_rows(const float* xc, const E* p, int64_t k0, int64_t k1,
                                                     Vec (&st)[G][2]) {
  Vec a[G][2];
  for (int r = 0; r < G; ++r) a[r][0] = st[r][0], a[r][1] = st[r][1];
  for (int64_t k = k0; k < k1; ++k) {
    Vec xb[G];
    for (int r = 0; r < G; ++r) xb[r] = vset1(xc[k * T + G0 + r]);
    if constexpr (kFetch) __builtin_prefetch(p + k * F32P::kPanel + kPanelPrefetchFar / sizeof(E), 0, 2);
    for (int v = 0; v < 2; ++v) {
      Vec wv = vload(p + k * F32P::kPanel + v * kWidth);
      vpin(wv);
      for (int r = 0; r < G; ++r) a[r][v] = vfma(xb[r], wv, a[r][v]);
    }
  }
  for (int r = 0; r < G; ++r) st[r][0] = a[r][0], st[r][1] = a[r][1];
}

// y[0 .. T rows, the panel's 16 columns from col] (+= when `add`) for the block's kb rows of the panel
// at p: rows [0, Ga) and [Ga, T) taking turns
template <int T, int Ga, typename E>
void panel_turns(const float* xc, const E* p, int64_t col, int64_t kb, float* y, int64_t ldy, bool add) {
  constexpr int Gb = T - Ga;
  Vec sa[Ga][2], sb[Gb][2];
  for (int r = 0; r < Ga; ++r) sa[r][0] = sa[r][1] = vzero();
  for (int r = 0; r < Gb; ++r) sb[r][0] = sb[r][1] = vzero();
  for (int64_t k0 = 0; k0 < kb; k0 += kTurnRows) {
    const int64_t k1 = std::min(kb, k0 + kTurnRows);
    turn_rows<T, Ga, 0, true>(xc, p, k0, k1, sa);
    turn_rows<T, Gb, Ga, false>(xc, p, k0, k1, sb);
  }
  auto put = [&](int t, int v, Vec a) {
    float* yt = y + t * ldy + col + v * kWidth;
    vstore(yt, add ? vadd(vload(yt), a) : a);
  };
  for (int r = 0; r < Ga; ++r) put(r, 0, sa[r][0]), put(r, 1, sa[r][1]);
  for (int r = 0; r < Gb; ++r) put(Ga + r, 0, sb[r][0]), put(Ga + r, 1, sb[r][1]);
}

// y[:, full panels p0..p1) for the block at k0 (kb rows): S panels a step (stream s: panels
// p0 + s * len ...), x's rows in groups of Gs... rows, each group over the step's panels in turn
template <int T, int S, int... Gs, typename E>
void panel_rows(const float* xc, const Panels<E>& w, int64_t k0, int64_t kb, int64_t p0, int64_t p1, float* y,
                int64_t ldy, bool add) {
  static_assert((Gs + ...) == T);
  const int64_t len = (p1 - p0 + S - 1) / S;
  for (int64_t i = 0; i < len; ++i) {
    const E* pp[S];
    int64_t col[S];
    int live = 0;
    for (int s = 0; s < S; ++s) {
      const int64_t p = p0 + s * len + i;
      if (s * len + i >= p1 - p0) break;
      pp[s] = w.panel(k0, kb, p), col[s] = p * F32P::kPanel, live = s + 1;
    }
    for (int s = live; s < S; ++s) pp[s] = pp[0], col[s] = -1;
    int g0 = 0;
    ((g0 == 0 ? panel_group<T, Gs, S, true>(xc, pp, col, live, kb, g0, y, ldy, add)
              : panel_group<T, Gs, S, false>(xc, pp, col, live, kb, g0, y, ldy, add),
      g0 += Gs), ...);
  }
}

// the block's chains for panels [p0, p1) into y: full panels by panel_rows, a last partial panel in
// scalars.  One group of T rows over S streams (at least two up to T = 6: one left T = 5 waiting on
// memory, 0.62-0.71x), but on AVX2 T = 6 and 7 as two groups (3 + 3, 4 + 3) over two streams: 12 or
// 16 sums, where one group's 24 or 28 spilled (1.15x and 1.02-1.07x on two threads).  At T = 8 the
// same split (4 + 4 on one stream, 3 + 3 + 2 on two) read 0.88-0.96x (RESULTS.md "Session 34"): T = 8
// takes panel_turns, the split in turns of kTurnRows rows.
template <int T, typename E>
void panel_block(const float* xc, const Panels<E>& w, int64_t k0, int64_t kb, int64_t p0, int64_t p1, float* y,
                 int64_t ldy, bool add) {
  // AVX-512 (a panel row one vector): the sums leave room for the T broadcasts and W's vector in the
  // 32 registers (T = 8: two streams, not four with spills; RESULTS.md "Session 38")
  constexpr int kRoom = kPanelVecs == 1 ? kPanelSums - T - 1 : kPanelSums;
  constexpr int kS = std::max(T <= 6 ? 2 : 1, std::min<int>(kPanelStreams, kRoom / (T * kPanelVecs)));
  const int64_t full = std::min(p1, w.N / F32P::kPanel);
  if (p0 < full) {
    if constexpr (kPanelVecs == 2 && T == 8)
      for (int64_t p = p0; p < full; ++p) panel_turns<T, 4>(xc, w.panel(k0, kb, p), p * F32P::kPanel, kb, y, ldy, add);
    else if constexpr (kPanelVecs == 1 || (T != 6 && T != 7))   // AVX-512: a panel row is one vector
      panel_rows<T, kS, T>(xc, w, k0, kb, p0, full, y, ldy, add);
    else if constexpr (T == 6)
      panel_rows<T, 2, 3, 3>(xc, w, k0, kb, p0, full, y, ldy, add);
    else
      panel_rows<T, 2, 4, 3>(xc, w, k0, kb, p0, full, y, ldy, add);
  }
  for (int64_t p = std::max(p0, full); p < p1; ++p) {   // N % kPanel columns
    const E* src = w.panel(k0, kb, p);
    const int64_t wp = w.width(p);
    for (int t = 0; t < T; ++t)
      for (int64_t c = 0; c < wp; ++c) {
        float s = 0.f;
        for (int64_t k = 0; k < kb; ++k) s = fmadd(xc[k * T + t], static_cast<float>(src[k * wp + c]), s);
        float& out = y[t * ldy + p * F32P::kPanel + c];
        out = add ? out + s : s;
      }
  }
}

template <typename E, int... R>
void panel_dispatch(int64_t T, std::integer_sequence<int, R...>, const float* xc, const Panels<E>& w, int64_t k0,
                    int64_t kb, int64_t p0, int64_t p1, float* y, int64_t ldy, bool add) {
  ((T == R + 1 ? panel_block<R + 1>(xc, w, k0, kb, p0, p1, y, ldy, add) : void()), ...);
}

// y[T, N] = x[T, K] @ w for T <= kStreamRows, in stream_tasks' tasks (gemm_stream.h) over panels: on
// one thread (or one block) panel ranges summing every block in order, else blocks x panel ranges
template <typename E>
void panel_stream_gemm(const float* x, const Panels<E>& w, int64_t T, int64_t K, int64_t N, float* y) {
  constexpr auto kRowCounts = std::make_integer_sequence<int, kStreamRows>{};
  const int64_t panels = (N + F32P::kPanel - 1) / F32P::kPanel;
  thread_local AlignedVector<float> xcs;   // x's rows in each block's chain order: [K][T]
  grown(xcs, K * T);
  for (int64_t k0 = 0; k0 < K; k0 += kKC) {
    const int64_t kb = std::min(kKC, K - k0);
    for (int64_t k = 0; k < kb; ++k)
      for (int64_t t = 0; t < T; ++t) xcs[(k0 + k) * T + t] = x[t * K + k0 + chain_row(kb, k)];
  }
  const float* const xc = xcs.data();
  // the block at k0, columns [c0, c1) (whole panels but N's last) into out, or added to it
  auto block = [&](int64_t k0, int64_t c0, int64_t c1, float* out, bool add) {
    panel_dispatch(T, kRowCounts, xc + k0 * T, w, k0, std::min(kKC, K - k0), c0 / F32P::kPanel,
                   (c1 + F32P::kPanel - 1) / F32P::kPanel, out, N, add);
  };
  stream_tasks(
      T, K, N, panels, F32P::kPanel, y,
      [&](int64_t c0, int64_t c1) {
        for (int64_t k0 = 0; k0 < K; k0 += kKC) block(k0, c0, c1, y, k0 > 0);
      },
      [&](int64_t c, int64_t c0, int64_t c1, float* out) { block(c * kKC, c0, c1, out, false); },
      [](int64_t, int64_t) {});
}

}  // namespace spmd
