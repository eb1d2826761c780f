// A mock of XLA's FFI API (XLA_FFI_Api) for calling FFI handlers without XLA, enforcing what XLA's
// implementation (xla/ffi/ffi_api.cc) enforces where our handlers touch it, and what a command-buffer
// compatible handler must not do:
//   - XLA_FFI_DeviceMemory_Allocate / _Free: never. The CUDA handlers take their scratch as a result
//     (XLA allocates it like any buffer) and allocate nothing at run time, which is what lets XLA capture
//     them into a command buffer (a CUDA graph; the allocation would be freed after capture and reused
//     by the replays). Any call is recorded as a violation and refused.
//   - XLA_FFI_Stream_Get: the stream comes from the context; none without a GPU context or stream.
//   - Struct sizes of the argument structs are checked like ActualStructSizeIsGreaterOrEqual.
//   - Every other API entry is refused and recorded as a violation.
// Invoke() builds the call frame XLA builds (EXECUTE stage, attributes sorted by name) and calls the
// handler. DeviceBuffer stands for a buffer XLA assigns: garbage-filled, ASan-poisoned around, and
// aligned as XLA guarantees and no more than the handlers assume (16 bytes, never 32).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "xla/ffi/api/c_api.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ZIPCCL_POISON(p, n) __asan_poison_memory_region((p), (n))
#define ZIPCCL_UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define ZIPCCL_POISON(p, n) ((void)(p), (void)(n))
#define ZIPCCL_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

struct CUstream_st;

// The opaque C API types, defined by the mock (XLA defines them in c_api_internal.h).
struct XLA_FFI_Error {
  XLA_FFI_Error_Code errc;
  std::string message;
};

// FFI API 0.4 (jaxlib 0.11.2; 0.11.0 still has 0.3) renamed the context XLA_FFI_InvokeContext (XLA_FFI_ExecutionContext stays as a
// typedef of it) and replaced XLA_FFI_Error_GetMessage with XLA_FFI_Error_GetDetails; the mock follows the
// headers it is built with. These #if's go when the oldest supported jaxlib has FFI API 0.4.
#if XLA_FFI_API_MAJOR == 0 && XLA_FFI_API_MINOR < 4
#define ZIPCCL_MOCK_FFI_0_3 1
#define ZIPCCL_MOCK_CONTEXT XLA_FFI_ExecutionContext
#else
#define ZIPCCL_MOCK_FFI_0_3 0
#define ZIPCCL_MOCK_CONTEXT XLA_FFI_InvokeContext
#endif

struct ZIPCCL_MOCK_CONTEXT {
  bool gpu = true;        // a GPU backend context: Stream_Get needs one
  bool allocator = true;  // the GPU context has a device memory allocator (the handlers must not need it)
  CUstream_st* stream = reinterpret_cast<CUstream_st*>(uintptr_t(0x5EED0));  // null: none
  std::vector<std::string> violations;  // contract breaches by the handler
  uint64_t allocations = 0, frees = 0;  // calls of XLA_FFI_DeviceMemory_Allocate / _Free (each a violation)
};

namespace xla_ffi_mock {

inline XLA_FFI_Error* Err(XLA_FFI_Error_Code c, std::string msg) { return new XLA_FFI_Error{c, std::move(msg)}; }

template <class Args>
XLA_FFI_Error* CheckSize(const char* what, size_t expected, const Args* a) {
  if (a->struct_size < expected)
    return Err(XLA_FFI_Error_Code_INVALID_ARGUMENT, std::string("Unexpected ") + what + " size");
  return nullptr;
}

inline XLA_FFI_Error* ErrorCreate(XLA_FFI_Error_Create_Args* a) {
  if (XLA_FFI_Error* e = CheckSize("XLA_FFI_Error_Create", XLA_FFI_Error_Create_Args_STRUCT_SIZE, a)) return e;
  return Err(a->errc, a->message ? a->message : "");
}
#if ZIPCCL_MOCK_FFI_0_3
inline void ErrorGetMessage(XLA_FFI_Error_GetMessage_Args* a) { a->message = a->error->message.c_str(); }
#else
inline void ErrorGetDetails(XLA_FFI_Error_GetDetails_Args* a) {
  a->message = a->error->message.c_str();
  a->errc = a->error->errc;
}
#endif
inline void ErrorDestroy(XLA_FFI_Error_Destroy_Args* a) { delete a->error; }

inline XLA_FFI_Error* StreamGet(XLA_FFI_Stream_Get_Args* a) {
  if (XLA_FFI_Error* e = CheckSize("XLA_FFI_Stream_Get", XLA_FFI_Stream_Get_Args_STRUCT_SIZE, a)) return e;
  if (!a->ctx->gpu) return Err(XLA_FFI_Error_Code_UNIMPLEMENTED, "XLA FFI GPU context is not available");
  if (a->ctx->stream == nullptr)
    return Err(XLA_FFI_Error_Code_UNIMPLEMENTED, "XLA FFI GPU stream is not available");
  a->stream = a->ctx->stream;
  return nullptr;
}

// Run-time device allocations: a command-buffer compatible handler makes none.
inline XLA_FFI_Error* Allocate(XLA_FFI_DeviceMemory_Allocate_Args* a) {
  if (XLA_FFI_Error* e = CheckSize("XLA_FFI_DeviceMemory_Allocate_Args",
                                   XLA_FFI_DeviceMemory_Allocate_Args_STRUCT_SIZE, a))
    return e;
  ++a->ctx->allocations;
  a->ctx->violations.push_back("XLA_FFI_DeviceMemory_Allocate called (" + std::to_string(a->size) +
                               " bytes): the CUDA handlers must take their scratch as a result, not "
                               "allocate at run time (command buffers)");
  return Err(XLA_FFI_Error_Code_FAILED_PRECONDITION, "the mock refuses run-time device allocations");
}

inline XLA_FFI_Error* Free(XLA_FFI_DeviceMemory_Free_Args* a) {
  if (XLA_FFI_Error* e = CheckSize("XLA_FFI_DeviceMemory_Free_Args",
                                   XLA_FFI_DeviceMemory_Free_Args_STRUCT_SIZE, a))
    return e;
  ++a->ctx->frees;
  a->ctx->violations.push_back("XLA_FFI_DeviceMemory_Free called");
  return Err(XLA_FFI_Error_Code_FAILED_PRECONDITION, "the mock refuses run-time device allocations");
}

// Any other entry: the handlers have no business calling it.
template <class Args>
XLA_FFI_Error* Refused(Args* a) {
  a->ctx->violations.push_back("unexpected XLA FFI API call");
  return Err(XLA_FFI_Error_Code_UNIMPLEMENTED, "not provided by the mock");
}
inline XLA_FFI_Error* RefusedNoCtx(void*) { return Err(XLA_FFI_Error_Code_UNIMPLEMENTED, "not provided by the mock"); }

inline const XLA_FFI_Api* Api() {
  static const XLA_FFI_Api api = [] {
    XLA_FFI_Api x{};
    x.struct_size = XLA_FFI_Api_STRUCT_SIZE;
    x.api_version = {XLA_FFI_Api_Version_STRUCT_SIZE, nullptr, XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR};
    x.XLA_FFI_Error_Create = ErrorCreate;
#if ZIPCCL_MOCK_FFI_0_3
    x.XLA_FFI_Error_GetMessage = ErrorGetMessage;
#else
    x.XLA_FFI_Error_GetDetails = ErrorGetDetails;
#endif
    x.XLA_FFI_Error_Destroy = ErrorDestroy;
    x.XLA_FFI_Handler_Register = reinterpret_cast<XLA_FFI_Handler_Register*>(RefusedNoCtx);
    x.XLA_FFI_Stream_Get = StreamGet;
    x.XLA_FFI_Type_Register = reinterpret_cast<XLA_FFI_Type_Register*>(RefusedNoCtx);
#if ZIPCCL_MOCK_FFI_0_3
    x.XLA_FFI_ExecutionContext_Get = Refused<XLA_FFI_ExecutionContext_Get_Args>;
#else
    x.XLA_FFI_InvokeContext_Get = Refused<XLA_FFI_InvokeContext_Get_Args>;
#endif
    x.XLA_FFI_State_Set = Refused<XLA_FFI_State_Set_Args>;
    x.XLA_FFI_State_Get = Refused<XLA_FFI_State_Get_Args>;
    x.XLA_FFI_DeviceMemory_Allocate = Allocate;
    x.XLA_FFI_DeviceMemory_Free = Free;
    x.XLA_FFI_ThreadPool_Schedule = Refused<XLA_FFI_ThreadPool_Schedule_Args>;
    x.XLA_FFI_ThreadPool_NumThreads = Refused<XLA_FFI_ThreadPool_NumThreads_Args>;
    x.XLA_FFI_Future_Create = reinterpret_cast<XLA_FFI_Future_Create*>(RefusedNoCtx);
    x.XLA_FFI_Future_SetAvailable = reinterpret_cast<XLA_FFI_Future_SetAvailable*>(RefusedNoCtx);
    x.XLA_FFI_Future_SetError = reinterpret_cast<XLA_FFI_Future_SetError*>(RefusedNoCtx);
    x.XLA_FFI_RunId_Get = Refused<XLA_FFI_RunId_Get_Args>;
    x.XLA_FFI_DeviceOrdinal_Get = Refused<XLA_FFI_DeviceOrdinal_Get_Args>;
    return x;
  }();
  return &api;
}

// A buffer as XLA assigns it to an operand or result: `size` bytes starting 16 bytes past a 256-aligned
// base (16-aligned, never 32-aligned: less than XLA:GPU guarantees, exactly what the handlers assume),
// garbage-filled (stale device memory), the bytes around it ASan-poisoned. `offset` moves the start
// (a test of a buffer less aligned than assumed).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t size, size_t offset = 16, uint64_t seed = 7) : size_(size) {
    span_ = (offset + size + 255) / 256 * 256 + 256;
    base_ = static_cast<uint8_t*>(std::aligned_alloc(256, span_));
    data_ = base_ + offset;
    std::mt19937_64 rng(seed);
    for (size_t i = 0; i < size; ++i) data_[i] = uint8_t(rng());
    ZIPCCL_POISON(base_, offset);
    ZIPCCL_POISON(data_ + size, span_ - offset - size);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    ZIPCCL_UNPOISON(base_, span_);
    std::free(base_);
  }
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* base_;
  uint8_t* data_;
  size_t size_, span_;
};

// One array operand or result: dtype, dims and host memory standing for device memory.
struct Array {
  XLA_FFI_DataType dtype;
  std::vector<int64_t> dims;
  void* data;
};

// The outcome of a call: null error or its code and message.
struct Outcome {
  bool ok;
  XLA_FFI_Error_Code errc;
  std::string message;
};

// A scalar attribute as XLA passes it: bool (PRED) or int64 (S64), by name.
struct ScalarAttr {
  ScalarAttr(std::string n, bool v) : name(std::move(n)), dtype(XLA_FFI_DataType_PRED), value(v) {}
  ScalarAttr(std::string n, int64_t v) : name(std::move(n)), dtype(XLA_FFI_DataType_S64), value(v) {}
  bool operator<(const ScalarAttr& o) const { return name < o.name; }
  std::string name;
  XLA_FFI_DataType dtype;
  int64_t value;
};

// Calls `handler` as XLA does, with the handler's scalar attributes.
inline Outcome Invoke(XLA_FFI_Handler* handler, XLA_FFI_ExecutionContext& ctx, std::vector<Array> args,
                      std::vector<Array> rets, std::vector<ScalarAttr> attrs) {
  std::vector<XLA_FFI_Buffer> arg_bufs(args.size()), ret_bufs(rets.size());
  std::vector<void*> arg_ptrs, ret_ptrs;
  std::vector<XLA_FFI_ArgType> arg_types(args.size(), XLA_FFI_ArgType_BUFFER);
  std::vector<XLA_FFI_RetType> ret_types(rets.size(), XLA_FFI_RetType_BUFFER);
  auto fill = [](std::vector<Array>& in, std::vector<XLA_FFI_Buffer>& out, std::vector<void*>& ptrs) {
    for (size_t i = 0; i < in.size(); ++i) {
      out[i] = {XLA_FFI_Buffer_STRUCT_SIZE, nullptr, in[i].dtype, in[i].data, int64_t(in[i].dims.size()),
                in[i].dims.data()};
      ptrs.push_back(&out[i]);
    }
  };
  fill(args, arg_bufs, arg_ptrs);
  fill(rets, ret_bufs, ret_ptrs);
  std::sort(attrs.begin(), attrs.end());  // XLA sorts attributes by name
  std::vector<uint8_t> bools(attrs.size());
  std::vector<int64_t> ints(attrs.size());
  std::vector<XLA_FFI_Scalar> scalars(attrs.size());
  std::vector<XLA_FFI_ByteSpan> names(attrs.size());
  std::vector<XLA_FFI_ByteSpan*> name_ptrs;
  std::vector<void*> attr_ptrs;
  std::vector<XLA_FFI_AttrType> attr_types(attrs.size(), XLA_FFI_AttrType_SCALAR);
  for (size_t i = 0; i < attrs.size(); ++i) {
    bools[i] = attrs[i].value != 0;
    ints[i] = attrs[i].value;
    void* value = attrs[i].dtype == XLA_FFI_DataType_PRED ? static_cast<void*>(&bools[i]) : &ints[i];
    scalars[i] = {attrs[i].dtype, value};
    names[i] = {attrs[i].name.data(), attrs[i].name.size()};
    name_ptrs.push_back(&names[i]);
    attr_ptrs.push_back(&scalars[i]);
  }
  XLA_FFI_CallFrame frame{};
  frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
  frame.api = Api();
  frame.ctx = &ctx;
  frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
  frame.args = {XLA_FFI_Args_STRUCT_SIZE, nullptr, int64_t(args.size()), arg_types.data(), arg_ptrs.data()};
  frame.rets = {XLA_FFI_Rets_STRUCT_SIZE, nullptr, int64_t(rets.size()), ret_types.data(), ret_ptrs.data()};
  frame.attrs = {XLA_FFI_Attrs_STRUCT_SIZE, nullptr, int64_t(attrs.size()), attr_types.data(),
                 name_ptrs.data(), attr_ptrs.data()};
  XLA_FFI_Error* err = handler(&frame);
  Outcome o{err == nullptr, XLA_FFI_Error_Code_OK, ""};
  if (err) {
    o.errc = err->errc;
    o.message = err->message;
    delete err;
  }
  return o;
}

}  // namespace xla_ffi_mock
