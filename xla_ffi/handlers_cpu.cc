// CPU FFI adapters: decode operands and attributes, validate shapes, then call
// the pure codec driver once per frame. No format logic lives here.
//
// Batching: the last payload dimension is the per-frame capacity and every
// leading dimension counts frames, so one call codes F = prod(leading dims)
// independent frames. This is what vmap(broadcast_all) produces, and what the
// collectives use to code one frame per peer.
//
// Skipping: both handlers take an optional last operand `skip` (bool or uint8,
// shape = the frame dims: nbytes' shape for encode, payload's shape without the
// capacity dim for decode). A skipped frame is not coded: encode zeroes its
// whole payload row and writes nbytes 0; decode neither reads nor validates its
// payload row and zeroes its output row. The collectives use it for the chunk a
// device sends to itself. Without the operand no frame is skipped.
//
// Status: the decoder accepts an optional second result, int32[frames], as the
// CUDA decoder does. With it a bad frame is not an error: its entry receives
// the Status code of codec/format.h (the first error, as DecodeFrame reports
// it; 0 = ok, and 0 for a skipped frame) and its whole output row is set to the
// quiet NaN of the CUDA poison kernel (RejectedFillBits of codec/format.h), so
// both platforms give the same bits. Without it the
// first bad frame fails the call with INVALID_ARGUMENT naming frame and block.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "codec/cpu_driver.h"
#include "codec/format.h"
#include "operands.h"
#include "handlers.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using zipccl::ffi_operands::Invalid;

ffi::Error EncodeImpl(ffi::AnyBuffer x, ffi::RemainingArgs extra, bool checksum,
                      ffi::Result<ffi::Buffer<ffi::U8>> payload,
                      ffi::Result<ffi::AnyBuffer> nbytes) try {
  zipccl::ffi_operands::EncodeCall call{};
  if (ffi::Error e = zipccl::ffi_operands::CheckEncode(x, extra, *payload, *nbytes, &call); e.failure())
    return e;
  const uint8_t* skip = call.skip;
  const uint8_t dtype = call.dtype;
  const uint64_t frames = call.frames, n = call.n, cap = call.cap_bytes;
  const uint64_t w = uint64_t(zipccl::ElemBytes(dtype));
  const auto* xs = static_cast<const uint8_t*>(x.untyped_data());
  uint8_t* out = payload->typed_data();
  for (uint64_t f = 0; f < frames; ++f) {
    if (skip && skip[f]) {  // not a frame: an all-zero row, size 0
      std::memset(out + f * cap, 0, cap);
      if (call.nbytes64)
        static_cast<int64_t*>(nbytes->untyped_data())[f] = 0;
      else
        static_cast<int32_t*>(nbytes->untyped_data())[f] = 0;
      continue;
    }
    uint64_t need = zipccl::cpu::EncodeFrame(xs + f * n * w, n, dtype, checksum, out + f * cap, cap);
    // The padded transport sends all `cap` bytes. XLA recycles output buffers, so zero whatever is not the
    // frame (after an overflow: everything after the header), lest stale memory of this process (other
    // tensors, heap pointers) reach the peers and the wire bytes vary from run to run.
    const uint64_t keep = need <= cap ? need : (cap < zipccl::kFrameHeaderBytes ? cap : zipccl::kFrameHeaderBytes);
    std::memset(out + f * cap + keep, 0, cap - keep);
    if (!call.nbytes64) {
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

// Every element of a rejected frame's output row (n elements of width w) set
// to the quiet NaN of the CUDA poison kernel.
void FillRejected(uint8_t* row, uint64_t n, uint64_t w, uint8_t dtype) {
  const uint32_t bits = zipccl::RejectedFillBits(dtype);
  if (w == 4) {
    for (uint64_t e = 0; e < n; ++e) std::memcpy(row + e * 4, &bits, 4);
  } else if (w == 1) {
    std::memset(row, int(bits), n);
  } else {
    const uint16_t b16 = uint16_t(bits);
    for (uint64_t e = 0; e < n; ++e) std::memcpy(row + e * 2, &b16, 2);
  }
}

// Decodes the call's frames from `in` into `o`: frame f's n elements from element
// f * out_row + col (a skipped frame's elements zero; with a status result a rejected frame's
// NaN, else the first bad frame fails the call, naming frame and block).
ffi::Error DecodeFrames(const zipccl::ffi_operands::DecodeCall& call, const uint8_t* in, uint8_t* o) {
  const uint8_t dtype = call.dtype;
  const uint64_t n = call.n, cap = call.cap_bytes;
  const uint64_t w = uint64_t(zipccl::ElemBytes(dtype));
  for (uint64_t f = 0; f < call.frames; ++f) {
    uint8_t* row = o + (f * call.out_row + call.col) * w;
    if (call.skip && call.skip[f]) {  // not read, not validated: zeros
      std::memset(row, 0, n * w);
      if (call.status) call.status[f] = zipccl::kOk;
      continue;
    }
    zipccl::cpu::DecodeResult r = zipccl::cpu::DecodeFrame(in + f * cap, cap, dtype, n, row);
    if (call.status) {  // report, do not fail: the row of a rejected frame is NaN (as on CUDA)
      call.status[f] = int32_t(r.status);
      if (r.status != zipccl::kOk) FillRejected(row, n, w, dtype);
      continue;
    }
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
}

ffi::Error DecodeImpl(ffi::Buffer<ffi::U8> payload, ffi::RemainingArgs extra,
                      ffi::Result<ffi::AnyBuffer> out, ffi::RemainingRets extra_rets) try {
  zipccl::ffi_operands::DecodeCall call{};
  if (ffi::Error e = zipccl::ffi_operands::CheckDecode(payload, extra, *out, extra_rets, &call); e.failure())
    return e;
  return DecodeFrames(call, payload.typed_data(), static_cast<uint8_t*>(out->untyped_data()));
} catch (const std::exception& e) {
  return ffi::Error::Internal(std::string("zipccl decode: ") + e.what());
}

// `out` is `into` (aliased): only the frames' columns are written.
ffi::Error DecodeIntoImpl(ffi::Buffer<ffi::U8> payload, ffi::AnyBuffer into, ffi::RemainingArgs extra,
                          int64_t col, int64_t elems, ffi::Result<ffi::AnyBuffer> out,
                          ffi::RemainingRets extra_rets) try {
  zipccl::ffi_operands::DecodeCall call{};
  if (ffi::Error e = zipccl::ffi_operands::CheckDecodeInto(payload, into, extra, col, elems, *out,
                                                           extra_rets, &call);
      e.failure())
    return e;
  return DecodeFrames(call, payload.typed_data(), static_cast<uint8_t*>(out->untyped_data()));
} catch (const std::exception& e) {
  return ffi::Error::Internal(std::string("zipccl decode_into: ") + e.what());
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEncodeCpu, EncodeImpl,
                              zipccl::ffi_operands::BindEncode(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecodeCpu, DecodeImpl,
                              zipccl::ffi_operands::BindDecode(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecodeIntoCpu, DecodeIntoImpl,
                              zipccl::ffi_operands::BindDecodeInto(ffi::Ffi::Bind()));
