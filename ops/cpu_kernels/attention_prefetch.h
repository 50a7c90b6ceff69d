// The next work item's past K and V, brought into L2 while the current item computes (attention.cc).
//
// A decode step's attention reads its past from memory: the linears between two layers stream
// every weight through the caches.  Alone, a work item (one sequence, one KV head) costs its
// arithmetic plus the read of its rows: the hardware prefetchers follow each contiguous 16 KB run
// of a block but do not run ahead across the block table, so the core waits on every new run and
// the two do not overlap.  A thread runs a chunk of consecutive items; while it scores and weighs
// item i, this cursor issues item i + 1's lines a few per key visited, spread over the whole item,
// so memory works during the arithmetic (`attention_cold`, B = 32, `--demo small`'s heads, two
// threads, from memory: 1.3-1.6x at past 192, 1.1-1.5x at past 1024; benchmarks/RESULTS.md
// "Session 43").  In cache it costs 20-40 %, but the pool is not in cache when a step reaches a
// layer's attention.  Prefetches change no result.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "attention.h"

namespace spmd {

class PoolPrefetch {
 public:
  // Nothing to fetch: step() does nothing
  PoolPrefetch() = default;

  // Sequence `seq`'s past rows of KV head `head` (its K runs, then its V runs, block by block),
  // at most kBudget bytes, spread over `visits` key visits of the current item (its score pass
  // and its weighing pass over its keys)
  PoolPrefetch(const PagedPool& pool, const StepTokens& st, int64_t seq, int64_t head, int64_t visits) {
    const int64_t bs = pool.block_size, d = pool.head_dim, past = st.ctx_lens[seq];
    const int64_t elem = pool.int8 ? 1 : static_cast<int64_t>(sizeof(float)), blocks = (past + bs - 1) / bs;
    const int64_t* table = st.block_tables + seq * st.max_blocks;
    int64_t budget = budget_bytes(), lines = 0;
    for (const void* base : {pool.k, pool.v})
      for (int64_t blk = 0; blk < blocks && budget > 0; ++blk) {
        // [NB, kvh, bs, d]: the block's rows of this head are one run
        const char* run = static_cast<const char*>(base) + ((table[blk] * pool.kv_heads + head) * bs * d) * elem;
        const int64_t bytes = std::min(bs, past - blk * bs) * d * elem;
        runs_.emplace_back(run, bytes);
        budget -= bytes;
        lines += (bytes + 63) / 64;
      }
    per_key_ = (lines + std::max<int64_t>(visits, 1) - 1) / std::max<int64_t>(visits, 1);
  }

  // The share of `keys` key visits: per_key lines each, in the runs' order
  void step(int64_t keys) {
    for (int64_t left = keys * per_key_; left > 0 && run_ < runs_.size(); --left) {
      __builtin_prefetch(runs_[run_].first + off_, 0, 2);   // into L2 (prefetcht1)
      off_ += 64;
      if (off_ >= runs_[run_].second) ++run_, off_ = 0;
    }
  }

 private:
  // Half the core's L2: the current item's rows stay while the next one's arrive
  static int64_t budget_bytes() {
    static const int64_t bytes = [] {
      const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
      return l2 > 0 ? static_cast<int64_t>(l2) / 2 : int64_t{256} << 10;
    }();
    return bytes;
  }

  std::vector<std::pair<const char*, int64_t>> runs_;
  size_t run_ = 0;
  int64_t off_ = 0, per_key_ = 0;
};

}  // namespace spmd
