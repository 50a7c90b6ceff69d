// The op library's persistent thread pool (thread_pool.cc): parallel_for(n, f) runs f(0) ... f(n-1)
// on the calling thread and the pool's workers, and returns when all have run.
//
// Tasks are handed out one at a time from a shared counter (a slow or preempted thread takes
// fewer), so a task must not depend on which thread runs it: the kernels give each task its own
// outputs and compute them the same way whatever the thread count (their results are bit-equal
// for 1 and n threads).  Tasks must not throw (validate inputs before parallel_for).  A call made
// from inside a task, or while another thread holds the pool, runs its tasks inline.
#pragma once

#include <cstdint>
#include <type_traits>

extern "C" {
void spmd_set_num_threads(int n);   // threads the ops use, the caller included (default 1)
int spmd_get_num_threads();
uint64_t spmd_prefetch_hint();      // the hint the worker has (tests): lines << 48 | address
}

namespace spmd {

int num_threads();
void parallel_for_impl(int64_t n, void (*fn)(void*, int64_t), void* ctx);

// A hint the next job hands to the pool's first worker: once out of that job's tasks, the worker
// prefetches [p, p + bytes) while it waits (the next linear's weights: gemm_ahead.h), so that memory
// keeps streaming while the caller runs alone (Paddle's interpreter between two ops, the job's last
// task).  Prefetch instructions only: a stale hint costs bandwidth, never a fault.  A later hint
// replaces it; one given inside a task is ignored.
void prefetch_when_idle(const void* p, int64_t bytes);

template <typename F>
void parallel_for(int64_t n, F&& f) {
  using Fn = std::remove_reference_t<F>;
  parallel_for_impl(n, [](void* c, int64_t i) { (*static_cast<Fn*>(c))(i); },
                    const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace spmd
