// The one Python extension, zipccl_jax._zipccl: FFI registrations per platform
// and the format constants that zipccl_jax/format.py mirrors.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "codec/cpu_driver.h"
#include "codec/format.h"
#include "cuda_scratch.h"
#include "handlers.h"
#include "runtime_stats.h"

namespace nb = nanobind;

// xla_ffi/cuda_host_bindings.cc: the CUDA driver's host-side pieces and emulator.
void ZipcclRegisterCudaHost(nb::module_& parent);

#if defined(ZIPCCL_WITH_CUDA)
#include "codec/cuda_launch.cuh"
#include "codec/kernel_images.h"
#endif

// What the build system recorded (CMakeLists.txt / cmake/cuda_toolkit.cmake, xla_ffi/BUILD.bazel); CMake
// writes the free-text strings into a header (cmake/build_info.cmake).
#if defined(ZIPCCL_HAVE_BUILD_INFO_H)
#include "zipccl_build_info.h"
#endif
#ifndef ZIPCCL_CUDA_TOOLKIT
#define ZIPCCL_CUDA_TOOLKIT ""
#endif
#ifndef ZIPCCL_CUDA_ARCHS
#define ZIPCCL_CUDA_ARCHS ""
#endif
#ifndef ZIPCCL_CUDA_MIN_DRIVER
#define ZIPCCL_CUDA_MIN_DRIVER ""
#endif
#if defined(ZIPCCL_BAZEL_BUILD)  // xla_ffi/BUILD.bazel: a CPU-only extension
#define ZIPCCL_CUDA_NOTE "built by Bazel, which builds no CUDA kernels (CMake builds them with NVRTC)"
#endif
#ifndef ZIPCCL_CUDA_NOTE
#define ZIPCCL_CUDA_NOTE ""
#endif
#ifndef ZIPCCL_BUILD_JAX_CUDA_PLUGIN
#define ZIPCCL_BUILD_JAX_CUDA_PLUGIN ""
#endif
#ifndef ZIPCCL_BUILD_JAXLIB
#define ZIPCCL_BUILD_JAXLIB ""
#endif
#ifndef ZIPCCL_CPU_NATIVE
#define ZIPCCL_CPU_NATIVE 0
#endif

namespace {

template <typename T>
nb::capsule Capsule(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "an FFI handler must have the XLA_FFI_Handler signature");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

using HostBytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using HostOut = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// Host-buffer entry points for benchmarks and the C++/NumPy cross-checks: the
// same driver the CPU FFI handler calls, minus XLA's dispatch.
uint64_t EncodeHost(HostBytes x, uint64_t n_elems, int dtype, bool checksum, HostOut out) {
  if (zipccl::ElemBytes(uint8_t(dtype)) == 0) throw nb::value_error("unsupported dtype code");
  // Divide rather than multiply: n_elems * width can wrap around 2^64 and pass a product check.
  const uint64_t w = uint64_t(zipccl::ElemBytes(uint8_t(dtype)));
  if (x.size() % w != 0 || x.size() / w != n_elems)
    throw nb::value_error("x must hold n_elems elements of the dtype, as bytes");
  nb::gil_scoped_release release;
  return zipccl::cpu::EncodeFrame(x.data(), n_elems, uint8_t(dtype), checksum, out.data(),
                                  out.size());
}

void DecodeHost(HostBytes payload, int dtype, uint64_t n_elems, HostOut out) {
  if (zipccl::ElemBytes(uint8_t(dtype)) == 0) throw nb::value_error("unsupported dtype code");
  const uint64_t w = uint64_t(zipccl::ElemBytes(uint8_t(dtype)));
  if (out.size() % w != 0 || out.size() / w != n_elems)
    throw nb::value_error("out must hold n_elems elements of the dtype, as bytes");
  zipccl::cpu::DecodeResult r;
  {
    nb::gil_scoped_release release;
    r = zipccl::cpu::DecodeFrame(payload.data(), payload.size(), uint8_t(dtype), n_elems,
                                 out.data());
  }
  if (r.status != zipccl::kOk)
    throw nb::value_error((std::string("zipccl decode: ") + zipccl::StatusMessage(r.status)).c_str());
}

}  // namespace

NB_MODULE(_zipccl, m) {
  m.doc() = "zipccl codec: XLA FFI handlers and wire-format constants";
  m.def("registrations", []() {
    nb::dict per_platform;
    nb::dict cpu;
    cpu["zipccl_encode"] = Capsule(ZipcclEncodeCpu);
    cpu["zipccl_decode"] = Capsule(ZipcclDecodeCpu);
    cpu["zipccl_decode_into"] = Capsule(ZipcclDecodeIntoCpu);
    cpu["zipccl_count"] = Capsule(ZipcclCountCpu);
    per_platform["cpu"] = cpu;
#if defined(ZIPCCL_WITH_CUDA)
    nb::dict cuda;
    cuda["zipccl_encode"] = Capsule(ZipcclEncodeCuda);
    cuda["zipccl_decode"] = Capsule(ZipcclDecodeCuda);
    cuda["zipccl_decode_into"] = Capsule(ZipcclDecodeIntoCuda);
    per_platform["CUDA"] = cuda;
#endif
    return per_platform;
  });
  m.def("runtime_counts", []() {
    nb::dict d;
    for (const auto& [site, c] : zipccl::runtime_stats::Snapshot())
      d[nb::int_(site)] = nb::make_tuple(c.calls, c.fallbacks);
    return d;
  }, "{site id: (calls, fallbacks)} counted by the zipccl_count handler in this process.");
  m.def("reset_runtime_counts", &zipccl::runtime_stats::Reset);
  m.def("encode_host", &EncodeHost, nb::arg("x"), nb::arg("n_elems"), nb::arg("dtype_code"),
        nb::arg("checksum"), nb::arg("out"),
        "Encodes x (raw bytes) into out; returns the frame size (> out.size on overflow).");
  m.def("decode_host", &DecodeHost, nb::arg("payload"), nb::arg("dtype_code"), nb::arg("n_elems"),
        nb::arg("out"), "Decodes a frame into out (raw bytes); ValueError on a bad frame.");
  m.def("cuda_scratch_bytes",
        [](const std::string& op, uint64_t frames, uint64_t n_elems) {
          if (op == "encode") return zipccl::cuda::EncodeScratchResultBytes(frames, n_elems);
          if (op == "decode") return zipccl::cuda::DecodeScratchResultBytes(frames, n_elems);
          throw nb::value_error("op must be 'encode' or 'decode'");
        },
        nb::arg("op"), nb::arg("frames"), nb::arg("n_elems"),
        "Bytes of the scratch result (uint8, the last result) a CUDA encode/decode call of `frames` frames "
        "of n_elems elements each takes: its layout's sections plus the slack that aligns them "
        "(xla_ffi/cuda_scratch.h). Defined in every build: the CUDA call is traced on any machine.");
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
    d["SEGMENT_LOG2"] = zipccl::kSegmentLog2;
    d["LANES"] = zipccl::kLanes;
    d["UNIT_BITS"] = zipccl::kUnitBits;
    d["MAX_CODE_LEN"] = zipccl::kMaxCodeLen;
    d["ZERO_SYMBOL"] = zipccl::kZeroSymbol;
    d["FLAG_CHECKSUM"] = zipccl::kFrameFlagChecksum;
    d["BLOCK_FLAG_LOW16"] = zipccl::kBlockFlagLow16;
    d["CHECKSUM_SEED"] = zipccl::kChecksumSeed;
    d["DTYPE_BF16"] = int(zipccl::kBF16);
    d["DTYPE_F16"] = int(zipccl::kF16);
    d["DTYPE_F32"] = int(zipccl::kF32);
    d["REJECTED_FILL_BF16"] = zipccl::kRejectedFillBF16;
    d["REJECTED_FILL_F16"] = zipccl::kRejectedFillF16;
    d["REJECTED_FILL_F32"] = zipccl::kRejectedFillF32;
    d["DTYPE_F8E4M3FN"] = int(zipccl::kF8E4M3FN);
    d["DTYPE_F8E5M2"] = int(zipccl::kF8E5M2);
    d["DTYPE_F8E4M3FNUZ"] = int(zipccl::kF8E4M3FNUZ);
    d["DTYPE_F8E5M2FNUZ"] = int(zipccl::kF8E5M2FNUZ);
    d["DTYPE_F8E4M3B11FNUZ"] = int(zipccl::kF8E4M3B11FNUZ);
    d["DTYPE_F8E4M3"] = int(zipccl::kF8E4M3);
    d["DTYPE_F8E3M4"] = int(zipccl::kF8E3M4);
    d["DTYPE_F8E8M0FNU"] = int(zipccl::kF8E8M0FNU);
    d["REJECTED_FILL_F8E4M3FN"] = zipccl::kRejectedFillF8E4M3FN;
    d["REJECTED_FILL_F8E5M2"] = zipccl::kRejectedFillF8E5M2;
    d["REJECTED_FILL_F8FNUZ"] = zipccl::kRejectedFillF8Fnuz;
    d["REJECTED_FILL_F8E4M3"] = zipccl::kRejectedFillF8E4M3;
    d["REJECTED_FILL_F8E3M4"] = zipccl::kRejectedFillF8E3M4;
    d["REJECTED_FILL_F8E8M0FNU"] = zipccl::kRejectedFillF8E8M0FNU;
    return d;
  });
  m.def("build_info", []() {
    nb::dict d;
#if defined(ZIPCCL_WITH_CUDA)
    d["cuda_kernels"] = true;
#else
    d["cuda_kernels"] = false;
#endif
    d["cuda_toolkit"] = ZIPCCL_CUDA_TOOLKIT;        // NVRTC's "major.minor", "" without kernels
    d["cuda_archs"] = ZIPCCL_CUDA_ARCHS;            // "80,90": a cubin per architecture (+ PTX of the first)
    d["cuda_min_driver"] = ZIPCCL_CUDA_MIN_DRIVER;  // oldest Linux driver that runs the cubins
    d["cuda_note"] = ZIPCCL_CUDA_NOTE;              // why this toolkit, or why no kernels
    d["jax_cuda_plugin"] = ZIPCCL_BUILD_JAX_CUDA_PLUGIN;  // the plugin seen at build time, "" if none
    d["jaxlib"] = ZIPCCL_BUILD_JAXLIB;              // the jaxlib whose XLA FFI headers were compiled in
    d["ffi_api"] = std::to_string(XLA_FFI_API_MAJOR) + "." + std::to_string(XLA_FFI_API_MINOR);  // their API
    d["cpu_code_paths"] = zipccl::cpu::CompiledCodePaths();
    d["cpu_native"] = bool(ZIPCCL_CPU_NATIVE);      // built with -march=native
    return d;
  }, "How this extension was built: CUDA toolkit, architectures, minimum driver, CPU code paths.");
  m.def("cuda_versions", []() -> nb::object {
#if defined(ZIPCCL_WITH_CUDA)
    zipccl::cuda::Versions v;
    int err = zipccl::cuda::GetVersions(&v);
    nb::dict d;
    d["compiled"] = v.compiled;  // the kernels' CUDA (NVRTC's), 1000 * major + 10 * minor
    d["driver"] = v.driver;      // the newest CUDA the driver supports; 0: no driver
    d["error"] = err ? std::string(zipccl::cuda::ErrorString(err)) : std::string();
    const char* why = zipccl::cuda::DriverError();
    d["driver_error"] = why ? std::string(why) : std::string();
    return d;
#else
    return nb::none();
#endif
  }, "CUDA versions of the kernels and of the driver (None without CUDA kernels).");
  m.def("cuda_images", []() {
    nb::list out;
#if defined(ZIPCCL_WITH_CUDA)
    int count = 0;
    const zipccl::cuda::KernelImage* images = zipccl::cuda::KernelImages(&count);
    for (int i = 0; i < count; ++i)
      out.append(nb::make_tuple(images[i].arch, images[i].ptx ? "ptx" : "cubin",
                                nb::bytes(reinterpret_cast<const char*>(images[i].data), images[i].size)));
#endif
    return out;
  }, "[(arch, 'cubin' | 'ptx', bytes)]: the kernel images embedded in this extension, the bytes the driver loads.");
  m.def("rejected_fill_bits", [](int dtype) {
    if (zipccl::ElemBytes(uint8_t(dtype)) == 0) throw nb::value_error("unsupported dtype code");
    return zipccl::RejectedFillBits(uint8_t(dtype));
  }, nb::arg("dtype_code"), "The bits every element of a rejected frame of this dtype gets.");
  m.def("status_messages", []() {
    nb::dict d;
    for (int s = zipccl::kOk; s < zipccl::kNumStatus; ++s) d[nb::int_(s)] = zipccl::StatusMessage(s);
    return d;
  }, "{Status code: message} of codec/format.h: the codes of the decoders' status result.");
  ZipcclRegisterCudaHost(m);
  m.attr("with_cuda") =
#if defined(ZIPCCL_WITH_CUDA)
      true;
#else
      false;
#endif
}
