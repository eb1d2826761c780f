// The kernel images of a build (cmake/nvrtc_build.py): one CUBIN per shipped
// architecture and PTX for the others, embedded byte for byte in the
// extension by the generated kernel_images.cc (xla_ffi/emulated_driver.cc
// supplies stand-ins for the FFI contract test).
#pragma once

#include <cstddef>

namespace zipccl::cuda {

struct KernelImage {
  int arch;                   // 80: sm_80 CUBIN, or compute_80 PTX when `ptx`
  bool ptx;                   // PTX text, NUL-terminated at data[size]
  const unsigned char* data;
  size_t size;
};

// The images, CUBINs first in ascending arch, then the PTX.
const KernelImage* KernelImages(int* count);

// The image to load on a device of compute capability `cc` (e.g. 86), or null
// when the build has none for it: the CUBIN of the same major and the highest
// minor <= the device's (SASS runs on later minors of its major), else the PTX
// if its arch is <= cc (the driver compiles it, which needs a driver of the
// NVRTC's CUDA version or newer).
inline const KernelImage* ChooseImage(const KernelImage* images, int count, int cc) {
  const KernelImage* best = nullptr;
  for (int i = 0; i < count; ++i) {
    const KernelImage& im = images[i];
    if (!im.ptx && im.arch / 10 == cc / 10 && im.arch <= cc && (best == nullptr || im.arch > best->arch))
      best = &im;
  }
  if (best) return best;
  for (int i = 0; i < count; ++i)
    if (images[i].ptx && images[i].arch <= cc) return &images[i];
  return nullptr;
}

}  // namespace zipccl::cuda
