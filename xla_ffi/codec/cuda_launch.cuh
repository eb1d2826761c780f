// CUDA driver of the zipccl codec: the launch sequences shared by the device
// launcher (codec/kernels_host.cc) and the host emulator (simt_emulator.h),
// and the asynchronous host API implemented in codec/kernels_host.cc.
#pragma once

#include <string>

#include "cuda_kernels.cuh"

namespace zipccl::cuda {

// =============================================================================
// Launch sequences, shared by the CUDA driver and the host emulator
// =============================================================================
// A Launcher provides
//   template <class K> void Launch(uint64_t grid, const typename K::Params&);
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
void RunEncode(Launcher& l, const EncodeParams& p) {
  if (p.frames == 0) return;
  if (p.total) {
    WithElemType(p.dtype, [&](auto t) { l.template Launch<AnalyseKernel<decltype(t)>>(p.total + 1, p); });
    l.template Launch<ScanKernel>(1, ScanParams{p.sizes, p.offsets, p.total + 1});
    WithElemType(p.dtype, [&](auto t) { l.template Launch<WriteKernel<decltype(t)>>(p.total, p); });
  }
  l.template Launch<FinishEncodeKernel>(p.frames, p);  // one CTA per frame
  l.template Launch<ZeroTailKernel>(p.frames * ZeroTailKernel::TilesPerFrame(p.cap), p);
}

template <class Launcher>
void RunDecode(Launcher& l, const DecodeParams& p) {
  if (p.frames == 0) return;
  if (p.total) {  // the directory first: the checksum hashes the blocks it delimits
    l.template Launch<DirKernel>(CeilDiv(p.total + 1, kItemThreads), p);
    l.template Launch<ScanKernel>(1, ScanParams{p.sizes, p.offsets, p.total + 1});
  }
  l.template Launch<FrameCheckKernel>(p.frames, p);  // one CTA per frame
  if (p.total) {
    WithElemType(p.dtype, [&](auto t) {
      l.template Launch<DecodeBlockKernel<decltype(t)>>(p.total, p);
      l.template Launch<PoisonKernel<decltype(t)>>(p.total, p);
    });
  }
  if (p.status) l.template Launch<StatusKernel>(CeilDiv(p.frames, kItemThreads), p);
}

// =============================================================================
// Host API (implemented in codec/kernels_host.cc; asynchronous on `stream`)
// =============================================================================
// Return values are CUresult codes (0 = success; the same numbers as
// cudaError_t). The launches go through the DriverApi of cuda_driver.h, which
// xla_ffi/emulated_driver.cc implements on the SIMT emulator for the FFI
// contract test (a link-time seam; the handlers and this API are unchanged).

// CUDA versions as cuDriverGetVersion reports them (1000 * major + 10 * minor):
// the CUDA of the NVRTC that compiled the kernels and the newest CUDA the
// installed driver supports (0: no driver).
struct Versions {
  int compiled, driver;
};
int GetVersions(Versions* v);

// Whether a driver supporting CUDA `driver` runs kernels compiled by NVRTC of
// CUDA `compiled`: the CUBINs need a driver of the same major or newer (CUDA's
// minor-version compatibility; the driver API used needs >= 12.0 in any case).
inline bool DriverSupports(int driver, int compiled) {
  return driver >= 12000 && driver / 1000 >= compiled / 1000;
}

// Null when the driver can run the kernels, else a message naming both
// versions and the minimum driver of the build (the driver is loaded once per
// process; the handlers call this before every launch, a version compare).
const char* DriverError();

// The message of DriverError for these versions ("12.2" style) and the build's
// minimum driver (e.g. "525.60.13").
inline std::string DriverMismatchMessage(int driver, int compiled, const char* min_driver) {
  auto ver = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  const std::string have =
      driver ? "the NVIDIA driver supports CUDA " + ver(driver) : std::string("no CUDA driver was found");
  return "zipccl_jax: " + have + ", but its CUDA kernels were compiled for CUDA " + ver(compiled) +
         " (NVRTC), which needs a driver for CUDA " + std::to_string(compiled / 1000) + ".x (>= " +
         min_driver + "). Update the NVIDIA driver, or rebuild zipccl_jax next to the jax-cuda plugin " +
         "the driver supports (pip install .); `python -m zipccl_jax.info` shows both versions.";
}

// Encodes `frames` frames of n elements each (x: frames * n elements, device
// memory) into payload (frames * cap bytes) and writes each frame's exact size
// to nbytes (int32 or int64 per frame). Semantics equal those of
// cpu::EncodeFrame applied per frame. skip (nullable, device memory, one byte
// per frame): a frame with a non-zero flag is not coded (its blocks are neither
// histogrammed, planned nor written), its payload row is all zero and its size 0. scratch holds L.scratch_bytes bytes
// (256-byte aligned); L comes from MakeEncodeLayout.
// The caller guarantees that MaxEncodedBytes(n) fits nbytes' type.
int EncodeAsync(const void* x, uint8_t dtype, bool checksum, uint8_t* payload, uint64_t cap,
                void* nbytes, bool nbytes64, const uint8_t* skip, const EncodeLayout& L,
                void* scratch, CUstream_st* stream);

// Decodes frames (payload: frames * cap bytes) into out: frame f's n elements start at element
// f * out_row of out (out_row >= n; n: frames * n contiguous elements).
// A rejected frame's elements are set to NaN; status (nullable, int32 per
// frame) receives 0 or the Status code of the first error, as the CPU driver
// would report it. skip (nullable, device memory, one byte per frame): a frame
// with a non-zero flag is not read, its elements are zero and its status 0.
int DecodeAsync(const uint8_t* payload, uint64_t cap, uint8_t dtype, void* out, uint64_t out_row,
                int32_t* status, const uint8_t* skip, const DecodeLayout& L, void* scratch,
                CUstream_st* stream);

// A CUresult's message (cuGetErrorString), or a generic one without a driver.
const char* ErrorString(int cuda_error);

}  // namespace zipccl::cuda
