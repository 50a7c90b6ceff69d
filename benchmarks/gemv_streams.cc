// How a T=1 fp32 GEMV should read its weights on this CPU (issue 16: decode is one pass over them).
// The 33 linear weights of `--demo small` (117 MB fp32) per pass, four ways, interleaved matrix by
// matrix in rotating order (a shared machine then slows each alike; compare within a run):
//   current  gemm.h's T=1 path: W [K, N] row-major, each task a range of columns, 8 rows per pass
//            (8 concurrent streams of short runs, the hardware prefetchers following each)
//   packed   W repacked as [N/64][K][64] panels: each task reads its panels as ONE sequential stream
//   read     a plain sum over W, one sequential stream per task (the "contiguous is best" bound)
//   read8    a sum over 8 interleaved segments per task (8 concurrent streams)
// Prints the median time per pass and weight GB/s of each.  Build and run (2 = threads):
//   g++ -O3 -march=native -std=c++17 -pthread -Iops/cpu_kernels benchmarks/gemv_streams.cc \
//       ops/cpu_kernels/thread_pool.cc -o /tmp/gemv_streams && /tmp/gemv_streams 1 60 && /tmp/gemv_streams 2 60
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include "gemm.h"
using namespace spmd;
struct Mat { int64_t K, N; float* w; float* p; };   // w row-major [K,N]; p packed [N/64][K][64]
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
      Vec a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
      for (int64_t k = 0; k < m.K; ++k) {
        const Vec xb = vset1(x[k]);
        const float* r = w + k * P;
        a0 = vfma(xb, vload(r), a0); a1 = vfma(xb, vload(r + 16), a1);
        a2 = vfma(xb, vload(r + 32), a2); a3 = vfma(xb, vload(r + 48), a3);
      }
      vstore(y + pi * P, a0); vstore(y + pi * P + 16, a1); vstore(y + pi * P + 32, a2); vstore(y + pi * P + 48, a3);
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
    for (; i + 32 <= e; i += 32) { a = vadd(a, vload(m.w + i)); b = vadd(b, vload(m.w + i + 16)); }
    float tmp[16]; vstore(tmp, vadd(a, b)); part[t] = tmp[0];
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
    for (int64_t i = 0; i < seg; i += 16)
      for (int s = 0; s < S; ++s) a[s] = vadd(a[s], vload(m.w + b + s * seg + i));
    for (int64_t i = b + S * seg; i + 16 <= e; i += 16) a[0] = vadd(a[0], vload(m.w + i));
    for (int s = 1; s < S; ++s) a[0] = vadd(a[0], a[s]);
    float tmp[16]; vstore(tmp, a[0]); part[t] = tmp[0];
  });
  return part[0];
}
int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 1, rounds = argc > 2 ? atoi(argv[2]) : 30;
  spmd_set_num_threads(threads);
  std::vector<Mat> ms;
  for (int l = 0; l < 8; ++l) { ms.push_back({512, 1024}); ms.push_back({512, 512}); ms.push_back({512, 3072}); ms.push_back({1536, 512}); }
  ms.push_back({512, 8000 / 64 * 64});
  int64_t bytes = 0;
  for (auto& m : ms) {
    m.w = (float*)aligned_alloc(64, m.K * m.N * 4); m.p = (float*)aligned_alloc(64, m.K * m.N * 4);
    for (int64_t i = 0; i < m.K * m.N; ++i) m.w[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    for (int64_t n = 0; n < m.N; ++n) for (int64_t k = 0; k < m.K; ++k) m.p[(n / P) * m.K * P + k * P + n % P] = m.w[k * m.N + n];
    bytes += m.K * m.N * 4;
  }
  std::vector<float> x(8192, 0.01f), y(8192), y2(8192);
  // check equality of the two GEMVs (same fma chain over k)
  for (auto& m : ms) {
    gemm(x.data(), F32W{m.w, m.N}, nullptr, 1, m.K, m.N, y.data());
    packed_gemv(x.data(), m, y2.data());
    if (memcmp(y.data(), y2.data(), m.N * 4)) { printf("MISMATCH\n"); return 1; }
  }
  std::vector<double> ta, tb, tc, td;
  volatile float sink = 0;
  for (int r = 0; r < rounds; ++r) {
    double sa = 0, sb = 0, sc = 0, sd = 0;
    for (auto& m : ms) {   // per matrix, rotating order: contention hits every variant alike
      for (int v = 0; v < 4; ++v) {
        const int which = (v + r) % 4;
        double t0 = now();
        if (which == 0) gemm(x.data(), F32W{m.w, m.N}, nullptr, 1, m.K, m.N, y.data());
        else if (which == 1) packed_gemv(x.data(), m, y2.data());
        else if (which == 2) sink = sink + read_all(m);
        else sink = sink + read_streams(m);
        double dt = now() - t0;
        (which == 0 ? sa : which == 1 ? sb : which == 2 ? sc : sd) += dt;
      }
    }
    ta.push_back(sa); tb.push_back(sb); tc.push_back(sc); td.push_back(sd);
  }
  auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  printf("threads %d: %.1f MB  current %.3f ms (%.1f GB/s)  packed %.3f ms (%.1f GB/s)  read %.3f ms (%.1f GB/s)  read8 %.1f GB/s\n", threads, bytes / 1e6,
         med(ta) * 1e3, bytes / med(ta) / 1e9, med(tb) * 1e3, bytes / med(tb) / 1e9, med(tc) * 1e3, bytes / med(tc) / 1e9, bytes / med(td) / 1e9);
}
