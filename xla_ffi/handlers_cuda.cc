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
// Scratch (per-block plans, sizes, offsets, error keys) is the custom call's
// last result, uint8[cuda_scratch_bytes], allocated by XLA like any other
// buffer (codec.py declares it on CUDA only, with the size the extension's
// cuda_scratch_bytes() gives: cuda_scratch.h, from MakeEncodeLayout /
// MakeDecodeLayout). The handlers check its size and align the 256-byte
// sections inside it (cuda_scratch.h says what XLA guarantees and why 240
// bytes of slack cover it). They allocate nothing at run time.
//
// Command-buffer compatible (ffi::Traits::kCmdBufferCompatible here, and the
// COMMAND_BUFFER_COMPATIBLE trait at registration, zipccl_jax/_ffi.py): XLA
// may trace a call into a CUDA graph (stream capture) and replay it. What
// the trait asks (xla/ffi/api/api.h, Traits): (1) only launches that belong in
// the graph: the codec's kernels on XLA's stream, nothing else; (2) only
// device memory passed in as buffers: operands, results and the scratch
// result; (3) no query of the stream's status: no synchronisation, no event,
// no memcpy. The launches depend only on the shapes and the `checksum`
// attribute (grids are sized from frames, elements and capacity; skip flags
// and data are read on the device), so a replay with new buffer addresses
// runs the same kernels. Under capture the handler's host work is a cached
// context lookup and cuLaunchKernel. One call is not a stream operation: the
// first call on a device loads the kernel library (codec/kernels_host.cc,
// cuLibraryLoadData, then cuLibraryGetKernel; the driver loads the module into
// the context at the first launch). XLA runs a command buffer's first
// execution op by op, a warm-up, when it holds collectives or compatible FFI
// custom calls (CustomCallThunk::requires_warmup, openxla/xla#43729; present
// in jaxlib 0.11.2's CUDA plugin), so that load happens outside capture; a
// capture that did meet it and refused it would return the driver's error as
// the launch's. Run in a command buffer on one H200 (xla_ffi/README.md).
//
// Plain host C++ (no CUDA headers: cudaStream_t is CUstream_st*). The kernels
// are reached only through the host API of codec/cuda_launch.cuh
// (codec/kernels_host.cc), which launches through the CUDA driver API of
// codec/cuda_driver.h: libcuda.so.1 in the extension, the SIMT emulator behind
// a mock driver (emulated_driver.cc) in the FFI contract test
// (tests/cc/ffi_contract_test.cc), which drives these very handlers through a
// mock XLA_FFI_Api.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "codec/cuda_launch.cuh"
#include "codec/format.h"
#include "cuda_scratch.h"
#include "operands.h"
#include "handlers.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using zipccl::ffi_operands::Invalid;

ffi::Error CudaError(const char* what, int err) {
  return ffi::Error::Internal(std::string(what) + ": " + zipccl::cuda::ErrorString(err));
}

// The driver can run the kernels (the handlers check it before every launch).
ffi::Error CheckDriver() {
  if (const char* why = zipccl::cuda::DriverError())
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition, why);
  return ffi::Error::Success();
}

// Before any launch: the driver can run the kernels and the call's blocks fit
// the kernels' int32 grid (`what` names the operation in messages).
ffi::Error PrepareLaunch(uint64_t frames, uint64_t n, const char* what) {
  if (ffi::Error e = CheckDriver(); e.failure()) return e;
  if (frames * zipccl::NumBlocks(n) > uint64_t(INT32_MAX))
    return Invalid(std::string(what) + ": too many blocks for one call");
  return ffi::Error::Success();
}

// The kScratchAlign-aligned start of the layout's `layout_bytes` inside the
// scratch result, or kInvalidArgument naming what the call needs and what it
// got (`what` names the operation and the call's shape).
ffi::ErrorOr<uint8_t*> ScratchOf(const ffi::AnyBuffer& scratch, uint64_t layout_bytes,
                                 const std::string& what) {
  namespace cu = zipccl::cuda;
  const uint64_t need = cu::ScratchResultBytes(layout_bytes);
  const uint64_t got = uint64_t(scratch.size_bytes());
  if (scratch.element_type() != ffi::DataType::U8)
    return ffi::Unexpected(Invalid(what + ": the last result (scratch) must be uint8"));
  if (got < need)
    return ffi::Unexpected(Invalid(
        what + ": the scratch result is too small: this call needs " + std::to_string(need) +
        " bytes (" + std::to_string(layout_bytes) + " for the kernels' sections + " +
        std::to_string(cu::kScratchResultSlack) + " to align them to " + std::to_string(cu::kScratchAlign) +
        "), got " + std::to_string(got) + " (zipccl_jax._ffi.extension().cuda_scratch_bytes gives the size)"));
  uint8_t* at = cu::ScratchStart(scratch.untyped_data(), got, layout_bytes);
  if (at == nullptr)
    return ffi::Unexpected(Invalid(
        what + ": the scratch result (" + std::to_string(got) + " bytes at address " +
        std::to_string(reinterpret_cast<uintptr_t>(scratch.untyped_data())) + ") is aligned to less than " +
        std::to_string(cu::kScratchResultAlign) + " bytes: its " + std::to_string(layout_bytes) +
        " bytes of sections do not fit once aligned to " + std::to_string(cu::kScratchAlign)));
  return at;
}

std::string CallName(const char* op, uint64_t frames, uint64_t n) {
  return std::string("zipccl ") + op + " (" + std::to_string(frames) + " frames of " + std::to_string(n) +
         " elements)";
}

ffi::Error EncodeImpl(CUstream_st* stream, ffi::AnyBuffer x, ffi::RemainingArgs extra, bool checksum,
                      ffi::Result<ffi::Buffer<ffi::U8>> payload, ffi::Result<ffi::AnyBuffer> nbytes,
                      ffi::Result<ffi::AnyBuffer> scratch) {
  zipccl::ffi_operands::EncodeCall call{};
  if (ffi::Error e = zipccl::ffi_operands::CheckEncode(x, extra, *payload, *nbytes, &call); e.failure())
    return e;
  const uint8_t dtype = call.dtype;
  const uint64_t frames = call.frames, n = call.n, cap = call.cap_bytes;
  if (frames == 0) return ffi::Error::Success();
  // The size is only known on the device, so int32 sizes are refused up front
  // whenever a frame could exceed them (the CPU handler checks the actual size).
  if (!call.nbytes64 && zipccl::MaxEncodedBytes(n, dtype) > uint64_t(INT32_MAX))
    return Invalid("zipccl encode: a frame may exceed 2^31-1 bytes; enable jax_enable_x64 for int64 sizes");
  const zipccl::cuda::EncodeLayout L = zipccl::cuda::MakeEncodeLayout(frames, n);
  ffi::ErrorOr<uint8_t*> s = ScratchOf(*scratch, L.scratch_bytes, CallName("encode", frames, n));
  if (s.has_error()) return s.error();
  if (ffi::Error e = PrepareLaunch(frames, n, "zipccl encode"); e.failure()) return e;
  int err = zipccl::cuda::EncodeAsync(x.untyped_data(), dtype, checksum, payload->typed_data(), cap,
                                      nbytes->untyped_data(), call.nbytes64, call.skip, L,
                                      s.value(), stream);
  return err ? CudaError("zipccl encode: kernel launch", err) : ffi::Error::Success();
}

// Enqueues the decode of a checked call into `out` (frame f's n elements from element
// f * out_row + col); the scratch is the last of `extra`.
ffi::Error LaunchDecode(CUstream_st* stream, const ffi::Buffer<ffi::U8>& payload,
                        const zipccl::ffi_operands::DecodeCall& call, void* out, ffi::RemainingRets& extra,
                        const char* op) {
  const uint64_t frames = call.frames, n = call.n;
  if (frames == 0) return ffi::Error::Success();
  ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> scratch = extra.get<ffi::AnyBuffer>(extra.size() - 1);
  if (scratch.has_error()) return Invalid(std::string("zipccl ") + op + ": the last result (scratch) must be an array");
  const zipccl::cuda::DecodeLayout L = zipccl::cuda::MakeDecodeLayout(frames, n);
  ffi::ErrorOr<uint8_t*> s = ScratchOf(**scratch, L.scratch_bytes, CallName(op, frames, n));
  if (s.has_error()) return s.error();
  const std::string what = std::string("zipccl ") + op;
  if (ffi::Error e = PrepareLaunch(frames, n, what.c_str()); e.failure()) return e;
  auto* base = static_cast<uint8_t*>(out) + call.col * uint64_t(zipccl::ElemBytes(call.dtype));
  int err = zipccl::cuda::DecodeAsync(payload.typed_data(), call.cap_bytes, call.dtype, base, call.out_row,
                                      call.status, call.skip, L, s.value(), stream);
  return err ? CudaError((what + ": kernel launch").c_str(), err) : ffi::Error::Success();
}

// Results: out, the optional status, then the scratch (the last one).
ffi::Error DecodeImpl(CUstream_st* stream, ffi::Buffer<ffi::U8> payload, ffi::RemainingArgs extra_args,
                      ffi::Result<ffi::AnyBuffer> out, ffi::RemainingRets extra) {
  zipccl::ffi_operands::DecodeCall call{};
  if (ffi::Error e = zipccl::ffi_operands::CheckDecode(payload, extra_args, *out, extra, &call,
                                                      /*trailing=*/1);
      e.failure())
    return e;
  return LaunchDecode(stream, payload, call, out->untyped_data(), extra, "decode");
}

// decode_into: `out` is `into` (aliased); only the frames' columns are written.
ffi::Error DecodeIntoImpl(CUstream_st* stream, ffi::Buffer<ffi::U8> payload, ffi::AnyBuffer into,
                          ffi::RemainingArgs extra_args, int64_t col, int64_t elems,
                          ffi::Result<ffi::AnyBuffer> out, ffi::RemainingRets extra) {
  zipccl::ffi_operands::DecodeCall call{};
  if (ffi::Error e = zipccl::ffi_operands::CheckDecodeInto(payload, into, extra_args, col, elems, *out,
                                                          extra, &call, /*trailing=*/1);
      e.failure())
    return e;
  return LaunchDecode(stream, payload, call, out->untyped_data(), extra, "decode_into");
}

}  // namespace

// The trait is declared with the handler (reported in its metadata) and again at registration
// (zipccl_jax/_ffi.py: jax passes it to XLA_FFI_Handler_Register). XLA's command-buffer conversion asks
// its handler registry for it (ffi::FindHandler(target, "gpu").traits, command_buffer_conversion_pass.cc).
XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEncodeCuda, EncodeImpl,
                              zipccl::ffi_operands::BindEncode(
                                  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream_st*>>())
                                  .Ret<ffi::AnyBuffer>(),  // scratch: uint8[cuda_scratch_bytes]
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecodeCuda, DecodeImpl,
                              zipccl::ffi_operands::BindDecode(
                                  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream_st*>>()),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecodeIntoCuda, DecodeIntoImpl,
                              zipccl::ffi_operands::BindDecodeInto(
                                  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream_st*>>()),
                              {ffi::Traits::kCmdBufferCompatible});
