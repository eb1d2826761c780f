// LoadDriver of cuda_driver.h on the real driver: dlopen("libcuda.so.1") at
// first use, every function through cuGetProcAddress for CUDA 12.0, so each
// gets the ABI cuda_driver.h declares (cuCtxPushCurrent -> the _v2 entry, ...)
// whatever the driver's own version.
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <type_traits>

#include "cuda_driver.h"

namespace zipccl::cuda {
namespace {

constexpr int kApiVersion = 12000;  // the CUDA version whose signatures cuda_driver.h declares

using GetProcAddress = CUresult (*)(const char* symbol, void** fn, int cuda_version, unsigned long long flags);
using GetProcAddressV2 = CUresult (*)(const char* symbol, void** fn, int cuda_version, unsigned long long flags,
                                      int* symbol_status);

std::string Load(DriverApi* d, int* version) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return std::string("cannot load libcuda.so.1: ") + dlerror();
  // cuGetProcAddress_v2 (drivers >= 12.0) or the 4-argument cuGetProcAddress of CUDA 11.3+, which older
  // drivers export (cuda.h maps the name to _v2 for callers built against CUDA >= 12.0).
  auto get_v2 = reinterpret_cast<GetProcAddressV2>(dlsym(lib, "cuGetProcAddress_v2"));
  auto get_v1 = reinterpret_cast<GetProcAddress>(dlsym(lib, "cuGetProcAddress"));
  if (get_v2 == nullptr && get_v1 == nullptr)
    return "libcuda.so.1 has no cuGetProcAddress (a driver older than CUDA 11.3)";
  auto get = [&](const char* name, void** p) {
    int status = 0;
    return get_v2 ? get_v2(name, p, kApiVersion, /*CU_GET_PROC_ADDRESS_DEFAULT=*/0, &status)
                  : get_v1(name, p, kApiVersion, 0);
  };
  std::string missing;
  auto resolve = [&](const char* name, auto** fn) {
    void* p = nullptr;
    if (get(name, &p) != kCudaSuccess || p == nullptr)
      missing += std::string(missing.empty() ? "" : ", ") + name;
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
  };
  resolve("cuDriverGetVersion", &d->cuDriverGetVersion);
  if (d->cuDriverGetVersion) d->cuDriverGetVersion(version);
  resolve("cuInit", &d->cuInit);
  resolve("cuGetErrorString", &d->cuGetErrorString);
  resolve("cuStreamGetCtx", &d->cuStreamGetCtx);
  resolve("cuCtxPushCurrent", &d->cuCtxPushCurrent);
  resolve("cuCtxPopCurrent", &d->cuCtxPopCurrent);
  resolve("cuCtxGetDevice", &d->cuCtxGetDevice);
  resolve("cuDeviceGetAttribute", &d->cuDeviceGetAttribute);
  resolve("cuLibraryLoadData", &d->cuLibraryLoadData);
  resolve("cuLibraryGetKernel", &d->cuLibraryGetKernel);
  resolve("cuLaunchKernel", &d->cuLaunchKernel);
  if (!missing.empty()) {
    return "the CUDA driver (CUDA " + std::to_string(*version / 1000) + "." +
           std::to_string(*version % 1000 / 10) + ") lacks " + missing + " (the codec needs CUDA 12.0 or newer)";
  }
  if (CUresult err = d->cuInit(0); err != kCudaSuccess) {
    const char* s = nullptr;
    d->cuGetErrorString(err, &s);
    return std::string("cuInit failed: ") + (s ? s : "unknown error");
  }
  return "";
}

}  // namespace

const DriverApi* LoadDriver(const char** why, int* driver_version) {
  static DriverApi api{};
  static std::string error;
  static int version = 0;
  static std::once_flag once;
  std::call_once(once, [] { error = Load(&api, &version); });
  *driver_version = version;
  if (!error.empty()) {
    *why = error.c_str();
    return nullptr;
  }
  return &api;
}

}  // namespace zipccl::cuda
