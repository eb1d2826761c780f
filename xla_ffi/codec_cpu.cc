// CPU FFI adapters: decode operands and attributes, validate shapes, then call
// the pure codec driver once per frame. No format logic lives here.
//
// Batching: the last payload dimension is the per-frame capacity and every
// leading dimension counts frames, so one call codes F = prod(leading dims)
// independent frames. This is what vmap(broadcast_all) produces, and what the
// collectives use to code one frame per peer.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "codec/codec_cpu.h"
#include "codec/format.h"
#include "handlers.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

uint8_t DTypeCode(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::BF16: return zipccl::kBF16;
    case ffi::DataType::F16: return zipccl::kF16;
    case ffi::DataType::F32: return zipccl::kF32;
    default: return zipccl::kDTypeInvalid;
  }
}

ffi::Error Invalid(const std::string& msg) { return ffi::Error::InvalidArgument(msg); }

ffi::Error EncodeImpl(ffi::AnyBuffer x, bool checksum,
                      ffi::Result<ffi::Buffer<ffi::U8>> payload,
                      ffi::Result<ffi::AnyBuffer> nbytes) try {
  const uint8_t dtype = DTypeCode(x.element_type());
  if (dtype == zipccl::kDTypeInvalid)
    return Invalid("zipccl encode: x has an unsupported dtype; supported: bfloat16, float16, float32");
  const ffi::DataType nb_type = nbytes->element_type();
  if (nb_type != ffi::DataType::S32 && nb_type != ffi::DataType::S64)
    return Invalid("zipccl encode: nbytes must be int32 or int64");
  auto pdims = payload->dimensions();
  if (pdims.size() == 0) return Invalid("zipccl encode: payload must have rank >= 1");
  const uint64_t frames = nbytes->element_count();
  const uint64_t cap = uint64_t(pdims[pdims.size() - 1]);
  if (payload->element_count() != frames * cap)
    return Invalid("zipccl encode: payload must have shape (*batch, capacity) matching nbytes (*batch)");
  if (frames == 0) return ffi::Error::Success();
  if (x.element_count() % frames != 0)
    return Invalid("zipccl encode: x element count is not a multiple of the frame count");
  const uint64_t n = x.element_count() / frames;
  const uint64_t w = uint64_t(zipccl::ElemBytes(dtype));
  const auto* xs = static_cast<const uint8_t*>(x.untyped_data());
  uint8_t* out = payload->typed_data();
  for (uint64_t f = 0; f < frames; ++f) {
    uint64_t need = zipccl::cpu::EncodeFrame(xs + f * n * w, n, dtype, checksum, out + f * cap, cap);
    // The padded transport sends all `cap` bytes. XLA recycles output buffers, so zero whatever is not the
    // frame (after an overflow: everything after the header), lest stale memory of this process (other
    // tensors, heap pointers) reach the peers and the wire bytes vary from run to run.
    const uint64_t keep = need <= cap ? need : (cap < zipccl::kFrameHeaderBytes ? cap : zipccl::kFrameHeaderBytes);
    std::memset(out + f * cap + keep, 0, cap - keep);
    if (nb_type == ffi::DataType::S32) {
      if (need > uint64_t(INT32_MAX))
        return Invalid("zipccl encode: frame exceeds 2^31-1 bytes; enable jax_enable_x64 for int64 sizes");
      static_cast<int32_t*>(nbytes->untyped_data())[f] = int32_t(need);
    } else {
      static_cast<int64_t*>(nbytes->untyped_data())[f] = int64_t(need);
    }
  }
  return ffi::Error::Success();
} catch (const std::exception& e) {
  return ffi::Error::Internal(std::string("zipccl encode: ") + e.what());
}

ffi::Error DecodeImpl(ffi::Buffer<ffi::U8> payload, ffi::Result<ffi::AnyBuffer> out) try {
  const uint8_t dtype = DTypeCode(out->element_type());
  if (dtype == zipccl::kDTypeInvalid)
    return Invalid("zipccl decode: unsupported output dtype; supported: bfloat16, float16, float32");
  auto pdims = payload.dimensions();
  if (pdims.size() == 0) return Invalid("zipccl decode: payload must have rank >= 1");
  const uint64_t cap = uint64_t(pdims[pdims.size() - 1]);
  uint64_t frames = 1;
  for (size_t i = 0; i + 1 < pdims.size(); ++i) frames *= uint64_t(pdims[i]);
  if (frames == 0) return ffi::Error::Success();
  if (out->element_count() % frames != 0)
    return Invalid("zipccl decode: output element count is not a multiple of the frame count");
  const uint64_t n = out->element_count() / frames;
  const uint64_t w = uint64_t(zipccl::ElemBytes(dtype));
  const uint8_t* in = payload.typed_data();
  auto* o = static_cast<uint8_t*>(out->untyped_data());
  for (uint64_t f = 0; f < frames; ++f) {
    zipccl::cpu::DecodeResult r = zipccl::cpu::DecodeFrame(in + f * cap, cap, dtype, n, o + f * n * w);
    if (r.status != zipccl::kOk) {
      char where[96];
      if (r.block >= 0)
        std::snprintf(where, sizeof(where), "frame %llu, block %lld",
                      (unsigned long long)f, (long long)r.block);
      else
        std::snprintf(where, sizeof(where), "frame %llu", (unsigned long long)f);
      return Invalid(std::string("zipccl decode (") + where + "): " +
                     zipccl::StatusMessage(r.status));
    }
  }
  return ffi::Error::Success();
} catch (const std::exception& e) {
  return ffi::Error::Internal(std::string("zipccl decode: ") + e.what());
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEncodeCpu, EncodeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()           // x
                                  .Attr<bool>("checksum")
                                  .Ret<ffi::Buffer<ffi::U8>>()     // payload
                                  .Ret<ffi::AnyBuffer>());         // nbytes

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecodeCpu, DecodeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U8>>()     // payload
                                  .Ret<ffi::AnyBuffer>());         // out
