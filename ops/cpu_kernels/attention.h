// The attention core of spmd_paged_attention (attention.cc):
// causal GQA attention of a step's query tokens over the paged K/V pool, threaded over
// (sequence, KV head, tile of query rows) work items.
//
// A step's tokens are flat, sequence after sequence ([T] = the StepPlan's layout, no padded grid):
// sequence b owns tokens [start_b, start_b + query_lens[b]), token i of it sits at position
// ctx_lens[b] + i and attends to the keys at positions 0 .. ctx_lens[b] + i.  Past keys (p <
// ctx_lens[b]) are read through the block table; the step's own keys must already be in the pool,
// at their slot_mapping slots (each op writes them first, then calls attend()).
#pragma once

#include <cstdint>
#include <vector>

#include "paddle/extension.h"

namespace spmd {

struct PagedPool {          // one layer's pool, [num_blocks, kv_heads, block_size, head_dim] each (head-major)
  void* k;                  // float, or int8_t with per-KV-head scales (value = q * scale[head])
  void* v;
  bool int8;
  const float* k_scale;     // [kv_heads], int8 pools only
  const float* v_scale;
  int64_t blocks, block_size, kv_heads, head_dim;
};

struct StepTokens {         // the step's flat token layout (protocol.StepPlan)
  int64_t seqs;             // B
  const int64_t* query_lens;  // [B]
  const int64_t* ctx_lens;    // [B]
  const int64_t* block_tables;  // [B, max_blocks]
  int64_t max_blocks;
  const int64_t* slots;     // [T] pool slot (block * block_size + offset) of each new token
  std::vector<int64_t> start;   // [B + 1] first token of each sequence, then T
};

// Element offset of (slot, KV head)'s row in a pool [NB, kvh, bs, d]: slot = block * bs + offset.
// Head-major, so that a KV head's rows of a block lie together: a decode reads bs * d contiguous
// elements per block and head, not d at strides of kvh * d (1.2-1.3x for attention from memory at
// long contexts: benchmarks/RESULTS.md "Session 42").
inline int64_t pool_row(const PagedPool& pool, int64_t slot, int64_t head) {
  const int64_t bs = pool.block_size;
  return ((slot / bs * pool.kv_heads + head) * bs + slot % bs) * pool.head_dim;
}

// The pool tensors of an op (checked: [NB, kvh, bs, head_dim] on the CPU, fp32 without scales, int8
// with fp32 [kvh] scales).  The op writes the step's K/V into them in place: they are the runner's
// buffers, bound zero-copy to the graph, and the op's output is used, so Paddle never prunes it.
PagedPool pool_of(const char* op, const paddle::Tensor& k_cache, const paddle::Tensor& v_cache, int64_t head_dim,
                  const paddle::Tensor* k_scale = nullptr, const paddle::Tensor* v_scale = nullptr);

// Store one head's row x[d] at pool row `row` (element offset) of `cache` (k or v): as it is, or
// quantised with the head's scale as ops/kv_cache_write.py does (clip(rint(x / scale), +-127)).
void store_row(const PagedPool& pool, bool is_v, int64_t row, int64_t head, const float* x);

// The step's tables from the op's int64 inputs (checked: dtypes and shapes; call check_tokens next).
StepTokens tokens_of(const char* op, const paddle::Tensor& block_tables, const paddle::Tensor& ctx_lens,
                     const paddle::Tensor& query_lens, const paddle::Tensor& slot_mapping);

// Shape inference: [T, nh * d], nh = qkv heads - 2 kv_heads (-1: unknown); qkv [T, heads, d] or
// [T, heads * d].
std::vector<std::vector<int64_t>> attention_shape(const std::vector<int64_t>& qkv,
                                                  const std::vector<int64_t>& k_cache);

// Checks the layout against the pool (throws with `op`'s name: call before any write) and fills
// `start`; returns T.
int64_t check_tokens(const char* op, StepTokens& step, const PagedPool& pool, int64_t tokens);

struct OwnKV {              // the step's own K (rotated) and V, [T, kv_heads, head_dim] fp32: an int8 pool's
  const float* k = nullptr;
  const float* v = nullptr;
};

// out[t, (h * g + j) * d ...] = softmax(q_t,hg+j . K_h) V_h for every token t and query head (nh of
// them, g = nh / kv_heads per KV head).  q: [T, nh, d] rows `q_stride` floats apart, already
// rotated and scaled; out: [T, nh * d].  An int8 pool's past is dequantised as it is read (scales
// folded into q and the weights); the step's own keys and values then come from `own`.
void attend(const float* q, int64_t q_stride, int64_t nh, const PagedPool& pool, const StepTokens& step, float* out,
            const OwnKV& own = {});

}  // namespace spmd
