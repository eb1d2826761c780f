// Device code of the zipccl codec: one extern "C" __global__ entry per kernel
// of cuda_kernels.cuh around the bodies of cuda_encode.cuh / cuda_decode.cuh /
// cuda_scan.cuh. Compiled by NVRTC at build time (cmake/nvrtc_build.py) into a
// CUBIN per shipped architecture and PTX; the host side (codec/kernels_host.cc)
// loads them through the CUDA driver API. No CUDA runtime, no CUB: only the
// device intrinsics NVRTC provides. NVRTC has no C++ standard library, so the
// build script supplies <cstddef>, <cstdint> and <cstring> as in-memory headers.
#include "cuda_kernels.cuh"

namespace zipccl::cuda {
namespace {

constexpr int kWarpThreads = 32;

// The CTA primitives of the kernel bodies, on the device.
template <int kBlockThreads>
struct DeviceCta {
  static constexpr int kWarps = kBlockThreads / kWarpThreads;
  static_assert(kBlockThreads % kWarpThreads == 0 && kWarps <= kWarpThreads, "one warp scans the warp totals");
  uint32_t* warp_total;  // [kWarps] in shared memory

  __device__ uint32_t tid() const { return threadIdx.x; }
  __device__ uint64_t block() const { return blockIdx.x; }
  __device__ void sync() { __syncthreads(); }
  __device__ int sync_or(int pred) { return __syncthreads_or(pred); }
  // The lanes of this warp whose pred is non-zero (warp-level: no CTA barrier).
  __device__ uint32_t ballot(int pred) { return __ballot_sync(0xFFFFFFFFu, pred); }
  // v of lane `src` of this warp.
  __device__ uint32_t shfl(uint32_t v, uint32_t src) { return __shfl_sync(0xFFFFFFFFu, v, src); }
  // Orders this warp's shared-memory accesses before and after it.
  __device__ void warp_sync() { __syncwarp(); }

  // Inclusive sum over the lanes of a full warp (shuffles, no shared memory).
  __device__ static uint32_t WarpInclusiveSum(uint32_t x, uint32_t lane) {
    for (uint32_t d = 1; d < uint32_t(kWarpThreads); d *= 2) {
      const uint32_t y = __shfl_up_sync(0xFFFFFFFFu, x, d);
      if (lane >= d) x += y;
    }
    return x;
  }
  // CTA-wide exclusive prefix sum; *aggregate receives the total. The
  // barriers around it let callers reuse shared memory freely.
  __device__ uint32_t exclusive_sum(uint32_t v, uint32_t* aggregate) {
    const uint32_t t = threadIdx.x, lane = t % kWarpThreads, warp = t / kWarpThreads;
    __syncthreads();
    const uint32_t in_warp = WarpInclusiveSum(v, lane);
    if (lane == kWarpThreads - 1) warp_total[warp] = in_warp;
    __syncthreads();
    if (warp == 0) {
      const uint32_t w = WarpInclusiveSum(lane < uint32_t(kWarps) ? warp_total[lane] : 0u, lane);
      __syncwarp();
      if (lane < uint32_t(kWarps)) warp_total[lane] = w;  // inclusive over warps
    }
    __syncthreads();
    const uint32_t before = warp ? warp_total[warp - 1] : 0u;
    *aggregate = warp_total[kWarps - 1];
    __syncthreads();
    return before + in_warp - v;
  }
};

template <class K>
__device__ __forceinline__ void RunOnDevice(const typename K::Params& p) {
  __shared__ typename K::Shared sm;
  __shared__ uint32_t warp_total[DeviceCta<K::kBlockThreads>::kWarps];
  DeviceCta<K::kBlockThreads> cta{warp_total};
  K::Run(cta, sm, p);
}

}  // namespace
}  // namespace zipccl::cuda

// Minimum one resident CTA: without it ptxas (CUDA 13, sm_90) capped the block
// decoder at 48 registers and spilled 12-20 bytes; the build refuses spills
// (-Xptxas -warn-spills -Werror), and static shared memory bounds occupancy anyway.
#define ZIPCCL_DEFINE_KERNEL(sym, ...)                                                     \
  extern "C" __global__ void __launch_bounds__(zipccl::cuda::__VA_ARGS__::kBlockThreads, 1) \
      sym(const typename zipccl::cuda::__VA_ARGS__::Params p) {                            \
    zipccl::cuda::RunOnDevice<zipccl::cuda::__VA_ARGS__>(p);                              \
  }
ZIPCCL_CUDA_KERNELS(ZIPCCL_DEFINE_KERNEL)
#undef ZIPCCL_DEFINE_KERNEL
