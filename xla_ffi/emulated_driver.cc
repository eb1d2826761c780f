// See emulated_driver.h.
#include "emulated_driver.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include "codec/cuda_launch.cuh"
#include "codec/kernel_images.h"
#include "simt_emulator.h"

namespace zipccl::cuda {
namespace {

// What the mock knows of each kernel of the build: its entry name, its launch
// bounds, its static shared memory and how to run it on the emulator.
struct EmuKernel {
  const char* name;
  unsigned threads;
  size_t static_shared;
  void (*run)(uint64_t grid, const void* params, uint64_t seed);
};

template <class K>
void RunOnEmulator(uint64_t grid, const void* params, uint64_t seed) {
  emu::EmuLauncher l(/*execute=*/true, seed);
  l.Launch<K>(grid, *static_cast<const typename K::Params*>(params));
}

// DeviceCta's warp totals (codec/kernels.cu) come on top of the body's Shared.
#define ZIPCCL_EMU_KERNEL(sym, ...)                                                          \
  {#sym, unsigned(__VA_ARGS__::kBlockThreads),                                               \
   sizeof(__VA_ARGS__::Shared) + sizeof(uint32_t) * (__VA_ARGS__::kBlockThreads / 32), \
   &RunOnEmulator<__VA_ARGS__>},
const EmuKernel kKernels[] = {ZIPCCL_CUDA_KERNELS(ZIPCCL_EMU_KERNEL)};
#undef ZIPCCL_EMU_KERNEL

// Stand-ins for the NVRTC images: the mock only checks that it is given one of them.
const unsigned char kFakeImage[3][8] = {"sm_80", "sm_90", "ptx_80"};
const KernelImage kImages[] = {{80, false, kFakeImage[0], 6}, {90, false, kFakeImage[1], 6},
                               {80, true, kFakeImage[2], 6}};

struct State {
  emulated::LastCall last;
  int driver = 13000;
  int cc = 80;
  int fail_next = 0;
  std::string hidden;
  uint64_t seed = 1;
  int libraries = 0;
};
State& S() {
  static State s;
  return s;
}

int Library(CUlibrary lib) { return int(reinterpret_cast<uintptr_t>(lib)); }

CUresult Init(unsigned) { return 0; }
CUresult DriverGetVersion(int* v) { return *v = S().driver, 0; }
CUresult GetErrorString(CUresult err, const char** s) {
  switch (err) {
    case kCudaSuccess: *s = "no error"; break;
    case kCudaErrorInvalidValue: *s = "invalid argument (emulated)"; break;
    case kCudaErrorNoBinaryForGpu: *s = "no kernel image is available for execution on the device (emulated)"; break;
    case kCudaErrorUnsupportedPtxVersion: *s = "the provided PTX was compiled with an unsupported toolchain (emulated)"; break;
    case kCudaErrorNotFound: *s = "named symbol not found (emulated)"; break;
    case kCudaErrorLaunchFailed: *s = "unspecified launch failure (emulated)"; break;
    default: *s = nullptr; return kCudaErrorInvalidValue;
  }
  return 0;
}
// Every stream is on "the" device, whose compute capability a test may change: as a GPU of another
// compute capability is another device, each cc has its own (primary) context, device number cc.
CUcontext ContextOf(int cc) { return reinterpret_cast<CUcontext>(uintptr_t(0x1000 + cc)); }
thread_local CUcontext current = nullptr;

CUresult StreamGetCtx(CUstream stream, CUcontext* ctx) {
  if (stream == nullptr) return kCudaErrorInvalidValue;  // XLA always passes its stream
  S().last = emulated::LastCall{};
  *ctx = ContextOf(S().cc);
  return 0;
}
CUresult CtxPushCurrent(CUcontext ctx) {
  if (ctx != ContextOf(S().cc)) return kCudaErrorInvalidValue;  // CUDA_ERROR_INVALID_CONTEXT
  current = ctx;
  return 0;
}
CUresult CtxPopCurrent(CUcontext* ctx) { return *ctx = std::exchange(current, nullptr), 0; }
CUresult CtxGetDevice(CUdevice* dev) {
  if (current == nullptr) return kCudaErrorInvalidValue;  // CUDA_ERROR_INVALID_CONTEXT: none is current
  ++S().last.device_queries;
  return *dev = CUdevice(reinterpret_cast<uintptr_t>(current) - 0x1000), 0;
}
CUresult DeviceGetAttribute(int* v, int attr, CUdevice dev) {
  if (attr == kAttrComputeCapabilityMajor) return *v = dev / 10, 0;
  if (attr == kAttrComputeCapabilityMinor) return *v = dev % 10, 0;
  return kCudaErrorInvalidValue;
}
CUresult LibraryLoadData(CUlibrary* lib, const void* code, void*, void**, unsigned, void*, void**, unsigned) {
  State& s = S();
  for (const KernelImage& im : kImages) {
    if (im.data != code) continue;
    if (im.ptx && s.driver < ZIPCCL_CUDA_VERSION) return kCudaErrorUnsupportedPtxVersion;
    if (!im.ptx && (im.arch / 10 != s.cc / 10 || im.arch > s.cc)) return kCudaErrorNoBinaryForGpu;
    if (im.ptx && im.arch > s.cc) return kCudaErrorNoBinaryForGpu;
    s.last.image_arch = im.arch;
    s.last.image_ptx = im.ptx;
    *lib = reinterpret_cast<CUlibrary>(uintptr_t(++s.libraries));
    return 0;
  }
  return kCudaErrorInvalidValue;  // not an image of this build
}
CUresult LibraryGetKernel(CUkernel* k, CUlibrary lib, const char* name) {
  if (Library(lib) < 1 || Library(lib) > S().libraries) return kCudaErrorInvalidValue;
  if (S().hidden == name) return kCudaErrorNotFound;
  for (const EmuKernel& e : kKernels)
    if (std::strcmp(e.name, name) == 0) return *k = reinterpret_cast<CUkernel>(const_cast<EmuKernel*>(&e)), 0;
  return kCudaErrorNotFound;
}

const DriverApi kApi = {&Init, &DriverGetVersion, &GetErrorString, &StreamGetCtx, &CtxPushCurrent,
                        &CtxPopCurrent, &CtxGetDevice, &DeviceGetAttribute, &LibraryLoadData,
                        &LibraryGetKernel, &emulated::LaunchKernel};

}  // namespace

const DriverApi* LoadDriver(const char**, int* driver_version) {
  *driver_version = S().driver;
  return &kApi;
}

const KernelImage* KernelImages(int* count) {
  *count = int(sizeof(kImages) / sizeof(kImages[0]));
  return kImages;
}

namespace emulated {

CUresult LaunchKernel(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                      unsigned block_y, unsigned block_z, unsigned shared_bytes, CUstream stream, void** params,
                      void** extra) {
  State& s = S();
  const auto* k = reinterpret_cast<const EmuKernel*>(f);
  if (k < kKernels || k >= kKernels + sizeof(kKernels) / sizeof(kKernels[0])) return kCudaErrorInvalidValue;
  if (grid_x == 0 || grid_x > 0x7FFFFFFFu || grid_y != 1 || grid_z != 1) return kCudaErrorInvalidValue;
  if (block_y != 1 || block_z != 1 || block_x != k->threads) return kCudaErrorInvalidValue;
  if (k->static_shared + shared_bytes > kMaxSharedBytes) return kCudaErrorInvalidValue;
  if (params == nullptr || params[0] == nullptr || extra != nullptr) return kCudaErrorInvalidValue;
  s.last.stream = stream;
  ++s.last.launches;
  if (int err = s.fail_next) {
    s.fail_next = 0;
    return err;
  }
  try {
    k->run(grid_x, params[0], s.seed++);
  } catch (const std::exception& e) {  // a kernel bug the emulator caught, as a launch failure
    std::fprintf(stderr, "%s\n", e.what());
    return kCudaErrorLaunchFailed;
  }
  return 0;
}

CUfunction KernelHandle(const char* name) {
  for (const EmuKernel& e : kKernels)
    if (std::strcmp(e.name, name) == 0) return reinterpret_cast<CUfunction>(const_cast<EmuKernel*>(&e));
  return nullptr;
}

const LastCall& Last() { return S().last; }
void SetDriverVersion(int driver) { S().driver = driver; }
void SetComputeCapability(int cc) { S().cc = cc; }
void FailNextLaunch(int cuda_error) { S().fail_next = cuda_error; }
void HideKernel(const char* name) { S().hidden = name ? name : ""; }
void SetSeed(uint64_t seed) { S().seed = seed; }

}  // namespace emulated
}  // namespace zipccl::cuda
