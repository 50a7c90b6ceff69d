// The FMA peak of this moment, one thread and all threads: 24 independent chains of vector FMAs
// a thread, no memory traffic.  GEMM figures are worth quoting only as a fraction of this,
// measured in the same minute: on this VM it read 107-175 GFLOP/s a thread within 20 minutes
// (RESULTS.md "Session 23").
//
//     g++ -O2 -march=native -pthread benchmarks/fma_peak.cc -o /tmp/fma_peak && /tmp/fma_peak
#include <chrono>
#include <cstdio>
#include <thread>
#include <utility>
#include <vector>

// One register a vector, `a * b + c` contracted to an FMA (GCC's default -ffp-contract=fast): 16
// floats and 24 chains with AVX-512 (32 registers); 8 floats and 12 chains with AVX2's 16 (the
// AVX-512 shape's 48 halves went through the stack there: 3.9-8 GFLOP/s a thread on a Zen 3)
#ifdef __AVX512F__
typedef float Vec __attribute__((vector_size(64)));
constexpr int kLanes = 16;
constexpr int kChains = 24;  // > FMA latency x units (4 x 2): the units never wait for a result
#else
typedef float Vec __attribute__((vector_size(32)));
constexpr int kLanes = 8;
constexpr int kChains = 12;
#endif
static Vec set1(float v) { return Vec{} + v; }
static Vec fma(Vec a, Vec b, Vec c) { return a * b + c; }
static float first(Vec v) { return v[0]; }

template <size_t... I>
static float chains(long iters, std::index_sequence<I...>) {
  Vec acc[kChains] = {set1(I * 1e-3f)...};  // unrolled by the pack: the chains live in registers
  const Vec b = set1(0.999f), c = set1(1e-4f);
  for (long it = 0; it < iters; ++it) {
    ((acc[I] = fma(acc[I], b, c)), ...);
    asm volatile("" ::: "memory");
  }
  return (first(acc[I]) + ...);
}

int main() {
  const long iters = 20'000'000;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  for (int round = 0; round < 2; ++round)
    for (int threads : {1, cores}) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> pool;
      std::vector<float> sink(threads);
      for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] { sink[t] = chains(iters, std::make_index_sequence<kChains>{}); });
      for (auto& th : pool) th.join();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("threads %d: %.1f GFLOP/s (checksum %g)\n", threads, threads * iters * kChains * 2.0 * kLanes / s / 1e9,
                  sink[0]);
    }
}
