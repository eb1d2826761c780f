// Host side of the zipccl CUDA codec: the host API of cuda_launch.cuh over the
// CUDA driver API (cuda_driver.h). The kernels are the NVRTC images of
// kernel_images.h, loaded with cuLibraryLoadData (context-independent) once per
// compute capability and launched with cuLaunchKernel on XLA's stream. No CUDA
// runtime and no CUDA header: plain C++ built by the host compiler, so the
// extension imports on a machine without a driver and fails only at first use.
// No allocation and no synchronisation (the caller provides scratch).
#include <atomic>
#include <mutex>
#include <string>

#include "cuda_driver.h"
#include "cuda_launch.cuh"
#include "kernel_images.h"

// The CUDA version the kernels were compiled for (NVRTC's, 1000 * major + 10 * minor)
// and the oldest driver that runs them; CMake sets both from the NVRTC it used.
#ifndef ZIPCCL_CUDA_VERSION
#error "ZIPCCL_CUDA_VERSION must give the NVRTC version of the kernel images"
#endif
#ifndef ZIPCCL_CUDA_MIN_DRIVER
#error "ZIPCCL_CUDA_MIN_DRIVER must name the minimum driver of the kernel images"
#endif

namespace zipccl::cuda {
namespace {

constexpr int kMaxArchs = 8;  // distinct compute capabilities in one process

// The kernels of one image, loaded for one compute capability.
struct Library {
  int cc = 0;
  CUlibrary lib = nullptr;
  std::atomic<CUkernel> kernels[kNumKernels] = {};  // resolved at first launch
};

constexpr int kMaxContexts = 64;  // contexts whose library is remembered (XLA: one primary context per GPU)

struct Loaded {
  std::mutex mu;
  Library libs[kMaxArchs];
  int n = 0;
  // The library of each context seen, so that a call costs one cuStreamGetCtx instead of six driver calls
  // (contexts live as long as the process under XLA; past kMaxContexts the device is asked every call).
  struct {
    CUcontext ctx;
    Library* lib;
  } by_ctx[kMaxContexts] = {};
  int n_ctx = 0;
};
Loaded& Libraries() {
  static Loaded l;
  return l;
}

// Compute capability (e.g. 86) of the device that owns `ctx`.
CUresult ContextArch(const DriverApi& d, CUcontext ctx, int* cc) {
  if (CUresult err = d.cuCtxPushCurrent(ctx)) return err;
  CUdevice dev = 0;
  int major = 0, minor = 0;
  CUresult err = d.cuCtxGetDevice(&dev);
  if (!err) err = d.cuDeviceGetAttribute(&major, kAttrComputeCapabilityMajor, dev);
  if (!err) err = d.cuDeviceGetAttribute(&minor, kAttrComputeCapabilityMinor, dev);
  CUcontext popped = nullptr;
  const CUresult pop = d.cuCtxPopCurrent(&popped);
  *cc = 10 * major + minor;
  return err ? err : pop;
}

// The library for compute capability cc, loaded at its first use (L.mu held).
CUresult LibraryFor(const DriverApi& d, Loaded& L, int cc, Library** out) {
  for (int i = 0; i < L.n; ++i)
    if (L.libs[i].cc == cc) return *out = &L.libs[i], kCudaSuccess;
  if (L.n == kMaxArchs) return kCudaErrorInvalidValue;
  int count = 0;
  const KernelImage* images = KernelImages(&count);
  const KernelImage* im = ChooseImage(images, count, cc);
  if (im == nullptr) return kCudaErrorNoBinaryForGpu;  // older than the oldest shipped arch
  Library& lib = L.libs[L.n];
  if (CUresult err = d.cuLibraryLoadData(&lib.lib, im->data, nullptr, nullptr, 0, nullptr, nullptr, 0))
    return err;
  lib.cc = cc;
  *out = &L.libs[L.n++];
  return kCudaSuccess;
}

// The library for the device of `stream`'s context.
CUresult StreamLibrary(const DriverApi& d, CUstream stream, Library** out) {
  CUcontext ctx = nullptr;
  if (CUresult err = d.cuStreamGetCtx(stream, &ctx)) return err;
  Loaded& L = Libraries();
  std::lock_guard<std::mutex> lock(L.mu);
  for (int i = 0; i < L.n_ctx; ++i)
    if (L.by_ctx[i].ctx == ctx) return *out = L.by_ctx[i].lib, kCudaSuccess;
  int cc = 0;
  if (CUresult err = ContextArch(d, ctx, &cc)) return err;
  if (CUresult err = LibraryFor(d, L, cc, out)) return err;
  if (L.n_ctx < kMaxContexts) L.by_ctx[L.n_ctx++] = {ctx, *out};
  return kCudaSuccess;
}

// Launches on one stream; stops at the first error.
struct DriverLauncher {
  const DriverApi& d;
  CUstream stream;
  Library* lib = nullptr;
  CUresult err = kCudaSuccess;

  template <class K>
  CUresult KernelOf(CUkernel* k) {
    using S = KernelSymbol<K>;
    std::atomic<CUkernel>& slot = lib->kernels[S::kId];
    *k = slot.load(std::memory_order_acquire);
    if (*k != nullptr) return kCudaSuccess;
    if (CUresult e = d.cuLibraryGetKernel(k, lib->lib, S::kName)) return e;
    slot.store(*k, std::memory_order_release);  // racing threads store the same handle
    return kCudaSuccess;
  }

  template <class K>
  void Launch(uint64_t grid, const typename K::Params& p) {
    if (err != kCudaSuccess || grid == 0) return;
    if (grid > uint64_t(0x7FFFFFFF)) {
      err = kCudaErrorInvalidValue;
      return;
    }
    CUkernel k = nullptr;
    if ((err = KernelOf<K>(&k))) return;
    typename K::Params params = p;  // the kernel's single by-value parameter
    void* args[] = {&params};
    err = d.cuLaunchKernel(reinterpret_cast<CUfunction>(k), unsigned(grid), 1, 1, unsigned(K::kBlockThreads), 1,
                           1, /*shared_bytes=*/0, stream, args, nullptr);
  }
};

// The driver and the library for `stream`'s device, or an error code.
template <class Run>
int WithLauncher(CUstream_st* stream, Run run) {
  const char* why = nullptr;
  int version = 0;
  const DriverApi* d = LoadDriver(&why, &version);
  if (d == nullptr) return kCudaErrorNotFound;
  DriverLauncher l{*d, stream};
  if ((l.err = StreamLibrary(*d, stream, &l.lib))) return l.err;
  run(l);
  return l.err;
}

}  // namespace

int EncodeAsync(const void* x, uint8_t dtype, bool checksum, uint8_t* payload, uint64_t cap,
                void* nbytes, bool nbytes64, const uint8_t* skip, const EncodeLayout& L,
                void* scratch, CUstream_st* stream) {
  auto* s = static_cast<uint8_t*>(scratch);
  const EncodeParams p = MakeEncodeParams(L, x, dtype, checksum, payload, cap, nbytes, nbytes64, skip, s);
  return WithLauncher(stream, [&](DriverLauncher& l) { RunEncode(l, p); });
}

int DecodeAsync(const uint8_t* payload, uint64_t cap, uint8_t dtype, void* out, uint64_t out_row,
                int32_t* status, const uint8_t* skip, const DecodeLayout& L, void* scratch,
                CUstream_st* stream) {
  auto* s = static_cast<uint8_t*>(scratch);
  const DecodeParams p = MakeDecodeParams(L, payload, cap, dtype, out, out_row, status, skip, s);
  return WithLauncher(stream, [&](DriverLauncher& l) { RunDecode(l, p); });
}

const char* ErrorString(int cuda_error) {
  // Ours before the driver's: ChooseImage finding no image is the usual source (a driver is there then, so
  // after cuGetErrorString this message would never show).
  if (cuda_error == kCudaErrorNoBinaryForGpu)
    return "no kernel image for this GPU (zipccl_jax ships sm_80+)";
  const char* why = nullptr;
  int version = 0;
  const char* s = nullptr;
  if (const DriverApi* d = LoadDriver(&why, &version); d && d->cuGetErrorString(cuda_error, &s) == 0 && s)
    return s;
  return why ? why : "CUDA error";
}

int GetVersions(Versions* v) {
  const char* why = nullptr;
  v->compiled = ZIPCCL_CUDA_VERSION;
  LoadDriver(&why, &v->driver);  // 0 without a driver
  return 0;
}

// Evaluated on every call (cheap once the driver is loaded), so a test's mock
// driver can change its version.
const char* DriverError() {
  static thread_local std::string message;
  const char* why = nullptr;
  int driver = 0;
  const DriverApi* d = LoadDriver(&why, &driver);
  if (!DriverSupports(driver, ZIPCCL_CUDA_VERSION))
    message = DriverMismatchMessage(driver, ZIPCCL_CUDA_VERSION, ZIPCCL_CUDA_MIN_DRIVER);
  else if (d == nullptr)
    message = std::string("zipccl_jax: the CUDA driver cannot be used: ") + why;
  else
    return nullptr;
  return message.c_str();
}

}  // namespace zipccl::cuda
