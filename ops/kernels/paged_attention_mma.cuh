// attend() on tensor cores (MMA 1; fp16/bf16 queries, HEAD_DIM 64 or 128, GROUP <= 16, KV blocks of
// a multiple of 16 tokens): each warp takes tiles of 16 tokens; per tile S = Q Kᵀ and O += P V are
// mma.sync m16n8k16 with the GROUP query heads as the 16 rows (padded with zeros), so the per-head
// dot products, shuffles and FMAs of the CUDA-core path become a few MMAs per 16 tokens.
//
// The layouts avoid shared memory.  Q Kᵀ sums over head dims in any order, so lane (g, q) (g = lane
// / 4, q = lane % 4) reads whole 16-byte chunks q, q + 4, ... of token g's K row (coalesced) and
// Q's fragments use the same dim order.  P V's output dims may be permuted too: dim-tile j's column
// g is dim g * D8 + j (D8 = HEAD_DIM / 8), so lane (g, q) reads D8 consecutive elements of each of
// its four V rows (tokens 2q, 2q + 1, 2q + 8, 2q + 9: the rows of P's A fragment that S's
// accumulator layout hands it) and writes its outputs at dims (2q + e) * D8 + j.
#if MMA
static_assert(DTYPE_ID != 0 && (HEAD_DIM == 64 || HEAD_DIM == 128) && GROUP <= 16, "MMA: fp16/bf16, D 64/128, GROUP <= 16");
constexpr int KSTEPS = HEAD_DIM / 16;  // k-steps of Q Kᵀ
constexpr int KCH = HEAD_DIM / 32;     // 8-element K chunks per lane and token
constexpr int D8 = HEAD_DIM / 8;       // dim-tiles of P V; also V elements per lane and token
constexpr int MMA_WARPS = NUM_THREADS / 32;

__device__ __forceinline__ void mma_step(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#if DTYPE_ID == 1
    mma_16816_f16(d, a, b);
#else
    mma_16816_bf16(d, a, b);
#endif
}

// Two floats as one 16-bit pair (lo in the low half), in dtype_t.
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    return (unsigned)from_float(lo) | ((unsigned)from_float(hi) << 16);
}

// `n` 8-element chunks of a pool row at `src` as 16-bit pairs (int8: converted exactly), 4 a chunk.
template <int N>
__device__ __forceinline__ void load_row(const cache_t* src, int stride, unsigned (&out)[N][4]) {
#pragma unroll
    for (int c = 0; c < N; ++c) {
#if KV_INT8
        const uint2 r = *reinterpret_cast<const uint2*>(src + c * stride);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const unsigned w = i < 2 ? r.x : r.y, sh = 16 * (i % 2);
            out[c][i] = pack2((float)(signed char)(w >> sh & 0xffu), (float)(signed char)(w >> (sh + 8) & 0xffu));
        }
#else
        const uint4 r = *reinterpret_cast<const uint4*>(src + c * stride);
        out[c][0] = r.x; out[c][1] = r.y; out[c][2] = r.z; out[c][3] = r.w;
#endif
    }
}

__device__ void attend_mma(const dtype_t* __restrict__ q_ptr, const cache_t* __restrict__ k_cache,
                           const cache_t* __restrict__ v_cache, const int* __restrict__ table, int block_size,
                           int kv_heads, int kvh, int tok_begin, int tok_end, float q_mult,
                           float* s_out, float* s_m, float* s_l) {
    __shared__ float s_wm[MMA_WARPS][16], s_wl[MMA_WARPS][16];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
    for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += NUM_THREADS) s_out[i] = 0.f;

    // Q's A fragments per k-step: rows g, g + 8 (heads; zero past GROUP) x the dims of this lane's
    // K halves 4s .. 4s + 3 (chunk q + 4 (s / 2), elements 4 (s % 2) .. + 3).
    unsigned qa[KSTEPS][4];
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) {
        const int dim = (q + 4 * (s / 2)) * 8 + 4 * (s % 2);
#pragma unroll
        for (int r = 0; r < 4; ++r) {  // r: (row g / g + 8) x (elements 0-1 / 2-3)
            const int row = g + 8 * (r % 2), d = dim + 2 * (r / 2);
            qa[s][r] = row < GROUP ? *reinterpret_cast<const unsigned*>(q_ptr + row * HEAD_DIM + d) : 0u;
        }
    }
    float o[D8][4], m[2] = {NEG_BIG, NEG_BIG}, l[2] = {0.f, 0.f};  // rows g, g + 8; l: this lane's tokens
#pragma unroll
    for (int j = 0; j < D8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

    const long long row_stride = HEAD_DIM;  // the pool is [NB, kv_heads, bs, d]: a head's rows lie together
    for (int t0 = tok_begin + 16 * warp; t0 < tok_end; t0 += 16 * MMA_WARPS) {
        // the tile's 16 tokens lie in one KV block (block_size % 16 == 0, tok_begin block aligned)
        const long long base = (((long long)table[t0 / block_size] * kv_heads + kvh) * block_size + t0 % block_size)
                             * row_stride;
        const int valid = tok_end - t0;  // tokens >= valid are past the context: masked, not read
        unsigned kr[2][KCH][4] = {}, vr[4][D8 / 8][4] = {};
#pragma unroll
        for (int n = 0; n < 2; ++n)
            if (8 * n + g < valid) load_row<KCH>(k_cache + base + (8 * n + g) * row_stride + q * 8, 32, kr[n]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int tok = 2 * q + (i % 2) + 8 * (i / 2);
            if (tok < valid) load_row<D8 / 8>(v_cache + base + tok * row_stride + g * D8, 8, vr[i]);
        }
        // S = Q Kᵀ: sc[n] = rows g, g + 8 x tokens 8n + 2q, 8n + 2q + 1
        float sc[2][4] = {};
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int s = 0; s < KSTEPS; ++s) {
                const unsigned b[2] = {kr[n][s / 2][2 * (s % 2)], kr[n][s / 2][2 * (s % 2) + 1]};
                mma_step(sc[n], qa[s], b);
            }
        // online softmax per row (the four lanes of a group share a row: max over them by shuffles)
        float alpha[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float top = NEG_BIG;
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& x = sc[n][2 * h + e];
                    x = 8 * n + 2 * q + e < valid ? x * q_mult : NEG_BIG;
                    top = fmaxf(top, x);
                }
            top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
            top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
            const float m_new = fmaxf(m[h], top);
            alpha[h] = exp2f(m[h] - m_new);
            m[h] = m_new;
            l[h] *= alpha[h];
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& x = sc[n][2 * h + e];
                    x = exp2f(x - m_new);
                    l[h] += x;
                }
        }
#pragma unroll
        for (int j = 0; j < D8; ++j) {
            o[j][0] *= alpha[0]; o[j][1] *= alpha[0];
            if (GROUP > 8) { o[j][2] *= alpha[1]; o[j][3] *= alpha[1]; }
        }
        // O += P V: P's A fragment is S's accumulators (token k = 2q + e + 8n); V's B fragment of
        // dim-tile j pairs element j of rows (2q, 2q + 1) and of rows (2q + 8, 2q + 9)
        const unsigned pa[4] = {pack2(sc[0][0], sc[0][1]), pack2(sc[0][2], sc[0][3]),
                                pack2(sc[1][0], sc[1][1]), pack2(sc[1][2], sc[1][3])};
#pragma unroll
        for (int j = 0; j < D8; ++j) {
            const int c = j / 8, w = (j % 8) / 2;
            const unsigned sel = j % 2 ? 0x7632u : 0x5410u;  // the high or the low halves of both words
            const unsigned b[2] = {__byte_perm(vr[0][c][w], vr[1][c][w], sel), __byte_perm(vr[2][c][w], vr[3][c][w], sel)};
            mma_step(o[j], pa, b);
        }
    }

    // Merge: the four lanes of a group hold one row's l in parts; then the warps, one at a time.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    if (q == 0) { s_wm[warp][g] = m[0]; s_wl[warp][g] = l[0]; s_wm[warp][g + 8] = m[1]; s_wl[warp][g + 8] = l[1]; }
    __syncthreads();
    float factor[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = g + 8 * h;
        float mx = NEG_BIG, sum = 0.f;
        for (int w = 0; w < MMA_WARPS; ++w) mx = fmaxf(mx, s_wm[w][row]);
        for (int w = 0; w < MMA_WARPS; ++w) sum += s_wl[w][row] * exp2f(s_wm[w][row] - mx);
        factor[h] = exp2f(m[h] - mx);
        if (warp == 0 && q == 0 && row < GROUP) { s_m[row] = mx; s_l[row] = sum; }
    }
    for (int w = 0; w < MMA_WARPS; ++w) {
        if (warp == w)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = g + 8 * h;
                if (row < GROUP)
#pragma unroll
                    for (int j = 0; j < D8; ++j)
#pragma unroll
                        for (int e = 0; e < 2; ++e) s_out[row * HEAD_DIM + (2 * q + e) * D8 + j] += o[j][2 * h + e] * factor[h];
            }
        __syncthreads();
    }
}
#endif
