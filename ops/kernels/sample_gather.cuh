// ============================================================================ the split gather
// A split sampled row whose region is larger than the lists (flat logits; temperature alone) needs
// the bins its searches will enter gathered from the row: one read, which one 1024-thread block made
// the largest piece of a sampled call (164-180 us of ~400 on an H200, RESULTS.md "Session 13").
// Two more launches split that read too, after SPLIT_PASS_KERNEL:
//   sample_split_want    per row: the bins the searches will enter (want_draw_bins, the main
//                        kernel's own bounds) from the loaded histograms; when their tokens fit a
//                        list, the bitmap and its suffix bin into the SplitRow, `gathered` set
//   SPLIT_PASS_KERNEL    again, with `gather` 1: per (row, chunk), the chunk's tokens of those bins,
//                        in id order, into its list (split_gather_chunk)
// and the main kernel loads the lists as the candidate buffer the one-block gather (gather_bins)
// would have built: the same tokens in the same order, so every later step is unchanged.
// The wanted tokens need only fit the main kernel's buffer (~19k on an H200), not one chunk's list:
// spread over ~9 chunks they rarely fill one.  A chunk whose list overflowed (chunk_n > SPLIT_CAP)
// sends the main kernel to gather_bins (lists_hold).  With the bound at one list, top_p rows (whose
// wanted bins hold 4-19k tokens) were split-gathered for nothing and gathered again by the main
// kernel: 420 -> 530 us on an H200 (session 19).

// The region did not fit.  Flag in sh.wanted, from the 12-bit histograms (c.l1_cnt, c.l1_mass), the
// bins that the searches will enter (top_k's bin, top_p's boundary for any possible top-k weight,
// the draw for any possible kept weight, the top-n ranks); sh.wanted starts zero.  Returns the
// tokens in those bins.  Only an optimisation: a search outside them gathers or re-reads on its own.
__device__ __noinline__ u64 want_draw_bins(Ctx& c, u64 q_all, u64 n_pos, int tk, float tp, u32 x0, int n_out,
                                           Shm& sh) {
    u64 k_lo = q_all, k_hi = q_all, ac, am;                  // bounds of the top-k weight
    const u64 kk = tk > 0 && (u64)tk < n_pos ? (u64)tk : n_pos;
    if (kk < n_pos) {
        ac = am = 0;
        const int bk = scan_bins(c.l1_cnt, c.l1_mass, L1_BINS, false, kk, ac, am, sh);
        want_bins(bk, bk, sh);
        k_lo = am; k_hi = am + c.l1_mass[bk];
    }
    u64 q_lo = k_lo, q_hi = k_hi;                            // bounds of the kept weight
    if (tp < 1.f) {
        const u64 need_lo = (u64)ceil(__dmul_rn((double)tp, (double)k_lo));
        const u64 need_hi = (u64)ceil(__dmul_rn((double)tp, (double)k_hi));
        ac = am = 0;
        const int hi_bin = scan_bins(c.l1_cnt, c.l1_mass, L1_BINS, true, max(need_lo, 1ull), ac, am, sh);
        ac = am = 0;
        const int lo_bin_p = scan_bins(c.l1_cnt, c.l1_mass, L1_BINS, true, need_hi, ac, am, sh);
        want_bins(lo_bin_p, hi_bin, sh);
        q_lo = need_lo;
        q_hi = min(k_hi, am + c.l1_mass[lo_bin_p]);
    }
    ac = am = 0;
    const int d_hi = scan_bins(c.l1_cnt, c.l1_mass, L1_BINS, true, __umul64hi((u64)x0 << 32, q_lo) + 1, ac, am, sh);
    ac = am = 0;
    const int d_lo = scan_bins(c.l1_cnt, c.l1_mass, L1_BINS, true, __umul64hi((u64)x0 << 32, q_hi) + 1, ac, am, sh);
    want_bins(d_lo, d_hi, sh);
    if (n_out > 0) {
        ac = am = 0;
        want_bins(scan_bins(c.l1_cnt, nullptr, L1_BINS, false, min((u64)n_out, n_pos), ac, am, sh), L1_BINS - 1, sh);
    }
    __syncthreads();
    u64 wanted_n = 0, e0, e1, t1;
    for (int i = threadIdx.x; i < L1_BINS; i += THREADS) wanted_n += is_wanted(sh.wanted, i) ? c.l1_cnt[i] : 0u;
    block_scan2(wanted_n, 0ull, e0, e1, wanted_n, t1, sh);
    return wanted_n;
}

// Did every chunk's list take all of its wanted tokens?  (Same answer in every thread.)
__device__ __forceinline__ bool lists_hold(const SplitRow* sr, int chunks) {
    bool ok = true;
    for (int ch = 0; ch < chunks; ++ch) ok &= sr->chunk_n[ch] <= (u32)SPLIT_CAP;
    return ok;
}

// The split lists concatenated in chunk order into the candidate buffer; returns the tokens.
__device__ __noinline__ int load_split_lists(Ctx& c, const SplitRow* sr, const uint2* lists, int chunks) {
    int at = 0;
    for (int ch = 0; ch < chunks; ++ch) {
        const int n = (int)sr->chunk_n[ch];
        const uint2* list = lists + (long long)ch * SPLIT_CAP;
        for (int i = threadIdx.x; i < n; i += THREADS) { c.cand_key[at + i] = list[i].x; c.cand_id[at + i] = (int)list[i].y; }
        at += n;
    }
    return at;
}

// grid (B), THREADS threads, dynamic shared memory L1_BINS x 12 bytes; cap: the main kernel's buffer
extern "C" __global__ void __launch_bounds__(THREADS) sample_split_want(
    const float* __restrict__ temperature, const float* __restrict__ top_p, const int* __restrict__ top_k,
    const float* __restrict__ rep_penalty, const float* __restrict__ freq_penalty,
    const float* __restrict__ pres_penalty, const int* __restrict__ min_tokens,
    const int* __restrict__ num_generated, int E, int G,
    const unsigned long long* __restrict__ seeds, const long long* __restrict__ counters, int num_logprobs,
    int cap, SplitRow* __restrict__ split)
{
    const int b = blockIdx.x, tid = threadIdx.x;
    if (!split_row(b, temperature, top_p, top_k, rep_penalty, freq_penalty, pres_penalty, min_tokens, num_generated,
                   E, G) || split[b].degenerate)
        return;
    SplitRow* s = split + b;
    if (s->region <= (u64)min(cap, SPLIT_CAP)) return;           // the lists hold the region
    __shared__ Shm sh;
    extern __shared__ __align__(16) unsigned char smem[];
    Ctx c;
    c.l1_mass = reinterpret_cast<u64*>(smem);                    // 4096 x 8
    c.l1_cnt = reinterpret_cast<u32*>(c.l1_mass + L1_BINS);      // 4096 x 4
    c.m = key_float((u32)(s->best >> 32));
    for (int i = tid; i < L1_BINS; i += THREADS) { c.l1_cnt[i] = s->cnt[i]; c.l1_mass[i] = s->mass[i]; }
    if (tid < L1_BINS / 32) sh.wanted[tid] = 0u;
    __syncthreads();
    const u32 x0 = philox_first_word(seeds[b], (u64)counters[b]);
    if (want_draw_bins(c, s->q_all, s->n_pos, top_k[b], top_p[b], x0, num_logprobs, sh) > (u64)cap) return;
    const int suffix = wanted_suffix(c, sh);
    if (tid < L1_BINS / 32) s->wanted[tid] = sh.wanted[tid];
    if (tid == 0) { s->suffix_lo = suffix; s->gathered = 1u; }
}
