// The one Python extension, zipccl_jax._zipccl: FFI registrations per platform
// and the format constants that zipccl_jax/format.py mirrors.
#include <nanobind/nanobind.h>

#include <cstdint>

#include "codec/format.h"
#include "handlers.h"

namespace nb = nanobind;

namespace {

template <typename T>
nb::capsule Capsule(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "an FFI handler must have the XLA_FFI_Handler signature");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_zipccl, m) {
  m.doc() = "zipccl codec: XLA FFI handlers and wire-format constants";
  m.def("registrations", []() {
    nb::dict per_platform;
    nb::dict cpu;
    cpu["zipccl_encode"] = Capsule(ZipcclEncodeCpu);
    cpu["zipccl_decode"] = Capsule(ZipcclDecodeCpu);
    per_platform["cpu"] = cpu;
#if defined(ZIPCCL_WITH_CUDA)
    nb::dict cuda;
    cuda["zipccl_encode"] = Capsule(ZipcclEncodeCuda);
    cuda["zipccl_decode"] = Capsule(ZipcclDecodeCuda);
    per_platform["CUDA"] = cuda;
#endif
    return per_platform;
  });
  m.def("max_encoded_bytes",
        [](uint64_t n_elems, int dtype) { return zipccl::MaxEncodedBytes(n_elems, uint8_t(dtype)); },
        nb::arg("n_elems"), nb::arg("dtype_code"));
  m.def("format_constants", []() {
    nb::dict d;
    d["MAGIC"] = zipccl::kMagic;
    d["VERSION"] = zipccl::kVersion;
    d["FRAME_HEADER_BYTES"] = zipccl::kFrameHeaderBytes;
    d["DIR_ENTRY_BYTES"] = zipccl::kDirEntryBytes;
    d["BLOCK_HEADER_BYTES"] = zipccl::kBlockHeaderBytes;
    d["BLOCK_LOG2"] = zipccl::kBlockLog2;
    d["STREAM_LOG2"] = zipccl::kStreamLog2;
    d["MAX_CODE_LEN"] = zipccl::kMaxCodeLen;
    d["ZERO_SYMBOL"] = zipccl::kZeroSymbol;
    d["FLAG_CHECKSUM"] = zipccl::kFrameFlagChecksum;
    d["BLOCK_FLAG_LOW16"] = zipccl::kBlockFlagLow16;
    d["CHECKSUM_SEED"] = zipccl::kChecksumSeed;
    d["DTYPE_BF16"] = int(zipccl::kBF16);
    d["DTYPE_F16"] = int(zipccl::kF16);
    d["DTYPE_F32"] = int(zipccl::kF32);
    return d;
  });
  m.attr("with_cuda") =
#if defined(ZIPCCL_WITH_CUDA)
      true;
#else
      false;
#endif
}
