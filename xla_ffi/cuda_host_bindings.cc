// Host-side view of the CUDA codec driver, for tests on machines without a GPU:
// the scratch layout, the launch sequence with its geometry, and the SIMT
// emulator of simt_emulator.h running the very kernel bodies and launch
// sequence of codec/cuda_{encode,decode,launch}.cuh on the CPU.
//
// Pure host C++ (no CUDA toolkit needed): it can be built with or without
// ZIPCCL_WITH_CUDA. Exposed as the submodule `zipccl_jax._zipccl.cuda_host`
// through ZipcclRegisterCudaHost(), called from module.cc.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "codec/cuda_launch.cuh"
#include "codec/format.h"
#include "simt_emulator.h"

namespace nb = nanobind;

namespace zipccl::cuda::emu {
namespace {

using Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using BytesOut = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I64Out = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I32Out = nb::ndarray<int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using U64 = nb::ndarray<const uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using U64Out = nb::ndarray<uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

void CheckDType(int dtype) {
  if (ElemBytes(uint8_t(dtype)) == 0) throw nb::value_error("unsupported dtype code");
}

std::vector<std::tuple<std::string, uint64_t, int, uint64_t>> ToTuples(
    const std::vector<LaunchRecord>& r) {
  std::vector<std::tuple<std::string, uint64_t, int, uint64_t>> out;
  for (const auto& x : r) out.emplace_back(x.name, x.grid, x.threads, x.shared_bytes);
  return out;
}

nb::dict EncodeLayoutDict(const EncodeLayout& L) {
  nb::dict d;
  d["frames"] = L.frames;
  d["n"] = L.n;
  d["blocks_per_frame"] = L.nb;
  d["total_blocks"] = L.total;
  d["plans_off"] = L.plans_off;
  d["sizes_off"] = L.sizes_off;
  d["offsets_off"] = L.offsets_off;
  d["hashes_off"] = L.hashes_off;
  d["scratch_bytes"] = L.scratch_bytes;
  return d;
}

nb::dict DecodeLayoutDict(const DecodeLayout& L) {
  nb::dict d;
  d["frames"] = L.frames;
  d["n"] = L.n;
  d["blocks_per_frame"] = L.nb;
  d["total_blocks"] = L.total;
  d["ferr_off"] = L.ferr_off;
  d["berr_off"] = L.berr_off;
  d["sizes_off"] = L.sizes_off;
  d["offsets_off"] = L.offsets_off;
  d["hashes_off"] = L.hashes_off;
  d["scratch_bytes"] = L.scratch_bytes;
  return d;
}

// One skip flag per frame, or null.
const uint8_t* SkipFlags(const std::optional<Bytes>& skip, uint64_t frames) {
  if (!skip.has_value()) return nullptr;
  if (skip->size() != frames) throw nb::value_error("skip must hold one uint8 flag per frame");
  return skip->data();
}

}  // namespace
}  // namespace zipccl::cuda::emu

void ZipcclRegisterCudaHost(nb::module_& parent) {
  using namespace zipccl::cuda;
  using namespace zipccl::cuda::emu;
  nb::module_ m = parent.def_submodule(
      "cuda_host", "Host-side pieces of the CUDA codec driver and its SIMT emulator (tests)");
  m.def("encode_layout",
        [](uint64_t frames, uint64_t n) { return EncodeLayoutDict(MakeEncodeLayout(frames, n)); },
        nb::arg("frames"), nb::arg("n_elems"),
        "Scratch layout of an encode call (byte offsets of each section).");
  m.def("decode_layout",
        [](uint64_t frames, uint64_t n) { return DecodeLayoutDict(MakeDecodeLayout(frames, n)); },
        nb::arg("frames"), nb::arg("n_elems"),
        "Scratch layout of a decode call.");
  m.def("encode_launches",
        [](uint64_t frames, uint64_t n, int dtype, uint64_t cap) {
          CheckDType(dtype);
          return ToTuples(EmulateEncode(nullptr, frames, n, dtype, false, nullptr, cap, nullptr, nullptr,
                                 /*execute=*/false, 0));
        },
        nb::arg("frames"), nb::arg("n_elems"), nb::arg("dtype_code"), nb::arg("cap_bytes") = 0,
        "The encoder's launch sequence for payload rows of cap_bytes: (kernel, grid, threads per "
        "CTA, static shared bytes).");
  m.def("decode_launches",
        [](uint64_t frames, uint64_t n, int dtype, bool status) {
          CheckDType(dtype);
          int32_t dummy = 0;
          return ToTuples(EmulateDecode(nullptr, frames, 0, dtype, n, nullptr, status ? &dummy : nullptr,
                                 nullptr, /*execute=*/false, 0));
        },
        nb::arg("frames"), nb::arg("n_elems"), nb::arg("dtype_code"), nb::arg("status"),
        "The decoder's launch sequence: (kernel, grid, threads per CTA, static shared bytes).");
  m.def("emulate_scan",
        [](U64 in, U64Out out, uint64_t seed) {
          if (out.shape(0) != in.shape(0)) throw nb::value_error("out must have the length of in");
          EmuLauncher l(/*execute=*/true, seed);
          l.Launch<ScanKernel>(1, ScanParams{in.data(), out.data(), uint64_t(in.shape(0))});
        },
        nb::arg("values"), nb::arg("out"), nb::arg("seed") = 1,
        "Runs the block-size scan kernel (codec/cuda_scan.cuh) on the emulator: out = exclusive prefix sum.");
  m.def("emulate_encode",
        [](Bytes x, uint64_t frames, uint64_t n, int dtype, bool checksum, BytesOut out,
           I64Out nbytes, uint64_t seed, std::optional<Bytes> skip) {
          CheckDType(dtype);
          const uint64_t w = uint64_t(zipccl::ElemBytes(uint8_t(dtype)));
          if (x.size() != frames * n * w) throw nb::value_error("x must hold frames * n elements");
          if (nbytes.size() != frames) throw nb::value_error("nbytes must hold one entry per frame");
          if (frames && out.size() % frames) throw nb::value_error("out must hold frames * cap bytes");
          const uint64_t cap = frames ? out.size() / frames : 0;
          const uint8_t* sk = SkipFlags(skip, frames);
          nb::gil_scoped_release release;
          EmulateEncode(x.data(), frames, n, dtype, checksum, out.data(), cap, nbytes.data(), sk, true,
                 seed);
        },
        nb::arg("x"), nb::arg("frames"), nb::arg("n_elems"), nb::arg("dtype_code"),
        nb::arg("checksum"), nb::arg("out"), nb::arg("nbytes"), nb::arg("seed") = 0,
        nb::arg("skip").none() = nb::none(),
        "Runs the CUDA encoder's kernels in the emulator: x (frames*n elements, as bytes) "
        "-> out (frames*cap bytes), nbytes (int64 per frame). skip: optional uint8 flag per "
        "frame (non-zero: not coded, zero row, size 0).");
  m.def("emulate_decode",
        [](Bytes payload, uint64_t frames, int dtype, uint64_t n, BytesOut out, I32Out status,
           uint64_t seed, std::optional<Bytes> skip) {
          CheckDType(dtype);
          const uint64_t w = uint64_t(zipccl::ElemBytes(uint8_t(dtype)));
          if (out.size() != frames * n * w) throw nb::value_error("out must hold frames * n elements");
          if (status.size() != frames) throw nb::value_error("status must hold one entry per frame");
          if (frames && payload.size() % frames) throw nb::value_error("payload must hold frames * cap bytes");
          const uint64_t cap = frames ? payload.size() / frames : 0;
          const uint8_t* sk = SkipFlags(skip, frames);
          nb::gil_scoped_release release;
          EmulateDecode(payload.data(), frames, cap, dtype, n, out.data(), status.data(), sk, true, seed);
        },
        nb::arg("payload"), nb::arg("frames"), nb::arg("dtype_code"), nb::arg("n_elems"),
        nb::arg("out"), nb::arg("status"), nb::arg("seed") = 0,
        nb::arg("skip").none() = nb::none(),
        "Runs the CUDA decoder's kernels in the emulator; status gets 0 or a Status code per "
        "frame. skip: optional uint8 flag per frame (non-zero: not read, zero output, status 0).");
  m.def("constants", []() {
    nb::dict d;
    d["THREADS"] = kThreads;
    d["ITEM_THREADS"] = kItemThreads;
    d["ELEMS_PER_THREAD"] = kElemsPerThread;
    d["SEG_THREADS"] = kSegThreads;
    d["TILE_ELEMS"] = kTileElems;
    d["SCRATCH_ALIGN"] = kScratchAlign;
    d["BLOCK_PLAN_BYTES"] = sizeof(zipccl::BlockPlan);
    return d;
  });
  m.def("error_key",
        [](int64_t block, int status) {
          return block < 0 ? (unsigned long long)status : BlockErrorKey(uint64_t(block), status);
        },
        nb::arg("block"), nb::arg("status"),
        "The error key the decoder minimises: frame errors (block -1) first, then the first block.");
  m.def("status_message", [](int status) { return std::string(zipccl::StatusMessage(status)); },
        nb::arg("status"), "The message of a Status code (as the CPU decoder words it).");
}
