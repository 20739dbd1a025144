// relaycc reduce kernels: dsts[j] = op(srcs[0], ..., srcs[k-1]) elementwise, for every
// element type and reduce operator, with k sources and m destinations in one launch (reduce
// and copy fused), after NCCL's reduceCopy (src/device/common_kernel.h).
//
// Entry points (extern "C", so their PTX names are predictable), one parameter each:
//   relaycc_reduce_<type>_<op>(RelayccReduceArgs args)
// <type>: f32 f64 f16 bf16 i8 u8 i32 u32 i64 u64; <op>: sum prod min max, and avg for the
// floating types only. The avg kernels add like sum and divide the result by
// `args.divisor` (when it is not 0: the plan's finalize step), in the accumulation type,
// before rounding once.
//
// Sources are folded left in their order (((s0 op s1) op s2) ...), as the host backend
// does, so f32/f64 results equal the host's bit for bit; f16 and bf16 are widened to f32,
// folded over every source, divided, and rounded to nearest-even once; integer sums and
// products wrap.
//
// Aliasing: a destination may equal a source (an in-place reduction) but may not overlap
// one partially, and destinations are pairwise disjoint. Each element is read from every
// source and written to every destination by the one thread that owns it, so no pointer is
// __restrict__ and in-place launches are exact.
//
// Memory access: when every pointer has the same offset within 16 bytes, a scalar head
// brings them to a 16-byte boundary and the body moves 16-byte packs (ld.global.v4 /
// st.global.v4), RELAYCC_UNROLL packs per thread in flight per source; each warp owns a
// contiguous hunk of RELAYCC_UNROLL x 32 packs per step (NCCL's layout: each load
// instruction of a warp reads 512 contiguous bytes). What is left is a scalar tail.
// Pointers with different offsets within 16 bytes take the scalar path throughout:
// correct, slower, and rare, since the executor's buffers are 256-byte aligned.
//
// The Rust mirror of RelayccReduceArgs is `ReduceArgs` in
// crates/collectives/src/cuda/kernel_sources.rs; its size is checked against the PTX
// parameter of every entry point, so the two cannot drift apart silently, and so is the list
// of entry points.
#include "common.cuh"

// Most sources and destinations one launch takes. More sources are chained launches (the
// CUDA backend's launch.rs); a reduction with its copies fused has at most 8 destinations.
#define RELAYCC_MAX_SRCS 16
#define RELAYCC_MAX_DSTS 8
// 16-byte packs per thread per source in flight.
#define RELAYCC_UNROLL 4

// The one kernel parameter, passed by value (216 bytes: kernel parameters live in the
// constant bank, so every thread reads them without a memory round trip).
struct RelayccReduceArgs {
    const void* srcs[RELAYCC_MAX_SRCS];
    void* dsts[RELAYCC_MAX_DSTS];
    // Elements per source and destination.
    relaycc_u64 n;
    // 1..RELAYCC_MAX_SRCS and 1..RELAYCC_MAX_DSTS.
    unsigned int nsrcs;
    unsigned int ndsts;
    // Avg only: divide by this after the last source (0: no division).
    unsigned int divisor;
    unsigned int reserved;
};

// A 16-byte pack of element type E, widened to its accumulation type and back.
template <typename E>
struct RelayccPack {
    typedef typename E::storage S;
    typedef typename E::acc A;
    enum { N = 16 / sizeof(S) };
    union Bits {
        uint4 v;
        S e[N];
    };
    static __device__ __forceinline__ void widen(uint4 v, A* out) {
        Bits b;
        b.v = v;
#pragma unroll
        for (int i = 0; i < N; i++) {
            out[i] = E::load(b.e[i]);
        }
    }
    static __device__ __forceinline__ uint4 narrow(const A* in) {
        Bits b;
#pragma unroll
        for (int i = 0; i < N; i++) {
            b.e[i] = E::store(in[i]);
        }
        return b.v;
    }
};

// Elements one at a time, grid-stride: the head [0, head) and the tail [tail, n). With
// head = n (pointers whose offsets within 16 bytes differ) that is every element. One loop
// for both keeps one copy of the scalar code in each kernel.
template <typename E, typename Op, bool AVG>
__device__ __forceinline__ void relaycc_reduce_elems(
    const RelayccReduceArgs& a, relaycc_u64 head, relaycc_u64 tail) {
    typedef typename E::storage S;
    typedef typename E::acc A;
    const relaycc_u64 count = head + (a.n - tail);
    const relaycc_u64 step = relaycc_thread_count();
    for (relaycc_u64 j = relaycc_thread_index(); j < count; j += step) {
        const relaycc_u64 i = j < head ? j : tail + (j - head);
        A acc = E::load(((const S*)a.srcs[0])[i]);
#pragma unroll 1
        for (unsigned int s = 1; s < a.nsrcs; s++) {
            acc = Op::apply(acc, E::load(((const S*)a.srcs[s])[i]));
        }
        if (AVG && a.divisor != 0) {
            acc = relaycc_div(acc, a.divisor);
        }
        const S out = E::store(acc);
#pragma unroll 1
        for (unsigned int d = 0; d < a.ndsts; d++) {
            ((S*)a.dsts[d])[i] = out;
        }
    }
}

// U packs per thread at pack indices first + k * stride (k < U), bytes counted from `base`
// (the first 16-byte aligned byte of every pointer).
template <typename E, typename Op, bool AVG, int U>
__device__ __forceinline__ void relaycc_reduce_packs(
    const RelayccReduceArgs& a, relaycc_u64 base, relaycc_u64 first, relaycc_u64 stride) {
    typedef RelayccPack<E> P;
    typedef typename E::acc A;
    A acc[U][P::N];
    {
        const relaycc_u64 src = relaycc_global(a.srcs[0]) + base;
        uint4 raw[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            raw[u] = relaycc_ld16(src + (first + u * stride) * 16ull);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            P::widen(raw[u], acc[u]);
        }
    }
#pragma unroll 1
    for (unsigned int s = 1; s < a.nsrcs; s++) {
        const relaycc_u64 src = relaycc_global(a.srcs[s]) + base;
        uint4 raw[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            raw[u] = relaycc_ld16(src + (first + u * stride) * 16ull);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            A x[P::N];
            P::widen(raw[u], x);
#pragma unroll
            for (int i = 0; i < P::N; i++) {
                acc[u][i] = Op::apply(acc[u][i], x[i]);
            }
        }
    }
    uint4 out[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (AVG && a.divisor != 0) {
#pragma unroll
            for (int i = 0; i < P::N; i++) {
                acc[u][i] = relaycc_div(acc[u][i], a.divisor);
            }
        }
        out[u] = P::narrow(acc[u]);
    }
#pragma unroll 1
    for (unsigned int d = 0; d < a.ndsts; d++) {
        const relaycc_u64 dst = relaycc_global(a.dsts[d]) + base;
#pragma unroll
        for (int u = 0; u < U; u++) {
            relaycc_st16(dst + (first + u * stride) * 16ull, out[u]);
        }
    }
}

template <typename E, typename Op, bool AVG>
__device__ __forceinline__ void relaycc_reduce_body(const RelayccReduceArgs& a) {
    typedef typename E::storage S;
    typedef RelayccPack<E> P;
    const relaycc_u64 n = a.n;
    // Every pointer's offset within 16 bytes must match for the packed body.
    const relaycc_u64 mis = (relaycc_u64)a.srcs[0] & 15ull;
    bool same = true;
#pragma unroll 1
    for (unsigned int s = 1; s < a.nsrcs; s++) {
        same = same && (((relaycc_u64)a.srcs[s] & 15ull) == mis);
    }
#pragma unroll 1
    for (unsigned int d = 0; d < a.ndsts; d++) {
        same = same && (((relaycc_u64)a.dsts[d] & 15ull) == mis);
    }
    // Pointers are element-aligned (the launch checks), so the head is whole elements.
    relaycc_u64 head = same ? ((16ull - mis) & 15ull) / sizeof(S) : n;
    if (head > n) {
        head = n;
    }
    // Hunks: warp w takes packs [h * 32U, (h + 1) * 32U) for h = w, w + warps, ...; lane l
    // of it packs h * 32U + l + 32u. Packs past the last whole hunk (under 2 KiB) go to the
    // scalar tail with the rest.
    const relaycc_u64 base = head * sizeof(S);
    const relaycc_u64 hunk = 32ull * RELAYCC_UNROLL;
    const relaycc_u64 hunks = (n - head) / P::N / hunk;
    const relaycc_u64 lane = threadIdx.x & 31u;
    const relaycc_u64 warps = relaycc_thread_count() >> 5;
    for (relaycc_u64 h = relaycc_thread_index() >> 5; h < hunks; h += warps) {
        relaycc_reduce_packs<E, Op, AVG, RELAYCC_UNROLL>(a, base, h * hunk + lane, 32ull);
    }
    relaycc_reduce_elems<E, Op, AVG>(a, head, head + hunks * hunk * P::N);
}

#define RELAYCC_REDUCE(TNAME, E, ONAME, OP, AVG)                                       \
    extern "C" __global__ void relaycc_reduce_##TNAME##_##ONAME(RelayccReduceArgs args) { \
        relaycc_reduce_body<E, OP, AVG>(args);                                          \
    }

#define RELAYCC_REDUCE_ALL_OPS(TNAME, E)         \
    RELAYCC_REDUCE(TNAME, E, sum, OpSum, false)  \
    RELAYCC_REDUCE(TNAME, E, prod, OpProd, false) \
    RELAYCC_REDUCE(TNAME, E, min, OpMin, false)  \
    RELAYCC_REDUCE(TNAME, E, max, OpMax, false)

#define RELAYCC_REDUCE_AVG(TNAME, E) RELAYCC_REDUCE(TNAME, E, avg, OpAvg, true)

RELAYCC_REDUCE_ALL_OPS(f32, ElemF32)
RELAYCC_REDUCE_ALL_OPS(f64, ElemF64)
RELAYCC_REDUCE_ALL_OPS(f16, ElemF16)
RELAYCC_REDUCE_ALL_OPS(bf16, ElemBf16)
RELAYCC_REDUCE_ALL_OPS(i8, ElemI8)
RELAYCC_REDUCE_ALL_OPS(u8, ElemU8)
RELAYCC_REDUCE_ALL_OPS(i32, ElemI32)
RELAYCC_REDUCE_ALL_OPS(u32, ElemU32)
RELAYCC_REDUCE_ALL_OPS(i64, ElemI64)
RELAYCC_REDUCE_ALL_OPS(u64, ElemU64)

RELAYCC_REDUCE_AVG(f32, ElemF32)
RELAYCC_REDUCE_AVG(f64, ElemF64)
RELAYCC_REDUCE_AVG(f16, ElemF16)
RELAYCC_REDUCE_AVG(bf16, ElemBf16)
