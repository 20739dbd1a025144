// relaycc forward kernel: copy bytes between two device pointers with the GPU's SMs, on one
// GPU or to or from a peer reached over NVLink (peer access enabled).
//
// This is the copy the CUDA backend runs instead of a copy-engine copy (cuMemcpyAsync) for
// copies below its SM-copy threshold (`CudaBackend::set_sm_copy_below`), and the relay
// primitive: a GPU on a route moves data from its staging buffer, or straight from a peer,
// to the next GPU without a driver copy. Every thread of every block takes part (grid-stride
// over warps), so the launch shape is the caller's: a relay may use a single warp and leave
// the rest of the GPU to its own work, a large copy as many blocks as the GPU holds.
#include "common.cuh"

// 16-byte words per thread in flight, as the reduce kernels' RELAYCC_UNROLL.
#define RELAYCC_FORWARD_UNROLL 4

// Copies `bytes` bytes from `s` to `d` (the regions must not overlap), this thread's share of
// a grid of `nthreads` threads.
//
// When src and dst share their offset within 16 bytes, a scalar head brings both to a
// 16-byte boundary and the body moves 16-byte words with ld.global.v4 / st.global.v4, the
// widest load and store a thread can issue: each warp owns a hunk of 32 x 4 words per step,
// each lane four words 512 bytes apart (NCCL's reduceCopy layout), so every load instruction
// of a warp reads 512 contiguous bytes and each thread has four in flight. Words past the
// last whole hunk and the bytes after the last word are a scalar tail. Otherwise every byte
// is copied singly: correct, slower, and rare, since the executor's buffers are 256-byte
// aligned.
__device__ static void relaycc_copy_bytes(unsigned char* d, const unsigned char* s, relaycc_u64 bytes,
                                          relaycc_u64 tid, relaycc_u64 nthreads) {
    const relaycc_u64 src_mis = (relaycc_u64)s & 15ull;
    const relaycc_u64 dst_mis = (relaycc_u64)d & 15ull;
    relaycc_u64 head = src_mis == dst_mis ? (16ull - src_mis) & 15ull : bytes;
    if (head > bytes) {
        head = bytes;
    }
    const relaycc_u64 hunk = 32ull * RELAYCC_FORWARD_UNROLL;
    const relaycc_u64 hunks = (bytes - head) / 16ull / hunk;
    const relaycc_u64 sw = relaycc_global(s + head);
    const relaycc_u64 dw = relaycc_global(d + head);
    const relaycc_u64 lane = threadIdx.x & 31u;
    const relaycc_u64 warps = nthreads >> 5;
    for (relaycc_u64 h = tid >> 5; h < hunks; h += warps) {
        const relaycc_u64 first = h * hunk + lane;
        uint4 v[RELAYCC_FORWARD_UNROLL];
#pragma unroll
        for (int u = 0; u < RELAYCC_FORWARD_UNROLL; u++) {
            v[u] = relaycc_ld16(sw + (first + 32ull * u) * 16ull);
        }
#pragma unroll
        for (int u = 0; u < RELAYCC_FORWARD_UNROLL; u++) {
            relaycc_st16(dw + (first + 32ull * u) * 16ull, v[u]);
        }
    }

    // The head [0, head) and the tail [tail, bytes), byte by byte, in one loop.
    const relaycc_u64 tail = head + hunks * hunk * 16ull;
    const relaycc_u64 scalar = head + (bytes - tail);
    for (relaycc_u64 j = tid; j < scalar; j += nthreads) {
        const relaycc_u64 i = j < head ? j : tail + (j - head);
        d[i] = s[i];
    }
}

extern "C" __global__ void relaycc_forward(void* dst, const void* src, relaycc_u64 bytes) {
    relaycc_copy_bytes((unsigned char*)dst, (const unsigned char*)src, bytes, relaycc_thread_index(),
                       relaycc_thread_count());
}

// Most copies one relaycc_forward_batch launch makes (MAX_BATCH_COPIES on the Rust side).
#define RELAYCC_MAX_COPIES 16

// The one parameter of relaycc_forward_batch, passed by value (CopyBatchArgs on the Rust side).
typedef struct {
    relaycc_u64 dsts[RELAYCC_MAX_COPIES];
    relaycc_u64 srcs[RELAYCC_MAX_COPIES];
    relaycc_u64 bytes[RELAYCC_MAX_COPIES];
    unsigned int count;
    unsigned int reserved;
} RelayccCopyBatch;

// Copies `bytes[e]` bytes from `srcs[e]` to `dsts[e]` for each `e < count`, all in one launch:
// copies that a stream would make one after the other, whose ranges are independent (no copy
// writes what another reads or writes), so their order does not matter. Every thread takes
// its share of each copy in turn.
extern "C" __global__ void relaycc_forward_batch(RelayccCopyBatch args) {
    const relaycc_u64 tid = relaycc_thread_index();
    const relaycc_u64 nthreads = relaycc_thread_count();
    for (unsigned int e = 0; e < args.count && e < RELAYCC_MAX_COPIES; e++) {
        relaycc_copy_bytes((unsigned char*)args.dsts[e], (const unsigned char*)args.srcs[e],
                           args.bytes[e], tid, nthreads);
    }
}
