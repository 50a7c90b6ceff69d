// The kernels (after paged_attention.cu's configuration and `attend`, and the tensor-core
// `attend_mma` of paged_attention_mma.cuh): MMA 1 picks the latter for fp16/bf16 pools.
#if MMA
#define ATTEND attend_mma
#else
#define ATTEND attend
#endif

// grid (kv_heads, B): one CTA per (sequence, KV head) covering all its GROUP query heads, so each K/V
// row is read from memory once for the whole group.
extern "C" __global__ void __launch_bounds__(NUM_THREADS) paged_attention(
    dtype_t* __restrict__ out, const dtype_t* __restrict__ query, const cache_t* __restrict__ k_cache,
    const cache_t* __restrict__ v_cache, const float* __restrict__ k_scale, const float* __restrict__ v_scale,
    const int* __restrict__ block_tables, const int* __restrict__ context_lens, int max_blocks, int block_size,
    float q_mult) {
    __shared__ float s_out[GROUP * HEAD_DIM], s_m[GROUP], s_l[GROUP];
    const int kvh = blockIdx.x, kv_heads = gridDim.x, b = blockIdx.y;
    const long long head0 = ((long long)b * kv_heads + kvh) * GROUP;  // first query head of the group
    const float ks = KV_INT8 ? k_scale[kvh] : 1.f, vs = KV_INT8 ? v_scale[kvh] : 1.f;
    ATTEND(query + head0 * HEAD_DIM, k_cache, v_cache, block_tables + (long long)b * max_blocks, block_size,
           kv_heads, kvh, 0, context_lens[b], q_mult * ks, s_out, s_m, s_l);
    for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += NUM_THREADS) {
        const float sum = s_l[i / HEAD_DIM];
        out[head0 * HEAD_DIM + i] = from_float(sum > 0.f ? s_out[i] * (vs / sum) : 0.f);
    }
}

// grid (kv_heads, B, max_parts): partition p covers tokens [p, p+1) * part_blocks * block_size and
// stores its unnormalised (max, sum, out) in the workspace; paged_attention_reduce combines them.
extern "C" __global__ void __launch_bounds__(NUM_THREADS) paged_attention_split(
    float* __restrict__ ws_ml, float* __restrict__ ws_out, const dtype_t* __restrict__ query,
    const cache_t* __restrict__ k_cache, const cache_t* __restrict__ v_cache, const float* __restrict__ k_scale,
    const int* __restrict__ block_tables, const int* __restrict__ context_lens, int max_blocks, int block_size,
    float q_mult, int part_blocks, int max_parts) {
    __shared__ float s_out[GROUP * HEAD_DIM], s_m[GROUP], s_l[GROUP];
    const int kvh = blockIdx.x, kv_heads = gridDim.x, b = blockIdx.y, p = blockIdx.z;
    const int len = context_lens[b], begin = p * part_blocks * block_size;
    if (begin >= len) return;  // whole CTA: the reduce only reads partitions that hold tokens
    const long long head0 = ((long long)b * kv_heads + kvh) * GROUP;
    ATTEND(query + head0 * HEAD_DIM, k_cache, v_cache, block_tables + (long long)b * max_blocks, block_size,
           kv_heads, kvh, begin, min(len, begin + part_blocks * block_size), q_mult * (KV_INT8 ? k_scale[kvh] : 1.f),
           s_out, s_m, s_l);
    for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += NUM_THREADS) {
        const long long slot = (head0 + i / HEAD_DIM) * max_parts + p;
        ws_out[slot * HEAD_DIM + i % HEAD_DIM] = s_out[i];
        if (i % HEAD_DIM == 0) { ws_ml[2 * slot] = s_m[i / HEAD_DIM]; ws_ml[2 * slot + 1] = s_l[i / HEAD_DIM]; }
    }
}

// grid (q_heads, B): rescale every partition to the global max and normalise.
extern "C" __global__ void paged_attention_reduce(
    dtype_t* __restrict__ out, const float* __restrict__ ws_ml, const float* __restrict__ ws_out,
    const float* __restrict__ v_scale, const int* __restrict__ context_lens, int part_tokens, int max_parts) {
    const int h = blockIdx.x, q_heads = gridDim.x, b = blockIdx.y;
    const long long row = (long long)b * q_heads + h;
    const int parts = min((context_lens[b] + part_tokens - 1) / part_tokens, max_parts);
    const float* ml = ws_ml + row * max_parts * 2;
    float mx = NEG_BIG, sum = 0.f;
    for (int p = 0; p < parts; ++p) mx = fmaxf(mx, ml[2 * p]);
    for (int p = 0; p < parts; ++p) sum += ml[2 * p + 1] * exp2f(ml[2 * p] - mx);
    const float vs = KV_INT8 ? v_scale[h / GROUP] : 1.f;
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
        float o = 0.f;
        for (int p = 0; p < parts; ++p) o += ws_out[(row * max_parts + p) * HEAD_DIM + d] * exp2f(ml[2 * p] - mx);
        out[row * HEAD_DIM + d] = from_float(sum > 0.f ? o * (vs / sum) : 0.f);
    }
}
