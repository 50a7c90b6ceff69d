// ---------------------------------------------------------------------------- block state
struct Shm {                 // static shared scratch
    u64 wa[WARPS], wb[WARPS];
    float fa[WARPS], fb[WARPS];
    int res_bin; u64 res_cnt, res_mass;
    int found, n_top;
    u32 top_key[MAX_TOP_N]; int top_id[MAX_TOP_N];
    u32 wanted[L1_BINS / 32];        // 12-bit bins gathered by gather_bins
};

struct Ctx {                 // identical in every thread of the block
    Row r;
    u32* l1_cnt; u64* l1_mass;   // 12-bit histograms of the row (counts) / region (weights)
    u32* lv_cnt; u64* lv_mass;   // 10-bit histograms of the level being searched
    u32* cand_key; int* cand_id; int cap;
    // The candidate buffer holds, in id order, cand_n tokens: when cand_valid, every token with key
    // in [cand_lo, cand_hi], or (cand_bins) every token of the 12-bit bins flagged in `wanted`
    // (then every nonempty bin >= suffix_lo is flagged).
    bool cand_valid, cand_bins;
    u32 cand_lo, cand_hi;
    int cand_n, suffix_lo;
    const u32* wanted;
    float m;                     // max s (sampled rows)
};

__device__ __forceinline__ u32 weight_of_key(u32 key, float m) { return exp2_weight(__fsub_rn(key_float(key), m)); }

// Exclusive prefix sums over the block (thread order) of two values, and their totals.
__device__ __noinline__ void block_scan2(u64 a, u64 b, u64& ea, u64& eb, u64& ta, u64& tb, Shm& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 ia = a, ib = b;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 xa = __shfl_up_sync(0xffffffffu, ia, o), xb = __shfl_up_sync(0xffffffffu, ib, o);
        if (lane >= o) { ia += xa; ib += xb; }
    }
    __syncthreads();                                   // sh.wa/wb may still be read by a previous call
    if (lane == 31) { sh.wa[warp] = ia; sh.wb[warp] = ib; }
    __syncthreads();
    if (warp == 0) {
        u64 va = lane < WARPS ? sh.wa[lane] : 0ull, vb = lane < WARPS ? sh.wb[lane] : 0ull;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u64 xa = __shfl_up_sync(0xffffffffu, va, o), xb = __shfl_up_sync(0xffffffffu, vb, o);
            if (lane >= o) { va += xa; vb += xb; }
        }
        if (lane < WARPS) { sh.wa[lane] = va; sh.wb[lane] = vb; }   // inclusive over warps
    }
    __syncthreads();
    ea = (warp ? sh.wa[warp - 1] : 0ull) + ia - a;
    eb = (warp ? sh.wb[warp - 1] : 0ull) + ib - b;
    ta = sh.wa[WARPS - 1];
    tb = sh.wb[WARPS - 1];
}

__device__ __noinline__ u64 block_max(u64 v, Shm& sh) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.wa[threadIdx.x >> 5] = v;
    __syncthreads();
    u64 r = 0;
    for (int w = 0; w < WARPS; ++w) r = max(r, sh.wa[w]);
    return r;
}
