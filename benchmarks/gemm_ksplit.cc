// The decode GEMV's task split at every decode step size: gemm.h's K split (tasks = 128-row chunks
// of whole rows, partials added in chunk order) against the column split it replaced (tasks =
// column ranges over all K), for T = 1, 2, 4, 8 rows of x, fp32 and int8 weights, on the linears
// of `--demo small` (8 layers, 117 MB fp32) or of Llama-3.2-1B (SHAPE=1b, LAYERS=2 by default:
// 486 MB fp32).  The K split writes and re-reads (chunks - 1) x T x N partials: at T = 8 and K = 8192
// (1B's down projection) that is 4 MB against 16 MB of int8 weights, the case to watch.
// Whole passes over all the weights, the two variants alternating (order rotating per round).
// Prints weight GB/s (median pass) per (dtype, T, variant).  Build and run (2 = threads):
//   g++ -O3 -march=native -std=c++17 -pthread -Iops/cpu_kernels benchmarks/gemm_ksplit.cc \
//       -Ibenchmarks ops/cpu_kernels/thread_pool.cc ops/cpu_kernels/amx_tiles.cc -o /tmp/gemm_ksplit && SHAPE=1b /tmp/gemm_ksplit 2 9
// TS=8,16,32 times other step sizes (the batched decodes; gemm_ab.py's A/B of the blocked path).
// DTYPES=fp32,int8,panels picks the weights (default fp32,int8): `panels` is fp32 in the exports'
// F32P layout, timed against itself here (an A/A: the noise floor) and against REV in gemm_ab.py.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gemm.h"
#include "to_panels.h"
using namespace spmd;

struct Lin { int64_t K, N; float* w; int8_t* q; float* scale; float* p; };

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// the column split before the K split: each task a range of columns (a multiple of kWidth) over all
// K as one chain
template <typename Src>
void columns(const float* x, const Src& w, const float* scale, int64_t T, int64_t K, int64_t N, float* y) {
  const int64_t threads = num_threads(), vectors = (N + kWidth - 1) / kWidth;
  const int64_t per = std::max<int64_t>(1, (vectors + 2 * threads - 1) / (2 * threads)) * kWidth;
  parallel_for((N + per - 1) / per, [&](int64_t i) {
    const int64_t c0 = i * per, c1 = std::min(N, c0 + per);
    stream_dispatch(T, std::make_integer_sequence<int, kStreamRows>{}, x, w, K, N, 0, K, c0, c1, y, false);
    if (scale != nullptr) scale_columns(y, scale, T, N, c0, c1);
  });
}

// panels have no column-split twin: the baseline is gemm itself (gemm_ab.py: REV's gemm)
static void panels_base(const float* x, const F32P& w, int64_t T, int64_t K, int64_t N, float* y) {
  gemm(x, w, nullptr, T, K, N, y);
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 1, rounds = argc > 2 ? atoi(argv[2]) : 9;
  spmd_set_num_threads(threads);
  const bool big = getenv("SHAPE") && !strcmp(getenv("SHAPE"), "1b");
  const int layers = getenv("LAYERS") ? atoi(getenv("LAYERS")) : big ? 2 : 8;
  std::vector<Lin> ls;
  for (int l = 0; l < layers; ++l) {
    if (big) { ls.push_back({2048, 3072}); ls.push_back({2048, 2048}); ls.push_back({2048, 16384}); ls.push_back({8192, 2048}); }
    else { ls.push_back({512, 1024}); ls.push_back({512, 512}); ls.push_back({512, 3072}); ls.push_back({1536, 512}); }
  }
  int64_t params = 0, maxn = 0;
  for (auto& m : ls) {
    m.w = (float*)aligned_alloc(64, m.K * m.N * 4); m.q = (int8_t*)aligned_alloc(64, m.K * m.N);
    m.scale = (float*)aligned_alloc(64, m.N * 4); m.p = (float*)aligned_alloc(64, m.K * m.N * 4);
    for (int64_t i = 0; i < m.K * m.N; ++i) { m.w[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f; m.q[i] = (int8_t)(i * 7919 % 255 - 127); }
    for (int64_t n = 0; n < m.N; ++n) m.scale[n] = 0.01f;
    to_panels(m.w, m.K, m.N, m.p);
    params += m.K * m.N; maxn = std::max(maxn, m.N);
  }
  std::vector<int64_t> steps;
  for (const char* p = getenv("TS") ? getenv("TS") : "1,2,4,8"; *p != 0; p += *p == ',') steps.push_back(strtol(p, (char**)&p, 10));
  const int64_t most = *std::max_element(steps.begin(), steps.end());
  std::vector<float> x(most * 8192, 0.01f), y(most * maxn), y2(most * maxn);
  const char* dtypes[] = {"fp32", "int8", "panels"};
  const char* want = getenv("DTYPES") ? getenv("DTYPES") : "fp32,int8";
  for (int dt = 0; dt < 3; ++dt) {
    if (!strstr(want, dtypes[dt])) continue;
    const bool int8 = dt == 1;
    const double bytes = (double)params * (int8 ? 1 : 4);
    for (int64_t T : steps) {
      std::vector<double> t[2];
      for (int r = 0; r < rounds; ++r)
        for (int v = 0; v < 2; ++v) {
          const int which = (v + r) % 2;
          const double t0 = now();
          for (auto& m : ls) {
            float* out = which ? y2.data() : y.data();
            if (int8) {
              const I8W w{m.q, m.N};
              which ? columns(x.data(), w, m.scale, T, m.K, m.N, out) : gemm(x.data(), w, m.scale, T, m.K, m.N, out);
            } else if (dt == 2) {
              const F32P w{m.p, m.K, m.N};
              which ? panels_base(x.data(), w, T, m.K, m.N, out) : gemm(x.data(), w, nullptr, T, m.K, m.N, out);
            } else {
              const F32W w{m.w, m.N};
              which ? columns(x.data(), w, nullptr, T, m.K, m.N, out) : gemm(x.data(), w, nullptr, T, m.K, m.N, out);
            }
          }
          t[which].push_back(now() - t0);
        }
      auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
      printf("%s %s T=%ld threads %d %.0f MB: ksplit %.1f GB/s  columns %.1f GB/s  (%.2fx)  %.1f ms, %.0f GFLOP/s\n",
             big ? "1b" : "small", dtypes[dt], (long)T, threads, bytes / 1e6, bytes / med(t[0]) / 1e9,
             bytes / med(t[1]) / 1e9, med(t[1]) / med(t[0]), med(t[0]) * 1e3, 2.0 * params * T / med(t[0]) / 1e9);
    }
  }
}
