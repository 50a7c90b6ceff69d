// ---------------------------------------------------------------------------- the kernel
// SAMPLE_STOP k (profiling only: ops/bench_sample.py times the kernel ended after each phase):
// return after phase k, writing v to out_tokens so the work before stays live.
#ifdef SAMPLE_STOP
#define STOP_AT(k, v) if (SAMPLE_STOP == (k)) { if (tid == 0) out_tokens[b] = (int)(v); return; }
#else
#define STOP_AT(k, v)
#endif
extern "C" __global__ void __launch_bounds__(THREADS) SAMPLE_KERNEL(
    const dtype_t* __restrict__ logits, long long ld, int V,
    const float* __restrict__ temperature, const float* __restrict__ top_p, const int* __restrict__ top_k,
    const float* __restrict__ rep_penalty, const float* __restrict__ freq_penalty,
    const float* __restrict__ pres_penalty,
    const unsigned long long* __restrict__ seeds, const long long* __restrict__ counters,
    const int* __restrict__ min_tokens, const int* __restrict__ num_generated,
    const int* __restrict__ eos_ids, int E, const int* __restrict__ gen_ids, int G,
    int2* __restrict__ workspace, int hash_bits, int num_logprobs, int cap,
    int* __restrict__ out_tokens, float* __restrict__ out_logprobs,
    int* __restrict__ out_top_ids, float* __restrict__ out_top_logprobs,
    const ScanPart* __restrict__ scan_parts, int scan_chunks,
    const SplitRow* __restrict__ split, const uint2* __restrict__ split_lists)
{
    const int b = blockIdx.x, tid = threadIdx.x;
    if (scan_chunks > 0 && scan_row(b, temperature, top_p, top_k, rep_penalty, freq_penalty, pres_penalty,
                                    min_tokens, num_generated, E, G, num_logprobs)) {
        if (tid == 0) finish_scanned_row(scan_parts, scan_chunks, b, out_tokens, out_logprobs);
        return;   // (uniform over the block: the test reads row b's parameters only)
    }
    __shared__ Shm sh;
    extern __shared__ __align__(16) unsigned char smem[];
    const float T = temperature[b], tp = top_p[b];
    const int tk = top_k[b];

    Ctx c;
    c.l1_mass = reinterpret_cast<u64*>(smem);                    // 4096 x 8
    c.lv_mass = c.l1_mass + L1_BINS;                             // 1024 x 8
    c.l1_cnt = reinterpret_cast<u32*>(c.lv_mass + LV_BINS);      // 4096 x 4
    c.lv_cnt = c.l1_cnt + L1_BINS;                               // 1024 x 4
    c.cand_key = c.lv_cnt + LV_BINS;                             // cap x 4
    c.cand_id = reinterpret_cast<int*>(c.cand_key + cap);        // cap x 4
    u32* bitmap = reinterpret_cast<u32*>(c.cand_id + cap);       // ceil(V / 32) x 4
    c.cap = cap; c.cand_valid = c.cand_bins = false; c.cand_lo = c.cand_hi = 0u; c.cand_n = c.suffix_lo = 0;
    c.wanted = sh.wanted; c.m = 0.f;
    if (tid < L1_BINS / 32) sh.wanted[tid] = 0u;

    Row& r = c.r;
    r.x = logits + b * ld; r.V = V;
    r.aligned = (reinterpret_cast<size_t>(r.x) & 15) == 0;
    r.greedy = is_greedy(T, tp, tk);
    r.T = T;
    r.rep = rep_penalty[b]; r.freq = freq_penalty[b]; r.pres = pres_penalty[b];
    r.mask_eos = E > 0 && num_generated[b] < min_tokens[b];
    r.eos = eos_ids + (long long)b * E; r.E = E;
    r.hbits = G > 0 && penalties_act(r.rep, r.freq, r.pres) ? hash_bits : 0;   // neutral: no table
    r.table = workspace + ((long long)b << hash_bits);
    r.bitmap = bitmap;
    r.special = r.mask_eos || r.hbits;

    // ---- phase 0: the penalty overlay (bitmap + counts of each generated token)
    if (r.special) {
        const int words = (V + 31) >> 5;
        for (int i = tid; i < words; i += THREADS) bitmap[i] = 0u;
        int2* table = workspace + ((long long)b << hash_bits);
        if (r.hbits)
            for (int i = tid; i < (1 << hash_bits); i += THREADS) table[i] = make_int2(-1, 0);
        __syncthreads();
        const u32 mask = (1u << hash_bits) - 1u;
        for (int j = tid; r.hbits && j < G; j += THREADS) {
            const int t = gen_ids[(long long)b * G + j];
            if (t < 0 || t >= V) continue;
            for (u32 h = hash_slot(t, hash_bits);; h = (h + 1u) & mask) {
                const int prev = atomicCAS(&table[h].x, -1, t);
                if (prev == -1 || prev == t) { atomicAdd(&table[h].y, 1); break; }
            }
            atomicOr(&bitmap[t >> 5], 1u << (t & 31));
        }
        for (int e = tid; r.mask_eos && e < E; e += THREADS) {
            const int t = r.eos[e];
            if (t >= 0 && t < V) atomicOr(&bitmap[t >> 5], 1u << (t & 31));
        }
    }
    const int n_out = num_logprobs;
    int* top_ids = out_top_ids + (long long)b * n_out;
    float* top_lps = out_top_logprobs + (long long)b * n_out;
    // a split sampled row (sample_split.cuh): its reads are done, its results in sr
    const SplitRow* sr = split != nullptr && split_row(b, temperature, top_p, top_k, rep_penalty, freq_penalty,
                                                       pres_penalty, min_tokens, num_generated, E, G)
                             ? split + b : nullptr;
    const bool need_hist = !r.greedy || n_out > 0;
    for (int i = tid; need_hist && i < L1_BINS; i += THREADS) {
        c.l1_cnt[i] = sr ? sr->cnt[i] : 0u;
        c.l1_mass[i] = sr ? sr->mass[i] : 0ull;
    }
    __syncthreads();

    // ---- phase 1 (row read 1): arg-max (key, then lowest id), 12-bit key counts, greedy log-sum-exp
    u64 best = sr ? sr->best : 0ull;
    float lmax = neg_inf(), lsum = 0.f;
    if (!sr) {
        u32* l1c = c.l1_cnt; const bool greedy = r.greedy;
        for_each(c, 0u, KEY_MAX, [&](u32 key, int id) {
            best = max(best, ((u64)key << 32) | (u32)~id);
            if (need_hist) atomicAdd(l1c + (key >> (32 - L1_BITS)), 1u);
            if (greedy) {
                const float p = key_float(key);
                if (p > lmax) { lsum = __fmul_rn(lsum, __expf(lmax - p)) + 1.f; lmax = p; }
                else if (p > neg_inf()) lsum += __expf(p - lmax);
            }
        });
    }
    best = block_max(best, sh);
    const u32 best_key = (u32)(best >> 32);
    const int best_id = (int)~(u32)best;
    STOP_AT(1, best_id)

    if (r.greedy) {
        // combine the per-thread (max, sum) pairs
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            const float om = __shfl_xor_sync(0xffffffffu, lmax, o), os = __shfl_xor_sync(0xffffffffu, lsum, o);
            const float nm = fmaxf(lmax, om);
            lsum = (lmax == nm ? lsum : lsum * __expf(lmax - nm)) + (om == nm ? os : os * __expf(om - nm));
            lmax = nm;
        }
        if ((tid & 31) == 0) { sh.fa[tid >> 5] = lmax; sh.fb[tid >> 5] = lsum; }
        __syncthreads();
        float gm = neg_inf(), gs = 0.f;
        for (int w = 0; w < WARPS; ++w) gm = fmaxf(gm, sh.fa[w]);
        for (int w = 0; w < WARPS; ++w) gs += sh.fa[w] == gm ? sh.fb[w] : sh.fb[w] * __expf(sh.fa[w] - gm);
        const float lse = gm == neg_inf() ? gm : gm + logf(gs);
        if (tid == 0) { out_tokens[b] = best_id; out_logprobs[b] = key_float(best_key) - lse; }
        if (n_out > 0) {
            const int n = min(n_out, V);
            u64 ac = 0, am = 0;          // the region: the bins holding the first n ranks
            const int lo_bin = scan_bins(c.l1_cnt, nullptr, L1_BINS, false, (u64)n, ac, am, sh);
            u64 region = 0;
            for (int i = lo_bin + tid; i < L1_BINS; i += THREADS) region += c.l1_cnt[i];
            u64 e0, e1, t1;
            block_scan2(region, 0ull, e0, e1, region, t1, sh);
            if (region <= (u64)cap) gather(c, (u32)lo_bin << (32 - L1_BITS), KEY_MAX, sh);
            top_n(c, n, lse, 0.f, top_ids, top_lps, n_out, sh);
        }
        return;
    }

    // ---- sampled rows
    const float m = key_float(best_key);
    c.m = m;
    if (!(fabsf(m) <= 3.402823466e38f)) {            // +-inf or NaN: degenerate row
        if (tid == 0) { out_tokens[b] = best_id; out_logprobs[b] = __int_as_float(0x7fc00000); }
        for (int i = tid; i < n_out; i += THREADS) { top_ids[i] = -1; top_lps[i] = neg_inf(); }
        return;
    }
    const u32 zero_key = zero_key_of(m);                 // keys below weigh 0
    const u32 lo_key = sr ? sr->lo_key : (u32)region_lo_bin(c, best_key, tk, tp, V, sh) << (32 - L1_BITS);
    u64 region = sr ? sr->region : 0ull;
    if (!sr) {
        u64 e0, e1, t1;
        for (int i = (int)(lo_key >> (32 - L1_BITS)) + tid; i < L1_BINS; i += THREADS) region += c.l1_cnt[i];
        block_scan2(region, 0ull, e0, e1, region, t1, sh);
    }
    // the region in the candidate buffer: from the split rows' lists, or copied in the second read
    const bool fits = region <= (u64)(sr ? min(cap, SPLIT_CAP) : cap);
    // Weights of every token (key >= zero_key): 12-bit weight histogram, total, count of positive
    // weights (row read 2); the region is copied into the candidate buffer in the same pass if it fits.
    u64 q_all = sr ? sr->q_all : 0ull, n_pos = sr ? sr->n_pos : 0ull;
    const uint2* row_lists = sr ? split_lists + (long long)b * scan_chunks * SPLIT_CAP : nullptr;
    if (sr) {
        if (fits) {                                           // the chunks' lists, in chunk order
            load_split_lists(c, sr, row_lists, scan_chunks);
            c.cand_valid = true; c.cand_bins = false; c.cand_lo = lo_key; c.cand_hi = KEY_MAX; c.cand_n = (int)region;
        }
        __syncthreads();
    } else {
        u64* l1m = c.l1_mass;
        auto weigh = [&](u32 key) {
            const u32 q = weight_of_key(key, m);
            if (q) { atomicAdd(l1m + (key >> (32 - L1_BITS)), (u64)q); q_all += q; ++n_pos; }
        };
        if (fits) {
            u32* ck = c.cand_key; int* ci = c.cand_id;
            ordered_pass(c, zero_key, KEY_MAX, [&](u32 key) { return key >= lo_key; },
                [&](u32 key, int id, bool in_region, u64 rank) {
                    weigh(key);
                    if (in_region) { ck[rank] = key; ci[rank] = id; }
                }, ~0ull, sh);
            c.cand_valid = true; c.cand_bins = false; c.cand_lo = lo_key; c.cand_hi = KEY_MAX; c.cand_n = (int)region;
        } else {
            for_each(c, zero_key, KEY_MAX, [&](u32 key, int) { weigh(key); });
        }
        u64 e0, e1;
        block_scan2(q_all, n_pos, e0, e1, q_all, n_pos, sh);       // (syncs: buffer, l1_mass complete)
    }
    STOP_AT(2, q_all + region)
    const u32 x0 = philox_first_word(seeds[b], (u64)counters[b]);
    if (!fits && sr && sr->gathered && lists_hold(sr, scan_chunks)) {   // the split gather's lists
        if (tid < L1_BINS / 32) sh.wanted[tid] = sr->wanted[tid];
        c.cand_n = load_split_lists(c, sr, row_lists, scan_chunks);
        c.cand_valid = c.cand_bins = true; c.suffix_lo = sr->suffix_lo;
        __syncthreads();
    } else if (!fits && want_draw_bins(c, q_all, n_pos, tk, tp, x0, n_out, sh) <= (u64)cap) {
        gather_bins(c, zero_key, sh);                         // (row read 3)
    }
    STOP_AT(3, c.cand_n + x0)
    // top-k, then top-p, on integer weights
    u64 k = n_pos;
    if (tk > 0 && (u64)tk < k) k = (u64)tk;
    u64 q_kept = q_all, n_kept = k;
    if (k < n_pos) {
        const Sel s = select(c, false, k, true, sh);
        q_kept = s.mass_above + (u64)(s.j + 1) * weight_of_key(s.key, m);
    }
    STOP_AT(4, q_kept)
    if (tp < 1.f) {
        const u64 need = (u64)ceil(__dmul_rn((double)tp, (double)q_kept));
        const Sel s = select(c, true, need, true, sh);
        n_kept = s.cnt_above + s.j + 1;
        q_kept = s.mass_above + (u64)(s.j + 1) * weight_of_key(s.key, m);
    }
    STOP_AT(5, q_kept + n_kept)
    // the draw: t = floor(x0 * q_kept / 2^32) and the first rank whose cumulative weight exceeds t
    const u64 t = __umul64hi((u64)x0 << 32, q_kept);
    const Sel s = select(c, true, t + 1, true, sh);
    STOP_AT(6, s.key + s.j)
    const int token = jth_id(c, s.key, s.j, sh);
    const float ln_z = (float)(log((double)q_kept) - LN2_31);
    if (tid == 0) {
        out_tokens[b] = token;
        out_logprobs[b] = __fsub_rn(__fsub_rn(key_float(s.key), m), ln_z);
    }
    if (n_out > 0) top_n(c, (int)min((u64)n_out, n_kept), m, ln_z, top_ids, top_lps, n_out, sh);
}
