// Compile-time: DTYPE_ID (query/output/pool type), KV_INT8, HEAD_DIM (power of two 32..256),
// GROUP (query heads per KV head); tuning: NUM_THREADS (per CTA), UNROLL (tokens per thread group
// and loop iteration), TILE_SOFTMAX (1: one online-softmax update per UNROLL tokens instead of one
// per token: fewer exp2f and accumulator rescales, the work that grows with GROUP), RESCALE_SLACK
// (> 0: the running max moves, and the accumulators are rescaled, only when a score exceeds it by
// more than this many log2 units; weights stay <= 2^RESCALE_SLACK, so fp32 sums cannot overflow).
#if KV_INT8
typedef signed char cache_t;
typedef uint2 load_t;  // 8 int8 per load: 8 row elements per chunk as for fp16, so the same registers
#else
typedef dtype_t cache_t;
typedef uint4 load_t;  // 16-byte loads
#endif
#ifndef NUM_THREADS
#define NUM_THREADS 128
#endif
#ifndef UNROLL
#define UNROLL 2
#endif
#ifndef TILE_SOFTMAX
#define TILE_SOFTMAX 1
#endif
#ifndef RESCALE_SLACK
#define RESCALE_SLACK 0
#endif
constexpr int VEC = sizeof(load_t) / sizeof(cache_t); // pool elements per load
constexpr int CHUNKS = HEAD_DIM / VEC;              // load-sized chunks in one K/V row
constexpr int TPT = CHUNKS < 32 ? CHUNKS : 32;      // threads sharing one token ("thread group")
constexpr int NV = CHUNKS / TPT;                    // chunks per thread
constexpr int ELEMS = NV * VEC;                     // row elements per thread
constexpr int NG = NUM_THREADS / TPT;               // thread groups (tokens in flight) per CTA
constexpr int NUM_WARPS = NUM_THREADS / 32;
constexpr float NEG_BIG = -1e30f;                   // "no token yet": finite so exp2(m - m) stays 1, not NaN
static_assert(CHUNKS * VEC == HEAD_DIM && (TPT & (TPT - 1)) == 0 && CHUNKS % TPT == 0, "HEAD_DIM");

// One raw load -> floats, per storage type (fp16/bf16 share u16; DTYPE_ID picks the conversion).
template <typename T> struct Unpack;
template <> struct Unpack<float> { static constexpr int N = 4;
    __device__ static void run(uint4 r, float* o) { o[0] = __uint_as_float(r.x); o[1] = __uint_as_float(r.y);
                                                    o[2] = __uint_as_float(r.z); o[3] = __uint_as_float(r.w); } };
template <> struct Unpack<u16> { static constexpr int N = 8;
    __device__ static void run(uint4 r, float* o) { const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            o[2 * i] = to_float((u16)(w[i] & 0xffffu));
            o[2 * i + 1] = to_float((u16)(w[i] >> 16));
        }
    } };
template <> struct Unpack<signed char> { static constexpr int N = 8;
    __device__ static void run(uint2 r, float* o) {
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = (float)(signed char)(((i < 4 ? r.x : r.y) >> (8 * (i % 4))) & 0xffu); } };

// Element d of a row handled by this thread: chunk j*TPT+lane, element i of the chunk, so each load
// instruction of a thread group reads one contiguous span of the row (coalesced).
__device__ __forceinline__ int elem_index(int j, int lane, int i) { return (j * TPT + lane) * VEC + i; }

// One token's GROUP scores (its K row in this thread's loads `kr`), summed over the thread group.
__device__ __forceinline__ void token_scores(const load_t (&kr)[NV], unsigned gmask, const float (&q)[GROUP][ELEMS],
                                             float (&s)[GROUP]) {
#pragma unroll
    for (int g = 0; g < GROUP; ++g) s[g] = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
        float kf[VEC];
        Unpack<cache_t>::run(kr[j], kf);
#pragma unroll
        for (int g = 0; g < GROUP; ++g)
#pragma unroll
            for (int i = 0; i < VEC; ++i) s[g] += q[g][j * VEC + i] * kf[i];
    }
#pragma unroll
    for (int g = 0; g < GROUP; ++g)
#pragma unroll
        for (int off = TPT / 2; off > 0; off /= 2) s[g] += __shfl_xor_sync(gmask, s[g], off);
}

// acc[g] += p[g] * (this thread's elements of one token's V row, loaded in `vr`).
__device__ __forceinline__ void add_values(const load_t (&vr)[NV], const float (&p)[GROUP],
                                           float (&acc)[GROUP][ELEMS]) {
#pragma unroll
    for (int j = 0; j < NV; ++j) {
        float vf[VEC];
        Unpack<cache_t>::run(vr[j], vf);
#pragma unroll
        for (int g = 0; g < GROUP; ++g)
#pragma unroll
            for (int i = 0; i < VEC; ++i) acc[g][j * VEC + i] += p[g] * vf[i];
    }
}

// The running max of one head given the largest new score `top`: with RESCALE_SLACK it stays put
// unless `top` exceeds it by more than the slack (the common case after the first tokens: no
// exp2f, no rescale); otherwise it becomes `top` and l/acc are rescaled.  (Scores are equal on all
// lanes of a thread group, so the branch is uniform there.)
__device__ __forceinline__ void move_max(float top, float& m, float& l, float (&acc)[ELEMS]) {
    if (RESCALE_SLACK > 0 && !(top > m + (float)RESCALE_SLACK)) return;
    const float m_new = fmaxf(m, top), alpha = exp2f(m - m_new);
    l *= alpha;
    m = m_new;
#pragma unroll
    for (int e = 0; e < ELEMS; ++e) acc[e] *= alpha;
}

// The `cnt` (<= UNROLL) loaded tokens: by default one online-softmax step per token; with
// TILE_SOFTMAX their scores first, then one step for all of them (one max, one rescale of the
// accumulators), then their values.
__device__ __forceinline__ void update(const load_t (&kr)[UNROLL][NV], const load_t (&vr)[UNROLL][NV], int cnt,
                                       unsigned gmask, const float (&q)[GROUP][ELEMS], float (&m)[GROUP],
                                       float (&l)[GROUP], float (&acc)[GROUP][ELEMS]) {
#if TILE_SOFTMAX
    float s[UNROLL][GROUP];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        if (u < cnt) token_scores(kr[u], gmask, q, s[u]);   // (cnt is uniform over the thread group)
        else
#pragma unroll
            for (int g = 0; g < GROUP; ++g) s[u][g] = NEG_BIG;   // no token: weight exp2f(NEG_BIG - m) = 0
    }
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        float top = s[0][g];
#pragma unroll
        for (int u = 1; u < UNROLL; ++u) top = fmaxf(top, s[u][g]);
        move_max(top, m[g], l[g], acc[g]);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) { s[u][g] = exp2f(s[u][g] - m[g]); l[g] += s[u][g]; }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
        if (u < cnt) add_values(vr[u], s[u], acc);
#else
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        if (u >= cnt) break;
        float s[GROUP];
        token_scores(kr[u], gmask, q, s);
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            move_max(s[g], m[g], l[g], acc[g]);
            s[g] = exp2f(s[g] - m[g]);  // reuse: the token's weight
            l[g] += s[g];
        }
        add_values(vr[u], s, acc);
    }
#endif
}

// Attention of the GROUP query heads of KV head `kvh` over tokens [tok_begin, tok_end) (tok_begin is
// block aligned).  Leaves in shared memory the combined running max s_m (log2 domain), the sum
// s_l and the unnormalised output s_out[GROUP][HEAD_DIM].  Every thread group keeps its own online
// softmax over its tokens (no block-wide sync in the loop); they are merged once at the end.
__device__ void attend(const dtype_t* __restrict__ q_ptr, const cache_t* __restrict__ k_cache,
                       const cache_t* __restrict__ v_cache, const int* __restrict__ table, int block_size,
                       int kv_heads, int kvh, int tok_begin, int tok_end, float q_mult,
                       float* s_out, float* s_m, float* s_l) {
    __shared__ float s_wm[NUM_WARPS][GROUP], s_wl[NUM_WARPS][GROUP];
    const int lane = threadIdx.x % TPT, tg = threadIdx.x / TPT, warp = threadIdx.x / 32;
    const unsigned gmask = TPT == 32 ? 0xffffffffu : ((1u << (TPT % 32)) - 1u) << (threadIdx.x % 32 / TPT * TPT);
    for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += NUM_THREADS) s_out[i] = 0.f;

    // The query, pre-multiplied by scale * log2(e) (* k_scale for int8), lives in registers.
    float q[GROUP][ELEMS];
#pragma unroll
    for (int g = 0; g < GROUP; ++g)
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            const uint4* src = reinterpret_cast<const uint4*>(q_ptr + g * HEAD_DIM + elem_index(j, lane, 0));
#pragma unroll
            for (int w = 0; w < VEC / Unpack<dtype_t>::N; ++w) {
                Unpack<dtype_t>::run(src[w], &q[g][j * VEC + w * Unpack<dtype_t>::N]);
            }
#pragma unroll
            for (int i = 0; i < VEC; ++i) q[g][j * VEC + i] *= q_mult;
        }
    float m[GROUP], l[GROUP], acc[GROUP][ELEMS];
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        m[g] = NEG_BIG; l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < ELEMS; ++e) acc[g][e] = 0.f;
    }

    const long long row_stride = HEAD_DIM;  // between tokens of a block: the pool is [NB, kv_heads, bs, d]
    for (int blk = tok_begin / block_size; blk * block_size < tok_end; ++blk) {
        const long long base = ((long long)table[blk] * kv_heads + kvh) * block_size * HEAD_DIM;
        const int n = min(block_size, tok_end - blk * block_size);
        // UNROLL tokens per iteration: all their K/V loads are issued before any math, so each
        // thread keeps 2 * UNROLL * NV independent loads in flight (decode attention is latency bound
        // on those loads, not on arithmetic).
        for (int o = tg; o < n; o += UNROLL * NG) {
            load_t kr[UNROLL][NV], vr[UNROLL][NV];
            const int cnt = min(UNROLL, (n - o + NG - 1) / NG);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (u < cnt) {
                    const long long row = base + (o + u * NG) * row_stride;
#pragma unroll
                    for (int j = 0; j < NV; ++j) {
                        kr[u][j] = *reinterpret_cast<const load_t*>(k_cache + row + elem_index(j, lane, 0));
                        vr[u][j] = *reinterpret_cast<const load_t*>(v_cache + row + elem_index(j, lane, 0));
                    }
                }
            update(kr, vr, cnt, gmask, q, m, l, acc);
        }
    }

    // Merge the thread groups of a warp: lanes with equal `lane` hold the same row elements.
#pragma unroll
    for (int off = TPT; off < 32; off *= 2)
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            const float m_o = __shfl_xor_sync(0xffffffffu, m[g], off), l_o = __shfl_xor_sync(0xffffffffu, l[g], off);
            const float m_new = fmaxf(m[g], m_o), a = exp2f(m[g] - m_new), b = exp2f(m_o - m_new);
            l[g] = l[g] * a + l_o * b;
            m[g] = m_new;
#pragma unroll
            for (int e = 0; e < ELEMS; ++e) {
                acc[g][e] = acc[g][e] * a + __shfl_xor_sync(0xffffffffu, acc[g][e], off) * b;
            }
        }
    // Merge the warps through shared memory, one warp at a time (deterministic summation order).
    if (threadIdx.x % 32 == 0)
#pragma unroll
        for (int g = 0; g < GROUP; ++g) { s_wm[warp][g] = m[g]; s_wl[warp][g] = l[g]; }
    __syncthreads();
    float factor[GROUP];
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        float mx = NEG_BIG, sum = 0.f;
        for (int w = 0; w < NUM_WARPS; ++w) mx = fmaxf(mx, s_wm[w][g]);
        for (int w = 0; w < NUM_WARPS; ++w) sum += s_wl[w][g] * exp2f(s_wm[w][g] - mx);
        factor[g] = exp2f(m[g] - mx);
        if (threadIdx.x == 0) { s_m[g] = mx; s_l[g] = sum; }
    }
    for (int w = 0; w < NUM_WARPS; ++w) {
        if (warp == w && threadIdx.x % 32 < TPT)
#pragma unroll
            for (int g = 0; g < GROUP; ++g)
#pragma unroll
                for (int j = 0; j < NV; ++j)
#pragma unroll
                    for (int i = 0; i < VEC; ++i) {
                        s_out[g * HEAD_DIM + elem_index(j, lane, i)] += acc[g][j * VEC + i] * factor[g];
                    }
        __syncthreads();
    }
}
