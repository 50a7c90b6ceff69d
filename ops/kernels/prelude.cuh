typedef unsigned short u16;
#define OPS_INL __device__ __forceinline__
OPS_INL float fp16_to_float(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
OPS_INL u16 float_to_fp16(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
OPS_INL float bf16_to_float(u16 b) { return __uint_as_float(((unsigned)b) << 16); }
OPS_INL u16 float_to_bf16(float f) { u16 b; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f)); return b; }
// Tensor cores (sm_80+): d += A (16 x 16, row-major) * B (16 x 8, column-major), fp32 accumulators,
// A/B as 16-bit pairs in the PTX fragment layout (group g = lane / 4, q = lane % 4): a = rows g,
// g + 8 x cols 2q, 2q + 1 (a0, a1), the same rows x cols 2q + 8, 2q + 9 (a2, a3); b = rows 2q, 2q + 1
// (b0) and 2q + 8, 2q + 9 (b1) of col g; d = row g (d0, d1) and g + 8 (d2, d3) x cols 2q, 2q + 1.
OPS_INL void mma_16816_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
OPS_INL void mma_16816_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#undef OPS_INL
#if DTYPE_ID == 0
typedef float dtype_t;
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float from_float(float x) { return x; }
#elif DTYPE_ID == 1
typedef u16 dtype_t;
__device__ __forceinline__ float to_float(u16 x) { return fp16_to_float(x); }
__device__ __forceinline__ u16 from_float(float x) { return float_to_fp16(x); }
#elif DTYPE_ID == 2
typedef u16 dtype_t;
__device__ __forceinline__ float to_float(u16 x) { return bf16_to_float(x); }
__device__ __forceinline__ u16 from_float(float x) { return float_to_bf16(x); }
#else
#error "DTYPE_ID must be 0 (fp32), 1 (fp16) or 2 (bf16)"
#endif
