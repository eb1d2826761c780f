// CUDA FFI adapters: decode operands and attributes, validate shapes, take
// scratch from XLA's allocator, then enqueue the codec kernels on XLA's stream.
// No format logic, no cudaMalloc, no stream synchronisation.
//
// Operands and results are those of the CPU handlers (xla_ffi/handlers_cpu.cc):
// the last payload dimension is the per-frame capacity and every leading
// dimension counts frames. The decoder additionally accepts an optional second
// result, int32[frames], that receives each frame's status (0 = ok, else the
// Status code of codec/format.h): a GPU handler cannot report a data-dependent
// error without synchronising, so a rejected frame decodes to NaNs and the
// status says why.
//
// Both handlers take the CPU handlers' optional last operand `skip` (bool or
// uint8 per frame, device memory): a skipped frame is not coded (zero payload
// row, nbytes 0) / not read (zero output row, status 0). The kernels test the
// flag per block or frame and return early, so a skipped frame costs no coding
// work; the encoder still launches its CTAs over all frames (the grid is sized
// on the host, which cannot read the device-resident flags without a sync).
//
// Not command-buffer compatible: the scratch comes from XLA's allocator at run
// time, which CUDA-graph capture forbids (XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER
// _COMPATIBLE condition 2), so XLA runs these calls outside command buffers.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "codec/cuda_launch.cuh"
#include "codec/format.h"
#include "operands.h"
#include "handlers.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using zipccl::ffi_operands::Invalid;

ffi::Error CudaError(const char* what, int err) {
  return ffi::Error::Internal(std::string(what) + ": " + zipccl::cuda::ErrorString(err));
}

// Scratch of `bytes` bytes (none for 0), 256-byte aligned.
ffi::ErrorOr<void*> Scratch(ffi::ScratchAllocator& alloc, uint64_t bytes, const char* what) {
  if (bytes == 0) return static_cast<void*>(nullptr);
  std::optional<void*> p = alloc.Allocate(size_t(bytes), size_t(zipccl::cuda::kScratchAlign));
  if (!p.has_value() || *p == nullptr)
    return ffi::Unexpected(ffi::Error(ffi::ErrorCode::kResourceExhausted,
                                      std::string(what) + ": cannot allocate " +
                                          std::to_string(bytes) + " bytes of scratch"));
  return *p;
}

ffi::Error EncodeImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer x,
                      ffi::RemainingArgs extra, bool checksum,
                      ffi::Result<ffi::Buffer<ffi::U8>> payload,
                      ffi::Result<ffi::AnyBuffer> nbytes) {
  zipccl::ffi_operands::EncodeCall call;
  if (ffi::Error e = zipccl::ffi_operands::CheckEncode(x, *payload, *nbytes, &call); e.failure()) return e;
  const uint8_t* skip = nullptr;
  if (ffi::Error e = zipccl::ffi_operands::CheckEncodeSkip(extra, *nbytes, &skip); e.failure()) return e;
  const uint8_t dtype = call.dtype;
  const uint64_t frames = call.frames, n = call.n, cap = call.cap_bytes;
  if (frames == 0) return ffi::Error::Success();
  // The size is only known on the device, so int32 sizes are refused up front
  // whenever a frame could exceed them (the CPU handler checks the actual size).
  if (!call.nbytes64 && zipccl::MaxEncodedBytes(n, dtype) > uint64_t(INT32_MAX))
    return Invalid("zipccl encode: a frame may exceed 2^31-1 bytes; enable jax_enable_x64 for int64 sizes");
  const uint64_t total = frames * zipccl::NumBlocks(n);
  if (total > uint64_t(INT32_MAX))
    return Invalid("zipccl encode: too many blocks for one call");
  uint64_t cub_bytes = 0;
  if (total) {
    int err = zipccl::cuda::ScanTempBytes(total + 1, &cub_bytes);
    if (err) return CudaError("zipccl encode: cub scan size query", err);
  }
  const zipccl::cuda::EncodeLayout L = zipccl::cuda::MakeEncodeLayout(frames, n, cub_bytes);
  ffi::ErrorOr<void*> s = Scratch(scratch, L.scratch_bytes, "zipccl encode");
  if (s.has_error()) return s.error();
  int err = zipccl::cuda::EncodeAsync(x.untyped_data(), dtype, checksum, payload->typed_data(), cap,
                                      nbytes->untyped_data(), call.nbytes64, skip, L,
                                      s.value(), stream);
  if (err) return CudaError("zipccl encode: kernel launch", err);
  return ffi::Error::Success();
}

ffi::Error DecodeImpl(cudaStream_t stream, ffi::ScratchAllocator scratch,
                      ffi::Buffer<ffi::U8> payload, ffi::RemainingArgs extra_args,
                      ffi::Result<ffi::AnyBuffer> out, ffi::RemainingRets extra) {
  zipccl::ffi_operands::DecodeCall call;
  if (ffi::Error e = zipccl::ffi_operands::CheckDecode(payload, *out, &call); e.failure()) return e;
  const uint8_t* skip = nullptr;
  if (ffi::Error e = zipccl::ffi_operands::CheckDecodeSkip(extra_args, payload, &skip); e.failure())
    return e;
  int32_t* status = nullptr;
  if (ffi::Error e = zipccl::ffi_operands::CheckDecodeStatus(extra, call.frames, &status); e.failure())
    return e;
  const uint8_t dtype = call.dtype;
  const uint64_t frames = call.frames, n = call.n, cap = call.cap_bytes;
  if (frames == 0) return ffi::Error::Success();
  const uint64_t total = frames * zipccl::NumBlocks(n);
  if (total > uint64_t(INT32_MAX))
    return Invalid("zipccl decode: too many blocks for one call");
  uint64_t cub_bytes = 0;
  if (total) {
    int err = zipccl::cuda::ScanTempBytes(total + 1, &cub_bytes);
    if (err) return CudaError("zipccl decode: cub scan size query", err);
  }
  const zipccl::cuda::DecodeLayout L = zipccl::cuda::MakeDecodeLayout(frames, n, cub_bytes);
  ffi::ErrorOr<void*> s = Scratch(scratch, L.scratch_bytes, "zipccl decode");
  if (s.has_error()) return s.error();
  int err = zipccl::cuda::DecodeAsync(payload.typed_data(), cap, dtype, out->untyped_data(),
                                      status, skip, L, s.value(), stream);
  if (err) return CudaError("zipccl decode: kernel launch", err);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEncodeCuda, EncodeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::AnyBuffer>()           // x
                                  .RemainingArgs()                 // optional skip: bool/u8, nbytes' shape
                                  .Attr<bool>("checksum")
                                  .Ret<ffi::Buffer<ffi::U8>>()     // payload
                                  .Ret<ffi::AnyBuffer>());         // nbytes

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecodeCuda, DecodeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::Buffer<ffi::U8>>()     // payload
                                  .RemainingArgs()                 // optional skip: bool/u8, payload dims[:-1]
                                  .Ret<ffi::AnyBuffer>()           // out
                                  .RemainingRets());               // optional int32 status
