// attend() (ops/cpu_kernels/attention.cc) alone, warm and cold: B decodes (one token each) over PAST
// keys of a paged fp32 pool [NB, kvh, 64, 64] with the blocks shuffled, as the serving pool holds
// them.  "cold" runs a 108 MB fp32 GEMV (gemm.h, the op library's threads) before each call, as a
// decode step's linears stream the weights between two attention layers: the pool then comes from
// memory.  (A plain one-thread read of the same buffer left the pool in this AMD VM's L3: attend ran
// 5x faster after it than after the GEMV; op_calls.py's attention is warm, and graph_step.py's pool
// must be written, not left to the zero page: RESULTS.md "Session 41".)  Prints the median µs a call
// and ns per (key, KV head) item of one thread:
//   g++ -O3 -march=native -std=c++17 -pthread -w -DPADDLE_NO_PYTHON -DPADDLE_WITH_CUSTOM_KERNEL \
//       -Iops/cpu_kernels -I$PADDLE/include -I$PADDLE/include/third_party benchmarks/attention_cold.cc \
//       ops/cpu_kernels/attention.cc ops/cpu_kernels/thread_pool.cc -o /tmp/attention_cold
//   /tmp/attention_cold B PAST THREADS [HEADS KV_HEADS REPS HEAD_DIM]    ($PADDLE: python -c "import paddle, os;
//   print(os.path.dirname(paddle.__file__))")
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "attention.h"
#include "gemm.h"
#include "thread_pool.h"

paddle::InitPhi::InitPhi() {}   // paddle/extension.h's static initialiser, without libpaddle

using namespace spmd;

namespace {

double median_us(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return fprintf(stderr, "usage: %s B PAST THREADS [HEADS KV_HEADS REPS HEAD_DIM]\n", argv[0]), 2;
  const int64_t B = atoi(argv[1]), past = atoi(argv[2]), threads = atoi(argv[3]);
  const int64_t nh = argc > 4 ? atoi(argv[4]) : 8, kvh = argc > 5 ? atoi(argv[5]) : 4, bs = 64;
  const int64_t d = argc > 7 ? atoi(argv[7]) : 64;
  const int reps = argc > 6 ? atoi(argv[6]) : 100;
  spmd_set_num_threads(static_cast<int>(threads));
  const int64_t per = (past + 1 + bs - 1) / bs, NB = B * per + 4;
  std::vector<float> k(NB * bs * kvh * d), v(k.size());
  std::mt19937 gen(1);
  std::normal_distribution<float> nd;
  for (auto& x : k) x = nd(gen);
  for (auto& x : v) x = nd(gen);
  std::vector<int64_t> blocks(NB);
  for (int64_t i = 0; i < NB; ++i) blocks[i] = i;
  std::shuffle(blocks.begin(), blocks.end(), gen);
  std::vector<int64_t> ql(B, 1), cl(B, past), tables(B * per), slots(B);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < per; ++j) tables[b * per + j] = blocks[b * per + j];
    slots[b] = tables[b * per + past / bs] * bs + past % bs;
  }
  const PagedPool pool{k.data(), v.data(), false, nullptr, nullptr, NB, bs, kvh, d};
  StepTokens st{B, ql.data(), cl.data(), tables.data(), per, slots.data(), {}};
  for (int64_t b = 0; b <= B; ++b) st.start.push_back(b);
  std::vector<float> q(B * nh * d), out(B * nh * d);
  for (auto& x : q) x = nd(gen) * 0.125f;
  constexpr int64_t kK = 2048, kN = 13184;   // 108 MB of weights, --demo small's linears
  std::vector<float> w(kK * kN, 1e-3f), x(kK, 0.01f), y(kN);
  double sink = 0;
  for (const bool cold : {false, true}) {
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      if (cold) gemm(x.data(), F32W{w.data(), kN}, nullptr, 1, kK, kN, y.data()), sink += y[0];
      const auto a = std::chrono::steady_clock::now();
      attend(q.data(), nh * d, nh, pool, st, out.data());
      t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
    }
    const double us = median_us(t);
    const double bytes = 2.0 * B * past * kvh * d * sizeof(float);   // the past's K and V
    printf("B=%ld past=%ld threads=%ld heads=%ld/%ld d=%ld %s: %.1f us (%.0f ns per key and KV head, one thread; "
           "%.1f GB/s of K and V)\n", B, past, threads, nh, kvh, d, cold ? "cold" : "warm", us,
           us * 1e3 * threads / (B * kvh * past), bytes / us / 1e3);
  }
  return sink == 42.0;
}
