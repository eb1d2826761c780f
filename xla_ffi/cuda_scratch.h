// The CUDA handlers' scratch, taken as the custom call's last result (handlers_cuda.cc): how many bytes
// the result holds, and where inside it the 256-byte aligned sections of the layout start. One fact for
// both sides: the handlers check the buffer with these functions and the extension's
// cuda_scratch_bytes() (module.cc) gives Python the size to declare, so Python never derives the layout.
// Plain host C++ over the layout functions of codec/cuda_common.cuh (no CUDA toolkit needed); kept out of
// codec/ so that editing it does not rebuild the NVRTC images.
#pragma once

#include <cstdint>

#include "codec/cuda_common.cuh"

namespace zipccl::cuda {

// The alignment the handlers assume of the buffer XLA passes as the scratch result. XLA:GPU aligns every
// buffer it assigns (temporaries and results, i.e. anything but entry parameters and constants) to
// kXlaAllocatedBufferAlignBytes (xla/service/gpu/gpu_constants.h: 128 bytes; BufferAssigner::Run gets it
// as color_alignment in gpu_compiler.cc, and GpuExecutable's CheckAlignment enforces it at run time),
// which is less than the 256 bytes of the kernels' sections (kScratchAlign). The handlers assume only 16
// (kEntryParameterAlignBytes, the weakest alignment any XLA:GPU buffer has), ask for the difference as
// slack and align the sections inside the buffer, as they did with XLA_FFI_DeviceMemory_Allocate, whose
// alignment is capped at 16: 240 bytes a call buy independence from that constant. A buffer that is
// less aligned than assumed is still used correctly when the aligned sections fit, and refused
// (ScratchStart returns null) when they do not.
constexpr uint64_t kScratchResultAlign = 16;
constexpr uint64_t kScratchResultSlack = kScratchAlign - kScratchResultAlign;

// Bytes of the scratch result for a layout of `layout_bytes` (0 stays 0: a call with no block needs none).
inline uint64_t ScratchResultBytes(uint64_t layout_bytes) {
  return layout_bytes ? layout_bytes + kScratchResultSlack : 0;
}
inline uint64_t EncodeScratchResultBytes(uint64_t frames, uint64_t n) {
  return ScratchResultBytes(MakeEncodeLayout(frames, n).scratch_bytes);
}
inline uint64_t DecodeScratchResultBytes(uint64_t frames, uint64_t n) {
  return ScratchResultBytes(MakeDecodeLayout(frames, n).scratch_bytes);
}

// The kScratchAlign-aligned start of `layout_bytes` inside the buffer [data, data + size), or null when
// they do not fit there. `data` may be null for layout_bytes == 0.
inline uint8_t* ScratchStart(void* data, uint64_t size, uint64_t layout_bytes) {
  if (layout_bytes == 0) return static_cast<uint8_t*>(data);
  const uintptr_t at = reinterpret_cast<uintptr_t>(data);
  const uint64_t skip = AlignUp(at, kScratchAlign) - at;
  if (data == nullptr || skip > size || size - skip < layout_bytes) return nullptr;
  return static_cast<uint8_t*>(data) + skip;
}

}  // namespace zipccl::cuda
