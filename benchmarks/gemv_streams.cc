// How a T=1 fp32 GEMV should read its weights on this CPU (issue 16: decode is one pass over them).
// The 33 linear weights of `--demo small` (117 MB fp32) per pass, four ways, interleaved matrix by
// matrix in rotating order (a shared machine then slows each alike; compare within a run):
//   current  gemm.h's T=1 path: W [K, N] row-major, each task a chunk of 128 whole rows (8 rows a
//            pass, one from each of the chunk's eight runs of 16 contiguous rows: eight linear
//            streams) into its own partial y, then the partials added in chunk order
//   columns  the T=1 path before the K split: each task a range of columns over all K, 8 rows per
//            pass (8 concurrent streams of short runs, the hardware prefetchers following each)
//   packed   W repacked as [N/64][K][64] panels: each task reads its panels as ONE sequential stream
//   read     a plain sum over W, one sequential stream per task (the "contiguous is best" bound)
//   read8    a sum over 8 interleaved segments per task (8 concurrent streams)
//   huge     current over a copy of W on 2 MB transparent huge pages (madvise)
//   dot      W held transposed, [N, K] (llama.cpp's layout): each task a range of outputs, 8 output
//            rows at a time as 8 dot products over K (8 streams of whole contiguous rows; the
//            accumulators stay in registers, x's vector is loaded once per 8 FMAs)
// Every variant is written against simd.h's kWidth (AVX-512 or AVX2).  Prints the median time per
// pass and weight GB/s of each.  Build and run (2 = threads; LAYERS=64 for 0.9 GB, past this VM's L3):
//   g++ -O3 -march=native -std=c++17 -pthread -Iops/cpu_kernels benchmarks/gemv_streams.cc \
//       ops/cpu_kernels/thread_pool.cc -o /tmp/gemv_streams && /tmp/gemv_streams 1 60 && /tmp/gemv_streams 2 60
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <sys/mman.h>
#include "gemm.h"
using namespace spmd;
struct Mat { int64_t K, N; float* w; float* p; float* t; float* h; };   // w row-major [K,N]; p packed [N/64][K][64]; t [N,K]; h = w on 2 MB pages
constexpr int64_t P = 64;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
void packed_gemv(const float* x, const Mat& m, float* y) {
  const int64_t panels = m.N / P;
  const int64_t threads = num_threads();
  const int64_t per = std::max<int64_t>(1, (panels + 2 * threads - 1) / (2 * threads));
  const int64_t tasks = (panels + per - 1) / per;
  parallel_for(tasks, [&](int64_t t) {
    for (int64_t pi = t * per; pi < std::min(panels, (t + 1) * per); ++pi) {
      const float* w = m.p + pi * m.K * P;
      constexpr int V = P / kWidth;   // 4 vectors a row with AVX-512, 8 with AVX2
      Vec a[V];
      for (int v = 0; v < V; ++v) a[v] = vzero();
      for (int64_t k = 0; k < m.K; ++k) {
        const Vec xb = vset1(x[k]);
        const float* r = w + k * P;
        for (int v = 0; v < V; ++v) a[v] = vfma(xb, vload(r + v * kWidth), a[v]);
      }
      for (int v = 0; v < V; ++v) vstore(y + pi * P + v * kWidth, a[v]);
    }
  });
}
static const bool kSpread = getenv("SPREAD") != nullptr;   // dot: 8 rows far apart in the task, not adjacent
void columns_gemv(const float* x, const Mat& m, float* y) {
  const int64_t threads = num_threads();
  const int64_t per = threads == 1 ? m.N : ((m.N + 2 * threads - 1) / (2 * threads) + kWidth - 1) / kWidth * kWidth;
  parallel_for((m.N + per - 1) / per, [&](int64_t i) {
    stream_dispatch(1, std::make_integer_sequence<int, kStreamRows>{}, x, F32W{m.w, m.N}, m.K, m.N, 0, m.K, i * per,
                    std::min(m.N, (i + 1) * per), y, false);
  });
}
void dot_gemv(const float* x, const Mat& m, float* y) {   // K a multiple of kWidth, N of 8
  constexpr int64_t R = 8;
  const int64_t threads = num_threads(), per = std::max<int64_t>(R, (m.N / (2 * threads) + R - 1) / R * R);
  parallel_for((m.N + per - 1) / per, [&](int64_t t) {
    const int64_t n0 = t * per, rows = std::min(m.N, n0 + per) - n0;
    // SPREAD: the 8 rows of a step are rows/8 apart, so each of the 8 streams runs through
    // contiguous memory for the whole task (read8's pattern); else 8 adjacent rows
    const int64_t seg = kSpread && rows % R == 0 ? rows / R : 1, step = seg == 1 ? R : 1;
    for (int64_t j = 0; j < (seg == 1 ? rows : seg); j += step) {
      const float* w = m.t + (n0 + j) * m.K;
      Vec a[R];
      for (int i = 0; i < R; ++i) a[i] = vzero();
      for (int64_t k = 0; k < m.K; k += kWidth) {
        const Vec xv = vload(x + k);
        for (int i = 0; i < R; ++i) a[i] = vfma(xv, vload(w + i * seg * m.K + k), a[i]);
      }
      for (int i = 0; i < R; ++i) y[n0 + j + i * seg] = vsum(a[i]);
    }
  });
}
float read_all(const Mat& m) {
  const int64_t n = m.K * m.N, threads = num_threads(), chunk = (n / (2 * threads) + 15) / 16 * 16;
  const int64_t tasks = (n + chunk - 1) / chunk;
  std::vector<float> part(tasks);
  parallel_for(tasks, [&](int64_t t) {
    Vec a = vzero(), b = vzero();
    const int64_t e = std::min(n, (t + 1) * chunk);
    int64_t i = t * chunk;
    for (; i + 2 * kWidth <= e; i += 2 * kWidth) { a = vadd(a, vload(m.w + i)); b = vadd(b, vload(m.w + i + kWidth)); }
    part[t] = vsum(vadd(a, b));
  });
  return part[0];
}
float read_streams(const Mat& m) {   // S interleaved streams per task (memory-level parallelism)
  constexpr int S = 8;
  const int64_t n = m.K * m.N, threads = num_threads(), chunk = (n / (2 * threads) + 16 * S - 1) / (16 * S) * (16 * S);
  const int64_t tasks = (n + chunk - 1) / chunk;
  std::vector<float> part(tasks);
  parallel_for(tasks, [&](int64_t t) {
    const int64_t b = t * chunk, e = std::min(n, b + chunk), seg = (e - b) / S / 16 * 16;
    Vec a[S];
    for (int s = 0; s < S; ++s) a[s] = vzero();
    for (int64_t i = 0; i < seg; i += kWidth)
      for (int s = 0; s < S; ++s) a[s] = vadd(a[s], vload(m.w + b + s * seg + i));
    for (int64_t i = b + S * seg; i + kWidth <= e; i += kWidth) a[0] = vadd(a[0], vload(m.w + i));
    for (int s = 1; s < S; ++s) a[0] = vadd(a[0], a[s]);
    part[t] = vsum(a[0]);
  });
  return part[0];
}
int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 1, rounds = argc > 2 ? atoi(argv[2]) : 30;
  spmd_set_num_threads(threads);
  std::vector<Mat> ms;
  const int layers = getenv("LAYERS") ? atoi(getenv("LAYERS")) : 8;   // 8: --demo small's 117 MB; 64: past the L3
  for (int l = 0; l < layers; ++l) { ms.push_back({512, 1024}); ms.push_back({512, 512}); ms.push_back({512, 3072}); ms.push_back({1536, 512}); }
  ms.push_back({512, 8000 / 64 * 64});
  int64_t bytes = 0;
  for (auto& m : ms) {
    m.w = (float*)aligned_alloc(64, m.K * m.N * 4); m.p = (float*)aligned_alloc(64, m.K * m.N * 4);
    m.t = (float*)aligned_alloc(64, m.K * m.N * 4);
    // huge: a copy of w on transparent huge pages (this VM: THP "madvise"; anonymous memory,
    // Paddle's tensors included, gets 4 KB pages unless asked, while a mapped file such as a GGUF
    // is served from the page cache's large folios: FileHugePages ~9 GB here)
    const size_t hb = (m.K * m.N * 4 + (2 << 20) - 1) / (2 << 20) * (2 << 20);
    m.h = (float*)aligned_alloc(2 << 20, hb);
    madvise(m.h, hb, MADV_HUGEPAGE);
    for (int64_t i = 0; i < m.K * m.N; ++i) m.w[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    memcpy(m.h, m.w, m.K * m.N * 4);
    for (int64_t n = 0; n < m.N; ++n) for (int64_t k = 0; k < m.K; ++k) m.p[(n / P) * m.K * P + k * P + n % P] = m.w[k * m.N + n];
    for (int64_t n = 0; n < m.N; ++n) for (int64_t k = 0; k < m.K; ++k) m.t[n * m.K + k] = m.w[k * m.N + n];
    bytes += m.K * m.N * 4;
  }
  std::vector<float> x(8192, 0.01f), y(8192), y2(8192);
  for (auto& m : ms) {
    gemm(x.data(), F32W{m.w, m.N}, nullptr, 1, m.K, m.N, y.data());
    for (auto f : {packed_gemv, columns_gemv, dot_gemv}) {   // other summation orders: equal within rounding
      f(x.data(), m, y2.data());
      for (int64_t n = 0; n < m.N; ++n)
        if (std::abs(y[n] - y2[n]) > 1e-4f * (1.f + std::abs(y[n]))) { printf("MISMATCH %g %g\n", y[n], y2[n]); return 1; }
    }
  }
  // a round: each variant in turn (rotating order) passes over ALL the weights, as a decode step
  // does, so a variant meets them as the previous pass (another variant's) left the caches; per
  // matrix interleaving let the variants that read the same copy of W hit the L3 for each other
  constexpr int kWays = 7;
  std::vector<double> t[kWays];
  volatile float sink = 0;
  // HOT=1: each timed pass follows an untimed one of the same variant, as serving's steps follow
  // each other (117 MB may then stay in this VM's L3: llama.cpp's 2.9 ms F32 step is 45 GB/s)
  const bool hot = getenv("HOT") != nullptr;
  for (int r = 0; r < rounds; ++r) {
    for (int v = 0; v < kWays * (hot ? 2 : 1); ++v) {
      const int which = (v / (hot ? 2 : 1) + r) % kWays;
      const double t0 = now();
      for (auto& m : ms) {
        if (which == 0) gemm(x.data(), F32W{m.w, m.N}, nullptr, 1, m.K, m.N, y.data());
        else if (which == 1) packed_gemv(x.data(), m, y2.data());
        else if (which == 2) sink = sink + read_all(m);
        else if (which == 3) sink = sink + read_streams(m);
        else if (which == 4) columns_gemv(x.data(), m, y2.data());
        else if (which == 5) dot_gemv(x.data(), m, y2.data());
        else gemm(x.data(), F32W{m.h, m.N}, nullptr, 1, m.K, m.N, y.data());
      }
      if (!hot || v % 2 == 1) t[which].push_back(now() - t0);
    }
  }
  auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  const char* names[kWays] = {"current", "packed", "read", "read8", "columns", "dot", "huge"};
  printf("threads %d, %.1f MB:", threads, bytes / 1e6);
  for (int v = 0; v < kWays; ++v) printf("  %s %.2f ms (%.1f GB/s)", names[v], med(t[v]) * 1e3, bytes / med(t[v]) / 1e9);
  printf("\n");
}
