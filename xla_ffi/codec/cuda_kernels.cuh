// CUDA driver of the zipccl codec: the list of kernels a build contains, in one
// place. codec/kernels.cu (device code, compiled by NVRTC) defines one
// extern "C" __global__ entry per line; the host launcher (codec/kernels_host.cc)
// and the emulator look entries up by the same names through KernelSymbol<K>.
// extern "C" names keep the host free of C++ name mangling: they are the names
// cuLibraryGetKernel resolves and cuobjdump prints.
#pragma once

#include "cuda_decode.cuh"
#include "cuda_encode.cuh"
#include "cuda_scan.cuh"

// X(symbol, kernel struct): every kernel the launch sequences of
// cuda_launch.cuh can launch, per element width where the body is a template.
#define ZIPCCL_CUDA_KERNELS(X)                          \
  X(zipccl_analyse_u8, AnalyseKernel<uint8_t>)          \
  X(zipccl_analyse_u16, AnalyseKernel<uint16_t>)        \
  X(zipccl_analyse_u32, AnalyseKernel<uint32_t>)        \
  X(zipccl_scan, ScanKernel)                            \
  X(zipccl_write_u8, WriteKernel<uint8_t>)              \
  X(zipccl_write_u16, WriteKernel<uint16_t>)            \
  X(zipccl_write_u32, WriteKernel<uint32_t>)            \
  X(zipccl_finish, FinishEncodeKernel)                  \
  X(zipccl_zero_tail, ZeroTailKernel)                   \
  X(zipccl_frame_check, FrameCheckKernel)               \
  X(zipccl_dir, DirKernel)                              \
  X(zipccl_decode_block_u8, DecodeBlockKernel<uint8_t>) \
  X(zipccl_decode_block_u16, DecodeBlockKernel<uint16_t>) \
  X(zipccl_decode_block_u32, DecodeBlockKernel<uint32_t>) \
  X(zipccl_poison_u8, PoisonKernel<uint8_t>)            \
  X(zipccl_poison_u16, PoisonKernel<uint16_t>)          \
  X(zipccl_poison_u32, PoisonKernel<uint32_t>)          \
  X(zipccl_status, StatusKernel)

namespace zipccl::cuda {

// Dense ids of the kernels (k_zipccl_hist_u8, ...), for per-kernel tables.
enum KernelId : int {
#define ZIPCCL_KERNEL_ID(sym, ...) k_##sym,
  ZIPCCL_CUDA_KERNELS(ZIPCCL_KERNEL_ID)
#undef ZIPCCL_KERNEL_ID
  kNumKernels
};

// KernelSymbol<K>: the extern "C" name of kernel struct K's entry and its id.
template <class K>
struct KernelSymbol;
#define ZIPCCL_KERNEL_SYMBOL(sym, ...)            \
  template <>                                     \
  struct KernelSymbol<__VA_ARGS__> {              \
    static constexpr const char* kName = #sym;    \
    static constexpr KernelId kId = k_##sym;      \
  };
ZIPCCL_CUDA_KERNELS(ZIPCCL_KERNEL_SYMBOL)
#undef ZIPCCL_KERNEL_SYMBOL

}  // namespace zipccl::cuda
