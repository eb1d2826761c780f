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
#include "operands.h"
#include "handlers.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// The alignment asked of XLA's allocator. XLA_FFI_DeviceMemory_Allocate
// accepts powers of two up to 16 and rejects anything else with
// "Unsupported alignment" (xla/ffi/ffi_api.cc, kMaxAlignment), so the
// 256-byte alignment of the scratch sections (kScratchAlign) is made inside an
// over-sized block. Overridable only so the contract test can seed the old bug.
#ifndef ZIPCCL_SCRATCH_REQUEST_ALIGN
#define ZIPCCL_SCRATCH_REQUEST_ALIGN 16
#endif

namespace zipccl {

// An XLA error's message, the error then destroyed: through the C API (c_api.h), whose structs are
// versioned, not xla::ffi::internal, whose helpers have moved between releases. FFI API 0.3 (jaxlib 0.10.2
// and 0.11.0) has XLA_FFI_Error_GetMessage; 0.4 (jaxlib 0.11.2) replaced it with XLA_FFI_Error_GetDetails
// (message and code), kept in 0.5 (jaxlib 0.12). Chosen by the headers' API version, not by jaxlib's; the
// #if can go when the oldest supported jaxlib has FFI API 0.4.
static std::string TakeErrorMessage(const XLA_FFI_Api* api, XLA_FFI_Error* err) {
#if XLA_FFI_API_MAJOR == 0 && XLA_FFI_API_MINOR < 4
  XLA_FFI_Error_GetMessage_Args get;
  get.struct_size = XLA_FFI_Error_GetMessage_Args_STRUCT_SIZE;
#else
  XLA_FFI_Error_GetDetails_Args get;
  get.struct_size = XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE;
  get.errc = XLA_FFI_Error_Code_INTERNAL;
#endif
  get.extension_start = nullptr;
  get.error = err;
  get.message = nullptr;
#if XLA_FFI_API_MAJOR == 0 && XLA_FFI_API_MINOR < 4
  api->XLA_FFI_Error_GetMessage(&get);
#else
  api->XLA_FFI_Error_GetDetails(&get);
#endif
  std::string msg = get.message ? get.message : "(XLA gave no message)";
  XLA_FFI_Error_Destroy_Args destroy;
  destroy.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
  destroy.extension_start = nullptr;
  destroy.error = err;
  api->XLA_FFI_Error_Destroy(&destroy);
  return msg;
}

// One block of device scratch from XLA's allocator, freed when the handler
// returns (Free, or the destructor on an early return). Unlike
// ffi::ScratchAllocator, whose failure message goes to a diagnostic engine that
// XLA reads only when operand decoding fails, a failed allocation here keeps
// XLA's own message in the handler's error.
class DeviceScratch {
 public:
  static constexpr uint64_t kRequestAlign = ZIPCCL_SCRATCH_REQUEST_ALIGN;

  DeviceScratch(const XLA_FFI_Api* api, XLA_FFI_ExecutionContext* ctx) : api_(api), ctx_(ctx) {}
  DeviceScratch(DeviceScratch&& o) noexcept
      : api_(o.api_), ctx_(o.ctx_), data_(std::exchange(o.data_, nullptr)), size_(o.size_) {}
  DeviceScratch& operator=(DeviceScratch&&) = delete;
  ~DeviceScratch() { (void)Free(); }

  // `bytes` of scratch whose start is kScratchAlign-aligned (null for 0).
  ffi::ErrorOr<uint8_t*> Allocate(uint64_t bytes, const char* what) {
    if (bytes == 0) return static_cast<uint8_t*>(nullptr);
    const uint64_t slack = cuda::kScratchAlign > kRequestAlign ? cuda::kScratchAlign - kRequestAlign : 0;
    XLA_FFI_DeviceMemory_Allocate_Args args;
    args.struct_size = XLA_FFI_DeviceMemory_Allocate_Args_STRUCT_SIZE;
    args.extension_start = nullptr;
    args.ctx = ctx_;
    args.size = size_t(bytes + slack);
    args.alignment = size_t(kRequestAlign);
    args.data = nullptr;
    if (XLA_FFI_Error* err = api_->XLA_FFI_DeviceMemory_Allocate(&args)) {
      std::string msg = std::string(what) + ": XLA's device allocator refused " +
                        std::to_string(args.size) + " bytes of scratch (alignment " +
                        std::to_string(kRequestAlign) + "): " + TakeErrorMessage(api_, err);
      return ffi::Unexpected(ffi::Error(ffi::ErrorCode::kResourceExhausted, msg));
    }
    data_ = args.data;
    size_ = args.size;
    if (data_ == nullptr)
      return ffi::Unexpected(ffi::Error::Internal(std::string(what) + ": XLA's device allocator returned null"));
    const uintptr_t at = reinterpret_cast<uintptr_t>(data_);
    return reinterpret_cast<uint8_t*>(cuda::AlignUp(at, cuda::kScratchAlign));
  }

  // Returns the block to XLA now; an error if XLA refuses it.
  ffi::Error Free() {
    if (data_ == nullptr) return ffi::Error::Success();
    XLA_FFI_DeviceMemory_Free_Args args;
    args.struct_size = XLA_FFI_DeviceMemory_Free_Args_STRUCT_SIZE;
    args.extension_start = nullptr;
    args.ctx = ctx_;
    args.size = size_;
    args.data = std::exchange(data_, nullptr);
    if (XLA_FFI_Error* err = api_->XLA_FFI_DeviceMemory_Free(&args)) {
      std::string msg = std::string("zipccl: XLA could not free the scratch block: ") +
                        TakeErrorMessage(api_, err);
      return ffi::Error::Internal(msg);
    }
    return ffi::Error::Success();
  }

 private:
  const XLA_FFI_Api* api_;
  XLA_FFI_ExecutionContext* ctx_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace zipccl

template <>
struct xla::ffi::CtxDecoding<zipccl::DeviceScratch> {
  using Type = zipccl::DeviceScratch;
  static std::optional<Type> Decode(const XLA_FFI_Api* api, XLA_FFI_ExecutionContext* ctx,
                                    DiagnosticEngine&) {
    return Type(api, ctx);
  }
};

namespace {

using zipccl::DeviceScratch;

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

// The launch's error, else the release's.
ffi::Error Finish(ffi::Error launch, DeviceScratch& scratch) {
  ffi::Error freed = scratch.Free();
  return launch.failure() ? launch : freed;
}

ffi::Error EncodeImpl(CUstream_st* stream, DeviceScratch scratch, ffi::AnyBuffer x,
                      ffi::RemainingArgs extra, bool checksum,
                      ffi::Result<ffi::Buffer<ffi::U8>> payload,
                      ffi::Result<ffi::AnyBuffer> nbytes) {
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
  if (ffi::Error e = PrepareLaunch(frames, n, "zipccl encode"); e.failure()) return e;
  const zipccl::cuda::EncodeLayout L = zipccl::cuda::MakeEncodeLayout(frames, n);
  ffi::ErrorOr<uint8_t*> s = scratch.Allocate(L.scratch_bytes, "zipccl encode");
  if (s.has_error()) return s.error();
  int err = zipccl::cuda::EncodeAsync(x.untyped_data(), dtype, checksum, payload->typed_data(), cap,
                                      nbytes->untyped_data(), call.nbytes64, call.skip, L,
                                      s.value(), stream);
  return Finish(err ? CudaError("zipccl encode: kernel launch", err) : ffi::Error::Success(),
                scratch);
}

ffi::Error DecodeImpl(CUstream_st* stream, DeviceScratch scratch,
                      ffi::Buffer<ffi::U8> payload, ffi::RemainingArgs extra_args,
                      ffi::Result<ffi::AnyBuffer> out, ffi::RemainingRets extra) {
  zipccl::ffi_operands::DecodeCall call{};
  if (ffi::Error e = zipccl::ffi_operands::CheckDecode(payload, extra_args, *out, extra, &call); e.failure())
    return e;
  const uint8_t dtype = call.dtype;
  const uint64_t frames = call.frames, n = call.n, cap = call.cap_bytes;
  if (frames == 0) return ffi::Error::Success();
  if (ffi::Error e = PrepareLaunch(frames, n, "zipccl decode"); e.failure()) return e;
  const zipccl::cuda::DecodeLayout L = zipccl::cuda::MakeDecodeLayout(frames, n);
  ffi::ErrorOr<uint8_t*> s = scratch.Allocate(L.scratch_bytes, "zipccl decode");
  if (s.has_error()) return s.error();
  int err = zipccl::cuda::DecodeAsync(payload.typed_data(), cap, dtype, out->untyped_data(),
                                      call.status, call.skip, L, s.value(), stream);
  return Finish(err ? CudaError("zipccl decode: kernel launch", err) : ffi::Error::Success(),
                scratch);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEncodeCuda, EncodeImpl,
                              zipccl::ffi_operands::BindEncode(
                                  ffi::Ffi::Bind()
                                      .Ctx<ffi::PlatformStream<CUstream_st*>>()
                                      .Ctx<DeviceScratch>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecodeCuda, DecodeImpl,
                              zipccl::ffi_operands::BindDecode(
                                  ffi::Ffi::Bind()
                                      .Ctx<ffi::PlatformStream<CUstream_st*>>()
                                      .Ctx<DeviceScratch>()));
