// ============================================================================ the sampled split
// One block per row reads a row at a fraction of the bandwidth, and a sampled row needs two or three
// reads (sample_row.cuh).  So a sampled row whose keys are its logits / T unchanged (`split_row`: no
// masked EOS, no acting penalty; the others keep the one-block path) is read by many blocks, in
// five launches on one stream, each after the one before (seven when its region passes the lists:
// sample_gather.cuh):
//   sample_split_zero    zero the row's SplitRow (accumulators for atomics)
//   SCAN_KERNEL          per (row, chunk): the arg-max and the 12-bit key counts (split_scan_chunk)
//   sample_split_plan    per row: the max m and the region (the one-block path's rule, region_lo_bin)
//   SPLIT_PASS_KERNEL    per (row, chunk): every weight into the 12-bit weight histogram, q_all,
//                        n_pos, and the chunk's region tokens in id order into its list
//   SAMPLE_KERNEL        loads all that (the lists concatenated in chunk order: the candidate
//                        buffer of the one-block path, in id order) and runs the same searches.
// Everything summed across blocks is an integer (or a max), so any order of the blocks gives the
// twin's tokens bit for bit.  A region larger than the lists leaves them to the split gather of
// the bins the searches will enter (sample_gather.cuh); when those do not fit either, the main
// kernel takes the one-block path's "region did not fit" branch with the histograms loaded.

#if DTYPE_ID == 0
#define SPLIT_PASS_KERNEL sample_split_pass_fp32
#elif DTYPE_ID == 1
#define SPLIT_PASS_KERNEL sample_split_pass_fp16
#else
#define SPLIT_PASS_KERNEL sample_split_pass_bf16
#endif

// Keys below this weigh 0: every positive weight has s - m > -22.9 (bin-aligned).
__device__ __forceinline__ u32 zero_key_of(float m) {
    return float_key(__double2float_rd((double)m - 25.0)) & ~(KEY_MAX >> L1_BITS);
}

// The region's first 12-bit bin (c.l1_cnt: the row's key counts; c.m: its max; c.l1_mass is
// scratch, left zero): a prefix of the ranking (whole bins) holding every token later steps look
// at: positive weight and, with top_k, the bin of rank top_k; without top_k but with top_p < 1, the
// bins whose weight surely reaches top_p of the total (bounds from the counts: weights are monotone
// in the key, so a bin's weights lie between those of its end keys).
__device__ __noinline__ int region_lo_bin(Ctx& c, u32 best_key, int tk, float tp, int V, Shm& sh) {
    const float m = c.m;
    const int zero_bin = (int)(zero_key_of(m) >> (32 - L1_BITS));
    int lo_bin = zero_bin;
    if (tk > 0 && tk < V) {
        u64 ac = 0, am = 0;
        lo_bin = max(lo_bin, scan_bins(c.l1_cnt, nullptr, L1_BINS, false, (u64)tk, ac, am, sh));
    } else if (tp < 1.f) {
        u64 hi_total = 0, e0, e1, t0;
        for (int i = threadIdx.x; i < L1_BINS; i += THREADS) {
            const u32 lo = (u32)i << (32 - L1_BITS), hi = min(lo | (KEY_MAX >> L1_BITS), best_key);
            const u64 n = i >= zero_bin && lo <= best_key ? c.l1_cnt[i] : 0u;
            c.l1_mass[i] = n * weight_of_key(lo, m);             // lower bound, only for this search
            hi_total += n * weight_of_key(hi, m);
        }
        block_scan2(hi_total, 0ull, e0, e1, hi_total, t0, sh);
        const u64 need = (u64)ceil(__dmul_rn((double)tp, (double)hi_total));
        u64 ac = 0, am = 0;                                       // no crossing: bin 0, no narrowing
        lo_bin = max(lo_bin, scan_bins(c.l1_cnt, c.l1_mass, L1_BINS, true, need, ac, am, sh));
        for (int i = threadIdx.x; i < L1_BINS; i += THREADS) c.l1_mass[i] = 0ull;
        __syncthreads();
    }
    return lo_bin;
}

// grid (B), SCAN_THREADS threads: the split rows' SplitRow to zero
extern "C" __global__ void __launch_bounds__(SCAN_THREADS) sample_split_zero(
    const float* __restrict__ temperature, const float* __restrict__ top_p, const int* __restrict__ top_k,
    const float* __restrict__ rep_penalty, const float* __restrict__ freq_penalty,
    const float* __restrict__ pres_penalty, const int* __restrict__ min_tokens,
    const int* __restrict__ num_generated, int E, int G, SplitRow* __restrict__ split)
{
    const int b = blockIdx.x;
    if (!split_row(b, temperature, top_p, top_k, rep_penalty, freq_penalty, pres_penalty, min_tokens, num_generated,
                   E, G))
        return;
    u64* words = reinterpret_cast<u64*>(split + b);
    for (int i = threadIdx.x; i < SPLIT_ROW_BYTES / 8; i += SCAN_THREADS) words[i] = 0ull;
}

// grid (B), THREADS threads, dynamic shared memory L1_BINS x 12 bytes: the region of each split row
extern "C" __global__ void __launch_bounds__(THREADS) sample_split_plan(
    const float* __restrict__ temperature, const float* __restrict__ top_p, const int* __restrict__ top_k,
    const float* __restrict__ rep_penalty, const float* __restrict__ freq_penalty,
    const float* __restrict__ pres_penalty, const int* __restrict__ min_tokens,
    const int* __restrict__ num_generated, int E, int G, int V, SplitRow* __restrict__ split)
{
    const int b = blockIdx.x, tid = threadIdx.x;
    if (!split_row(b, temperature, top_p, top_k, rep_penalty, freq_penalty, pres_penalty, min_tokens, num_generated,
                   E, G))
        return;
    SplitRow* s = split + b;
    __shared__ Shm sh;
    extern __shared__ __align__(16) unsigned char smem[];
    Ctx c;
    c.l1_mass = reinterpret_cast<u64*>(smem);                    // 4096 x 8
    c.l1_cnt = reinterpret_cast<u32*>(c.l1_mass + L1_BINS);      // 4096 x 4
    const u32 best_key = (u32)(s->best >> 32);
    c.m = key_float(best_key);
    if (!(fabsf(c.m) <= 3.402823466e38f)) {                      // +-inf or NaN: the main kernel answers
        if (tid == 0) s->degenerate = 1u;
        return;
    }
    for (int i = tid; i < L1_BINS; i += THREADS) c.l1_cnt[i] = s->cnt[i];
    __syncthreads();
    const int lo_bin = region_lo_bin(c, best_key, top_k[b], top_p[b], V, sh);
    u64 region = 0, e0, e1, t1;
    for (int i = lo_bin + tid; i < L1_BINS; i += THREADS) region += c.l1_cnt[i];
    block_scan2(region, 0ull, e0, e1, region, t1, sh);
    if (tid == 0) { s->lo_key = (u32)lo_bin << (32 - L1_BITS); s->region = region; }
}

// Exclusive prefix sum over a SCAN_THREADS block (thread order) and the total; w: SCAN_WARPS slots.
__device__ __forceinline__ u64 split_block_scan(u64 v, u64& total, u64* w) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 x = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += x;
    }
    __syncthreads();                                   // w may still be read by the previous call
    if (lane == 31) w[warp] = inc;
    __syncthreads();
    u64 before = 0;
    total = 0;
    for (int i = 0; i < SCAN_WARPS; ++i) { before += i < warp ? w[i] : 0ull; total += w[i]; }
    return before + inc - v;
}

// Tokens [lo, hi) of row r read once: on_key(key) for each, and (when keep; uniform over the block)
// those with in(key) compacted in id order into list[0, SPLIT_CAP) (one block scan per SCAN_UNROLL
// tiles, counts packed 16 bits a tile: a tile holds <= 2048); returns how many had in(key) (when keep).
template <class OnKey, class In>
__device__ __forceinline__ u32 compact_chunk(const Row& r, int lo, int hi, bool keep, OnKey on_key, In in,
                                             uint2* list, u64* w) {
    const int tid = threadIdx.x;
    u32 listed = 0;                                              // the chunk's listed tokens so far
    constexpr int STEP = SCAN_THREADS * VEC;
    for (int base = lo; base < hi; base += SCAN_UNROLL * STEP) {  // the same trip count in every thread
        dtype_t raw[SCAN_UNROLL][VEC];
        u32 key[SCAN_UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < SCAN_UNROLL; ++u)
            if (base + u * STEP + tid * VEC < hi) load_raw(r, base + u * STEP + tid * VEC, raw[u]);
        u64 counts = 0;
#pragma unroll
        for (int u = 0; u < SCAN_UNROLL; ++u) {
            const int i0 = base + u * STEP + tid * VEC, valid = min(VEC, hi - i0);
            u64 n = 0;
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                if (v >= valid) continue;
                key[u][v] = row_key(r, i0 + v, to_float(raw[u][v]));
                on_key(key[u][v]);
                n += in(key[u][v]);
            }
            counts |= n << (16 * u);
        }
        if (!keep) continue;
        // id order is (tile u, thread, v): rank = the tiles before, the threads before, then v
        u64 total;
        const u64 excl = split_block_scan(counts, total, w);
#pragma unroll
        for (int u = 0; u < SCAN_UNROLL; ++u) {
            const int i0 = base + u * STEP + tid * VEC, valid = min(VEC, hi - i0);
            u32 rank = listed + (u32)((excl >> (16 * u)) & 0xffffu);
#pragma unroll
            for (int v = 0; v < VEC; ++v)
                if (v < valid && in(key[u][v])) {
                    if (rank < SPLIT_CAP) list[rank] = make_uint2(key[u][v], (u32)(i0 + v));
                    ++rank;
                }
            listed += (u32)((total >> (16 * u)) & 0xffffu);
        }
    }
    return listed;
}

// A split row's view for the chunk passes (its keys: logits / T).
__device__ __forceinline__ Row split_row_view(const dtype_t* logits, long long ld, int V, int b, float T) {
    Row r;
    r.x = logits + b * ld; r.V = V; r.aligned = (reinterpret_cast<size_t>(r.x) & 15) == 0;
    r.greedy = false; r.T = T; r.special = false;
    return r;
}

// The gather of a gathered split row's wanted bins (keys >= zero_key, as gather_bins reads them):
// the chunk's tokens of them into its list (sample_gather.cuh has the picture).
__device__ __noinline__ void split_gather_chunk(const Row& r, int lo, int hi, SplitRow* s, uint2* list, u64* w) {
    __shared__ u32 wanted[L1_BINS / 32];
    for (int i = threadIdx.x; i < L1_BINS / 32; i += SCAN_THREADS) wanted[i] = s->wanted[i];
    __syncthreads();
    const u32 zero_key = zero_key_of(key_float((u32)(s->best >> 32)));
    const u32 listed = compact_chunk(r, lo, hi, true, [](u32) {},
        [&](u32 key) { return key >= zero_key && is_wanted(wanted, key >> (32 - L1_BITS)); }, list, w);
    if (threadIdx.x == 0) s->chunk_n[blockIdx.x] = listed;
}

// grid (chunks, B), SCAN_THREADS threads (chunks as SCAN_KERNEL's): the second read of a split row,
// or with `gather` its gather (sample_gather.cuh)
extern "C" __global__ void __launch_bounds__(SCAN_THREADS) SPLIT_PASS_KERNEL(
    const dtype_t* __restrict__ logits, long long ld, int V,
    const float* __restrict__ temperature, const float* __restrict__ top_p, const int* __restrict__ top_k,
    const float* __restrict__ rep_penalty, const float* __restrict__ freq_penalty,
    const float* __restrict__ pres_penalty, const int* __restrict__ min_tokens,
    const int* __restrict__ num_generated, int E, int G, int chunk,
    SplitRow* __restrict__ split, uint2* __restrict__ lists, int gather)
{
    // The 64-bit weight sums as two u32 words: a shared u64 atomicAdd is a compare-and-swap loop,
    // which peaked bins serialise (this kernel took ~200 us, 11 reads, on an H200 with u64 sums).
    __shared__ u32 mass_lo[L1_BINS], mass_hi[L1_BINS];
    __shared__ u64 w_a[SCAN_WARPS], w_b[SCAN_WARPS];
    const int ch = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
    if (!split_row(b, temperature, top_p, top_k, rep_penalty, freq_penalty, pres_penalty, min_tokens, num_generated,
                   E, G) || split[b].degenerate)
        return;
    SplitRow* s = split + b;
    const Row r = split_row_view(logits, ld, V, b, temperature[b]);
    const int lo = ch * chunk, hi = min(V, lo + chunk);
    uint2* list = lists + ((long long)b * gridDim.x + ch) * SPLIT_CAP;
    if (gather) {
        if (s->gathered) split_gather_chunk(r, lo, hi, s, list, w_a);
        return;
    }
    const float m = key_float((u32)(s->best >> 32));
    const u32 zero_key = zero_key_of(m), lo_key = s->lo_key;
    for (int i = tid; i < L1_BINS; i += SCAN_THREADS) mass_lo[i] = mass_hi[i] = 0u;
    __syncthreads();
    u64 q_all = 0, n_pos = 0;
    const u32 listed = compact_chunk(
        r, lo, hi, s->region <= (u64)SPLIT_CAP,                   // else the lists go unused
        [&](u32 key) {
            if (key < zero_key) return;
            const u32 q = weight_of_key(key, m);
            if (!q) return;
            const u32 bin = key >> (32 - L1_BITS), was = atomicAdd(mass_lo + bin, q);
            if (was + q < was) atomicAdd(mass_hi + bin, 1u);   // this add carried out of the low word
            q_all += q; ++n_pos;
        },
        [&](u32 key) { return key >= lo_key; }, list, w_a);
    __syncthreads();                                             // mass complete
    for (int i = tid; i < L1_BINS; i += SCAN_THREADS) {
        const u64 sum = (u64)mass_hi[i] << 32 | mass_lo[i];
        if (sum) atomicAdd(s->mass + i, sum);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        q_all += __shfl_xor_sync(0xffffffffu, q_all, o);
        n_pos += __shfl_xor_sync(0xffffffffu, n_pos, o);
    }
    if ((tid & 31) == 0) { w_a[tid >> 5] = q_all; w_b[tid >> 5] = n_pos; }
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < SCAN_WARPS; ++w) { q_all += w_a[w]; n_pos += w_b[w]; }
        atomicAdd(&s->q_all, q_all);
        atomicAdd(&s->n_pos, n_pos);
        s->chunk_n[ch] = listed;
    }
}
