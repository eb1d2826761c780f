// CUDA driver of the zipccl codec: the exclusive prefix sum of the block sizes
// (encode step 3, decode step 3), a kernel body of our own in place of
// cub::DeviceScan::ExclusiveSum. CUB's device scan is a host template that
// launches with <<<>>> through the CUDA runtime; the kernels are compiled by
// NVRTC and launched through the driver API (codec/kernels_host.cc), and a
// body of our own also runs in the SIMT emulator like every other kernel.
//
// One CTA walks the array in chunks of kScanChunk items with a carry: thread t
// scans its kScanItems consecutive items in registers, a Hillis-Steele scan of
// the 256 thread totals in shared memory (8 steps, ping-pong buffers) gives its
// offset, and the chunk's total is added to the carry. Cost: ⌈n / 2048⌉ chunks
// of 8 barrier steps, ~2 µs each; 8192 blocks (a 1 GiB bfloat16 call) are 4
// chunks, and a call needs more than ~250K blocks (16 G elements) before the
// scan reaches 0.25 ms. No temporary storage beyond the output.
#pragma once

#include "cuda_common.cuh"

namespace zipccl::cuda {

constexpr int kScanItems = 8;                        // items per thread per chunk
constexpr uint64_t kScanChunk = uint64_t(kThreads) * kScanItems;

struct ScanParams {
  const uint64_t* in;  // [n]
  uint64_t* out;       // [n]: out[i] = in[0] + ... + in[i - 1]; may not alias `in`
  uint64_t n;
};

// Launched with a grid of one CTA.
struct ScanKernel {
  static constexpr const char* kName = "zipccl_scan";
  static constexpr int kBlockThreads = kThreads;
  using Params = ScanParams;
  struct Shared {
    uint64_t part[2][kThreads];  // inclusive scan of the thread totals, ping-pong
  };
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared& sm, const Params& p) {
    const uint32_t t = cta.tid();
    uint64_t carry = 0;  // sum of all previous chunks, the same in every thread
    for (uint64_t base = 0; base < p.n; base += kScanChunk) {
      const uint64_t first = base + uint64_t(t) * kScanItems;
      uint64_t v[kScanItems], own = 0;
      for (int j = 0; j < kScanItems; ++j) {
        v[j] = first + j < p.n ? p.in[first + j] : 0;
        own += v[j];
      }
      int cur = 0;
      sm.part[cur][t] = own;
      cta.sync();
      for (uint32_t d = 1; d < uint32_t(kThreads); d *= 2) {
        const uint64_t x = sm.part[cur][t] + (t >= d ? sm.part[cur][t - d] : 0);
        sm.part[cur ^ 1][t] = x;
        cur ^= 1;
        cta.sync();
      }
      uint64_t acc = carry + sm.part[cur][t] - own;  // exclusive offset of this thread's first item
      carry += sm.part[cur][kThreads - 1];
      cta.sync();  // every thread has read part[cur] before the next chunk writes part[0]
      for (int j = 0; j < kScanItems; ++j) {
        if (first + j < p.n) p.out[first + j] = acc;
        acc += v[j];
      }
    }
  }
};

}  // namespace zipccl::cuda
