// The host API of codec/cuda_launch.cuh (ScanTempBytes, EncodeAsync,
// DecodeAsync, GetVersions, DriverError, ErrorString) implemented on the SIMT
// emulator of simt_emulator.h: linked in place of codec/kernels.cu, it lets
// the real CUDA FFI handlers (handlers_cuda.cc) run on a machine without a GPU.
// Device memory is host memory. Each call runs synchronously, so the emulated
// "stream" is only recorded. The knobs below let a test check what the
// handlers passed and inject the failures a GPU can produce.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace zipccl::cuda::emulated {

// What the handler passed on its last EncodeAsync / DecodeAsync call.
struct LastCall {
  CUstream_st* stream = nullptr;
  const void* scratch = nullptr;
  uint64_t scratch_bytes = 0;
  uint64_t launches = 0;  // kernel launches + scans of that call
};
const LastCall& Last();

// The CUB temporary bytes ScanTempBytes reports (a device-dependent number on a
// GPU; any value must work).
void SetScanTempBytes(uint64_t bytes);
// The driver's CUDA version GetVersions reports (default: the runtime's, so
// DriverError is null); DriverError re-evaluates it on every call.
void SetDriverVersion(int driver);
constexpr int kRuntimeVersion = 12090;  // what GetVersions reports as the runtime
constexpr const char* kMinDriver = "525.60.13";
// The next EncodeAsync / DecodeAsync returns this cudaError_t code without
// launching (0: none).
void FailNextCall(int cuda_error);
// Seed of thread order, CTA order and garbage fills.
void SetSeed(uint64_t seed);

// cudaError_t codes the emulator returns.
constexpr int kErrorInvalidValue = 1;         // cudaErrorInvalidValue
constexpr int kErrorMisalignedAddress = 716;  // cudaErrorMisalignedAddress

}  // namespace zipccl::cuda::emulated
