// int8 weights on Intel AMX's tile unit, exact (int8_exact.h):
// y[T, N] = (x[T, K] @ q[K, N]) * scale[N] for T above kVnniRows (prefill chunks, batched decodes),
// and exact_gemm, the int8 GEMM of every T on such a machine (the smallest steps: gemm_vnni.h).
//
// A task owns up to kAmxNC columns; per kAmxKB rows of W it converts its block into the tile unit's
// B layout, [column tile of 16][k-step][16 rows][16 columns][4 rows] (rows 4r .. 4r + 3 of a column
// side by side), and multiplies every row tile of x's digits by it, keeping the sums in
// int32 [digit][T rounded up to 16][columns rounded up to 32].  Tile registers 0-5: the sums of 1 row
// tile x 2 column tiles x 3 digits; 6: x's digit tile; 7: W's tile.
#pragma once

#include "int8_exact.h"

#ifdef SPMD_HAVE_EXACT_INT8

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "gemm_vnni.h"
#include "simd.h"
#include "thread_pool.h"

namespace spmd {

constexpr int64_t kAmxKB = 128;     // rows of W converted per block: [kAmxNC / 16][2][1 KiB] = 32 KiB, L1
constexpr int64_t kAmxNC = 256;     // columns per task, at most
constexpr int64_t kAmxPrefetch = 16;   // rows of W prefetched ahead by the conversion

void amx_configure_thread(int rows);   // this thread's tiles: x's and the sums' `rows` rows, W's 16

// q[k0 : k0 + kb, n0 : n0 + nb] → B tiles dst[nb / 32 rounded up, x 2][kb / 64 rounded up][1 KiB]
// (rows past kb, columns past nb: zero).  Four rows at a time, 64 columns a load; W is read in runs
// of nb bytes a row.
inline void amx_convert(const int8_t* q, int64_t N, int64_t k0, int64_t kb, int64_t n0, int64_t nb, int8_t* dst,
                        int64_t K) {
  const Interleave interleave;
  const int64_t steps = (kb + kAmxStep - 1) / kAmxStep, tiles = (nb + 31) / 32 * 2;
  for (int64_t r = 0; r < steps * kAmxStep; r += 4) {
    const bool ahead = k0 + r + kAmxPrefetch + 3 < K;
    int8_t* out = dst + (r / kAmxStep) * kAmxTile + (r % kAmxStep) / 4 * 64;
    for (int64_t j = 0; j < nb; j += 64) {
      // the lines kAmxPrefetch rows down, one per row and load: spread over the loop (all of a
      // row group's at once filled the line buffers and stalled, benchmarks/RESULTS.md "Session 21")
      if (ahead)
        for (int64_t i = 0; i < 4; ++i) __builtin_prefetch(q + (k0 + r + kAmxPrefetch + i) * N + n0 + j);
      __m512i row[4];
      load_rows(q, N, k0 + r, k0 + kb, n0, j, nb, row);
      for (int g = 0; g < 4 && j / 16 + g < tiles; ++g)
        _mm512_store_si512(out + (j / 16 + g) * steps * kAmxTile, interleave(row, g));
    }
  }
}

// The tile instructions with the register as a template argument (GCC 12's intrinsics paste the
// number into the mnemonic, so they take only literals).  "memory": the loads read what plain
// stores just wrote (the converted W, x's digits, the sums).
template <int R>
inline void tile_load(const void* base, int64_t stride) {
  asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "n"(R) : "memory");
}
template <int R>
inline void tile_store(void* base, int64_t stride) {
  asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "n"(R) : "memory");
}
template <int R>
inline void tile_zero() {
  asm volatile("tilezero %%tmm%c0" ::"n"(R));
}
template <int C, int A, int B>   // C += A @ B, signed bytes both
inline void tile_dp() {
  asm volatile("tdpbssd %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"n"(C), "n"(A), "n"(B));
}

template <int... I, typename F>
inline void amx_unroll(std::integer_sequence<int, I...>, F&& f) {
  (f(std::integral_constant<int, I>{}), ...);
}

// sums[digit][MT x 16 rows][NT x 16 columns] (+)= the k-steps [0, steps) of the MT row tiles at a
// (k-step stride sa) times the NT column tiles at b (column-tile stride sb); sums' rows ldc int32
// apart, digits dstride apart.  Tile registers: 0-5 the sums (MT * NT = 2), 6 x's, 7 W's.
template <int MT, int NT>
void amx_micro(const int8_t* a, int64_t sa, const int8_t* b, int64_t sb, int64_t steps, int32_t* c, int64_t ldc,
               int64_t dstride, bool zero) {
  static_assert(MT * NT == 2, "six sums, one x tile, one W tile");
  constexpr auto kC = std::make_integer_sequence<int, 6>{};
  auto sums = [&](int i) { return c + (i % 3) * dstride + (i / 3 / NT) * kAmxRows * ldc + (i / 3 % NT) * kAmxCols; };
  amx_unroll(kC, [&](auto i) {
    if (zero) tile_zero<decltype(i)::value>(); else tile_load<decltype(i)::value>(sums(i), ldc * 4);
  });
  for (int64_t s = 0; s < steps; ++s)
    amx_unroll(std::make_integer_sequence<int, NT>{}, [&](auto j) {
      tile_load<7>(b + decltype(j)::value * sb + s * kAmxTile, 64);
      amx_unroll(std::make_integer_sequence<int, MT * 3>{}, [&](auto md) {
        constexpr int M = decltype(md)::value / 3, D = decltype(md)::value % 3;
        tile_load<6>(a + s * sa + (M * 3 + D) * kAmxTile, 64);
        tile_dp<(M * NT + decltype(j)::value) * 3 + D, 6, 7>();
      });
    });
  amx_unroll(kC, [&](auto i) { tile_store<decltype(i)::value>(sums(i), ldc * 4); });
}

// one task: y[:, n0 : n0 + nb] = (x @ q[:, n0 : n0 + nb]) * scale, x packed by amx_pack_row;
// buf: 2 x kAmxKB x (nb rounded up to 32) bytes, acc: [3][tiles x 16][nb rounded up to 32] int32
inline void amx_columns(const int8_t* xp, const float* mult, const int8_t* q, const float* scale, int64_t T,
                        int64_t K, int64_t N, int64_t n0, int64_t nb, int8_t* buf, int32_t* acc, float* y) {
  amx_configure_thread(static_cast<int>(std::min(T, kAmxRows)));
  const int64_t tiles = (T + kAmxRows - 1) / kAmxRows, ld = (nb + 31) / 32 * 32, dstride = tiles * kAmxRows * ld;
  const int64_t sa = tiles * 3 * kAmxTile;
  // W's blocks converted one ahead of their use, into two buffers: a tile load of what was stored
  // just before it waits for the stores to drain (T = 1: 3.7 GB/s against 10 converting alone)
  const int64_t half = kAmxKB * ld;
  if (K > 0) amx_convert(q, N, 0, std::min(kAmxKB, K), n0, nb, buf, K);
  for (int64_t k0 = 0, b = 0; k0 < K; k0 += kAmxKB, b ^= 1) {
    const int64_t kb = std::min(kAmxKB, K - k0), steps = (kb + kAmxStep - 1) / kAmxStep, sb = steps * kAmxTile;
    if (k0 + kAmxKB < K) amx_convert(q, N, k0 + kAmxKB, std::min(kAmxKB, K - k0 - kAmxKB), n0, nb, buf + (b ^ 1) * half, K);
    const int8_t* a = xp + (k0 / kAmxStep) * sa;
    const int8_t* w = buf + b * half;
    for (int64_t i = 0; i < tiles; ++i)
      for (int64_t j = 0; j < ld / kAmxCols; j += 2)   // 1 x 2 tiles (ld: an even count of column tiles)
        amx_micro<1, 2>(a + i * 3 * kAmxTile, sa, w + j * sb, sb, steps, acc + i * kAmxRows * ld + j * kAmxCols,
                        ld, dstride, k0 == 0);
  }
  thread_local std::vector<int64_t> sums;
  sums.resize(nb);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* s0 = acc + t * ld;
    combine_digits(s0, s0 + dstride, s0 + 2 * dstride, nb, sums.data());
    finish_row(sums.data(), mult[t], scale + n0, nb, y + t * N + n0);
  }
}

// y[T, N] = (x[T, K] @ q[K, N]) * scale[N] on the op library's threads, exact; only if amx_enabled()
inline void exact_gemm(const float* x, const int8_t* q, const float* scale, int64_t T, int64_t K, int64_t N, float* y) {
  if (K == 0) return std::fill(y, y + T * N, 0.f);
  const int64_t tiles = (T + kAmxRows - 1) / kAmxRows, steps = std::max<int64_t>(1, (K + kAmxStep - 1) / kAmxStep);
  thread_local AlignedVector<int8_t> packed;   // the caller's; the tasks read it through xp
  thread_local AlignedVector<float> mults;
  packed.resize(steps * tiles * 3 * kAmxTile);
  mults.resize(tiles * kAmxRows);
  int8_t* const xp = packed.data();
  float* const mult = mults.data();
  // rows past T are left as they are: the tile unit's results for them are never stored, VNNI never reads them
  parallel_for(T, [&](int64_t t) { pack_digits(x, T, K, t, tiles, xp, mult); });
  if (T <= kVnniRows) return vnni_gemm(xp, mult, q, scale, T, K, N, y);
  const int64_t threads = num_threads(), per = threads == 1 ? N : (N + 2 * threads - 1) / (2 * threads);
  const int64_t width = std::clamp((per + 31) / 32 * 32, int64_t{32}, kAmxNC), tasks = (N + width - 1) / width;
  parallel_for(tasks, [&](int64_t i) {
    const int64_t c0 = i * width, c1 = std::min(N, c0 + width);
    thread_local AlignedVector<int8_t> buf;
    thread_local AlignedVector<int32_t> acc;
    buf.resize(2 * kAmxKB * width);
    acc.resize(3 * tiles * kAmxRows * width);
    amx_columns(xp, mult, q, scale, T, K, N, c0, c1 - c0, buf.data(), acc.data(), y);
  });
}

}  // namespace spmd

#endif
