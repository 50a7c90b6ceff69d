// Which weights a decode step's next linear reads (gemm.h, T <= kStreamRows): a graph runs its
// linears in the same order every step, so each weight's successor is learned from the calls and,
// once the same one followed it twice in a row, handed to the pool as the first worker's prefetch
// while it waits (thread_pool.h, prefetch_when_idle).  A weight whose successor varies (an MoE
// expert) gets no hint.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <unordered_map>

#include "cache_size.h"
#include "thread_pool.h"
#include "weights.h"

namespace spmd {

// the first bytes of the next weights the worker prefetches (what its L2 cannot hold falls into the
// shared L3, where the caller reads it): --demo small's graph at batch 1 on a Zen 4 with 1 MiB of L2,
// hint on against off in one process, 1 and 2 MiB read 1.01-1.06x (the VM's bandwidth state decides
// where), 4 MiB 1.00-1.02x (RESULTS.md "Session 53")
inline int64_t ahead_bytes() { return 2 * l2_bytes(); }

template <typename Src>
const void* weight_start(const Src& w) {
  if constexpr (kIsPanels<Src>) return w.w;
  else return w.at(0, 0);
}

// the bytes of a [K, N] weight in layout Src (int8 and int4 scales aside)
template <typename Src>
int64_t weight_bytes(int64_t K, int64_t N) {
  if constexpr (kIsPanels<Src>) return K * N * static_cast<int64_t>(sizeof(typename Src::Elem));
  else if constexpr (std::is_same_v<Src, F32W>) return K * N * 4;
  else if constexpr (std::is_same_v<Src, I4W>) return (K + 1) / 2 * N;
  else return K * N;
}

// this call's weights start at `p`, `bytes` long: note them as the last call's successor (on this
// thread) and hint the ones that surely follow them
inline void note_weights(const void* p, int64_t bytes) {
  struct Next {
    const void* p = nullptr;
    int64_t bytes = 0;
    bool sure = false;   // followed twice in a row
  };
  thread_local std::unordered_map<const void*, Next> after;
  thread_local const void* last = nullptr;
  // the same linear again (int8 on bf16 calls gemm twice); on one thread no worker would prefetch
  if (p == last || num_threads() == 1) return;
  if (last != nullptr) {
    Next& n = after[last];
    n = Next{p, bytes, n.p == p};
  }
  last = p;
  const auto it = after.find(p);
  if (it != after.end() && it->second.sure) prefetch_when_idle(it->second.p, std::min(it->second.bytes, ahead_bytes()));
}

}  // namespace spmd
