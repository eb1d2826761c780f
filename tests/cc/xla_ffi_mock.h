// A mock of XLA's FFI API (XLA_FFI_Api) for calling FFI handlers without XLA, enforcing what XLA's
// implementation (xla/ffi/ffi_api.cc) enforces where our handlers touch it:
//   - XLA_FFI_DeviceMemory_Allocate: a GPU context with an allocator is required; the alignment must be
//     a power of two <= 16, else InvalidArgument "Unsupported alignment: N" (kMaxAlignment there);
//     allocation can fail (a byte budget stands in for the device's memory). The block handed out is
//     16-byte aligned and no more (an offset of 16 from a 256-aligned base: XLA does not pass the
//     alignment on to its allocator), filled with garbage, and ASan-poisoned around it.
//   - XLA_FFI_DeviceMemory_Free: a GPU context with an allocator is required; the pointer must be live
//     and the size the allocated one.
//   - XLA_FFI_Stream_Get: the stream comes from the context; none without a GPU context or stream.
//   - Struct sizes of the argument structs are checked like ActualStructSizeIsGreaterOrEqual.
//   - Every other API entry is refused and recorded as a violation.
// Invoke() builds the call frame XLA builds (EXECUTE stage, attributes sorted by name), calls the
// handler, and records as a violation any scratch still live when the handler returns (XLA's
// ScratchAllocator frees at return; memory kept past it would leak from XLA's pool).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
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
  bool gpu = true;        // a GPU backend context: Stream_Get and DeviceMemory_* need one
  bool allocator = true;  // the GPU context has a device memory allocator: DeviceMemory_* need it
  CUstream_st* stream = reinterpret_cast<CUstream_st*>(uintptr_t(0x5EED0));  // null: none
  uint64_t budget_bytes = ~0ull;  // what the allocator can still hand out
  struct Block {
    uint8_t* base;
    size_t size, span;
  };
  std::map<void*, Block> live;
  std::vector<std::string> violations;  // contract breaches by the handler
  uint64_t allocations = 0, frees = 0;
  size_t max_alignment = 0;
  std::mt19937_64 rng{7};
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

inline XLA_FFI_Error* NoAllocator(const XLA_FFI_ExecutionContext* c) {
  if (c->allocator) return nullptr;
  return Err(XLA_FFI_Error_Code_UNIMPLEMENTED, "No device memory allocator available on this platform");
}

inline XLA_FFI_Error* Allocate(XLA_FFI_DeviceMemory_Allocate_Args* a) {
  if (XLA_FFI_Error* e = CheckSize("XLA_FFI_DeviceMemory_Allocate_Args",
                                   XLA_FFI_DeviceMemory_Allocate_Args_STRUCT_SIZE, a))
    return e;
  XLA_FFI_ExecutionContext* c = a->ctx;
  if (!c->gpu) return Err(XLA_FFI_Error_Code_INVALID_ARGUMENT, "XLA FFI GPU context is not available");
  if (XLA_FFI_Error* e = NoAllocator(c)) return e;
  c->max_alignment = std::max(c->max_alignment, a->alignment);
  const size_t al = a->alignment;
  if (al == 0 || (al & (al - 1)) != 0 || al > 16)
    return Err(XLA_FFI_Error_Code_INVALID_ARGUMENT, "Unsupported alignment: " + std::to_string(al));
  if (a->size > c->budget_bytes)
    return Err(XLA_FFI_Error_Code_RESOURCE_EXHAUSTED,
               "Out of memory while trying to allocate " + std::to_string(a->size) + " bytes.");
  c->budget_bytes -= a->size;
  // 16-aligned and never 32-aligned: base is 256-aligned, the block starts 16 bytes in.
  const size_t span = (a->size + 16 + 255) / 256 * 256 + 256;
  auto* base = static_cast<uint8_t*>(std::aligned_alloc(256, span));
  uint8_t* data = base + 16;
  for (size_t i = 0; i < a->size; ++i) data[i] = uint8_t(c->rng());
  ZIPCCL_POISON(base, 16);
  ZIPCCL_POISON(data + a->size, span - 16 - a->size);
  c->live[data] = {base, a->size, span};
  ++c->allocations;
  a->data = data;
  return nullptr;
}

inline XLA_FFI_Error* Free(XLA_FFI_DeviceMemory_Free_Args* a) {
  if (XLA_FFI_Error* e = CheckSize("XLA_FFI_DeviceMemory_Free_Args",
                                   XLA_FFI_DeviceMemory_Free_Args_STRUCT_SIZE, a))
    return e;
  XLA_FFI_ExecutionContext* c = a->ctx;
  if (!c->gpu) return Err(XLA_FFI_Error_Code_UNIMPLEMENTED, "XLA FFI GPU context is not available");
  if (XLA_FFI_Error* e = NoAllocator(c)) return e;
  auto it = c->live.find(a->data);
  if (it == c->live.end()) {
    c->violations.push_back("free of a pointer that is not a live allocation");
    return Err(XLA_FFI_Error_Code_INVALID_ARGUMENT, "not a live allocation");
  }
  if (it->second.size != a->size) c->violations.push_back("free with a size other than the allocated one");
  ZIPCCL_UNPOISON(it->second.base, it->second.span);
  std::free(it->second.base);
  c->budget_bytes += it->second.size;
  c->live.erase(it);
  ++c->frees;
  return nullptr;
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

// Calls `handler` as XLA does. bool_attrs are the handler's scalar bool attributes.
inline Outcome Invoke(XLA_FFI_Handler* handler, XLA_FFI_ExecutionContext& ctx, std::vector<Array> args,
                      std::vector<Array> rets, std::vector<std::pair<std::string, bool>> bool_attrs) {
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
  std::sort(bool_attrs.begin(), bool_attrs.end());  // XLA sorts attributes by name
  std::vector<uint8_t> values(bool_attrs.size());
  std::vector<XLA_FFI_Scalar> scalars(bool_attrs.size());
  std::vector<XLA_FFI_ByteSpan> names(bool_attrs.size());
  std::vector<XLA_FFI_ByteSpan*> name_ptrs;
  std::vector<void*> attr_ptrs;
  std::vector<XLA_FFI_AttrType> attr_types(bool_attrs.size(), XLA_FFI_AttrType_SCALAR);
  for (size_t i = 0; i < bool_attrs.size(); ++i) {
    values[i] = bool_attrs[i].second;
    scalars[i] = {XLA_FFI_DataType_PRED, &values[i]};
    names[i] = {bool_attrs[i].first.data(), bool_attrs[i].first.size()};
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
  frame.attrs = {XLA_FFI_Attrs_STRUCT_SIZE, nullptr, int64_t(bool_attrs.size()), attr_types.data(),
                 name_ptrs.data(), attr_ptrs.data()};
  XLA_FFI_Error* err = handler(&frame);
  if (!ctx.live.empty()) ctx.violations.push_back("scratch still allocated when the handler returned");
  Outcome o{err == nullptr, XLA_FFI_Error_Code_OK, ""};
  if (err) {
    o.errc = err->errc;
    o.message = err->message;
    delete err;
  }
  return o;
}

}  // namespace xla_ffi_mock
