// The fp32 GEMM in the panel layout (weights.h F32P, spmd_serve/export/panels.py) against the [K, N]
// layout it replaced in the graphs (F32W), in one binary: first every output compared bit for bit
// over odd shapes, T and thread counts (mode 0), then whole passes over the `--demo small` linears
// (SHAPE=1b: two Llama-3.2-1B layers), the two alternating per round, median times (mode 1).
//   g++ -O3 -march=native -std=c++17 -pthread -Iops/cpu_kernels -Ibenchmarks benchmarks/gemm_panels.cc \
//       ops/cpu_kernels/thread_pool.cc ops/cpu_kernels/amx_tiles.cc -o /tmp/gemm_panels
//   /tmp/gemm_panels 0 && TS=1,2,4,8,12,32,512 /tmp/gemm_panels 1 <threads> <rounds>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "gemm.h"
#include "to_panels.h"
using namespace spmd;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
struct Lin { int64_t K, N; float* w; float* p; };
int main(int argc, char** argv) {
  const int mode = atoi(argv[1]);
  if (mode == 0) {  // equality
    int bad = 0, n = 0;
    const int64_t Ks[] = {1, 2, 100, 128, 130, 300, 512};
    const int64_t Ns[] = {1, 15, 16, 17, 64, 131, 257, 1000};
    const int64_t Ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 32, 47, 64, 130};
    for (int th : {1, 2, 3}) {
      spmd_set_num_threads(th);
      for (auto K : Ks) for (auto N : Ns) {
        std::vector<float> w(K * N), p(K * N);
        for (int64_t i = 0; i < K * N; ++i) w[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
        to_panels(w.data(), K, N, p.data());
        for (auto T : Ts) {
          std::vector<float> x(T * K), y1(T * N, 7.f), y2(T * N, 9.f);
          for (int64_t i = 0; i < T * K; ++i) x[i] = (float)((i * 40503u) % 997) * 1e-3f - 0.4f;
          gemm(x.data(), F32W{w.data(), N}, nullptr, T, K, N, y1.data());
          gemm(x.data(), F32P{p.data(), K, N}, nullptr, T, K, N, y2.data());
          ++n;
          if (memcmp(y1.data(), y2.data(), T * N * 4)) { if (bad++ < 10) printf("DIFF th=%d K=%ld N=%ld T=%ld\n", th, K, N, T); }
        }
      }
    }
    printf("%d of %d cases differ\n", bad, n);
    return bad != 0;
  }
  const int threads = atoi(argv[2]), rounds = atoi(argv[3]);
  const bool big = getenv("SHAPE") && !strcmp(getenv("SHAPE"), "1b");
  spmd_set_num_threads(threads);
  std::vector<Lin> ls;
  for (int l = 0; l < (big ? 2 : 8); ++l) {
    if (big) { ls.push_back({2048, 3072}); ls.push_back({2048, 2048}); ls.push_back({2048, 16384}); ls.push_back({8192, 2048}); }
    else { ls.push_back({512, 1024}); ls.push_back({512, 512}); ls.push_back({512, 3072}); ls.push_back({1536, 512}); }
  }
  int64_t params = 0;
  for (auto& m : ls) {
    m.w = (float*)aligned_alloc(64, m.K * m.N * 4); m.p = (float*)aligned_alloc(64, m.K * m.N * 4);
    for (int64_t i = 0; i < m.K * m.N; ++i) m.w[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    to_panels(m.w, m.K, m.N, m.p); params += m.K * m.N;
  }
  std::vector<int64_t> Ts;
  for (const char* q = getenv("TS") ? getenv("TS") : "1,2,4,8,12,16,32,64,512"; *q; q += *q == ',') Ts.push_back(strtol(q, (char**)&q, 10));
  for (auto T : Ts) {
    std::vector<float> x(T * 8192, 0.01f), y(T * 16384);
    std::vector<double> t[2];
    for (int r = 0; r < rounds; ++r) for (int v = 0; v < 2; ++v) {
      const int which = (v + r) % 2; const double t0 = now();
      for (auto& m : ls) which ? gemm(x.data(), F32W{m.w, m.N}, nullptr, T, m.K, m.N, y.data())
                               : gemm(x.data(), F32P{m.p, m.K, m.N}, nullptr, T, m.K, m.N, y.data());
      t[which].push_back(now() - t0);
    }
    auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
    printf("%s T=%ld threads %d: panels %.2f ms (%.1f GB/s, %.0f GFLOP/s)  rows %.2f ms  (%.2fx)\n", big ? "1b" : "small", (long)T, threads,
           med(t[0]) * 1e3, params * 4 / med(t[0]) / 1e9, 2.0 * params * T / med(t[0]) / 1e9, med(t[1]) * 1e3, med(t[1]) / med(t[0]));
  }
}
