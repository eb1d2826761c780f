// CUDA driver of the zipccl codec: __global__ wrappers around the kernel bodies
// of cuda_encode.cuh / cuda_decode.cuh, CUB scans, and the asynchronous host
// entry points of cuda_launch.cuh. No XLA includes; no allocation and no
// synchronisation (the caller provides scratch).
#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include "cuda_launch.cuh"

namespace zipccl::cuda {
namespace {

// The CTA primitives of the kernel bodies, on the device.
template <int kBlockThreads>
struct DeviceCta {
  using Scan = cub::BlockScan<uint32_t, kBlockThreads>;
  typename Scan::TempStorage* scan_temp;

  __device__ uint32_t tid() const { return threadIdx.x; }
  __device__ uint64_t block() const { return blockIdx.x; }
  __device__ void sync() { __syncthreads(); }
  __device__ int sync_or(int pred) { return __syncthreads_or(pred); }
  // CTA-wide exclusive prefix sum; *aggregate receives the total. The
  // barriers around it let callers reuse shared memory freely.
  __device__ uint32_t exclusive_sum(uint32_t v, uint32_t* aggregate) {
    uint32_t out, agg;
    __syncthreads();
    Scan(*scan_temp).ExclusiveSum(v, out, agg);
    __syncthreads();
    *aggregate = agg;
    return out;
  }
};

template <class K>
__global__ void __launch_bounds__(K::kBlockThreads) Kernel(typename K::Params p) {
  __shared__ typename K::Shared sm;
  __shared__ typename DeviceCta<K::kBlockThreads>::Scan::TempStorage scan_temp;
  DeviceCta<K::kBlockThreads> cta{&scan_temp};
  K::Run(cta, sm, p);
}

// Launches on one stream; stops at the first error (cudaGetLastError after
// every launch).
struct DeviceLauncher {
  cudaStream_t stream;
  cudaError_t err = cudaSuccess;

  template <class K>
  void Launch(uint64_t grid, const typename K::Params& p) {
    if (err != cudaSuccess || grid == 0) return;
    if (grid > uint64_t(0x7FFFFFFF)) {
      err = cudaErrorInvalidConfiguration;
      return;
    }
    Kernel<K><<<unsigned(grid), K::kBlockThreads, 0, stream>>>(p);
    err = cudaGetLastError();
  }

  void ExclusiveSum(const uint64_t* in, uint64_t* out, uint64_t n, void* temp,
                    uint64_t temp_bytes) {
    if (err != cudaSuccess) return;
    size_t bytes = size_t(temp_bytes);
    err = cub::DeviceScan::ExclusiveSum(temp, bytes, in, out, int64_t(n), stream);
    if (err == cudaSuccess) err = cudaGetLastError();
  }
};

}  // namespace

int ScanTempBytes(uint64_t n_items, uint64_t* bytes) {
  size_t b = 0;
  cudaError_t err = cub::DeviceScan::ExclusiveSum(
      nullptr, b, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
      int64_t(n_items), cudaStream_t(nullptr));
  *bytes = b;
  return int(err);
}

int EncodeAsync(const void* x, uint8_t dtype, bool checksum, uint8_t* payload, uint64_t cap,
                void* nbytes, bool nbytes64, const uint8_t* skip, const EncodeLayout& L,
                void* scratch, CUstream_st* stream) {
  auto* s = static_cast<uint8_t*>(scratch);
  EncodeParams p =
      MakeEncodeParams(L, x, dtype, checksum, payload, cap, nbytes, nbytes64, skip, s);
  DeviceLauncher l{stream};
  RunEncode(l, p, L, s);
  return int(l.err);
}

int DecodeAsync(const uint8_t* payload, uint64_t cap, uint8_t dtype, void* out, int32_t* status,
                const uint8_t* skip, const DecodeLayout& L, void* scratch, CUstream_st* stream) {
  auto* s = static_cast<uint8_t*>(scratch);
  DecodeParams p = MakeDecodeParams(L, payload, cap, dtype, out, status, skip, s);
  DeviceLauncher l{stream};
  RunDecode(l, p, L, s);
  return int(l.err);
}

const char* ErrorString(int cuda_error) { return cudaGetErrorString(cudaError_t(cuda_error)); }

}  // namespace zipccl::cuda
