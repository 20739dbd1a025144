// relaycc kernels: shared definitions (element types, conversions, reduce operators).
//
// NVRTC compiles these sources with no system headers at all: the Rust side
// (crates/collectives/src/cuda/kernel_sources.rs) embeds every file and expands
// `#include "common.cuh"` itself, so this header must stay free of <...>
// includes. That is also why f16 and bf16 are handled here with inline PTX and
// bit operations instead of cuda_fp16.h / cuda_bf16.h: those headers live in
// the CUDA toolkit (or a pip wheel), which a user's machine may lack, while a
// handful of conversions is all the kernels need.
#pragma once

typedef unsigned long long relaycc_u64;
typedef long long relaycc_i64;

// Grid-stride helpers: the launch shape (blocks x threads) is chosen by the
// caller, so one kernel serves both a full-GPU launch and a single warp on a
// relay GPU that must not disturb its own work.
__device__ __forceinline__ relaycc_u64 relaycc_thread_index() {
    return (relaycc_u64)blockIdx.x * (relaycc_u64)blockDim.x + (relaycc_u64)threadIdx.x;
}
__device__ __forceinline__ relaycc_u64 relaycc_thread_count() {
    return (relaycc_u64)gridDim.x * (relaycc_u64)blockDim.x;
}

// ---- half precision (IEEE binary16), stored as its 16 bits ----------------
// cvt.f32.f16 and cvt.rn.f16.f32 exist on every architecture NVRTC targets.
__device__ __forceinline__ float relaycc_f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short relaycc_f32_to_f16(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// ---- bfloat16, stored as its 16 bits ---------------------------------------
__device__ __forceinline__ float relaycc_bf16_to_f32(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}
__device__ __forceinline__ unsigned short relaycc_f32_to_bf16(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // The hardware conversion (PTX ISA 7.0, sm_80+).
    unsigned short b;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
    return b;
#else
    // Round to nearest, ties to even, as cvt.rn.bf16.f32 and Rust's
    // half::bf16::from_f32 do; a NaN stays a (quiet) NaN with its sign.
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (unsigned short)((u >> 16) | 0x0040u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
#endif
}

// ---- element types ----------------------------------------------------------
// Each element type names its storage type, the type arithmetic happens in
// (f16/bf16 accumulate in f32 and round once; i8/u8 widen to 32 bits), and
// how to convert between the two.
#define RELAYCC_PLAIN_ELEM(NAME, STORAGE, ACC)                                   \
    struct NAME {                                                                \
        typedef STORAGE storage;                                                 \
        typedef ACC acc;                                                         \
        static __device__ __forceinline__ acc load(storage x) { return (acc)x; } \
        static __device__ __forceinline__ storage store(acc x) { return (storage)x; } \
    };

RELAYCC_PLAIN_ELEM(ElemF32, float, float)
RELAYCC_PLAIN_ELEM(ElemF64, double, double)
RELAYCC_PLAIN_ELEM(ElemI8, signed char, int)
RELAYCC_PLAIN_ELEM(ElemU8, unsigned char, unsigned int)
RELAYCC_PLAIN_ELEM(ElemI32, int, int)
RELAYCC_PLAIN_ELEM(ElemU32, unsigned int, unsigned int)
RELAYCC_PLAIN_ELEM(ElemI64, relaycc_i64, relaycc_i64)
RELAYCC_PLAIN_ELEM(ElemU64, relaycc_u64, relaycc_u64)

struct ElemF16 {
    typedef unsigned short storage;
    typedef float acc;
    static __device__ __forceinline__ acc load(storage x) { return relaycc_f16_to_f32(x); }
    static __device__ __forceinline__ storage store(acc x) { return relaycc_f32_to_f16(x); }
};
struct ElemBf16 {
    typedef unsigned short storage;
    typedef float acc;
    static __device__ __forceinline__ acc load(storage x) { return relaycc_bf16_to_f32(x); }
    static __device__ __forceinline__ storage store(acc x) { return relaycc_f32_to_bf16(x); }
};

// ---- arithmetic that wraps ---------------------------------------------------
// Signed overflow is undefined in C++, so signed sums and products go through
// the unsigned type: two's complement wrap-around, as Rust's wrapping_add and
// NCCL's integer reductions give.
__device__ __forceinline__ float relaycc_add(float x, float y) { return x + y; }
__device__ __forceinline__ double relaycc_add(double x, double y) { return x + y; }
__device__ __forceinline__ int relaycc_add(int x, int y) { return (int)((unsigned int)x + (unsigned int)y); }
__device__ __forceinline__ unsigned int relaycc_add(unsigned int x, unsigned int y) { return x + y; }
__device__ __forceinline__ relaycc_i64 relaycc_add(relaycc_i64 x, relaycc_i64 y) { return (relaycc_i64)((relaycc_u64)x + (relaycc_u64)y); }
__device__ __forceinline__ relaycc_u64 relaycc_add(relaycc_u64 x, relaycc_u64 y) { return x + y; }

__device__ __forceinline__ float relaycc_mul(float x, float y) { return x * y; }
__device__ __forceinline__ double relaycc_mul(double x, double y) { return x * y; }
__device__ __forceinline__ int relaycc_mul(int x, int y) { return (int)((unsigned int)x * (unsigned int)y); }
__device__ __forceinline__ unsigned int relaycc_mul(unsigned int x, unsigned int y) { return x * y; }
__device__ __forceinline__ relaycc_i64 relaycc_mul(relaycc_i64 x, relaycc_i64 y) { return (relaycc_i64)((relaycc_u64)x * (relaycc_u64)y); }
__device__ __forceinline__ relaycc_u64 relaycc_mul(relaycc_u64 x, relaycc_u64 y) { return x * y; }

// Float min/max return the other operand when one is NaN (fminf/fmaxf, like
// Rust's f32::min/max), so a single NaN does not poison a reduction.
__device__ __forceinline__ float relaycc_min(float x, float y) { return fminf(x, y); }
__device__ __forceinline__ double relaycc_min(double x, double y) { return fmin(x, y); }
__device__ __forceinline__ float relaycc_max(float x, float y) { return fmaxf(x, y); }
__device__ __forceinline__ double relaycc_max(double x, double y) { return fmax(x, y); }
template <typename A> __device__ __forceinline__ A relaycc_min(A x, A y) { return y < x ? y : x; }
template <typename A> __device__ __forceinline__ A relaycc_max(A x, A y) { return x < y ? y : x; }

// Avg's division, once, at the end, in the accumulation type: IEEE division rounds exactly as
// the host backend's `x / n` does (NVRTC divides correctly rounded unless --prec-div=false).
// The integer forms exist so every element type instantiates; plans never average integers.
__device__ __forceinline__ float relaycc_div(float x, unsigned int n) { return x / (float)n; }
__device__ __forceinline__ double relaycc_div(double x, unsigned int n) { return x / (double)n; }
template <typename A> __device__ __forceinline__ A relaycc_div(A x, unsigned int n) { return x / (A)n; }

// ---- 16-byte global memory access ---------------------------------------------
// Generic pointers (every pointer the kernels get is one) are converted to the global window
// once, and 16-byte packs move with ld.global.v4 / st.global.v4, as NCCL's reduceCopy does
// (src/device/op128.h): the compiler cannot prove a pointer read out of a by-value struct is
// global, and without that it emits generic loads. The load is not volatile: no thread ever
// reads a pack it or another thread of the launch writes, so the compiler may schedule the
// loads of every source early. Every address must be 16-byte aligned.
__device__ __forceinline__ relaycc_u64 relaycc_global(const void* p) {
    relaycc_u64 g;
    asm("cvta.to.global.u64 %0, %1;" : "=l"(g) : "l"(p));
    return g;
}
__device__ __forceinline__ uint4 relaycc_ld16(relaycc_u64 addr) {
    uint4 v;
    asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(addr));
    return v;
}
__device__ __forceinline__ void relaycc_st16(relaycc_u64 addr, uint4 v) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 :
                 : "l"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

// ---- reduce operators --------------------------------------------------------
// Avg combines like Sum; the kernel divides by the launch's divisor (the plan's
// finalize step) after the last source, before rounding once.
struct OpSum { template <typename A> static __device__ __forceinline__ A apply(A x, A y) { return relaycc_add(x, y); } };
struct OpProd { template <typename A> static __device__ __forceinline__ A apply(A x, A y) { return relaycc_mul(x, y); } };
struct OpMin { template <typename A> static __device__ __forceinline__ A apply(A x, A y) { return relaycc_min(x, y); } };
struct OpMax { template <typename A> static __device__ __forceinline__ A apply(A x, A y) { return relaycc_max(x, y); } };
typedef OpSum OpAvg;
