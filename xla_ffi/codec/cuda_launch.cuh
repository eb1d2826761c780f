// CUDA driver of the zipccl codec: the launch sequences shared by the device
// launcher (codec/kernels.cu) and the host emulator (cuda_host_bindings.cc),
// and the asynchronous host API implemented in codec/kernels.cu.
#pragma once

#include <string>

#include "cuda_common.cuh"
#include "cuda_decode.cuh"
#include "cuda_encode.cuh"

namespace zipccl::cuda {

// =============================================================================
// Launch sequences, shared by the CUDA driver and the host emulator
// =============================================================================
// A Launcher provides
//   template <class K> void Launch(uint64_t grid, const typename K::Params&);
//   void ExclusiveSum(const uint64_t* in, uint64_t* out, uint64_t n, void* temp,
//                     uint64_t temp_bytes);
// and remembers the first error itself.

// Calls f(T{}) with T the unsigned integer of the dtype's element width, the
// type the per-block kernels are instantiated for.
template <class F>
void WithElemType(uint8_t dtype, F&& f) {
  switch (ElemBytes(dtype)) {
    case 1: f(uint8_t{}); break;
    case 4: f(uint32_t{}); break;
    default: f(uint16_t{}); break;
  }
}

template <class Launcher>
void RunEncode(Launcher& l, const EncodeParams& p, const EncodeLayout& L, uint8_t* scratch) {
  if (p.frames == 0) return;
  if (p.total) {
    WithElemType(p.dtype, [&](auto t) { l.template Launch<HistKernel<decltype(t)>>(p.total, p); });
    l.template Launch<PlanKernel>(p.total + 1, p);
    l.ExclusiveSum(p.sizes, p.offsets, p.total + 1, scratch + L.cub_off, L.cub_bytes);
    WithElemType(p.dtype, [&](auto t) { l.template Launch<WriteKernel<decltype(t)>>(p.total, p); });
  }
  l.template Launch<FinishEncodeKernel>(p.frames, p);  // one CTA per frame
  l.template Launch<ZeroTailKernel>(p.frames * ZeroTailKernel::TilesPerFrame(p.cap), p);
}

template <class Launcher>
void RunDecode(Launcher& l, const DecodeParams& p, const DecodeLayout& L, uint8_t* scratch) {
  if (p.frames == 0) return;
  l.template Launch<FrameCheckKernel>(p.frames, p);  // one CTA per frame
  if (p.total) {
    l.template Launch<DirKernel>(CeilDiv(p.total + 1, kItemThreads), p);
    l.ExclusiveSum(p.sizes, p.offsets, p.total + 1, scratch + L.cub_off, L.cub_bytes);
    WithElemType(p.dtype, [&](auto t) {
      l.template Launch<DecodeBlockKernel<decltype(t)>>(p.total, p);
      l.template Launch<PoisonKernel<decltype(t)>>(p.total, p);
    });
  }
  if (p.status) l.template Launch<StatusKernel>(CeilDiv(p.frames, kItemThreads), p);
}

// =============================================================================
// Host API (implemented in codec/kernels.cu; asynchronous on `stream`)
// =============================================================================
// Return values are cudaError_t codes (0 = success). xla_ffi/emulated_kernels.cc
// implements the same API on the SIMT emulator: the FFI contract test links it
// in place of codec/kernels.cu (a link-time seam; the handlers are unchanged).

// CUDA versions as cudaRuntimeGetVersion / cudaDriverGetVersion report them
// (1000 * major + 10 * minor): the runtime the kernels were built against and
// the newest CUDA the installed driver supports (0: no driver).
struct Versions {
  int runtime, driver;
};
int GetVersions(Versions* v);

// Whether a driver supporting CUDA `driver` runs kernels built with runtime
// `runtime`: CUDA's minor-version compatibility needs the same major or newer.
inline bool DriverSupports(int driver, int runtime) { return driver / 1000 >= runtime / 1000; }

// Null when the driver can run the kernels, else a message naming both
// versions and the minimum driver of the build (checked once per process;
// the handlers call it before their first launch).
const char* DriverError();

// The message of DriverError for these versions ("12.2" style) and the build's
// minimum driver (e.g. "525.60.13").
inline std::string DriverMismatchMessage(int driver, int runtime, const char* min_driver) {
  auto ver = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  const std::string have =
      driver ? "the NVIDIA driver supports CUDA " + ver(driver) : std::string("no CUDA driver was found");
  return "zipccl_jax: " + have + ", but its CUDA kernels were built with the CUDA " + ver(runtime) +
         " runtime, which needs a driver for CUDA " + std::to_string(runtime / 1000) + ".x (>= " +
         min_driver + "). Update the NVIDIA driver, or rebuild zipccl_jax with a CUDA toolkit " +
         "the driver supports (pip install next to the matching jax-cuda plugin); " +
         "`python -m zipccl_jax.info` shows both versions.";
}

// Bytes of CUB temporary storage for an exclusive scan of n uint64 values on
// the current device.
int ScanTempBytes(uint64_t n_items, uint64_t* bytes);

// Encodes `frames` frames of n elements each (x: frames * n elements, device
// memory) into payload (frames * cap bytes) and writes each frame's exact size
// to nbytes (int32 or int64 per frame). Semantics equal those of
// cpu::EncodeFrame applied per frame. skip (nullable, device memory, one byte
// per frame): a frame with a non-zero flag is not coded (its blocks are neither
// histogrammed, planned nor written), its payload row is all zero and its size 0. scratch holds L.scratch_bytes bytes
// (256-byte aligned); L comes from MakeEncodeLayout with ScanTempBytes(total + 1).
// The caller guarantees that MaxEncodedBytes(n) fits nbytes' type.
int EncodeAsync(const void* x, uint8_t dtype, bool checksum, uint8_t* payload, uint64_t cap,
                void* nbytes, bool nbytes64, const uint8_t* skip, const EncodeLayout& L,
                void* scratch, CUstream_st* stream);

// Decodes frames (payload: frames * cap bytes) into out (frames * n elements).
// A rejected frame's elements are set to NaN; status (nullable, int32 per
// frame) receives 0 or the Status code of the first error, as the CPU driver
// would report it. skip (nullable, device memory, one byte per frame): a frame
// with a non-zero flag is not read, its elements are zero and its status 0.
int DecodeAsync(const uint8_t* payload, uint64_t cap, uint8_t dtype, void* out, int32_t* status,
                const uint8_t* skip, const DecodeLayout& L, void* scratch, CUstream_st* stream);

const char* ErrorString(int cuda_error);

}  // namespace zipccl::cuda
