// relaycc forward kernel: copy bytes between two device pointers, usually on
// different GPUs reached over NVLink (peer access enabled).
//
// This is the relay primitive: a GPU on a route moves data from its staging
// buffer, or straight from a peer, to the next GPU without a driver copy. The
// launch shape is the caller's, so a relay may use a single warp and leave the
// rest of the GPU to its own work.
#include "common.cuh"

// Copies `bytes` bytes from `src` to `dst` (the regions must not overlap).
//
// When src and dst share their offset within 16 bytes, a scalar head brings
// both to a 16-byte boundary and the body moves uint4 (16-byte) words, the
// widest load/store a thread can issue; whatever is left is a scalar tail.
// Otherwise every byte is copied singly: correct, slower, and rare, since the
// executor hands out 256-byte aligned buffers.
extern "C" __global__ void relaycc_forward(void* dst, const void* src, relaycc_u64 bytes) {
    unsigned char* d = (unsigned char*)dst;
    const unsigned char* s = (const unsigned char*)src;
    const relaycc_u64 tid = relaycc_thread_index();
    const relaycc_u64 nthreads = relaycc_thread_count();

    const relaycc_u64 src_mis = (relaycc_u64)s & 15ull;
    const relaycc_u64 dst_mis = (relaycc_u64)d & 15ull;
    if (src_mis != dst_mis) {
        for (relaycc_u64 i = tid; i < bytes; i += nthreads) {
            d[i] = s[i];
        }
        return;
    }

    relaycc_u64 head = (16ull - src_mis) & 15ull;
    if (head > bytes) {
        head = bytes;
    }
    for (relaycc_u64 i = tid; i < head; i += nthreads) {
        d[i] = s[i];
    }

    const relaycc_u64 words = (bytes - head) / 16ull;
    uint4* dw = (uint4*)(d + head);
    const uint4* sw = (const uint4*)(s + head);
    for (relaycc_u64 i = tid; i < words; i += nthreads) {
        dw[i] = sw[i];
    }

    const relaycc_u64 tail_start = head + words * 16ull;
    for (relaycc_u64 i = tail_start + tid; i < bytes; i += nthreads) {
        d[i] = s[i];
    }
}
