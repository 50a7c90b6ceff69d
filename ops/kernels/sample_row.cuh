// ============================================================================ sample
// One block of THREADS threads per row.  Tokens are ranked by a 32-bit order-preserving key of
// their scaled logit s (descending, ties by id), so "the k-th best token" or "where the cumulative
// weight reaches w" is a radix search over the key: a 12-bit histogram from the first pass over
// the row, then two 10-bit levels inside the chosen bin.  Passes over the row are the cost, so:
//   * the row is read once to find the max (weights need it), the arg-max and the 12-bit counts;
//   * the second read weighs every token; the "region" (a prefix of the ranking holding every
//     token that can matter: positive weight, within top_k, or surely within top_p) is copied in
//     the same read, in id order, into a shared-memory candidate buffer when it fits (`cap`
//     entries) and every later step runs on chip: 2 row reads in all (top_k, or peaked logits);
//   * otherwise the histograms bound the 12-bit bins the searches will enter (top-k, top-p and
//     draw boundaries, top-n ranks) and read 3 copies just those bins; 3 row reads in all;
//   * only if those do not fit either, each search re-reads the row, gathering its own bin once
//     that fits (up to ~6 reads: flat logits, small shared memory).  Correctness never depends
//     on what fits: the buffer is only used for searches it fully covers.
// Penalties never touch the logits: generated tokens (and masked EOS ids) are flagged in a shared
// bitmap, and only flagged tokens look up their count in a per-row hash table in `workspace`.
// All float arithmetic that decides the token uses explicit round-to-nearest intrinsics (never
// contracted into FMAs) so it is bit-identical to the numpy twin; sums of weights are integers.

#ifndef THREADS                           // the emulation in the tests builds it with fewer
#define THREADS 1024
#endif
#define WARPS (THREADS / 32)
#define VEC (16 / (int)sizeof(dtype_t))   // elements per 16-byte load
#define TILE (THREADS * VEC)
#define UNROLL 4                          // tiles per thread in flight in a row pass (for_each)
#define L1_BITS 12
#define L1_BINS 4096
#define LV_BITS 10
#define LV_BINS 1024
#define MAX_TOP_N 64
#define KEY_MAX 0xffffffffu
static_assert(THREADS % 32 == 0 && THREADS >= L1_BINS / 32 && LV_BINS % THREADS == 0, "THREADS: a multiple of 32 in 128..1024");

#if DTYPE_ID == 0
#define SAMPLE_KERNEL sample_fp32
#elif DTYPE_ID == 1
#define SAMPLE_KERNEL sample_fp16
#else
#define SAMPLE_KERNEL sample_bf16
#endif

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Order-preserving key: larger float -> larger key; -0.0 ranks as +0.0.
__device__ __forceinline__ u32 float_key(float x) {
    u32 b = __float_as_uint(x);
    if (b == 0x80000000u) b = 0u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_float(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k ^ 0x80000000u) : ~k);
}

// ~2^31 * exp(d) for d <= 0 as an integer; see exp2_weight in the twin (same operations).
__device__ __forceinline__ u32 exp2_weight(float d) {
    const float y = __fmul_rn(d, LOG2E);
    if (!(y >= -33.f)) return 0u;                 // also NaN
    const float k = floorf(y);
    const float f = __fsub_rn(y, k);              // exact
    float p = COEF8;
    p = __fadd_rn(__fmul_rn(p, f), COEF7); p = __fadd_rn(__fmul_rn(p, f), COEF6);
    p = __fadd_rn(__fmul_rn(p, f), COEF5); p = __fadd_rn(__fmul_rn(p, f), COEF4);
    p = __fadd_rn(__fmul_rn(p, f), COEF3); p = __fadd_rn(__fmul_rn(p, f), COEF2);
    p = __fadd_rn(__fmul_rn(p, f), COEF1); p = __fadd_rn(__fmul_rn(p, f), COEF0);
    return __float2uint_rn(__fmul_rn(p, __int_as_float(((int)k + 158) << 23)));   // * 2^(k+31)
}

// ---------------------------------------------------------------------------- one row's view
struct Row {
    const dtype_t* x;       // the row's logits
    int V;
    bool aligned;           // x is 16-byte aligned: vector loads
    bool greedy;            // keys rank p itself; otherwise p / T
    float T;
    bool special;           // the bitmap is in use (generated tokens and/or masked EOS)
    const u32* bitmap;      // shared, bit i: token i was generated or is a masked EOS
    const int2* table;      // workspace hash table (token, count), 2^hbits slots, linear probing
    int hbits;
    float rep, freq, pres;
    bool mask_eos;
    const int* eos; int E;
};

__device__ __forceinline__ u32 hash_slot(int t, int hbits) { return ((u32)t * 2654435761u) >> (32 - hbits); }

// Penalised / masked value of a flagged token (rare: only generated tokens and EOS ids).
__device__ __noinline__ float overlay(const Row& r, int i, float p) {
    if (r.mask_eos)
        for (int e = 0; e < r.E; ++e)
            if (r.eos[e] == i) return neg_inf();
    if (r.hbits) {
        const u32 mask = (1u << r.hbits) - 1u;
        for (u32 h = hash_slot(i, r.hbits);; h = (h + 1u) & mask) {
            const int2 e = __ldcg(r.table + h);   // L2: written with atomics by this block
            if (e.x == i) {
                if (r.rep != 1.f) p = p > 0.f ? __fdiv_rn(p, r.rep) : __fmul_rn(p, r.rep);
                return __fsub_rn(__fsub_rn(p, __fmul_rn(r.freq, (float)e.y)), r.pres);
            }
            if (e.x < 0) break;
        }
    }
    return p;
}

__device__ __forceinline__ u32 row_key(const Row& r, int i, float p) {
    if (r.special && ((r.bitmap[i >> 5] >> (i & 31)) & 1u)) p = overlay(r, i, p);
    return float_key(r.greedy || r.T == 1.f ? p : __fdiv_rn(p, r.T));   // p / 1 is exactly p
}

// The raw logits of tokens [i0, i0 + VEC) (those < V; the rest repeat x[i0]); a 16-byte load when
// aligned.  Inlined and separate from the key computation so a pass can issue several tiles' loads
// before using any (memory-level parallelism: one load in flight per thread cannot fill HBM).
__device__ __forceinline__ void load_raw(const Row& r, int i0, dtype_t raw[VEC]) {
    const int valid = min(VEC, r.V - i0);
    if (valid <= 0) return;
    if (valid == VEC && r.aligned) {
        union { uint4 u; dtype_t e[VEC]; } pack;
        pack.u = __ldg(reinterpret_cast<const uint4*>(r.x + i0));
#pragma unroll
        for (int v = 0; v < VEC; ++v) raw[v] = pack.e[v];
    } else {
#pragma unroll
        for (int v = 0; v < VEC; ++v) raw[v] = v < valid ? r.x[i0 + v] : r.x[i0];
    }
}

// Keys of the loaded tokens [i0, i0 + VEC) (those < V); returns how many exist.  Inlined: as a
// call, the Row and the key array went through local memory on every element (measured on an H100:
// a greedy row read at 1/5 of the copy bandwidth), at the price of a longer NVRTC compile.
__device__ __forceinline__ int raw_keys(const Row& r, int i0, const dtype_t raw[VEC], u32 key[VEC]) {
    const int valid = min(VEC, r.V - i0);
#pragma unroll
    for (int v = 0; v < VEC; ++v)
        if (v < valid) key[v] = row_key(r, i0 + v, to_float(raw[v]));
    return max(valid, 0);
}

__device__ __forceinline__ int load_row_keys(const Row& r, int i0, u32 key[VEC]) {
    dtype_t raw[VEC];
    load_raw(r, i0, raw);
    return raw_keys(r, i0, raw, key);
}
