typedef unsigned short u16;
#define OPS_INL __device__ __forceinline__
OPS_INL float fp16_to_float(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
OPS_INL u16 float_to_fp16(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
OPS_INL float bf16_to_float(u16 b) { return __uint_as_float(((unsigned)b) << 16); }
OPS_INL u16 float_to_bf16(float f) { u16 b; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f)); return b; }
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
