// The persistent thread pool behind spmd::parallel_for (see thread_pool.h).
//
// Why our own pool and not OpenMP: Paddle's CPU build loads its own OpenMP runtime (Intel's, for
// MKL/oneDNN) and sizes it with set_cpu_math_library_num_threads; a second runtime (libgomp) in
// this library would keep its own spinning workers beside Paddle's, and neither runtime's
// spin/sleep policy nor its thread count would be ours to set.  This pool is ~150 lines, has no
// link dependency, and its workers only ever run our ops' tasks.
//
// Protocol (all counters are std::atomic, seq_cst where a waiter and a waker must see each other):
//   state   = generation << 1 | open.  The caller fills in the job, then opens the next generation
//             and wakes sleeping workers (FUTEX_WAKE only if any sleep: no syscall when they spin).
//   inside  = workers inside the current job.  A worker counts itself in, then re-reads `state`:
//             only if the job it saw is still open does it touch the job (the caller's stack).
//   The caller runs tasks too; when the counter is exhausted it closes the job and waits for
//   `inside` to drain, so no worker can read the job after parallel_for returns.  A worker that
//   never wakes (preempted, or absent after fork) costs nothing: the caller runs every task.
// Idle workers spin for kSpin (the gap between two ops of one graph is ~10-50 us), then sleep on
// a futex, so a rank between steps does not burn its cores.
// The first worker spins by prefetching the hint of prefetch_when_idle, a few lines a turn, while
// there is any: in a decode step of --demo small the worker idled ~20 % of the time and the caller
// ran alone ~18 % (the interpreter, our ops' serial parts), with memory idle (RESULTS.md "Session 53").
#include "thread_pool.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <mutex>
#include <thread>
#include <vector>

namespace spmd {
namespace {

constexpr auto kSpin = std::chrono::microseconds(200);

void futex_wait(std::atomic<uint32_t>* word, uint32_t value) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, value, nullptr, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// prefetch_when_idle's hints: an address in the low kAddressBits bits, its length in cache lines
// (< 2^16) above them, one word: the worker never pairs one hint's address with another's length
constexpr int kAddressBits = 48;
constexpr uint64_t kAddressMask = (uint64_t{1} << kAddressBits) - 1;
constexpr int64_t kAheadLines = 8;          // lines prefetched a turn of the wait (its job checks)
std::atomic<uint64_t> hint_given{0};        // for the next job to hand over
std::atomic<uint64_t> hint_now{0};          // handed over: what the first worker prefetches

// The first worker's way through the hint it has
struct Ahead {
  uint64_t hint = 0;
  int64_t line = 0;
  bool step() {   // prefetch the next few lines; false when none are left
    const uint64_t now = hint_now.load(std::memory_order_relaxed);
    if (now != hint) hint = now, line = 0;
    const int64_t lines = static_cast<int64_t>(now >> kAddressBits);
    if (line >= lines) return false;
    const char* p = reinterpret_cast<const char*>(now & kAddressMask);
    for (const int64_t end = std::min(lines, line + kAheadLines); line < end; ++line) __builtin_prefetch(p + line * 64);
    return true;
  }
};

// Spin while *word == value for up to kSpin, then sleep on it (counted in *sleepers, so that the
// writer knows to wake).  Returns once *word != value.  `ahead`: the first worker's, which spins
// by prefetching.
void wait_while(std::atomic<uint32_t>* word, uint32_t value, std::atomic<uint32_t>* sleepers, Ahead* ahead) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1; word->load(std::memory_order_acquire) == value; ++i) {
    if (ahead == nullptr || !ahead->step()) cpu_relax();
    if (i % 128 == 0 && std::chrono::steady_clock::now() > until) {
      sleepers->fetch_add(1);
      while (word->load() == value) futex_wait(word, value);
      sleepers->fetch_sub(1);
      return;
    }
  }
}

struct Pool {
  std::atomic<uint32_t> state{0}, inside{0}, sleepers{0}, caller_sleeps{0};
  std::atomic<int64_t> next{0};
  std::atomic<bool> stop{false};
  int64_t n = 0;
  void (*fn)(void*, int64_t) = nullptr;
  void* ctx = nullptr;
  std::mutex busy;                 // one caller at a time; others run inline
  std::vector<std::thread> workers;
  pid_t pid = getpid();

  void run_tasks() {
    for (int64_t i; (i = next.fetch_add(1)) < n;) fn(ctx, i);
  }

  // `seen`: the state when the worker was created (not when its thread first runs: a stop or a
  // job that came in between must not become the state it waits to see change)
  void work(uint32_t seen, Ahead* ahead) {
    for (;;) {
      if (stop.load()) return;
      wait_while(&state, seen, &sleepers, ahead);
      seen = state.load();
      if (stop.load()) return;
      if (!(seen & 1)) continue;                          // a job closed before we saw it open
      inside.fetch_add(1);
      if (state.load() == seen) run_tasks();              // still open: the job's fields are valid
      if (inside.fetch_sub(1) == 1 && caller_sleeps.load()) futex_wake(&inside);
    }
  }
};

thread_local bool in_task = false;
std::mutex config;                 // serialises spmd_set_num_threads
std::atomic<Pool*> pool{nullptr};  // a replaced pool is stopped but never freed: a caller may hold it
std::atomic<int> threads{1};

void drain(Pool* p) {             // the caller, after closing the job: wait for workers to leave
  for (int i = 0; i < 4096; ++i) {
    if (p->inside.load() == 0) return;
    cpu_relax();
  }
  p->caller_sleeps.store(1);
  for (uint32_t v; (v = p->inside.load()) != 0;) futex_wait(&p->inside, v);
  p->caller_sleeps.store(0);
}

}  // namespace

int num_threads() { return threads; }

void prefetch_when_idle(const void* p, int64_t bytes) {
  if (in_task) return;
  const uint64_t lines = static_cast<uint64_t>(std::clamp<int64_t>(bytes / 64, 0, 0xffff));
  hint_given.store(lines << kAddressBits | (reinterpret_cast<uint64_t>(p) & kAddressMask), std::memory_order_relaxed);
}

void parallel_for_impl(int64_t n, void (*fn)(void*, int64_t), void* ctx) {
  Pool* p = pool.load();
  if (n <= 0) return;
  if (n == 1 || p == nullptr || in_task || p->pid != getpid() || !p->busy.try_lock()) {
    for (int64_t i = 0; i < n; ++i) fn(ctx, i);
    return;
  }
  p->n = n;
  p->fn = fn;
  p->ctx = ctx;
  p->next.store(0);
  const uint32_t gen = (p->state.load() | 1) + 1;       // the next even generation
  p->state.store(gen | 1);                              // open
  if (p->sleepers.load()) futex_wake(&p->state);
  // handed over only now: a hint given before the job opened would have cut short the prefetch of
  // this job's own weights (the last hint)
  if (const uint64_t hint = hint_given.exchange(0, std::memory_order_relaxed))
    hint_now.store(hint, std::memory_order_relaxed);
  auto finish = [&] {
    in_task = false;
    p->state.store(gen);                                // closed: late workers leave untouched
    drain(p);
    p->busy.unlock();
  };
  in_task = true;
  try {
    p->run_tasks();
  } catch (...) {                                       // a bug (tasks must not throw): still leave clean
    finish();
    throw;
  }
  finish();
}

}  // namespace spmd

using spmd::Pool;
using spmd::futex_wake;

extern "C" void spmd_set_num_threads(int n) {
  std::lock_guard<std::mutex> lock(spmd::config);
  n = std::max(1, n);
  Pool* now = spmd::pool.load();
  if (n == spmd::threads.load() && (n == 1 || (now != nullptr && now->pid == getpid()))) return;   // as it is
  if (Pool* old = spmd::pool.exchange(nullptr)) {
    std::lock_guard<std::mutex> idle(old->busy);         // no job in flight; later callers go inline
    if (old->pid == getpid()) {                         // after fork() its workers are gone
      old->stop.store(true);
      old->state.fetch_add(2);
      futex_wake(&old->state);
      for (auto& t : old->workers) t.join();
    }
  }
  spmd::threads.store(n);
  if (n == 1) return;
  auto* fresh = new Pool();
  for (int i = 1; i < n; ++i)
    fresh->workers.emplace_back([fresh, seen = fresh->state.load(), first = i == 1] {
      spmd::Ahead ahead;   // the first worker's
      fresh->work(seen, first ? &ahead : nullptr);
    });
  spmd::pool.store(fresh);
}

extern "C" int spmd_get_num_threads() { return spmd::threads.load(); }

extern "C" uint64_t spmd_prefetch_hint() { return spmd::hint_now.load(); }
