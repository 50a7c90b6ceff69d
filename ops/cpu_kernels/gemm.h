// y[T, N] = x[T, K] @ W[K, N] (W one of weights.h's layouts, times a per-column scale for int8),
// multi-threaded, for every T: one kernel choice by T alone, never by size.
//
// * T <= kStreamRows (decode steps): memory-bound, the time is one pass over W.  With several
//   threads a task owns one chunk of kKC rows of W and (when the threads need more tasks than
//   chunks) a range of columns: it reads whole rows, long contiguous runs (1.0-1.3x the bandwidth
//   of column ranges with two threads here: RESULTS.md "The decode GEMV's K split, ported");
//   chunk 0 writes y, the others a scratch partial each, and the last of a column range's chunks
//   to finish adds them in chunk order.  On one thread the task owns all columns and sums its
//   chunks itself (no partials).
//   stream_tile keeps T x tile accumulators in L1 and multiplies kPassRows rows of W at a time
//   into them, with a software prefetch kPrefetchRows rows ahead (int8: it issues four 16-byte
//   loads a line, so the out-of-order window alone holds too few lines in flight; RESULTS.md
//   "Speed change 4b").  At T > 1 a pass is compute-bound: it holds up to kStreamSums of the sums
//   (rows x two vectors) in registers over its rows, so a weight vector is loaded once for those
//   rows and a broadcast of x once for two vectors (RESULTS.md "Session 32": fp32 1.16-1.27x at
//   T = 6-8 on two threads, int8 1.12-1.14x at T = 2-8).
// * T > kStreamRows (prefill chunks, batched decodes): compute-bound.  A task owns <= kNC columns;
//   per kKC rows of W it converts its [kKC, kNC] block to fp32 micro-panels [kKC][kNR] (in L2;
//   int8/int4 are dequantised here, once per call) and runs a kMR x kNR register-blocked
//   micro-kernel over all T rows for each micro-panel while that panel stays in L1, adding each
//   block's product to the task's contiguous [T, kNC] sums (y once at the end); while it fits in L2 the
//   next block is prefetched into L2 meanwhile (BlockPrefetch).  x is packed once
//   per call into kMR-row micro-panels per block of kKC rows.  The packings are per-call scratch
//   buffers: no second copy of the weights is kept.
//
// * fp32 weights in panels (weights.h F32P, the exports' layout) and bf16 ones (B16P, --dtype bfloat16,
//   widened exactly as they are loaded): the blocked path reads full panels in place (no pack), the
//   stream path is gemm_panels.h's; the same sums as below (bf16: those of the widened weights).
//
// * int8 on a CPU with AMX (and the kernel's grant): exact integer sums, gemm_amx.h (T > 2) and
//   gemm_vnni.h (T <= 2), for every T; int8_exact.h says how, and why never mixed with the above.
// * int8 on a CPU with AVX-512 BF16 and no AMX: x rounded to bf16, then at T >= 2 bf16 dot products
//   over pairs of W's rows on both paths (stream and blocked): the same chains (gemm_bf16.h).
//
// Every output element is the same fp32 sum in both paths and in the scalar tails: per chunk of
// kKC rows (k0 = 0, kKC, ...) the chain acc = fma(x[t,k], w[k,n], acc) from acc = 0 over the chunk's
// rows in chain_row's order (gemm_blocked.h: eight interleaved runs), and the chunks' chains added
// in order, y = ((c0 + c1) + c2) + ... (then * scale[n] for int8): results are bit-equal whatever
// the thread count, tile sizes, or the T of the call a row came in.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "gemm_ahead.h"
#include "gemm_amx.h"
#include "gemm_bf16.h"
#include "gemm_blocked.h"
#include "gemm_panels.h"
#include "gemm_stream.h"
#include "simd.h"
#include "thread_pool.h"
#include "weights.h"

namespace spmd {

constexpr int64_t kBlockedTasks = 8;        // blocked: column tasks a thread, about (see gemm())

// y[T, N] = (x[T, K] @ w) * scale[N] (scale may be null), on the op library's threads
template <typename Src>
void gemm(const float* x, const Src& w, const float* scale, int64_t T, int64_t K, int64_t N, float* y) {
  if (T == 0 || N == 0) return;
  if (T <= kStreamRows) note_weights(weight_start(w), weight_bytes<Src>(K, N));   // a decode step's: memory-bound
#ifdef SPMD_HAVE_EXACT_INT8
  if constexpr (std::is_same_v<Src, I8W>)
    if (amx_enabled()) return exact_gemm(x, w.q, scale, T, K, N, y);
#endif
#ifdef SPMD_HAVE_BF16_INT8
  if constexpr (std::is_same_v<Src, I8W>) {
    thread_local AlignedVector<float> rounded;   // the caller's: x in bf16, read by the tasks
    float* const xr = grown(rounded, T * K);
    if (T > kStreamRows)   // on the threads: a prefill chunk's x took 1.4 ms alone (T = 512, K = 8192)
      parallel_for(T, [&](int64_t t) { round_bf16(x + t * K, K, xr + t * K); });
    else
      round_bf16(x, T * K, xr);
    // T = 1 is bound by W's read: FMAs on widened weights read it as fast as the pairs (whose
    // blend costs issue slots: 0.9-1.0x) and make the same chain, so the same bits
    if (T == 1) return stream_gemm(xr, w, scale, T, K, N, y);
    return gemm(xr, I8Pairs{w}, scale, T, K, N, y);
  }
#endif
  if constexpr (kIsPanels<Src>) {
    if (T <= kStreamRows) return panel_stream_gemm(x, w, T, K, N, y);
  } else {
    if (T <= kStreamRows) return stream_gemm(x, w, scale, T, K, N, y);
  }
  const int64_t threads = num_threads();
  // columns per task: a multiple of the micro-panel width; with threads, about kBlockedTasks a thread:
  // the VM's vCPUs run up to 1.5x apart for minutes, and with two tasks a thread the fast one idled at
  // the end of N = 512 (four tasks); eight a thread read 1.03-1.08x at --demo small, T = 16-512
  // (RESULTS.md "Session 24").  Narrower tasks cost nothing: each still packs its W once per call
  const int64_t per = threads == 1 ? N : (N + kBlockedTasks * threads - 1) / (kBlockedTasks * threads);
  const int64_t width = std::clamp((per + kNR - 1) / kNR * kNR, kNR, std::max(kNR, kNC / kNR * kNR));
  const int64_t tasks = (N + width - 1) / width, tiles = Tiles(T).count;
  thread_local AlignedVector<float> packed;  // the caller's; the tasks read it through xp
  grown(packed, tiles * K * kMR);
  float* const xp = packed.data();
  parallel_for(tiles, [&](int64_t i) { BlockedKernel<Src>::pack_x(x, T, K, i, xp); });
  parallel_for(tasks, [&](int64_t i) {
    const int64_t c0 = i * width, c1 = std::min(N, c0 + width);
    thread_local AlignedVector<float> buf, acc;
    buf.resize(kKC * width);
    acc.resize(T * width);
    if (K == 0)
      for (int64_t t = 0; t < T; ++t) std::fill(y + t * N + c0, y + t * N + c1, 0.f);
    else
      blocked_columns(xp, w, T, K, N, c0, c1 - c0, buf.data(), acc.data(), y,
                      i + threads < tasks ? (i + threads) * width : -1);
    if (scale != nullptr) scale_columns(y, scale, T, N, c0, c1);
  });
}

}  // namespace spmd
