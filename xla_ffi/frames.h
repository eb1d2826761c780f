// Operand checks shared by the CPU and CUDA FFI handlers: the batched-frame
// layout (last payload dimension = per-frame capacity, leading dimensions =
// frames) and the dtype mapping. Header-only; included by both compilers.
#pragma once

#include <cstdint>
#include <string>

#include "codec/format.h"
#include "xla/ffi/api/ffi.h"

namespace zipccl::ffi_frames {

namespace ffi = ::xla::ffi;

inline uint8_t DTypeCode(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::BF16: return kBF16;
    case ffi::DataType::F16: return kF16;
    case ffi::DataType::F32: return kF32;
    default: return kDTypeInvalid;
  }
}

inline ffi::Error Invalid(const std::string& msg) { return ffi::Error::InvalidArgument(msg); }

// What one encode call codes: `frames` frames of `n` elements of `dtype`,
// each into `cap_bytes` bytes of the payload.
struct EncodeCall {
  uint8_t dtype;
  uint64_t frames, n, cap_bytes;
  bool nbytes64;  // nbytes is int64 (else int32)
};

inline ffi::Error CheckEncode(const ffi::AnyBuffer& x, const ffi::Buffer<ffi::U8>& payload,
                              const ffi::AnyBuffer& nbytes, EncodeCall* call) {
  call->dtype = DTypeCode(x.element_type());
  if (call->dtype == kDTypeInvalid)
    return Invalid("zipccl encode: x has an unsupported dtype; supported: bfloat16, float16, float32");
  const ffi::DataType nb_type = nbytes.element_type();
  if (nb_type != ffi::DataType::S32 && nb_type != ffi::DataType::S64)
    return Invalid("zipccl encode: nbytes must be int32 or int64");
  call->nbytes64 = nb_type == ffi::DataType::S64;
  auto pdims = payload.dimensions();
  if (pdims.size() == 0) return Invalid("zipccl encode: payload must have rank >= 1");
  call->frames = nbytes.element_count();
  call->cap_bytes = uint64_t(pdims[pdims.size() - 1]);
  call->n = 0;
  if (payload.element_count() != call->frames * call->cap_bytes)
    return Invalid("zipccl encode: payload must have shape (*batch, capacity) matching nbytes (*batch)");
  if (call->frames == 0) return ffi::Error::Success();
  if (x.element_count() % call->frames != 0)
    return Invalid("zipccl encode: x element count is not a multiple of the frame count");
  call->n = x.element_count() / call->frames;
  return ffi::Error::Success();
}

// What one decode call reads: `frames` frames of capacity `cap_bytes`, each
// decoding to `n` elements of `dtype`.
struct DecodeCall {
  uint8_t dtype;
  uint64_t frames, n, cap_bytes;
};

inline ffi::Error CheckDecode(const ffi::Buffer<ffi::U8>& payload, const ffi::AnyBuffer& out,
                              DecodeCall* call) {
  call->dtype = DTypeCode(out.element_type());
  if (call->dtype == kDTypeInvalid)
    return Invalid("zipccl decode: unsupported output dtype; supported: bfloat16, float16, float32");
  auto pdims = payload.dimensions();
  if (pdims.size() == 0) return Invalid("zipccl decode: payload must have rank >= 1");
  call->cap_bytes = uint64_t(pdims[pdims.size() - 1]);
  call->frames = 1;
  for (size_t i = 0; i + 1 < pdims.size(); ++i) call->frames *= uint64_t(pdims[i]);
  call->n = 0;
  if (call->frames == 0) return ffi::Error::Success();
  if (out.element_count() % call->frames != 0)
    return Invalid("zipccl decode: output element count is not a multiple of the frame count");
  call->n = out.element_count() / call->frames;
  return ffi::Error::Success();
}

}  // namespace zipccl::ffi_frames
