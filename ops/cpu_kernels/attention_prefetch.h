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

#include <algorithm>
#include <cstdint>

#include "attention.h"
#include "cache_size.h"

namespace spmd {

class PoolPrefetch {
 public:
  // Nothing to fetch: step() does nothing
  PoolPrefetch() = default;

  // Sequence `seq`'s past rows of KV head `head` (its K runs, then its V runs, block by block), at
  // most budget_bytes(), spread over `visits` key visits of the current item (its score pass and
  // its weighing pass over its keys).  The runs are found from the block table as the cursor goes.
  PoolPrefetch(const PagedPool& pool, const StepTokens& st, int64_t seq, int64_t head, int64_t visits)
      : pool_(&pool), table_(st.block_tables + seq * st.max_blocks), head_(head), past_(st.ctx_lens[seq]),
        row_bytes_(pool.head_dim * (pool.int8 ? 1 : static_cast<int64_t>(sizeof(float)))) {
    if (past_ == 0) return;
    const int64_t lines = 2 * ((past_ * row_bytes_ + 63) / 64);   // K and V, about (a block's run rounds up)
    left_ = std::min(lines, budget_bytes() / 64);
    per_key_ = (left_ + std::max<int64_t>(visits, 1) - 1) / std::max<int64_t>(visits, 1);
    open_run();
  }

  // The share of `keys` key visits: per_key lines each, in the runs' order
  void step(int64_t keys) {
    for (int64_t n = keys * per_key_; n > 0 && left_ > 0; --n, --left_) {
      __builtin_prefetch(run_ + off_, 0, 2);   // into L2 (prefetcht1)
      if ((off_ += 64) < run_bytes_) continue;
      if (++blk_ * pool_->block_size >= past_) blk_ = 0, ++kv_;
      if (kv_ == 2) left_ = 0;
      else open_run();
    }
  }

 private:
  // Half the core's L2: the current item's rows stay while the next one's arrive
  static int64_t budget_bytes() { return l2_bytes() / 2; }

  // [NB, kvh, bs, d]: block blk_'s rows of this head in K (kv_ 0) or V (1) are one run
  void open_run() {
    const int64_t bs = pool_->block_size;
    const char* base = static_cast<const char*>(kv_ ? pool_->v : pool_->k);
    run_ = base + (table_[blk_] * pool_->kv_heads + head_) * bs * row_bytes_;
    run_bytes_ = std::min(bs, past_ - blk_ * bs) * row_bytes_;
    off_ = 0;
  }

  const PagedPool* pool_ = nullptr;
  const int64_t* table_ = nullptr;
  int64_t head_ = 0, past_ = 0, row_bytes_ = 0;
  int64_t left_ = 0, per_key_ = 0;   // lines still to issue; lines a key visit
  int kv_ = 0;
  int64_t blk_ = 0, off_ = 0, run_bytes_ = 0;
  const char* run_ = nullptr;
};

}  // namespace spmd
