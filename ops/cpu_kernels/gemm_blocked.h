// The blocked path of gemm.h (T > kStreamRows: prefill chunks, batched decodes): packing a
// [kKC, kNC] block of W into fp32 micro-panels and the kMR x kNR register-blocked micro-kernel.
// gemm.h owns the task split and the summation order every path shares (see its top comment).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "cache_size.h"
#include "simd.h"
#include "weights.h"

namespace spmd {

constexpr int64_t kStreamRows = 8;          // T above: the blocked path (CPU time equal at T ~ 12; 8 below)
constexpr int kStreamSums = kVecRegs * 3 / 4;  // stream (gemm.h, gemm_panels.h) at T > 1: sums held in registers (the rest: W, x)
constexpr int64_t kMR = 6;                  // blocked: rows of x per micro-kernel
// blocked: vectors of columns per micro-kernel: 6 x 4 accumulators in AVX-512's 32 registers, 6 x 2 in AVX2's 16
constexpr int64_t kNV = kVecRegs >= 32 ? 4 : 2;
constexpr int64_t kNR = kNV * kWidth;       // blocked: columns per micro-panel
constexpr int64_t kKC = 128;                // both: rows of W per chunk of the sum (blocked: a micro-panel, 32 KiB)
constexpr int64_t kNC = 256;                // blocked: columns per task, at most
constexpr int64_t kPackPrefetchRows = 8;    // blocked: software prefetch distance of the packing
constexpr int64_t kPrefetchTiles = 16;      // blocked: next block prefetched up to these tiles (see prefetch_ahead)
constexpr int64_t kChainStreams = 8;        // both: the interleaved runs of rows a chunk's chain visits

// Chain position p (0 <= p < kb) of a chunk of kb rows → its row in the chunk.  The chain visits the
// chunk's rows as kChainStreams interleaved runs of kb / kChainStreams contiguous rows (run i's q-th
// row is position q * kChainStreams + i; the kb % kChainStreams rows past the runs come last, in
// order), so the decode path's pass over kChainStreams consecutive positions reads rows far apart
// and each of its streams runs linearly through memory: one linear stream a task read 10 GB/s on an
// AMD Zen 3 core, eight 17 (RESULTS.md "Session 29").  Every path sums in this order.
inline int64_t chain_row(int64_t kb, int64_t p) {
  const int64_t run = kb / kChainStreams;
  return p >= run * kChainStreams ? p : p % kChainStreams * run + p / kChainStreams;
}

// y[:, c0:c1] += the K split's partials of chunks 1 .. chunks - 1 ([chunks - 1][T][N]), in chunk
// order: y = ((c0 + c1) + c2) + ..., the sum every path makes (gemm.h's top comment)
inline void add_partials(float* y, const float* partial, int64_t T, int64_t N, int64_t chunks, int64_t c0,
                         int64_t c1) {
  for (int64_t t = 0; t < T; ++t) {
    float* yt = y + t * N;
    for (int64_t k = 1; k < chunks; ++k) {
      const float* pt = partial + ((k - 1) * T + t) * N;
      int64_t n = c0;
      for (; n + kWidth <= c1; n += kWidth) vstore(yt + n, vadd(vload(yt + n), vload(pt + n)));
      for (; n < c1; ++n) yt[n] += pt[n];
    }
  }
}

// T rows of x in ceil(T / kMR) tiles of as equal a size as can be (T = 32: 6, 6, 5, 5, 5, 5, not
// 6 x 5 and a 2-row tile, whose 4 accumulators leave the FMA units half idle: 7 % of the time at
// T = 32).  Which tile a row lies in changes no sum.
struct Tiles {
  int64_t count, base, extra;   // tile i has base + (i < extra) rows
  explicit Tiles(int64_t T) : count((T + kMR - 1) / kMR), base(T / std::max<int64_t>(count, 1)),
                              extra(T % std::max<int64_t>(count, 1)) {}
  int64_t start(int64_t i) const { return i * base + std::min(i, extra); }
  int64_t rows(int64_t i) const { return base + (i < extra); }
};

// The row kPackPrefetchRows chain positions past position k of the block at k0 (kb rows; past the
// block: the next one's), columns [n0, n0 + nb), prefetched a cache line at a time: a task reads W
// in short runs (nb columns of each row), and without it the hardware prefetchers leave the pack
// latency-bound
template <typename Src>
void prefetch_pack_row(const Src& w, int64_t k0, int64_t kb, int64_t k, int64_t n0, int64_t nb, int64_t K) {
  const int64_t ahead = k + kPackPrefetchRows;
  if (k0 + ahead >= K) return;
  const int64_t next = ahead < kb ? k0 + chain_row(kb, ahead)
                                  : k0 + kb + chain_row(std::min(kKC, K - k0 - kb), ahead - kb);
  for (int64_t j = 0; j < nb; j += Src::kLine) __builtin_prefetch(w.at(next, n0 + j));
}

// [kb, nb] block of W from (k0, n0) → fp32 micro-panels dst[nb / kNR rounded up][kb][kNR], zero-padded,
// its rows in the chain's order (chain_row)
template <typename Src>
void pack(const Src& w, int64_t k0, int64_t kb, int64_t n0, int64_t nb, int64_t K, float* dst) {
  const int64_t full = nb / kWidth * kWidth;
  for (int64_t k = 0; k < kb; ++k) {   // k: the chain position; panel row k holds W row `row`
    const int64_t row = k0 + chain_row(kb, k);
    prefetch_pack_row(w, k0, kb, k, n0, nb, K);
    for (int64_t j = 0; j < full; j += kWidth)
      vstore(dst + (j / kNR) * kb * kNR + k * kNR + j % kNR, w.vec(row, n0 + j));
    for (int64_t j = full; j < (nb + kNR - 1) / kNR * kNR; ++j)
      dst[(j / kNR) * kb * kNR + k * kNR + j % kNR] = j < nb ? w.one(row, n0 + j) : 0.f;
  }
}

// x[T, K] → micro-panels, per block of kKC rows of W (k0 = 0, kKC, ...) a contiguous
// [Tiles(T).count][kb][kMR] (a tile's rows past its own zero; columns in the chain's order, as pack's
// rows); this fills one tile (Tiles(T).rows(tile) rows of x) of each.
// The micro-kernel's broadcasts then read one stream, and a block's panels stay in L2 while its
// W block is in use.  Read in place, x's kMR rows lie K floats apart (a multiple of 4 KiB for every
// model here) and crowd a few L1 sets with the W panel (RESULTS.md "Session 20").
inline void pack_rows(const float* x, int64_t T, int64_t K, int64_t tile, float* xp) {
  const Tiles tl(T);
  const int64_t tiles = tl.count, t0 = tl.start(tile), rows = tl.rows(tile);
  for (int64_t k0 = 0; k0 < K; k0 += kKC) {
    const int64_t kb = std::min(kKC, K - k0);
    float* dst = xp + k0 * tiles * kMR + tile * kb * kMR;
    for (int64_t k = 0; k < kb; ++k) {
      const int64_t col = k0 + chain_row(kb, k);
      for (int64_t m = 0; m < kMR; ++m) dst[k * kMR + m] = m < rows ? x[(t0 + m) * K + col] : 0.f;
    }
  }
}

// `lines` to issue over `calls` calls of start(): each call's share (the last one's what is left)
// spread evenly over its `steps` calls of due(), how many to issue at each (Bresenham's)
class Trickle {
 public:
  Trickle(int64_t lines, int64_t calls) : left_(lines), share_((lines + calls - 1) / calls) {}
  void start(int64_t steps) {
    now_ = std::min(share_, left_), left_ -= now_, steps_ = std::max<int64_t>(steps, 1), debt_ = 0;
  }
  int64_t due() {
    int64_t n = 0;
    for (debt_ += now_; debt_ >= steps_; debt_ -= steps_) ++n;
    return n;
  }

 private:
  int64_t left_, share_, now_ = 0, steps_ = 1, debt_ = 0;
};

// A [rows, nb] block of W from (k0, n0) into L2 (prefetcht1), its lines in memory order spread over
// `calls` micro-kernel calls: start(kb) at a call's top, then tick() at each of its kb steps issues
// the call's share a line or two at a time.  Issued as a burst before each call, the share (~170
// lines at T = 16) filled the miss buffers and the micro-kernel's own loads waited behind them, so
// a step cost about the memory's time plus the arithmetic's: T = 9-16 ran 1.3-1.5x slower, T = 32
// 1.1x (RESULTS.md "Session 77").
template <typename Src>
class BlockPrefetch {
 public:
  BlockPrefetch(const Src& w, int64_t k0, int64_t rows, int64_t n0, int64_t nb, int64_t calls)
      : w_(w), row_(k0), n0_(n0), nb_(nb), lines_(rows * ((nb + Src::kLine - 1) / Src::kLine), calls) {}
  void start(int64_t kb) { lines_.start(kb); }
  void tick() {
    for (int64_t n = lines_.due(); n > 0; --n) {
      __builtin_prefetch(w_.at(row_, n0_ + col_), 0, 2);
      col_ += Src::kLine;
      if (col_ >= nb_) col_ = 0, ++row_;
    }
  }

 private:
  const Src& w_;
  int64_t row_, n0_, nb_, col_ = 0;
  Trickle lines_;
};

// Panels: a task's [rows, nb] block is one contiguous run (its panels, in order)
template <typename E>
class BlockPrefetch<Panels<E>> {
 public:
  BlockPrefetch(const Panels<E>& w, int64_t k0, int64_t rows, int64_t n0, int64_t nb, int64_t calls)
      : p_(rows > 0 ? reinterpret_cast<const char*>(w.panel(k0, rows, n0 / Panels<E>::kPanel)) : nullptr),
        lines_((rows * nb * static_cast<int64_t>(sizeof(E)) + 63) / 64, calls) {}
  void start(int64_t kb) { lines_.start(kb); }
  void tick() {
    for (int64_t n = lines_.due(); n > 0; --n, p_ += 64) __builtin_prefetch(p_, 0, 2);
  }

 private:
  const char* p_;
  Trickle lines_;
};

// Where micro() reads W: a packed micro-panel [kb][kNR] ...
struct PackedPanel {
  const float* p;
  const float* at(int64_t k, int v) const { return p + k * kNR + v * kWidth; }
  static Vec madd(Vec x, Vec w, Vec acc) { return vfma(x, w, acc); }
};

// ... or kNR columns of full panels in place (rows of kPanel elements, panels `stride` apart; bf16
// widened by micro()'s vload)
template <typename E>
struct PanelRun {
  const E* p;
  int64_t stride;
  const E* at(int64_t k, int v) const {
    const int64_t col = v * kWidth;
    return p + col / F32P::kPanel * stride + k * F32P::kPanel + col % F32P::kPanel;
  }
  static Vec madd(Vec x, Vec w, Vec acc) { return vfma(x, w, acc); }
};

// How the blocked path packs and steps through a Src: fp32 micro-panels, a row of W a step (for the
// layouts read through pack(); gemm_bf16.h's pairs of rows specialise it)
template <typename Src>
struct BlockedKernel {
  using Panel = PackedPanel;
  static int64_t steps(int64_t kb) { return kb; }   // micro-kernel steps of a block of kb rows
  static void pack_w(const Src& w, int64_t k0, int64_t kb, int64_t n0, int64_t nb, int64_t K, float* dst) {
    pack(w, k0, kb, n0, nb, K, dst);
  }
  static void pack_x(const float* x, int64_t T, int64_t K, int64_t tile, float* xp) { pack_rows(x, T, K, tile, xp); }
};

// Panels' columns [n0, n0 + nb) of the block at k0 (kb rows; n0 a multiple of kPanel) → one
// zero-padded fp32 micro-panel dst[kb][kNR] (nb <= kNR: a task's last, partial one)
template <typename E>
void pack_panels(const Panels<E>& w, int64_t k0, int64_t kb, int64_t n0, int64_t nb, float* dst) {
  for (int64_t c0 = 0; c0 < kNR; c0 += F32P::kPanel) {
    const int64_t p = (n0 + c0) / F32P::kPanel, wp = c0 < nb ? w.width(p) : 0;
    const E* src = w.panel(k0, kb, p);
    for (int64_t k = 0; k < kb; ++k)
      for (int64_t c = 0; c < F32P::kPanel; ++c)
        dst[k * kNR + c0 + c] = c < wp ? static_cast<float>(src[k * wp + c]) : 0.f;
  }
}

// out[M, kNR] (row stride ldo) = (zero ? 0 : c) + x[M, kb] @ panel[kb, kNR], c's rows ldc apart, x
// one of pack_rows' micro-panels (x[m, k] at x[k * kMR + m]): the block's product summed from 0
// (one chunk of the sum: see the top); out is c, or y for a task's last block.  kb: P's steps (a
// row of W each, or gemm_bf16.h's pair of rows, whose x and panel lanes hold the pair)
template <int M, typename P, typename Ahead>
void micro(const float* x, P panel, int64_t kb, const float* c, int64_t ldc, float* out, int64_t ldo,
           bool zero, Ahead& ahead) {
  ahead.start(kb);
  Vec acc[M][kNV];
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < kNV; ++v) acc[m][v] = vzero();
  for (int64_t k = 0; k < kb; ++k) {
    ahead.tick();
    Vec wv[kNV];
    for (int v = 0; v < kNV; ++v) wv[v] = vload(panel.at(k, v));
    for (int m = 0; m < M; ++m) {
      const Vec xb = vset1(x[k * kMR + m]);
      for (int v = 0; v < kNV; ++v) acc[m][v] = P::madd(xb, wv[v], acc[m][v]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < kNV; ++v)
      vstore(out + m * ldo + v * kWidth, zero ? acc[m][v] : vadd(vload(c + m * ldc + v * kWidth), acc[m][v]));
}

template <typename P, typename Ahead, int... M>
void micro_dispatch(int64_t m, std::integer_sequence<int, M...>, const float* x, P panel, int64_t kb,
                    const float* c, int64_t ldc, float* out, int64_t ldo, bool zero, Ahead& ahead) {
  ((m == M + 1 ? micro<M + 1>(x, panel, kb, c, ldc, out, ldo, zero, ahead) : void()), ...);
}

// Whether blocked_columns brings the next block of W into L2 ahead: up to kPrefetchTiles tiles of x
// always (the pack's wait on memory was a third of the time, RESULTS.md "Session 30"); above, while
// the task's working set (its sums, T x kNC floats; x's panels of a block, T x kKC; this block of
// W and the next) fits in three quarters of the L2.  With more tiles the wait is amortised and
// the prefetched block crowded the sums out of a 512 KiB L2; on a 2 MiB one T = 128-512 ran
// 1.0-1.1x with it (RESULTS.md "Session 44").
inline bool prefetch_ahead(int64_t T, int64_t tiles) {
  const int64_t set = (T * (kNC + kKC) + 2 * kKC * kNC) * static_cast<int64_t>(sizeof(float));
  return tiles <= kPrefetchTiles || 4 * set <= 3 * l2_bytes();
}

// y[:, n0:n0+nb] for all T rows (one task of the blocked path), x packed by pack_rows.  buf holds
// kKC x kNC floats of W; acc the task's sums [T][nb rounded up to kNR]: the micro-kernels add each
// block's product into it, and the last block's sums go to y.  Added into y in place (rows N floats
// apart) the tiles' lines crowded a few L2 sets and each block re-read them from memory (T = 512
// on two threads: a quarter of the time, RESULTS.md "Session 20"); the last block writes its whole
// micro-panels' sums straight into y (a copy pass fewer), a partial panel's through acc.
template <typename Src>
void blocked_columns(const float* xp, const Src& w, int64_t T, int64_t K, int64_t N, int64_t n0, int64_t nb,
                     float* buf, float* acc, float* y, int64_t n_after = -1) {
  constexpr auto kRows = std::make_integer_sequence<int, kMR>{};
  const Tiles tl(T);
  using Kernel = BlockedKernel<Src>;
  const int64_t ld = (nb + kNR - 1) / kNR * kNR, tiles = tl.count, whole = nb / kNR * kNR;
  for (int64_t k0 = 0; k0 < K; k0 += kKC) {
    const int64_t kb = std::min(kKC, K - k0), steps = Kernel::steps(kb);
    constexpr bool kPanels = kIsPanels<Src>;
    if constexpr (kPanels) {   // read in place, but for a last micro-panel past N's last full panel
      if (whole < nb) pack_panels(w, k0, kb, n0 + whole, nb - whole, buf);
    } else {
      Kernel::pack_w(w, k0, kb, n0, nb, K, buf);   // zero past nb: acc's padding columns are sums of zeros
    }
    // this block's micro-panels of x, [tiles][steps][kMR] (k0 a multiple of kKC: whole steps before it)
    const float* xk = xp + Kernel::steps(k0) * tiles * kMR;
    const bool last = k0 + kb == K;
    // The next block into L2 while this one's micro-kernels run, so its pack reads L2 and the memory
    // reads overlap the arithmetic; after the last block, the first block of the columns at n_after
    // (the task this thread likely takes next); prefetch_ahead says for which T.
    const bool ahead = prefetch_ahead(T, tiles) && (!last || n_after >= 0);
    const int64_t pn0 = last ? n_after : n0;
    BlockPrefetch<Src> next(w, last ? 0 : k0 + kb, ahead ? std::min(kKC, last ? K : K - k0 - kb) : 0, pn0,
                            std::min(nb, N - pn0), ld / kNR * tiles);
    for (int64_t j = 0; j < nb; j += kNR)
      for (int64_t i = 0; i < tiles; ++i) {
        const int64_t t0 = tl.start(i);
        float* c = acc + t0 * ld + j;
        const bool direct = last && j < whole;
        float* const out = direct ? y + t0 * N + n0 + j : c;
        const int64_t ldo = direct ? N : ld;
        const float* const xi = xk + i * steps * kMR;
        if constexpr (kPanels) {
          if (j < whole)
            micro_dispatch(tl.rows(i), kRows, xi, PanelRun<typename Src::Elem>{w.panel(k0, kb, (n0 + j) / Src::kPanel),
                           kb * Src::kPanel}, kb, c, ld, out, ldo, k0 == 0, next);
          else
            micro_dispatch(tl.rows(i), kRows, xi, PackedPanel{buf}, kb, c, ld, out, ldo, k0 == 0, next);
        } else {
          micro_dispatch(tl.rows(i), kRows, xi, typename Kernel::Panel{buf + (j / kNR) * steps * kNR}, steps, c, ld,
                         out, ldo, k0 == 0, next);
        }
      }
  }
  if (whole < nb)
    for (int64_t t = 0; t < T; ++t) std::copy_n(acc + t * ld + whole, nb - whole, y + t * N + n0 + whole);
}

}  // namespace spmd
