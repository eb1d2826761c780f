// What the CPU and CUDA FFI handlers share: the bindings of the two custom
// calls and their operand checks (the batched-frame layout: last payload
// dimension = per-frame capacity, leading dimensions = frames; the dtype
// mapping; the optional skip operand and status result). Header-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "codec/format.h"
#include "xla/ffi/api/ffi.h"

namespace zipccl::ffi_operands {

namespace ffi = ::xla::ffi;

inline uint8_t DTypeCode(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::BF16: return kBF16;
    case ffi::DataType::F16: return kF16;
    case ffi::DataType::F32: return kF32;
    case ffi::DataType::F8E4M3FN: return kF8E4M3FN;
    case ffi::DataType::F8E5M2: return kF8E5M2;
    case ffi::DataType::F8E4M3FNUZ: return kF8E4M3FNUZ;
    case ffi::DataType::F8E5M2FNUZ: return kF8E5M2FNUZ;
    case ffi::DataType::F8E4M3B11FNUZ: return kF8E4M3B11FNUZ;
    case ffi::DataType::F8E4M3: return kF8E4M3;
    case ffi::DataType::F8E3M4: return kF8E3M4;
    case ffi::DataType::F8E8M0FNU: return kF8E8M0FNU;
    default: return kDTypeInvalid;
  }
}

// The names of DTypeCode's dtypes, for error messages.
constexpr char kSupportedDTypeNames[] =
    "bfloat16, float16, float32, float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, float8_e5m2fnuz, "
    "float8_e4m3b11fnuz, float8_e4m3, float8_e3m4, float8_e8m0fnu";

// The custom calls' operands, attribute and results, in the order jax.ffi.ffi_call
// passes them (zipccl_jax/codec.py), after the platform context `b` already
// binds: one description of each call for its CPU and CUDA handlers.
template <class Binding>
auto BindEncode(Binding&& b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()        // x
      .RemainingArgs()                       // optional skip: bool/u8, nbytes' shape
      .template Attr<bool>("checksum")
      .template Ret<ffi::Buffer<ffi::U8>>()  // payload
      .template Ret<ffi::AnyBuffer>();       // nbytes: int32 or int64
}
template <class Binding>
auto BindDecode(Binding&& b) {
  return std::move(b)
      .template Arg<ffi::Buffer<ffi::U8>>()  // payload
      .RemainingArgs()                       // optional skip: bool/u8, payload dims[:-1]
      .template Ret<ffi::AnyBuffer>()        // out
      .RemainingRets();                      // optional int32 status
}

// Decode into a buffer the caller gives: `into` (frames x R elements), aliased to the result
// (jax.ffi.ffi_call's input_output_aliases={1: 0}), gets each frame's `elems` elements in its
// columns [col, col + elems); every other element keeps its value. A K-piece collective decodes
// its pieces into one result this way instead of joining K decoded buffers (zipccl_jax._exchange).
template <class Binding>
auto BindDecodeInto(Binding&& b) {
  return std::move(b)
      .template Arg<ffi::Buffer<ffi::U8>>()  // payload
      .template Arg<ffi::AnyBuffer>()        // into: frames x R elements, aliased to out
      .RemainingArgs()                       // optional skip: bool/u8, payload dims[:-1]
      .template Attr<int64_t>("col")         // first column of a row the frame fills
      .template Attr<int64_t>("elems")       // elements per frame
      .template Ret<ffi::AnyBuffer>()        // out: `into`, columns [col, col + elems) written
      .RemainingRets();                      // optional int32 status
}

inline ffi::Error Invalid(const std::string& msg) { return ffi::Error::InvalidArgument(msg); }

// What one encode call codes: `frames` frames of `n` elements of `dtype`,
// each into `cap_bytes` bytes of the payload.
struct EncodeCall {
  uint8_t dtype;
  uint64_t frames, n, cap_bytes;
  bool nbytes64;                  // nbytes is int64 (else int32)
  const uint8_t* skip = nullptr;  // [frames] flags (CheckSkip) or null
};

inline ffi::Error CheckEncodeShapes(const ffi::AnyBuffer& x, const ffi::Buffer<ffi::U8>& payload,
                                    const ffi::AnyBuffer& nbytes, EncodeCall* call) {
  call->dtype = DTypeCode(x.element_type());
  if (call->dtype == kDTypeInvalid)
    return Invalid(std::string("zipccl encode: x has an unsupported dtype; supported: ") + kSupportedDTypeNames);
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
  uint64_t out_row = 0;           // elements from one frame's output to the next (>= n)
  uint64_t col = 0;               // the first one's offset in the output, elements
  const uint8_t* skip = nullptr;  // [frames] flags (CheckSkip) or null
  int32_t* status = nullptr;      // [frames] (CheckDecodeStatus) or null
};

inline ffi::Error CheckDecodeShapes(const ffi::Buffer<ffi::U8>& payload, const ffi::AnyBuffer& out,
                                    DecodeCall* call) {
  call->dtype = DTypeCode(out.element_type());
  if (call->dtype == kDTypeInvalid)
    return Invalid(std::string("zipccl decode: unsupported output dtype; supported: ") + kSupportedDTypeNames);
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
  call->out_row = call->n;
  return ffi::Error::Success();
}

// "[2,3]" for dims (2, 3); "[]" for a scalar.
template <class Dims>
std::string DimsString(const Dims& dims, size_t count) {
  std::string s = "[";
  for (size_t i = 0; i < count; ++i) {
    if (i) s += ",";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

// The optional `skip` operand of both handlers: one flag per frame, bool
// (PRED) or uint8 (non-zero = skip), with exactly the frame dims (`frame_dims`,
// the first `n_frame_dims` entries; `what` says where they come from, for the
// message). A skipped frame is not coded / not read: encode writes an all-zero
// payload row and nbytes 0, decode writes an all-zero output row.
//
// `extra` are the operands after the required ones (RemainingArgs): none (no
// frame is skipped; *skip = nullptr) or exactly one. On success *skip points at
// the flags (host memory for the CPU handler, device memory for CUDA).
template <class Dims>
ffi::Error CheckSkip(const ffi::RemainingArgs& extra, const char* op, const Dims& frame_dims,
                     size_t n_frame_dims, const char* what, const uint8_t** skip) {
  *skip = nullptr;
  if (extra.size() == 0) return ffi::Error::Success();
  const std::string name = std::string("zipccl ") + op + ": ";
  if (extra.size() > 1)
    return Invalid(name + "expected at most one operand after the required ones (skip), got " +
                   std::to_string(extra.size()));
  ffi::ErrorOr<ffi::AnyBuffer> b = extra.get<ffi::AnyBuffer>(0);
  if (b.has_error()) return Invalid(name + "operand skip must be an array");
  const ffi::DataType t = b->element_type();
  if (t != ffi::DataType::PRED && t != ffi::DataType::U8)
    return Invalid(name + "operand skip must be bool (PRED) or uint8, one flag per frame");
  auto dims = b->dimensions();
  bool same = size_t(dims.size()) == n_frame_dims;
  for (size_t i = 0; same && i < n_frame_dims; ++i) same = dims[i] == frame_dims[i];
  if (!same)
    return Invalid(name + "operand skip must have shape " + DimsString(frame_dims, n_frame_dims) +
                   " (one flag per frame: " + what + "), got " +
                   DimsString(dims, size_t(dims.size())));
  *skip = static_cast<const uint8_t*>(b->untyped_data());
  return ffi::Error::Success();
}

inline ffi::Error CheckEncodeSkip(const ffi::RemainingArgs& extra, const ffi::AnyBuffer& nbytes,
                                  const uint8_t** skip) {
  auto d = nbytes.dimensions();
  return CheckSkip(extra, "encode", d, size_t(d.size()), "the shape of nbytes", skip);
}

inline ffi::Error CheckDecodeSkip(const ffi::RemainingArgs& extra,
                                  const ffi::Buffer<ffi::U8>& payload, const uint8_t** skip) {
  auto d = payload.dimensions();
  return CheckSkip(extra, "decode", d, d.size() ? size_t(d.size()) - 1 : 0,
                   "the leading dims of payload, without the capacity dim", skip);
}

// The optional status result of both decode handlers (RemainingRets after
// `out`): none (*status = nullptr: a bad frame is an error) or exactly one,
// int32 with one entry per frame. With it a decoder does not fail on a bad
// frame: it writes the frame's Status code (0 = ok, skipped frames 0) and fills
// that frame's output row with a quiet NaN (FillRejected). *status points at
// host memory for the CPU handler, device memory for CUDA. `trailing` results
// after it belong to the platform's handler (CUDA: its scratch) and are not
// looked at here; fewer than `trailing` extra results is an error.
inline ffi::Error CheckDecodeStatus(const ffi::RemainingRets& extra, uint64_t frames,
                                    int32_t** status, size_t trailing = 0) {
  *status = nullptr;
  if (extra.size() < trailing)
    return Invalid("zipccl decode: expected " + std::to_string(trailing) +
                   " trailing result(s) (the scratch), got " + std::to_string(extra.size()));
  const size_t n_status = extra.size() - trailing;
  if (n_status == 0) return ffi::Error::Success();
  if (n_status > 1) return Invalid("zipccl decode: at most one extra result (status)");
  ffi::ErrorOr<ffi::Result<ffi::Buffer<ffi::S32>>> st = extra.get<ffi::Buffer<ffi::S32>>(0);
  if (st.has_error()) return Invalid("zipccl decode: the status result must be int32");
  if ((*st)->element_count() != frames)
    return Invalid("zipccl decode: the status result must have one int32 per frame");
  *status = (*st)->typed_data();
  return ffi::Error::Success();
}

// Every operand and result of an encode / decode call, in the order the
// handlers report errors: dtypes and shapes, then skip, then status.
inline ffi::Error CheckEncode(const ffi::AnyBuffer& x, const ffi::RemainingArgs& extra,
                              const ffi::Buffer<ffi::U8>& payload, const ffi::AnyBuffer& nbytes,
                              EncodeCall* call) {
  if (ffi::Error e = CheckEncodeShapes(x, payload, nbytes, call); e.failure()) return e;
  return CheckEncodeSkip(extra, nbytes, &call->skip);
}

// `trailing`: results after the optional status that the platform's handler
// takes itself (CUDA: the scratch).
inline ffi::Error CheckDecode(const ffi::Buffer<ffi::U8>& payload, const ffi::RemainingArgs& extra,
                              const ffi::AnyBuffer& out, const ffi::RemainingRets& extra_rets,
                              DecodeCall* call, size_t trailing = 0) {
  if (ffi::Error e = CheckDecodeShapes(payload, out, call); e.failure()) return e;
  if (ffi::Error e = CheckDecodeSkip(extra, payload, &call->skip); e.failure()) return e;
  return CheckDecodeStatus(extra_rets, call->frames, &call->status, trailing);
}

// decode_into's shapes (BindDecodeInto): `out` is `into` (same dtype, dims and address: XLA
// gives an aliased result the operand's buffer), frames x R elements with R >= col + elems.
inline ffi::Error CheckDecodeIntoShapes(const ffi::Buffer<ffi::U8>& payload, const ffi::AnyBuffer& into,
                                        int64_t col, int64_t elems, const ffi::AnyBuffer& out,
                                        DecodeCall* call) {
  if (ffi::Error e = CheckDecodeShapes(payload, out, call); e.failure()) return e;
  auto id = into.dimensions(), od = out.dimensions();
  bool same = into.element_type() == out.element_type() && id.size() == od.size();
  for (size_t i = 0; same && i < size_t(od.size()); ++i) same = id[i] == od[i];
  if (!same)
    return Invalid("zipccl decode_into: the result must have the dtype and shape of operand into, "
                   "got " + DimsString(od, size_t(od.size())) + " and " + DimsString(id, size_t(id.size())));
  if (into.untyped_data() != out.untyped_data())
    return Invalid("zipccl decode_into: the result must alias operand into (input_output_aliases={1: 0})");
  if (col < 0 || elems < 0 || (call->frames > 0 && uint64_t(col) + uint64_t(elems) > call->n))
    return Invalid("zipccl decode_into: columns [col, col + elems) = [" + std::to_string(col) + ", " +
                   std::to_string(col + elems) + ") must lie in a row of " + std::to_string(call->n) +
                   " elements");
  call->out_row = call->n;
  call->col = uint64_t(col);
  call->n = uint64_t(elems);
  return ffi::Error::Success();
}

// decode_into's operands and results (the skip and status rules are decode's).
inline ffi::Error CheckDecodeInto(const ffi::Buffer<ffi::U8>& payload, const ffi::AnyBuffer& into,
                                  const ffi::RemainingArgs& extra, int64_t col, int64_t elems,
                                  const ffi::AnyBuffer& out, const ffi::RemainingRets& extra_rets,
                                  DecodeCall* call, size_t trailing = 0) {
  if (ffi::Error e = CheckDecodeIntoShapes(payload, into, col, elems, out, call); e.failure()) return e;
  if (ffi::Error e = CheckDecodeSkip(extra, payload, &call->skip); e.failure()) return e;
  return CheckDecodeStatus(extra_rets, call->frames, &call->status, trailing);
}

}  // namespace zipccl::ffi_operands
