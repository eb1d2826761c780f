// A mock CUDA driver (the DriverApi of codec/cuda_driver.h) whose launches run
// the kernel bodies on the SIMT emulator of simt_emulator.h, and stand-in
// kernel images. Linked in place of codec/cuda_driver.cc and the generated
// kernel_images.cc, it lets the real CUDA FFI handlers (handlers_cuda.cc) and
// the real launch layer (codec/kernels_host.cc) run on a machine without a GPU.
// Device memory is host memory; each launch runs synchronously.
//
// It refuses what the real driver refuses where the launch layer could get it
// wrong: a kernel name not in the library (CUDA_ERROR_NOT_FOUND), an image that
// was not one of the build's, a CUBIN of another architecture
// (CUDA_ERROR_NO_BINARY_FOR_GPU), PTX newer than the driver
// (CUDA_ERROR_UNSUPPORTED_PTX_VERSION), more threads per CTA than the kernel's
// __launch_bounds__, static + dynamic shared memory over 48 KB, a grid outside
// [1, 2^31 - 1] x 1 x 1 (all CUDA_ERROR_INVALID_VALUE); and, stricter than the
// driver, fewer threads than the body needs. The knobs below let a test check
// what the launch layer passed and inject what a GPU can do.
#pragma once

#include <cstddef>
#include <cstdint>

#include "codec/cuda_driver.h"

namespace zipccl::cuda::emulated {

// The launches since the last cuStreamGetCtx (the launch layer asks for the
// stream's context once per EncodeAsync / DecodeAsync call, and for the
// context's device only the first time it sees the context).
struct LastCall {
  CUstream_st* stream = nullptr;  // the stream of the last launch
  uint64_t launches = 0;
  int image_arch = 0;             // the image the call's library was loaded from (80, 90, ...)
  bool image_ptx = false;
  int device_queries = 0;         // cuCtxGetDevice calls (the launch layer remembers a context's device)
};
const LastCall& Last();

// The driver's CUDA version (default 13000); LoadDriver reports it on every call.
void SetDriverVersion(int driver);
// The compute capability of the device (default 80).
void SetComputeCapability(int cc);
// The next launch returns this CUresult without running (0: none).
void FailNextLaunch(int cuda_error);
// cuLibraryGetKernel does not find this name (null: every kernel is there).
void HideKernel(const char* name);
// Seed of thread order, CTA order and garbage fills.
void SetSeed(uint64_t seed);

// The mock's cuLaunchKernel, for tests of its refusals.
CUresult LaunchKernel(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                      unsigned block_y, unsigned block_z, unsigned shared_bytes, CUstream stream, void** params,
                      void** extra);
// A kernel handle of the mock library (for LaunchKernel), or null.
CUfunction KernelHandle(const char* name);

constexpr size_t kMaxSharedBytes = 48 * 1024;  // without the opt-in attribute

}  // namespace zipccl::cuda::emulated
