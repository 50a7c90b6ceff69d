#if KV_INT8
typedef signed char cache_t;
#else
typedef dtype_t cache_t;
#endif

// One thread moves 8 elements of one (token, kv head) row: 16-byte loads for 16-bit dtypes.
// key/value rows may be strided (e.g. slices of a fused QKV output); the pool is contiguous,
// [num_blocks, kv_heads, block_size, head_dim] (head-major).
extern "C" __global__ void kv_cache_write(
    const dtype_t* __restrict__ key, const dtype_t* __restrict__ value,
    cache_t* __restrict__ k_cache, cache_t* __restrict__ v_cache,
    const int* __restrict__ slot_mapping,
    const float* __restrict__ k_scale, const float* __restrict__ v_scale,
    int num_tokens, int kv_heads, int block_size, int head_dim, long long key_stride, long long value_stride)
{
    const int vecs = head_dim / 8;
    const int total = num_tokens * kv_heads * vecs;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int v = i % vecs, h = (i / vecs) % kv_heads, t = i / (vecs * kv_heads);
        const int slot = slot_mapping[t];
        if (slot < 0) continue;
        const int col = h * head_dim + v * 8;
        const long long dst =
            (((long long)(slot / block_size) * kv_heads + h) * block_size + slot % block_size) * head_dim + v * 8;
        const dtype_t* src[2] = {key + t * key_stride + col, value + t * value_stride + col};
        cache_t* out[2] = {k_cache + dst, v_cache + dst};
#pragma unroll
        for (int kv = 0; kv < 2; ++kv) {
#if KV_INT8
            const float scale = (kv == 0 ? k_scale : v_scale)[h];
            unsigned packed[2] = {0u, 0u};
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                // x / scale (not x * (1/scale)) so the result is bit-identical to the numpy twin.
                float q = rintf(to_float(src[kv][e]) / scale);
                q = fminf(fmaxf(q, -127.f), 127.f);
                packed[e / 4] |= ((unsigned)(int)q & 0xffu) << (8 * (e % 4));
            }
            *reinterpret_cast<uint2*>(out[kv]) = make_uint2(packed[0], packed[1]);
#else
            // A plain copy: 8 elements are 16 bytes (fp16/bf16) or 32 bytes (fp32).
            const uint4* s = reinterpret_cast<const uint4*>(src[kv]);
            uint4* d = reinterpret_cast<uint4*>(out[kv]);
#pragma unroll
            for (int w = 0; w < (int)sizeof(dtype_t) / 2; ++w) d[w] = s[w];
#endif
        }
    }
}
