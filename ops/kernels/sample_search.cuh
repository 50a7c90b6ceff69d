// ---------------------------------------------------------------------------- passes
__device__ __forceinline__ bool is_wanted(const u32* wanted, u32 bin) { return (wanted[bin >> 5] >> (bin & 31)) & 1u; }

// Does the candidate buffer hold every token with key in [lo, hi]?
__device__ __forceinline__ bool covers(const Ctx& c, u32 lo, u32 hi) {
    if (!c.cand_valid) return false;
    if (!c.cand_bins) return c.cand_lo <= lo && hi <= c.cand_hi;
    const u32 bl = lo >> (32 - L1_BITS), bh = hi >> (32 - L1_BITS);
    if (bl == bh) return is_wanted(c.wanted, bl) || c.l1_cnt[bl] == 0u;
    return hi == KEY_MAX && (int)bl >= c.suffix_lo;
}

// Keys and ids of elements [i0, i0 + VEC) of the source (candidate buffer or row).
__device__ __forceinline__ int load_src(const Ctx& c, bool on_chip, int i0, u32 key[VEC], int id[VEC]) {
    if (on_chip) {
        const int valid = min(VEC, c.cand_n - i0);
#pragma unroll
        for (int v = 0; v < VEC; ++v)
            if (v < valid) { key[v] = c.cand_key[i0 + v]; id[v] = c.cand_id[i0 + v]; }
        return valid;
    }
#pragma unroll
    for (int v = 0; v < VEC; ++v) id[v] = i0 + v;
    return load_row_keys(c.r, i0, key);
}

// fn(key, id) for every token with key in [lo, hi], in no particular order.
template <class F>
__device__ void for_each(const Ctx& c, u32 lo, u32 hi, F fn) {
    const bool on_chip = covers(c, lo, hi);
    const int n = on_chip ? c.cand_n : c.r.V;
    int start = 0;
    if (!on_chip) {  // the row: UNROLL tiles' loads in flight per thread, then their keys
        for (; start + UNROLL * TILE <= n; start += UNROLL * TILE) {
            dtype_t raw[UNROLL][VEC];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) load_raw(c.r, start + u * TILE + threadIdx.x * VEC, raw[u]);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int i0 = start + u * TILE + threadIdx.x * VEC;
                u32 key[VEC];
                const int valid = raw_keys(c.r, i0, raw[u], key);
#pragma unroll
                for (int v = 0; v < VEC; ++v)
                    if (v < valid && key[v] >= lo && key[v] <= hi) fn(key[v], i0 + v);
            }
        }
    }
    for (int base = start; base < n; base += TILE) {
        u32 key[VEC]; int id[VEC];
        const int valid = load_src(c, on_chip, base + threadIdx.x * VEC, key, id);
#pragma unroll
        for (int v = 0; v < VEC; ++v)
            if (v < valid && key[v] >= lo && key[v] <= hi) fn(key[v], id[v]);
    }
}

// Every token with key in [lo, hi] in id order: visit(key, id, flagged, rank), where rank counts
// the flagged tokens before this one.  Stops after the tile where the flagged count passes
// stop_after.  Returns the number of flagged tokens seen.
template <class Flag, class Visit>
__device__ u64 ordered_pass(const Ctx& c, u32 lo, u32 hi, Flag flag, Visit visit, u64 stop_after, Shm& sh) {
    const bool on_chip = covers(c, lo, hi);
    const int n = on_chip ? c.cand_n : c.r.V;
    u64 done = 0;
    for (int base = 0; base < n; base += TILE) {
        u32 key[VEC]; int id[VEC]; bool in[VEC], fl[VEC];
        const int valid = load_src(c, on_chip, base + threadIdx.x * VEC, key, id);
        u64 cnt = 0;
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            in[v] = v < valid && key[v] >= lo && key[v] <= hi;
            fl[v] = in[v] && flag(key[v]);
            cnt += fl[v];
        }
        u64 excl, unused, total, unused_t;
        block_scan2(cnt, 0ull, excl, unused, total, unused_t, sh);
        u64 rank = done + excl;
#pragma unroll
        for (int v = 0; v < VEC; ++v)
            if (in[v]) { visit(key[v], id[v], fl[v], rank); rank += fl[v]; }
        done += total;
        if (done > stop_after) break;
    }
    return done;
}

// Copy every token with key in [lo, hi] (read from the row) into the candidate buffer, id order.
__device__ __noinline__ void gather(Ctx& c, u32 lo, u32 hi, Shm& sh) {
    c.cand_valid = false;
    u32* ck = c.cand_key; int* ci = c.cand_id; const u64 cap = (u64)c.cap;
    const u64 n = ordered_pass(c, lo, hi, [](u32) { return true; },
        [&](u32 key, int id, bool, u64 rank) { if (rank < cap) { ck[rank] = key; ci[rank] = id; } }, ~0ull, sh);
    __syncthreads();
    c.cand_valid = n <= cap; c.cand_bins = false; c.cand_lo = lo; c.cand_hi = hi; c.cand_n = (int)min(n, cap);
}

// 1 + the highest nonempty 12-bit bin not flagged in sh.wanted: every nonempty bin from there up is
// gathered (covers() answers suffix queries with it).
__device__ __noinline__ int wanted_suffix(const Ctx& c, Shm& sh) {
    u64 bad = 0;
    for (int i = threadIdx.x; i < L1_BINS; i += THREADS)
        if (c.l1_cnt[i] && !is_wanted(sh.wanted, i)) bad = max(bad, (u64)i + 1);
    return (int)block_max(bad, sh);
}

// Copy every token of the bins flagged in sh.wanted (read from the row) into the buffer, id order.
__device__ __noinline__ void gather_bins(Ctx& c, u32 lo, Shm& sh) {
    const int bad = wanted_suffix(c, sh);
    c.cand_valid = false;
    u32* ck = c.cand_key; int* ci = c.cand_id; const u64 cap = (u64)c.cap; const u32* wanted = sh.wanted;
    const u64 n = ordered_pass(c, lo, KEY_MAX, [&](u32 key) { return is_wanted(wanted, key >> (32 - L1_BITS)); },
        [&](u32 key, int id, bool flagged, u64 rank) { if (flagged && rank < cap) { ck[rank] = key; ci[rank] = id; } },
        ~0ull, sh);
    __syncthreads();
    c.cand_valid = n <= cap; c.cand_bins = true; c.suffix_lo = bad; c.cand_n = (int)min(n, cap);
}

// Flag bins [lo, hi] in sh.wanted (callers sync before use).
__device__ __forceinline__ void want_bins(int lo, int hi, Shm& sh) {
    for (int i = lo + (int)threadIdx.x; i <= hi; i += THREADS) atomicOr(&sh.wanted[i >> 5], 1u << (i & 31));
}

// Top-down (largest digit first) search of an nb-bin histogram for the bin where the running
// total (counts, or weights when by_mass) first reaches `target`, starting from the totals
// above_cnt / above_mass of everything ranked before the histogram; those are advanced to the
// chosen bin.  `mass` may be null (weights not tracked).  Same answer in every thread.
__device__ __noinline__ int scan_bins(const u32* cnt, const u64* mass, int nb, bool by_mass, u64 target,
                         u64& above_cnt, u64& above_mass, Shm& sh) {
    const int per = nb / THREADS, top = nb - 1 - threadIdx.x * per;   // my bins: top, top-1, ...
    u64 c = 0, w = 0;
    for (int k = 0; k < per; ++k) { c += cnt[top - k]; w += mass ? mass[top - k] : 0ull; }
    if (threadIdx.x == 0) { sh.res_bin = 0; sh.res_cnt = above_cnt; sh.res_mass = above_mass; }
    u64 ec, ew, tc, tw;
    block_scan2(c, w, ec, ew, tc, tw, sh);
    u64 rc = above_cnt + ec, rw = above_mass + ew;
    for (int k = 0; k < per; ++k) {
        const u64 bc = cnt[top - k], bw = mass ? mass[top - k] : 0ull;
        const u64 before = by_mass ? rw : rc, after = before + (by_mass ? bw : bc);
        if (before < target && target <= after) { sh.res_bin = top - k; sh.res_cnt = rc; sh.res_mass = rw; }
        rc += bc; rw += bw;
    }
    __syncthreads();
    above_cnt = sh.res_cnt; above_mass = sh.res_mass;
    const int bin = sh.res_bin;
    __syncthreads();                                   // read by all before the next search reuses sh.res_*
    return bin;
}

struct Sel { u32 key; u32 j; u64 cnt_above; u64 mass_above; };

// A position in the ranking of the region (key descending, id ascending):
//   by_mass = false: the token of rank target - 1;
//   by_mass = true:  the first token whose inclusive cumulative weight reaches target.
// Result: its key, j = its index (id order) among the tokens with that key, and the count and
// weight of all tokens with a larger key (with_mass: weights tracked; required for by_mass).
__device__ __noinline__ Sel select(Ctx& c, bool by_mass, u64 target, bool with_mass, Shm& sh) {
    u64 ac = 0, am = 0;
    u32 prefix = (u32)scan_bins(c.l1_cnt, with_mass ? c.l1_mass : nullptr, L1_BINS, by_mass, target, ac, am, sh);
    int bits = L1_BITS;
    u32 n_in = c.l1_cnt[prefix];
    for (int level = 0; level < 2; ++level) {
        const u32 lo = prefix << (32 - bits), hi = lo | (KEY_MAX >> bits);
        if (!covers(c, lo, hi) && n_in <= (u32)c.cap) gather(c, lo, hi, sh);
        const int shift = 32 - bits - LV_BITS;
        __syncthreads();                               // everyone has read n_in / the last scan
        for (int i = threadIdx.x; i < LV_BINS; i += THREADS) { c.lv_cnt[i] = 0u; c.lv_mass[i] = 0ull; }
        __syncthreads();
        u32* lc = c.lv_cnt; u64* lm = c.lv_mass; const float m = c.m;
        for_each(c, lo, hi, [&](u32 key, int) {
            const u32 d = (key >> shift) & (LV_BINS - 1);
            atomicAdd(lc + d, 1u);
            if (with_mass) { const u32 q = weight_of_key(key, m); if (q) atomicAdd(lm + d, (u64)q); }
        });
        __syncthreads();
        const u32 b = (u32)scan_bins(c.lv_cnt, with_mass ? c.lv_mass : nullptr, LV_BINS, by_mass, target, ac, am, sh);
        prefix = (prefix << LV_BITS) | b;
        bits += LV_BITS;
        n_in = c.lv_cnt[b];
    }
    Sel s;
    s.key = prefix; s.cnt_above = ac; s.mass_above = am;
    if (by_mass) {
        const u64 q = weight_of_key(prefix, c.m);     // > 0: the crossing bin has weight
        s.j = (u32)((target - am + q - 1) / q - 1);
    } else {
        s.j = (u32)(target - ac - 1);
    }
    return s;
}

// Id of the j-th (id order) token whose key is `key`.
__device__ __noinline__ int jth_id(Ctx& c, u32 key, u32 j, Shm& sh) {
    if (threadIdx.x == 0) sh.found = -1;
    int* found = &sh.found;
    ordered_pass(c, key, key, [](u32) { return true; },
        [&](u32, int id, bool, u64 rank) { if (rank == j) *found = id; }, (u64)j, sh);
    __syncthreads();
    return sh.found;
}

// The first n ranks (n <= MAX_TOP_N) sorted best first into out_ids / out_lp[0, n), logprob
// = (key_float(key) - base) - ln_z; the rest of [0, n_out) gets -1 / -inf.
__device__ __noinline__ void top_n(Ctx& c, int n, float base, float ln_z, int* out_ids, float* out_lp, int n_out, Shm& sh) {
    if (n > 0) {
        const Sel s = select(c, false, (u64)n, false, sh);
        if (threadIdx.x == 0) sh.n_top = 0;
        __syncthreads();
        int* n_top = &sh.n_top; u32* tk = sh.top_key; int* ti = sh.top_id;
        ordered_pass(c, s.key, KEY_MAX, [&](u32 key) { return key == s.key; },
            [&](u32 key, int id, bool tie, u64 rank) {
                if (!tie || rank <= s.j) {
                    const int slot = atomicAdd(n_top, 1);
                    if (slot < MAX_TOP_N) { tk[slot] = key; ti[slot] = id; }
                }
            }, ~0ull, sh);
        __syncthreads();
    }
    if ((int)threadIdx.x < n) {           // rank of my entry among the n collected
        const u32 k = sh.top_key[threadIdx.x]; const int id = sh.top_id[threadIdx.x];
        int pos = 0;
        for (int o = 0; o < n; ++o)
            pos += sh.top_key[o] > k || (sh.top_key[o] == k && sh.top_id[o] < id);
        out_ids[pos] = id;
        out_lp[pos] = __fsub_rn(__fsub_rn(key_float(k), base), ln_z);
    }
    for (int i = n + threadIdx.x; i < n_out; i += THREADS) { out_ids[i] = -1; out_lp[i] = neg_inf(); }
}
