// How a T=1 fp32 GEMV should read its weights on this CPU (issue 16: decode is one pass over them).
// The 33 linear weights of `--demo small` (117 MB fp32) per pass, four ways, interleaved matrix by
// matrix in rotating order (a shared machine then slows each alike; compare within a run):
//   current  gemm.h's T=1 path: W [K, N] row-major, each task a range of columns, 8 rows per pass
//            (8 concurrent streams of short runs, the hardware prefetchers following each)
//   packed   W repacked as [N/64][K][64] panels: each task reads its panels as ONE sequential stream
//   read     a plain sum over W, one sequential stream per task (the "contiguous is best" bound)
//   read8    a sum over 8 interleaved segments per task (8 concurrent streams)
//   ksplit   W split by rows: each task multiplies kSplitRows whole rows (8 rows a pass, full-length
//            rows: long runs) into its own partial y, then the partials are added in chunk order
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
static int64_t kSplitRows = getenv("SPLIT_ROWS") ? atoi(getenv("SPLIT_ROWS")) : 64;   // rows of W per task (fixed: the sum order is not the thread count's)
static const bool kSpread = getenv("SPREAD") != nullptr;   // 8 rows far apart in the chunk, not adjacent
std::vector<float> partials;
void ksplit_gemv(const float* x, const Mat& m, float* y) {
  const int64_t chunks = (m.K + kSplitRows - 1) / kSplitRows;
  partials.resize(chunks * m.N);
  parallel_for(chunks, [&](int64_t c) {
    float* acc = partials.data() + c * m.N;
    const int64_t k0 = c * kSplitRows, k1 = std::min(m.K, k0 + kSplitRows);
    for (int64_t j = 0; j < m.N; j += kWidth) vstore(acc + j, vzero());
    // a pass multiplies rows k0 + kk + i * seg, i < 8: eight streams far apart (when SPREAD)
    const int64_t seg = kSpread ? (k1 - k0) / kPassRows : 1, step = kSpread ? 1 : kPassRows;
    for (int64_t kk = 0; kk + (kSpread ? 0 : kPassRows - 1) < (kSpread ? seg : k1 - k0); kk += step) {
      const int64_t k = k0 + kk;
      Vec xb[kPassRows];
      for (int i = 0; i < kPassRows; ++i) xb[i] = vset1(x[k + i * seg]);
      for (int64_t j = 0; j < m.N; j += kWidth) {
        Vec a = vload(acc + j);
        for (int i = 0; i < kPassRows; ++i) a = vfma(xb[i], vload(m.w + (k + i * seg) * m.N + j), a);
        vstore(acc + j, a);
      }
    }
  });
  const int64_t threads = num_threads(), cols = std::max<int64_t>(kWidth, (m.N / (2 * threads) + kWidth - 1) / kWidth * kWidth);
  parallel_for((m.N + cols - 1) / cols, [&](int64_t t) {
    for (int64_t j = t * cols; j < std::min(m.N, (t + 1) * cols); j += kWidth) {
      Vec a = vload(partials.data() + j);
      for (int64_t c = 1; c < chunks; ++c) a = vadd(a, vload(partials.data() + c * m.N + j));
      vstore(y + j, a);
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
  std::vector<double> ta, tb, tc, td, te;
  volatile float sink = 0;
  constexpr int kWays = 5;
  for (int r = 0; r < rounds; ++r) {
    double sa = 0, sb = 0, sc = 0, sd = 0, se = 0;
    for (auto& m : ms) {   // per matrix, rotating order: contention hits every variant alike
      for (int v = 0; v < kWays; ++v) {
        const int which = (v + r) % kWays;
        double t0 = now();
        if (which == 0) gemm(x.data(), F32W{m.w, m.N}, nullptr, 1, m.K, m.N, y.data());
        else if (which == 1) packed_gemv(x.data(), m, y2.data());
        else if (which == 2) sink = sink + read_all(m);
        else if (which == 3) sink = sink + read_streams(m);
        else ksplit_gemv(x.data(), m, y2.data());
        double dt = now() - t0;
        (which == 0 ? sa : which == 1 ? sb : which == 2 ? sc : which == 3 ? sd : se) += dt;
      }
    }
    ta.push_back(sa); tb.push_back(sb); tc.push_back(sc); td.push_back(sd); te.push_back(se);
  }
  auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  printf("threads %d: %.1f MB  current %.3f ms (%.1f GB/s)  packed %.3f ms (%.1f GB/s)  read %.3f ms (%.1f GB/s)  read8 %.1f GB/s"
         "  ksplit %.3f ms (%.1f GB/s)\n", threads, bytes / 1e6,
         med(ta) * 1e3, bytes / med(ta) / 1e9, med(tb) * 1e3, bytes / med(tb) / 1e9, med(tc) * 1e3, bytes / med(tc) / 1e9,
         bytes / med(td) / 1e9, med(te) * 1e3, bytes / med(te) / 1e9);
}
