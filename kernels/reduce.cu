// relaycc reduce kernels: dst = a op b elementwise, for every element type and
// reduce operator, and the reduce-copy form that also writes the result to a
// second buffer (usually a peer's, the "write onward" step of a ring).
//
// Entry points (extern "C", so their PTX names are predictable):
//   relaycc_reduce_<type>_<op>(dst, a, b, n)
//   relaycc_reduce_copy_<type>_<op>(dst, dst2, a, b, n)
//   relaycc_reduce_<type>_avg(dst, a, b, n, scale)
//   relaycc_reduce_copy_<type>_avg(dst, dst2, a, b, n, scale)
// <type>: f32 f64 f16 bf16 i8 u8 i32 u32 i64 u64; <op>: sum prod min max, and
// avg for the floating types only. `n` counts elements. The avg kernels add
// like sum and multiply the result by `scale` (1/n at the plan's finalize
// step, 1 before it), in the accumulation type, before rounding once.
//
// dst may be a or b (an in-place reduction), so no pointer is __restrict__;
// each thread reads an element before writing the same element.
// The Rust list of these names (crates/collectives/src/cuda/kernel_sources.rs) is
// checked against the compiled PTX, so the two cannot drift apart silently.
#include "common.cuh"

template <typename E, typename Op>
__device__ __forceinline__ void relaycc_reduce_body(
    typename E::storage* dst, typename E::storage* dst2,
    const typename E::storage* a, const typename E::storage* b,
    relaycc_u64 n, bool scaled, double scale) {
    typedef typename E::acc A;
    const A s = (A)scale;
    const relaycc_u64 step = relaycc_thread_count();
    for (relaycc_u64 i = relaycc_thread_index(); i < n; i += step) {
        A r = Op::apply(E::load(a[i]), E::load(b[i]));
        if (scaled) {
            r = relaycc_mul(r, s);
        }
        const typename E::storage out = E::store(r);
        dst[i] = out;
        if (dst2 != 0) {
            dst2[i] = out;
        }
    }
}

#define RELAYCC_REDUCE(TNAME, E, ONAME, OP)                                            \
    extern "C" __global__ void relaycc_reduce_##TNAME##_##ONAME(                        \
        E::storage* dst, const E::storage* a, const E::storage* b, relaycc_u64 n) {     \
        relaycc_reduce_body<E, OP>(dst, 0, a, b, n, false, 1.0);                        \
    }                                                                                   \
    extern "C" __global__ void relaycc_reduce_copy_##TNAME##_##ONAME(                   \
        E::storage* dst, E::storage* dst2, const E::storage* a, const E::storage* b,    \
        relaycc_u64 n) {                                                                \
        relaycc_reduce_body<E, OP>(dst, dst2, a, b, n, false, 1.0);                     \
    }

#define RELAYCC_REDUCE_AVG(TNAME, E)                                                    \
    extern "C" __global__ void relaycc_reduce_##TNAME##_avg(                            \
        E::storage* dst, const E::storage* a, const E::storage* b, relaycc_u64 n,       \
        double scale) {                                                                 \
        relaycc_reduce_body<E, OpAvg>(dst, 0, a, b, n, true, scale);                    \
    }                                                                                   \
    extern "C" __global__ void relaycc_reduce_copy_##TNAME##_avg(                       \
        E::storage* dst, E::storage* dst2, const E::storage* a, const E::storage* b,    \
        relaycc_u64 n, double scale) {                                                  \
        relaycc_reduce_body<E, OpAvg>(dst, dst2, a, b, n, true, scale);                 \
    }

#define RELAYCC_REDUCE_ALL_OPS(TNAME, E)  \
    RELAYCC_REDUCE(TNAME, E, sum, OpSum)  \
    RELAYCC_REDUCE(TNAME, E, prod, OpProd) \
    RELAYCC_REDUCE(TNAME, E, min, OpMin)  \
    RELAYCC_REDUCE(TNAME, E, max, OpMax)

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
