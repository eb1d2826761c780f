// The part of the CUDA driver API (libcuda.so.1) the codec's host side uses,
// declared here so that the extension builds without any CUDA header or
// toolkit: opaque handles, CUresult codes, and the functions' documented
// signatures (cuda.h of CUDA 12.0, the versions cuGetProcAddress returns for
// cudaVersion 12000). No CUDA runtime is linked: the kernels are NVRTC images
// launched with cuLaunchKernel, so the only requirement on the host is a driver
// that loads those images (see ZIPCCL_CUDA_MIN_DRIVER in CMakeLists.txt).
//
// Two implementations of LoadDriver: codec/cuda_driver.cc (dlopen of
// libcuda.so.1 at first use; the extension still imports without a driver) and
// xla_ffi/emulated_driver.cc (a mock whose launches run the SIMT emulator; the
// FFI contract test links it instead, a link-time seam).
#pragma once

#include <cstddef>

struct CUstream_st;  // cudaStream_t == CUstream == CUstream_st*

namespace zipccl::cuda {

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUlibrary = struct CUlib_st*;
using CUkernel = struct CUkern_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = CUstream_st*;

// CUresult codes used by name (cuda.h's values; the same as cudaError_t's).
constexpr CUresult kCudaSuccess = 0;
constexpr CUresult kCudaErrorInvalidValue = 1;
constexpr CUresult kCudaErrorNoBinaryForGpu = 209;
constexpr CUresult kCudaErrorUnsupportedPtxVersion = 222;
constexpr CUresult kCudaErrorNotFound = 500;
constexpr CUresult kCudaErrorLaunchFailed = 719;
// CUdevice_attribute values.
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;

struct DriverApi {
  CUresult (*cuInit)(unsigned flags);
  CUresult (*cuDriverGetVersion)(int* version);  // 1000 * major + 10 * minor
  CUresult (*cuGetErrorString)(CUresult error, const char** str);
  CUresult (*cuStreamGetCtx)(CUstream stream, CUcontext* ctx);
  CUresult (*cuCtxPushCurrent)(CUcontext ctx);   // exported as cuCtxPushCurrent_v2
  CUresult (*cuCtxPopCurrent)(CUcontext* ctx);   // exported as cuCtxPopCurrent_v2
  CUresult (*cuCtxGetDevice)(CUdevice* device);
  CUresult (*cuDeviceGetAttribute)(int* value, int attribute, CUdevice device);
  // Context-independent loading (CUDA >= 12.0): the library is loaded into a
  // context when a kernel of it first runs there.
  CUresult (*cuLibraryLoadData)(CUlibrary* library, const void* code, void* jit_options, void** jit_values,
                                unsigned n_jit_options, void* library_options, void** library_values,
                                unsigned n_library_options);
  CUresult (*cuLibraryGetKernel)(CUkernel* kernel, CUlibrary library, const char* name);
  // A CUkernel cast to CUfunction is launched in the context of `stream`.
  CUresult (*cuLaunchKernel)(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                             unsigned block_y, unsigned block_z, unsigned shared_bytes, CUstream stream,
                             void** params, void** extra);
};

// The driver, loaded and initialised (cuInit) at the first call; null with
// *why set when there is none (no libcuda.so.1, a symbol missing, or cuInit
// failing), e.g. on a machine without an NVIDIA driver. *driver_version: what
// cuDriverGetVersion reports (0 without libcuda.so.1), also when null is
// returned, so a too-old driver can be named.
const DriverApi* LoadDriver(const char** why, int* driver_version);

}  // namespace zipccl::cuda
