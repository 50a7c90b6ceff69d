// ============================================================================ the split scan
// A greedy row needs one pass: its arg-max and log-sum-exp.  One block of THREADS per row reads
// that pass at a fraction of the bandwidth (few blocks per SM, one row each), so `SCAN_KERNEL`
// splits each such row over gridDim.x chunks of SCAN_THREADS-thread blocks and leaves one
// ScanPart per (row, chunk); the main kernel, launched after it on the same stream, combines a
// row's parts in chunk order and is done.  Only rows whose logits reach the keys unchanged take
// this path (`scan_row`): greedy, no top-n logprobs, no masked EOS, no penalty that changes a
// generated token (a table of generated ids with neutral penalties is no change).  Sampled rows
// with the same property are split too, with more launches (`split_row`, sample_split.cuh); the
// others skip the scan at once and run the one-block path.

#define SCAN_THREADS 256
#define SCAN_WARPS (SCAN_THREADS / 32)
#define SCAN_UNROLL 4                     // 16-byte loads in flight per thread

#if DTYPE_ID == 0
#define SCAN_KERNEL sample_scan_fp32
#elif DTYPE_ID == 1
#define SCAN_KERNEL sample_scan_fp16
#else
#define SCAN_KERNEL sample_scan_bf16
#endif

struct ScanPart {            // one chunk of one row
    u64 best;                // max over (key << 32 | ~id): the arg-max, ties to the lowest id
    float lmax, lsum;        // log-sum-exp as (max, sum of exp(p - max))
};

// Penalties change a generated token's logit (the main kernel builds their hash table only then).
__device__ __forceinline__ bool penalties_act(float rep, float freq, float pres) {
    return rep != 1.f || freq != 0.f || pres != 0.f;
}

__device__ __forceinline__ bool is_greedy(float T, float tp, int tk) { return !(T > 0.f) || tk == 1 || !(tp > 0.f); }

// Whether row b is answered by the split scan (the same test in both kernels).
__device__ __forceinline__ bool scan_row(int b, const float* temperature, const float* top_p, const int* top_k,
                                         const float* rep, const float* freq, const float* pres,
                                         const int* min_tokens, const int* num_generated, int E, int G, int n_out) {
    return n_out == 0 && is_greedy(temperature[b], top_p[b], top_k[b])
        && !(E > 0 && num_generated[b] < min_tokens[b]) && !(G > 0 && penalties_act(rep[b], freq[b], pres[b]));
}

// One logit into a thread's running (arg-max, log-sum-exp), as the main kernel's first pass does.
__device__ __forceinline__ void greedy_take(float x, int id, u64& best, float& lmax, float& lsum) {
    const u32 key = float_key(x);
    best = max(best, ((u64)key << 32) | (u32)~id);
    const float p = key_float(key);
    if (p > lmax) { lsum = __fmul_rn(lsum, __expf(lmax - p)) + 1.f; lmax = p; }
    else if (p > neg_inf()) lsum += __expf(p - lmax);
}

// (lmax, lsum) += (om, os): the log-sum-exp pairs' merge.
__device__ __forceinline__ void lse_merge(float& lmax, float& lsum, float om, float os) {
    const float nm = fmaxf(lmax, om);
    lsum = (lmax == nm ? lsum : lsum * __expf(lmax - nm)) + (om == nm ? os : os * __expf(om - nm));
    lmax = nm;
}

// ---------------------------------------------------------------------------- sampled rows
// A sampled row whose keys are its logits / T unchanged (no masked EOS, no acting penalty) is split
// over the chunks too (sample_split.cuh): this kernel adds each chunk's arg-max and 12-bit key counts
// into the row's SplitRow, zeroed by sample_split_zero before it.

#define SPLIT_CAP 4096            // a chunk's list of region tokens, at most (and so the region)

struct SplitRow {                 // one split sampled row's state in the workspace (SPLIT_ROW_BYTES)
    u64 best;                     // max over (key << 32 | ~id), atomicMax
    u64 q_all, n_pos;             // total weight, count of positive weights: atomicAdd
    u64 region;                   // tokens with key >= lo_key (sample_split_plan)
    u32 lo_key, degenerate;       // the region's first key; the max is +-inf or NaN (plan)
    u32 chunk_n[MAX_SCAN_CHUNKS]; // tokens in each chunk's list: the region when region <= SPLIT_CAP,
                                  // else (gathered) the wanted bins' (sample_gather.cuh)
    u32 wanted[L1_BINS / 32];     // the bins the searches will enter, when gathered (sample_split_want)
    int suffix_lo;                // wanted_suffix of those
    u32 gathered;                 // the lists hold the wanted bins' tokens
    u32 cnt[L1_BINS];             // 12-bit key counts: atomicAdd
    u64 mass[L1_BINS];            // 12-bit weight sums of the keys >= zero_key: atomicAdd
};
static_assert(sizeof(SplitRow) == SPLIT_ROW_BYTES, "SplitRow's size is sample_cuda.SPLIT_ROW_BYTES");

// Whether row b is a split sampled row (the same test in every kernel).
__device__ __forceinline__ bool split_row(int b, const float* temperature, const float* top_p, const int* top_k,
                                          const float* rep, const float* freq, const float* pres,
                                          const int* min_tokens, const int* num_generated, int E, int G) {
    return !is_greedy(temperature[b], top_p[b], top_k[b]) && !(E > 0 && num_generated[b] < min_tokens[b])
        && !(G > 0 && penalties_act(rep[b], freq[b], pres[b]));
}

// Tokens [lo, hi) of a split sampled row (x its logits): their arg-max (key, then lowest id) and
// 12-bit key counts into s.  A max and sums of integers: any order of the blocks gives the same.
__device__ __noinline__ void split_scan_chunk(const dtype_t* x, int V, float T, int lo, int hi, SplitRow* s) {
    __shared__ u32 hist[L1_BINS];
    __shared__ u64 w_best[SCAN_WARPS];
    const int tid = threadIdx.x;
    for (int i = tid; i < L1_BINS; i += SCAN_THREADS) hist[i] = 0u;
    __syncthreads();
    Row r;
    r.x = x; r.V = V; r.aligned = (reinterpret_cast<size_t>(x) & 15) == 0;
    r.greedy = false; r.T = T; r.special = false;
    u64 best = 0ull;
    constexpr int STEP = SCAN_THREADS * VEC;
    for (int start = lo + tid * VEC; start < hi; start += SCAN_UNROLL * STEP) {
        dtype_t raw[SCAN_UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < SCAN_UNROLL; ++u)
            if (start + u * STEP < hi) load_raw(r, start + u * STEP, raw[u]);
#pragma unroll
        for (int u = 0; u < SCAN_UNROLL; ++u) {
            const int i0 = start + u * STEP, valid = min(VEC, hi - i0);
#pragma unroll
            for (int v = 0; v < VEC; ++v)
                if (v < valid) {
                    const u32 key = row_key(r, i0 + v, to_float(raw[u][v]));
                    best = max(best, ((u64)key << 32) | (u32)~(i0 + v));
                    atomicAdd(hist + (key >> (32 - L1_BITS)), 1u);
                }
        }
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
    if ((tid & 31) == 0) w_best[tid >> 5] = best;
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < SCAN_WARPS; ++w) best = max(best, w_best[w]);
        atomicMax(&s->best, best);
    }
    for (int i = tid; i < L1_BINS; i += SCAN_THREADS)
        if (hist[i]) atomicAdd(s->cnt + i, hist[i]);
}

// grid (chunks, B), SCAN_THREADS threads: chunk c of row b is tokens [c * chunk, (c + 1) * chunk)
// (chunk a multiple of every VEC, so each chunk starts 16-byte aligned when the row does).
extern "C" __global__ void __launch_bounds__(SCAN_THREADS) SCAN_KERNEL(
    const dtype_t* __restrict__ logits, long long ld, int V,
    const float* __restrict__ temperature, const float* __restrict__ top_p, const int* __restrict__ top_k,
    const float* __restrict__ rep_penalty, const float* __restrict__ freq_penalty,
    const float* __restrict__ pres_penalty, const int* __restrict__ min_tokens,
    const int* __restrict__ num_generated, int E, int G, int num_logprobs, int chunk,
    ScanPart* __restrict__ parts, SplitRow* __restrict__ split)
{
    __shared__ u64 s_best[SCAN_WARPS];
    __shared__ float s_m[SCAN_WARPS], s_s[SCAN_WARPS];
    const int c = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
    if (!scan_row(b, temperature, top_p, top_k, rep_penalty, freq_penalty, pres_penalty, min_tokens,
                  num_generated, E, G, num_logprobs)) {
        if (split != nullptr && split_row(b, temperature, top_p, top_k, rep_penalty, freq_penalty, pres_penalty,
                                          min_tokens, num_generated, E, G))
            split_scan_chunk(logits + b * ld, V, temperature[b], c * chunk, min(V, (c + 1) * chunk), split + b);
        return;   // (uniform over the block)
    }
    Row r;
    r.x = logits + b * ld; r.V = V;
    r.aligned = (reinterpret_cast<size_t>(r.x) & 15) == 0;
    const int lo = c * chunk, hi = min(V, lo + chunk);
    u64 best = 0ull;
    float lmax = neg_inf(), lsum = 0.f;
    constexpr int STEP = SCAN_THREADS * VEC;
    for (int start = lo + tid * VEC; start < hi; start += SCAN_UNROLL * STEP) {
        dtype_t raw[SCAN_UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < SCAN_UNROLL; ++u)
            if (start + u * STEP < hi) load_raw(r, start + u * STEP, raw[u]);   // (hi <= V: whole VECs)
#pragma unroll
        for (int u = 0; u < SCAN_UNROLL; ++u) {
            const int i0 = start + u * STEP, valid = min(VEC, hi - i0);
#pragma unroll
            for (int v = 0; v < VEC; ++v)
                if (v < valid) greedy_take(to_float(raw[u][v]), i0 + v, best, lmax, lsum);
        }
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
        const float om = __shfl_xor_sync(0xffffffffu, lmax, o), os = __shfl_xor_sync(0xffffffffu, lsum, o);
        lse_merge(lmax, lsum, om, os);
    }
    if ((tid & 31) == 0) { s_best[tid >> 5] = best; s_m[tid >> 5] = lmax; s_s[tid >> 5] = lsum; }
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < SCAN_WARPS; ++w) { best = max(best, s_best[w]); lse_merge(lmax, lsum, s_m[w], s_s[w]); }
        ScanPart p; p.best = best; p.lmax = lmax; p.lsum = lsum;
        parts[(long long)b * gridDim.x + c] = p;
    }
}

// In the main kernel, thread 0 of a scanned row: merge its parts in chunk order and answer.
__device__ __forceinline__ void finish_scanned_row(const ScanPart* parts, int chunks, int b, int* out_tokens,
                                                   float* out_logprobs) {
    const ScanPart* p = parts + (long long)b * chunks;
    u64 best = p[0].best;
    float lmax = p[0].lmax, lsum = p[0].lsum;
    for (int c = 1; c < chunks; ++c) { best = max(best, p[c].best); lse_merge(lmax, lsum, p[c].lmax, p[c].lsum); }
    const float lse = lmax == neg_inf() ? lmax : lmax + logf(lsum);
    out_tokens[b] = (int)~(u32)best;
    out_logprobs[b] = key_float((u32)(best >> 32)) - lse;
}
