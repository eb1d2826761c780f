// FFI contract test of the CUDA handlers: the real ZipcclEncodeCuda / ZipcclDecodeCuda of
// xla_ffi/handlers_cuda.cc, called through a mock XLA_FFI_Api that enforces XLA's rules
// (xla_ffi_mock.h), over the real launch layer (xla_ffi/codec/kernels_host.cc) with a mock CUDA driver
// (xla_ffi/emulated_driver.cc) linked in place of libcuda.so.1, whose launches run the kernels in the
// SIMT emulator on host memory. Host compiler only.
//
// The handlers take their scratch as the last result (uint8[cuda_scratch_bytes], xla_ffi/cuda_scratch.h),
// a buffer aligned as XLA aligns buffers and no better; a run-time allocation through XLA's allocator
// (what a command-buffer compatible handler must not make) or any other API use XLA would reject is
// recorded as a violation and fails the test. The bytes are compared with the CPU driver's.
//
// Build (tests/test_ffi_contract.py does this; Bazel: //tests/cc:ffi_contract_test):
//   g++ -std=c++17 -I. -Ixla_ffi -isystem <jaxlib>/include tests/cc/ffi_contract_test.cc
//       xla_ffi/handlers_cuda.cc xla_ffi/codec/kernels_host.cc xla_ffi/emulated_driver.cc
//       xla_ffi/codec/cpu_driver.cc -DZIPCCL_CUDA_VERSION=12090 -DZIPCCL_CUDA_MIN_DRIVER='"525.60.13"'

#ifndef ZIPCCL_WITH_CUDA
#define ZIPCCL_WITH_CUDA 1
#endif
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/cc/check.h"
#include "tests/cc/codec_test_util.h"
#include "tests/cc/xla_ffi_mock.h"
#include "xla_ffi/codec/cuda_common.cuh"
#include "xla_ffi/codec/cuda_launch.cuh"
#include "xla_ffi/cuda_scratch.h"
#include "xla_ffi/emulated_driver.h"
#include "xla_ffi/handlers.h"
#include "xla_ffi/simt_emulator.h"

namespace {

using namespace zipccl_test;
using xla_ffi_mock::Array;
using xla_ffi_mock::DeviceBuffer;
using xla_ffi_mock::Invoke;
using xla_ffi_mock::Outcome;
namespace emulated = zipccl::cuda::emulated;

XLA_FFI_DataType FfiType(uint8_t dtype) {
  return dtype == kBF16                ? XLA_FFI_DataType_BF16
         : dtype == kF16               ? XLA_FFI_DataType_F16
         : dtype == zipccl::kF8E4M3FN ? XLA_FFI_DataType_F8E4M3FN
                                       : XLA_FFI_DataType_F32;
}

// Frames of n elements each, concatenated: gaussian with zeros, so every block mode occurs.
zipccl_test::Array Frames(uint8_t dtype, uint64_t frames, uint64_t n, uint32_t seed) {
  zipccl_test::Array all = MakeArray(dtype, frames * n);
  for (uint64_t f = 0; f < frames; ++f) {
    zipccl_test::Array a = f == 1 ? RandomBits(dtype, n, seed + f) : Gaussian(dtype, n, seed + f, 1.0f, 0.3);
    std::memcpy(all.bytes.data() + f * a.bytes.size(), a.bytes.data(), a.bytes.size());
  }
  return all;
}

struct Encoded {
  Outcome outcome;
  std::vector<uint8_t> payload;
  std::vector<int64_t> nbytes;
};

// What the handler needs (cuda_scratch.h), unless a test says otherwise.
constexpr int64_t kNeeded = -1;

// Encodes frames x (frames of x.n / frames elements) with the CUDA handler. scratch_bytes: the size of the
// scratch result (kNeeded: the extension's cuda_scratch_bytes); scratch_offset: its start past a
// 256-aligned base (XLA's buffers: at least 16-aligned).
Encoded EncodeCuda(XLA_FFI_ExecutionContext& ctx, const zipccl_test::Array& x, uint64_t frames, uint64_t cap,
                   bool checksum, std::vector<uint8_t>* skip = nullptr, int64_t scratch_bytes = kNeeded,
                   size_t scratch_offset = 16) {
  Encoded e;
  e.payload.assign(frames * cap, 0xAB);  // stale device memory
  e.nbytes.assign(frames, -7);
  const int64_t n = int64_t(x.n / frames);
  const uint64_t need = zipccl::cuda::EncodeScratchResultBytes(frames, uint64_t(n));
  DeviceBuffer scratch(scratch_bytes == kNeeded ? need : uint64_t(scratch_bytes), scratch_offset);
  std::vector<Array> args = {{FfiType(x.dtype), {int64_t(frames), n}, const_cast<uint8_t*>(x.bytes.data())}};
  if (skip) args.push_back({XLA_FFI_DataType_U8, {int64_t(frames)}, skip->data()});
  e.outcome = Invoke(ZipcclEncodeCuda, ctx, args,
                     {{XLA_FFI_DataType_U8, {int64_t(frames), int64_t(cap)}, e.payload.data()},
                      {XLA_FFI_DataType_S64, {int64_t(frames)}, e.nbytes.data()},
                      {XLA_FFI_DataType_U8, {int64_t(scratch.size())}, scratch.data()}},
                     {{"checksum", checksum}});
  return e;
}

// Decodes `frames` rows of `payload` (cap bytes each) into out (frames * n elements of dtype) with the CUDA
// handler; status (optional) gets a code per frame; skip (optional) one flag per frame.
Outcome DecodeCuda(XLA_FFI_ExecutionContext& ctx, std::vector<uint8_t>& payload, uint64_t frames, uint64_t cap,
                   uint8_t dtype, uint64_t n, std::vector<uint8_t>& out, std::vector<int32_t>* status,
                   std::vector<uint8_t>* skip = nullptr, int64_t scratch_bytes = kNeeded) {
  const uint64_t need = zipccl::cuda::DecodeScratchResultBytes(frames, n);
  DeviceBuffer scratch(scratch_bytes == kNeeded ? need : uint64_t(scratch_bytes));
  std::vector<Array> args = {{XLA_FFI_DataType_U8, {int64_t(frames), int64_t(cap)}, payload.data()}};
  if (skip) args.push_back({XLA_FFI_DataType_U8, {int64_t(frames)}, skip->data()});
  std::vector<Array> rets = {{FfiType(dtype), {int64_t(frames), int64_t(n)}, out.data()}};
  if (status) rets.push_back({XLA_FFI_DataType_S32, {int64_t(frames)}, status->data()});
  rets.push_back({XLA_FFI_DataType_U8, {int64_t(scratch.size())}, scratch.data()});
  return Invoke(ZipcclDecodeCuda, ctx, args, rets, {});
}

// The CPU driver's frame f, padded with zeros to cap (what the CUDA encoder must write).
std::vector<uint8_t> CpuRow(const zipccl_test::Array& x, uint64_t frames, uint64_t f, uint64_t cap,
                            bool checksum, int64_t* size) {
  const uint64_t n = x.n / frames, w = uint64_t(zipccl::ElemBytes(x.dtype));
  std::vector<uint8_t> row(cap, 0);
  *size = int64_t(zipccl::cpu::EncodeFrame(x.bytes.data() + f * n * w, n, x.dtype, checksum, row.data(), cap));
  return row;
}

// Every frame of x as the CPU driver writes it, each padded to cap: frames * cap bytes.
std::vector<uint8_t> CpuPayload(const zipccl_test::Array& x, uint64_t frames, uint64_t cap, bool checksum) {
  std::vector<uint8_t> payload(frames * cap);
  for (uint64_t f = 0; f < frames; ++f) {
    int64_t size = 0;
    std::vector<uint8_t> row = CpuRow(x, frames, f, cap, checksum, &size);
    std::memcpy(payload.data() + f * cap, row.data(), cap);
  }
  return payload;
}

// No violation of XLA's FFI contract, and no run-time allocation at all.
void ExpectClean(const XLA_FFI_ExecutionContext& ctx, const char* what) {
  CHECK(ctx.violations.empty()) << what << ": " << ctx.violations.front();
  CHECK(ctx.allocations == 0 && ctx.frees == 0) << what << ": the handler used XLA's allocator";
}

TEST(encode_through_xla_ffi_gives_the_cpu_drivers_bytes) {
  for (uint8_t dtype : kDTypes) {
    for (bool checksum : {false, true}) {
      XLA_FFI_ExecutionContext ctx;
      const uint64_t frames = 3, n = 70001;  // two blocks per frame, the second partial
      zipccl_test::Array x = Frames(dtype, frames, n, 11);
      const uint64_t cap = zipccl::MaxEncodedBytes(n, dtype);
      Encoded e = EncodeCuda(ctx, x, frames, cap, checksum);
      CHECK(e.outcome.ok) << DTypeName(dtype) << ": " << e.outcome.message;
      ExpectClean(ctx, DTypeName(dtype));
      CHECK(emulated::Last().stream == ctx.stream) << "kernels must go to the stream of XLA's context";
      CHECK(emulated::Last().launches > 0);
      // The real kernel bodies ran under the instrumentation (race checks, random yields).
      CHECK(zipccl::cuda::emu::EmuInstrumented() && zipccl::cuda::emu::Emu().yields > 0);
      for (uint64_t f = 0; f < frames; ++f) {
        int64_t size = 0;
        std::vector<uint8_t> want = CpuRow(x, frames, f, cap, checksum, &size);
        CHECK_EQ(e.nbytes[f], size) << DTypeName(dtype) << " frame " << f;
        CHECK(std::memcmp(e.payload.data() + f * cap, want.data(), cap) == 0)
            << DTypeName(dtype) << " frame " << f << " checksum " << checksum;
      }
    }
  }
}

// The launch layer picks the image for the device's compute capability: the CUBIN of its major with the
// highest minor not above it, else the PTX; the mock driver refuses any other (as the driver does).
TEST(each_gpu_generation_gets_an_image_it_can_run) {
  struct Case {
    int cc, arch;
    bool ptx;
  };
  for (Case c : {Case{86, 80, false}, Case{90, 90, false}, Case{120, 80, true}, Case{89, 80, false}}) {
    emulated::SetComputeCapability(c.cc);
    XLA_FFI_ExecutionContext ctx;
    zipccl_test::Array x = Frames(kBF16, 2, 5000, 3);
    const uint64_t cap = zipccl::MaxEncodedBytes(5000, kBF16);
    Encoded e = EncodeCuda(ctx, x, 2, cap, false);
    CHECK(e.outcome.ok) << "sm_" << c.cc << ": " << e.outcome.message;
    CHECK(emulated::Last().image_arch == c.arch && emulated::Last().image_ptx == c.ptx) << "sm_" << c.cc;
    int64_t size = 0;
    std::vector<uint8_t> want = CpuRow(x, 2, 0, cap, false, &size);
    CHECK(std::memcmp(e.payload.data(), want.data(), cap) == 0) << "sm_" << c.cc;
    CHECK(EncodeCuda(ctx, x, 2, cap, false).outcome.ok) << "sm_" << c.cc;
    CHECK_EQ(emulated::Last().device_queries, 0) << "the context's device is asked once, not per call";
    ExpectClean(ctx, "image choice");
  }
  emulated::SetComputeCapability(75);  // older than every image: an error, not a crash
  XLA_FFI_ExecutionContext ctx;
  zipccl_test::Array x = Frames(kBF16, 1, 3000, 3);
  Encoded e = EncodeCuda(ctx, x, 1, zipccl::MaxEncodedBytes(3000, kBF16), false);
  CHECK(!e.outcome.ok);
  CHECK(e.outcome.message.find("no kernel image for this GPU (zipccl_jax ships sm_80+)") != std::string::npos)
      << e.outcome.message;
  ExpectClean(ctx, "sm_75");
  emulated::SetComputeCapability(80);
}
// What the driver refuses comes back as the handler's error: a kernel the library lacks, and (the mock's
// own launch checks) a CTA over the kernel's launch bounds or more shared memory than 48 KB.
TEST(the_driver_refuses_a_missing_kernel_and_a_bad_launch) {
  emulated::SetComputeCapability(87);  // a library not loaded yet, so every kernel is looked up afresh
  emulated::HideKernel("zipccl_scan");
  XLA_FFI_ExecutionContext ctx;
  zipccl_test::Array x = Frames(kF16, 1, 3000, 4);
  Encoded e = EncodeCuda(ctx, x, 1, zipccl::MaxEncodedBytes(3000, kF16), false);
  emulated::HideKernel(nullptr);
  emulated::SetComputeCapability(80);
  CHECK(!e.outcome.ok);
  CHECK(e.outcome.message.find("zipccl encode: kernel launch: named symbol not found") != std::string::npos)
      << e.outcome.message;
  ExpectClean(ctx, "missing kernel");

  using namespace zipccl::cuda;
  CUfunction scan = emulated::KernelHandle("zipccl_scan");
  CHECK(scan != nullptr && emulated::KernelHandle("zipccl_no_such_kernel") == nullptr);
  uint64_t in[3] = {5, 6, 7}, out[3] = {};
  ScanParams p{in, out, 3};
  void* args[] = {&p};
  auto launch = [&](unsigned grid, unsigned threads, unsigned shared) {
    return emulated::LaunchKernel(scan, grid, 1, 1, threads, 1, 1, shared, reinterpret_cast<CUstream>(&ctx),
                                  args, nullptr);
  };
  CHECK_EQ(launch(1, kThreads, 0), kCudaSuccess);
  CHECK(out[0] == 0 && out[1] == 5 && out[2] == 11);
  CHECK_EQ(launch(1, kThreads * 2, 0), kCudaErrorInvalidValue);                   // over __launch_bounds__
  CHECK_EQ(launch(1, kThreads, unsigned(emulated::kMaxSharedBytes)), kCudaErrorInvalidValue);  // > 48 KB
  CHECK_EQ(launch(0, kThreads, 0), kCudaErrorInvalidValue);                       // empty grid
}

TEST(decode_with_status_and_skip_through_xla_ffi) {
  for (uint8_t dtype : kDTypes) {
    const uint64_t frames = 4, n = 66000;
    zipccl_test::Array x = Frames(dtype, frames, n, 5);
    const uint64_t cap = zipccl::MaxEncodedBytes(n, dtype), w = uint64_t(zipccl::ElemBytes(dtype));
    std::vector<uint8_t> payload = CpuPayload(x, frames, cap, true);
    payload[2 * cap + 40] ^= 0x10;  // frame 2: corrupt (the checksum catches it)
    std::vector<uint8_t> skip = {0, 0, 0, 1};
    std::vector<uint8_t> out(frames * n * w, 0xCD);
    std::vector<int32_t> status(frames, -1);
    XLA_FFI_ExecutionContext ctx;
    Outcome o = DecodeCuda(ctx, payload, frames, cap, dtype, n, out, &status, &skip);
    CHECK(o.ok) << o.message;
    ExpectClean(ctx, "decode");
    CHECK(emulated::Last().stream == ctx.stream);
    CHECK_EQ(status[0], 0);
    CHECK_EQ(status[1], 0);
    CHECK_EQ(status[2], int(zipccl::kErrChecksum));
    CHECK_EQ(status[3], 0);
    CHECK(std::memcmp(out.data(), x.bytes.data(), 2 * n * w) == 0) << DTypeName(dtype);
    const uint32_t fill = zipccl::RejectedFillBits(dtype);
    bool nan_row = true, zero_row = true;
    for (uint64_t i = 0; i < n; ++i) {
      uint32_t v = 0, z = 0;
      std::memcpy(&v, out.data() + (2 * n + i) * w, w);
      std::memcpy(&z, out.data() + (3 * n + i) * w, w);
      nan_row &= v == fill;
      zero_row &= z == 0;
    }
    CHECK(nan_row) << DTypeName(dtype) << ": a rejected frame decodes to the fill bits";
    CHECK(zero_row) << DTypeName(dtype) << ": a skipped frame decodes to zeros";
  }
}

// decode_into (BindDecodeInto): frame f's n elements land in columns [col, col + n) of row f of a
// frames x row buffer that is both the operand `into` and the result (XLA aliases them: one address);
// every other element keeps its bytes. With status and skip, as decode.
Outcome DecodeIntoCuda(XLA_FFI_ExecutionContext& ctx, std::vector<uint8_t>& payload, uint64_t frames,
                       uint64_t cap, uint8_t dtype, uint64_t row, int64_t col, int64_t n, uint8_t* into,
                       uint8_t* out, std::vector<int32_t>* status, std::vector<uint8_t>* skip = nullptr) {
  const uint64_t need = zipccl::cuda::DecodeScratchResultBytes(frames, uint64_t(n));
  DeviceBuffer scratch(need);
  std::vector<Array> args = {{XLA_FFI_DataType_U8, {int64_t(frames), int64_t(cap)}, payload.data()},
                             {FfiType(dtype), {int64_t(frames), int64_t(row)}, into}};
  if (skip) args.push_back({XLA_FFI_DataType_U8, {int64_t(frames)}, skip->data()});
  std::vector<Array> rets = {{FfiType(dtype), {int64_t(frames), int64_t(row)}, out}};
  if (status) rets.push_back({XLA_FFI_DataType_S32, {int64_t(frames)}, status->data()});
  rets.push_back({XLA_FFI_DataType_U8, {int64_t(scratch.size())}, scratch.data()});
  return Invoke(ZipcclDecodeIntoCuda, ctx, args, rets, {{"col", col}, {"elems", n}});
}

TEST(decode_into_writes_only_its_columns) {
  for (uint8_t dtype : kDTypes) {
    const uint64_t frames = 3, n = 66000, row = 70000, col = 3001;  // an odd column: any element alignment
    zipccl_test::Array x = Frames(dtype, frames, n, 9);
    const uint64_t cap = zipccl::MaxEncodedBytes(n, dtype), w = uint64_t(zipccl::ElemBytes(dtype));
    std::vector<uint8_t> payload = CpuPayload(x, frames, cap, false);
    payload[1 * cap + 40] ^= 0x10;  // frame 1: a damaged frame (its row: the fill bits)
    std::vector<uint8_t> skip = {0, 0, 1}, buf(frames * row * w, 0xCD);
    std::vector<int32_t> status(frames, -1);
    XLA_FFI_ExecutionContext ctx;
    Outcome o = DecodeIntoCuda(ctx, payload, frames, cap, dtype, row, int64_t(col), int64_t(n), buf.data(),
                               buf.data(), &status, &skip);
    CHECK(o.ok) << o.message;
    ExpectClean(ctx, "decode_into");
    CHECK_EQ(status[0], 0);
    CHECK(status[1] != 0);
    CHECK_EQ(status[2], 0);
    const uint32_t fill = zipccl::RejectedFillBits(dtype);
    for (uint64_t f = 0; f < frames; ++f) {
      const uint8_t* r = buf.data() + f * row * w;
      for (uint64_t e = 0; e < row; ++e) {
        uint32_t v = 0, want = 0xCDCDCDCDu >> (32 - 8 * w);
        std::memcpy(&v, r + e * w, w);
        if (e >= col && e < col + n) {
          if (f == 0) std::memcpy(&want, x.bytes.data() + (f * n + e - col) * w, w);
          else want = f == 1 ? fill : 0;
        }
        CHECK_EQ(v, want) << DTypeName(dtype) << " frame " << f << " element " << e;
      }
    }
  }
}

TEST(decode_into_refuses_an_unaliased_result_and_columns_past_the_row) {
  const uint64_t frames = 2, n = 1000, row = 1500, cap = zipccl::MaxEncodedBytes(n, kBF16);
  std::vector<uint8_t> payload(frames * cap, 0), into(frames * row * 2), out(frames * row * 2);
  XLA_FFI_ExecutionContext ctx;
  const uint64_t launches = emulated::Last().launches;
  Outcome a = DecodeIntoCuda(ctx, payload, frames, cap, kBF16, row, 0, int64_t(n), into.data(), out.data(),
                             nullptr);
  CHECK(!a.ok && a.errc == XLA_FFI_Error_Code_INVALID_ARGUMENT) << a.message;
  CHECK(a.message.find("alias") != std::string::npos) << a.message;
  Outcome b = DecodeIntoCuda(ctx, payload, frames, cap, kBF16, row, 501, int64_t(n), into.data(), into.data(),
                             nullptr);
  CHECK(!b.ok && b.errc == XLA_FFI_Error_Code_INVALID_ARGUMENT) << b.message;
  CHECK(b.message.find("[501, 1501)") != std::string::npos) << b.message;
  CHECK_EQ(emulated::Last().launches, launches);  // refused before any launch
}

// A command-buffer compatible handler allocates nothing at run time: the mock refuses XLA's allocator and
// records the call (so every ExpectClean above would fail on one), and the handlers run without one.
TEST(the_handlers_never_call_xlas_allocator) {
  XLA_FFI_ExecutionContext probe;
  XLA_FFI_DeviceMemory_Allocate_Args a{XLA_FFI_DeviceMemory_Allocate_Args_STRUCT_SIZE, nullptr, &probe, 64, 16,
                                       nullptr};
  XLA_FFI_Error* err = xla_ffi_mock::Api()->XLA_FFI_DeviceMemory_Allocate(&a);
  CHECK(err != nullptr && probe.allocations == 1 && probe.violations.size() == 1);
  delete err;
  for (bool allocator : {true, false}) {  // a context with no device allocator at all makes no difference
    XLA_FFI_ExecutionContext ctx;
    ctx.allocator = allocator;
    zipccl_test::Array x = Frames(kF16, 2, 70000, 9);
    const uint64_t cap = zipccl::MaxEncodedBytes(70000, kF16);
    Encoded e = EncodeCuda(ctx, x, 2, cap, true);
    CHECK(e.outcome.ok) << e.outcome.message;
    std::vector<uint8_t> out(2 * 70000 * 2, 0xCD);
    std::vector<int32_t> status(2, -1);
    Outcome o = DecodeCuda(ctx, e.payload, 2, cap, kF16, 70000, out, &status);
    CHECK(o.ok) << o.message;
    CHECK(out == x.bytes && status[0] == 0 && status[1] == 0);
    ExpectClean(ctx, allocator ? "with an allocator" : "without an allocator");
  }
}

// One byte less than cuda_scratch_bytes is refused before any launch, naming what the call needs and
// what it got; a missing scratch result too.
TEST(a_scratch_result_too_small_is_an_invalid_argument) {
  const uint64_t frames = 2, n = 70000;
  zipccl_test::Array x = Frames(kBF16, frames, n, 4);
  const uint64_t cap = zipccl::MaxEncodedBytes(n, kBF16);
  const uint64_t enc = zipccl::cuda::EncodeScratchResultBytes(frames, n);
  const uint64_t dec = zipccl::cuda::DecodeScratchResultBytes(frames, n);
  CHECK_EQ(enc, zipccl::cuda::MakeEncodeLayout(frames, n).scratch_bytes + 240);
  XLA_FFI_ExecutionContext ctx;
  const uint64_t before = emulated::Last().launches;
  Encoded e = EncodeCuda(ctx, x, frames, cap, false, nullptr, int64_t(enc) - 1);
  CHECK(!e.outcome.ok);
  CHECK_EQ(int(e.outcome.errc), int(XLA_FFI_Error_Code_INVALID_ARGUMENT));
  const std::string want = "zipccl encode (2 frames of 70000 elements): the scratch result is too small: this "
                           "call needs " + std::to_string(enc) + " bytes";
  CHECK(e.outcome.message.find(want) != std::string::npos) << e.outcome.message;
  CHECK(e.outcome.message.find("got " + std::to_string(enc - 1)) != std::string::npos) << e.outcome.message;
  CHECK(e.nbytes[0] == -7 && e.payload[0] == 0xAB) << "nothing may run";

  std::vector<uint8_t> payload(frames * cap, 0), out(frames * n * 2);
  Outcome o = DecodeCuda(ctx, payload, frames, cap, kBF16, n, out, nullptr, nullptr, int64_t(dec) - 1);
  CHECK(!o.ok);
  CHECK_EQ(int(o.errc), int(XLA_FFI_Error_Code_INVALID_ARGUMENT));
  CHECK(o.message.find("zipccl decode (2 frames of 70000 elements): the scratch result is too small: this call "
                       "needs " + std::to_string(dec) + " bytes") != std::string::npos) << o.message;
  CHECK(o.message.find("got " + std::to_string(dec - 1)) != std::string::npos) << o.message;
  CHECK_EQ(emulated::Last().launches, before);
  // The decoder's results without the scratch: only `out`, or `out` and an int32 status.
  Outcome none = Invoke(ZipcclDecodeCuda, ctx, {{XLA_FFI_DataType_U8, {2, int64_t(cap)}, payload.data()}},
                        {{XLA_FFI_DataType_BF16, {2, int64_t(n)}, out.data()}}, {});
  CHECK(!none.ok && none.message.find("(the scratch), got 0") != std::string::npos) << none.message;
  std::vector<int32_t> status(2);
  Outcome st = Invoke(ZipcclDecodeCuda, ctx, {{XLA_FFI_DataType_U8, {2, int64_t(cap)}, payload.data()}},
                      {{XLA_FFI_DataType_BF16, {2, int64_t(n)}, out.data()},
                       {XLA_FFI_DataType_S32, {2}, status.data()}}, {});
  CHECK(!st.ok && st.message.find("the last result (scratch) must be uint8") != std::string::npos) << st.message;
  ExpectClean(ctx, "too small");
}

// XLA aligns its buffers to at least 16 bytes (128 on GPU): the sections are aligned to 256 inside the
// scratch at any such start. A start below 16 (never XLA's) works when the aligned sections still fit and
// is refused, not overrun, when they do not.
TEST(the_sections_are_aligned_inside_the_scratch_result) {
  const uint64_t frames = 2, n = 70000;
  zipccl_test::Array x = Frames(kF32, frames, n, 6);
  const uint64_t cap = zipccl::MaxEncodedBytes(n, kF32);
  const uint64_t need = zipccl::cuda::EncodeScratchResultBytes(frames, n);
  for (size_t offset : {size_t(16), size_t(32), size_t(128), size_t(256), size_t(8)}) {
    XLA_FFI_ExecutionContext ctx;
    Encoded e = EncodeCuda(ctx, x, frames, cap, false, nullptr, kNeeded, offset);
    CHECK_EQ(e.outcome.ok, offset != 8) << offset << ": " << e.outcome.message;
    if (offset == 8) {
      CHECK(e.outcome.message.find("is aligned to less than 16 bytes") != std::string::npos) << e.outcome.message;
    }
    ExpectClean(ctx, "offset");
  }
  XLA_FFI_ExecutionContext ctx;  // 8 more bytes: the 8-aligned start fits again
  CHECK(EncodeCuda(ctx, x, frames, cap, false, nullptr, int64_t(need) + 8, 8).outcome.ok);
}

// Under jax.vmap (vmap_method="broadcast_all") the handler gets B times the frames and a scratch result of
// shape (B, S), S the unbatched call's bytes: never less than the batched call needs (each section grows
// linearly with the blocks and is rounded up once per call).
TEST(a_batched_calls_scratch_is_enough) {
  for (uint64_t n : {uint64_t(1), uint64_t(100), uint64_t(65536), uint64_t(70001), uint64_t(300000)})
    for (uint64_t f = 0; f <= 5; ++f)
      for (uint64_t b = 1; b <= 9; ++b) {
        CHECK(zipccl::cuda::EncodeScratchResultBytes(b * f, n) <= b * zipccl::cuda::EncodeScratchResultBytes(f, n))
            << b << " x " << f << " frames of " << n;
        CHECK(zipccl::cuda::DecodeScratchResultBytes(b * f, n) <= b * zipccl::cuda::DecodeScratchResultBytes(f, n))
            << b << " x " << f << " frames of " << n;
      }
  const uint64_t b = 2, f = 3, n = 5000, cap = zipccl::MaxEncodedBytes(n, kBF16);
  zipccl_test::Array x = Frames(kBF16, b * f, n, 8);
  const uint64_t s = zipccl::cuda::EncodeScratchResultBytes(f, n);
  DeviceBuffer scratch(b * s);
  std::vector<uint8_t> payload(b * f * cap);
  std::vector<int64_t> nbytes(b * f);
  XLA_FFI_ExecutionContext ctx;
  Outcome o = Invoke(ZipcclEncodeCuda, ctx,
                     {{XLA_FFI_DataType_BF16, {int64_t(b), int64_t(f), int64_t(n)}, x.bytes.data()}},
                     {{XLA_FFI_DataType_U8, {int64_t(b), int64_t(f), int64_t(cap)}, payload.data()},
                      {XLA_FFI_DataType_S64, {int64_t(b), int64_t(f)}, nbytes.data()},
                      {XLA_FFI_DataType_U8, {int64_t(b), int64_t(s)}, scratch.data()}},
                     {{"checksum", false}});
  CHECK(o.ok) << o.message;
  int64_t size = 0;
  std::vector<uint8_t> want = CpuRow(x, b * f, 5, cap, false, &size);
  CHECK(std::memcmp(payload.data() + 5 * cap, want.data(), cap) == 0 && nbytes[5] == size);
  ExpectClean(ctx, "batched");
}

TEST(launch_failure_propagates) {
  XLA_FFI_ExecutionContext ctx;
  emulated::FailNextLaunch(719);
  zipccl_test::Array x = Frames(kF32, 1, 3000, 2);
  Encoded e = EncodeCuda(ctx, x, 1, zipccl::MaxEncodedBytes(3000, kF32), false);
  CHECK(!e.outcome.ok);
  CHECK_EQ(int(e.outcome.errc), int(XLA_FFI_Error_Code_INTERNAL));
  CHECK(e.outcome.message.find("zipccl encode: kernel launch: unspecified launch failure") != std::string::npos)
      << e.outcome.message;
  ExpectClean(ctx, "launch failure");
}

TEST(old_driver_fails_naming_both_versions) {
  zipccl::cuda::Versions v{};
  zipccl::cuda::GetVersions(&v);
  CHECK_EQ(v.compiled, 12090);  // -DZIPCCL_CUDA_VERSION of this build: kernels "compiled by NVRTC 12.9"
  for (int old : {11080, 0}) {  // a CUDA 11.8 driver; no driver at all
    emulated::SetDriverVersion(old);
    XLA_FFI_ExecutionContext ctx;
    zipccl_test::Array x = Frames(kBF16, 1, 3000, 2);
    Encoded e = EncodeCuda(ctx, x, 1, zipccl::MaxEncodedBytes(3000, kBF16), false);
    emulated::SetDriverVersion(13000);
    CHECK(!e.outcome.ok);
    CHECK_EQ(int(e.outcome.errc), int(XLA_FFI_Error_Code_FAILED_PRECONDITION));
    for (const char* part : {old ? "supports CUDA 11.8" : "no CUDA driver was found", "compiled for CUDA 12.9",
                             "525.60.13"})
      CHECK(e.outcome.message.find(part) != std::string::npos) << part << " in: " << e.outcome.message;
    CHECK_EQ(ctx.allocations, uint64_t(0));
    ExpectClean(ctx, "driver");
  }
  // A CUDA 12.0 driver runs CUBINs of NVRTC 12.9 (minor-version compatibility), but not its PTX.
  emulated::SetDriverVersion(12000);
  for (int cc : {80, 100}) {
    emulated::SetComputeCapability(cc);
    XLA_FFI_ExecutionContext ctx;
    zipccl_test::Array x = Frames(kBF16, 1, 3000, 2);
    Encoded e = EncodeCuda(ctx, x, 1, zipccl::MaxEncodedBytes(3000, kBF16), false);
    CHECK_EQ(e.outcome.ok, cc == 80) << cc << ": " << e.outcome.message;
    if (cc == 100) {
      CHECK(e.outcome.message.find("unsupported toolchain") != std::string::npos) << e.outcome.message;
    }
    ExpectClean(ctx, "CUDA 12.0 driver");
  }
  emulated::SetComputeCapability(80);
  emulated::SetDriverVersion(13000);
}

// Damaged frames through the decode handler on the emulated kernels, under ASan: each payload buffer is
// exactly the readable bytes (a heap block of that size), so a kernel reading past them is reported; each
// frame gets the CPU driver's verdict, and its row the CPU's decoded bits or the rejected-frame fill.
TEST(damaged_frames_get_the_cpu_verdict_and_no_read_past_the_payload) {
  std::mt19937 rng(11);
  for (uint8_t dtype : {uint8_t(kBF16), uint8_t(kF32), uint8_t(zipccl::kF8E4M3FN)}) {
    const uint64_t n = 70000, w = uint64_t(zipccl::ElemBytes(dtype));  // a HUFF block and a short one
    zipccl_test::Array x = Gaussian(w == 1 ? kBF16 : dtype, n, 21, 1.0f, 0.3);
    if (w == 1) {  // one-byte floats: the bfloat16's sign and high exponent bits, so that blocks are HUFF
      zipccl_test::Array b = MakeArray(dtype, n);
      for (uint64_t i = 0; i < n; ++i) SetElem(b, i, GetElem(x, i) >> 8);
      x = b;
    }
    const std::vector<uint8_t> good = Encode(x, false);
    CHECK(good.size() < n * w) << DTypeName(dtype) << ": the frame should have HUFF blocks";
    // 12 trials per dtype: each kind of damage four times, each form of truncation twice (an emulated
    // decode of the 70,000 elements takes ~1.5 s under ASan and the race detector; 24 trials took 118 s of CI).
    for (int trial = 0; trial < 12; ++trial) {
      std::vector<uint8_t> frame = good;
      const int kind = trial % 3;
      if (kind == 0) {  // a bit flip in the first 300 bytes: header, directory, block header, table
        frame[rng() % 300] ^= uint8_t(1u << (rng() % 8));
      } else if (kind == 1) {  // a random byte anywhere
        frame[rng() % frame.size()] = uint8_t(rng());
      } else {  // truncation: within the header, directory and first block header, or anywhere
        frame.resize(rng() % (trial % 2 ? 64 : frame.size()));
      }
      frame = std::vector<uint8_t>(frame.begin(), frame.end());  // a heap block of exactly the bytes left
      const uint64_t cap = frame.size();
      std::vector<uint8_t> want(n * w);
      const zipccl::Status st = zipccl::cpu::DecodeFrame(frame.data(), cap, dtype, n, want.data()).status;
      std::vector<uint8_t> out(n * w, 0xCD);
      std::vector<int32_t> status(1, -1);
      XLA_FFI_ExecutionContext ctx;
      Outcome o = DecodeCuda(ctx, frame, 1, cap, dtype, n, out, &status);
      CHECK(o.ok) << o.message;
      ExpectClean(ctx, "damaged decode");
      CHECK_EQ(status[0], int(st)) << DTypeName(dtype) << " trial " << trial;
      if (st != zipccl::kOk) {
        const uint32_t fill = zipccl::RejectedFillBits(dtype);
        for (uint64_t i = 0; i < n * w; i += w) std::memcpy(want.data() + i, &fill, w);
      }
      CHECK(out == want) << DTypeName(dtype) << " trial " << trial << ": status " << st;
    }
  }
}

// What ffi_api.cc refuses without a GPU context or a stream comes back as the handler's error carrying
// XLA's message.
TEST(no_gpu_context_or_stream_is_an_error_not_a_crash) {
  struct Case {
    const char* what;
    void (*take_away)(XLA_FFI_ExecutionContext&);
    const char* message;
  };
  const Case cases[] = {
      {"no GPU context", [](XLA_FFI_ExecutionContext& c) { c.gpu = false; }, "GPU context is not available"},
      {"no stream", [](XLA_FFI_ExecutionContext& c) { c.stream = nullptr; }, "GPU stream is not available"},
  };
  zipccl_test::Array x = Frames(kF32, 1, 3000, 2);
  for (const Case& k : cases) {
    XLA_FFI_ExecutionContext ctx;
    k.take_away(ctx);
    Encoded e = EncodeCuda(ctx, x, 1, zipccl::MaxEncodedBytes(3000, kF32), false);
    CHECK(!e.outcome.ok) << k.what;
    CHECK(e.outcome.message.find(k.message) != std::string::npos) << k.what << ": " << e.outcome.message;
    ExpectClean(ctx, k.what);
  }
}

TEST(bad_operands_fail_before_any_allocation) {
  XLA_FFI_ExecutionContext ctx;
  std::vector<int32_t> x(64);
  std::vector<uint8_t> payload(200);
  std::vector<int64_t> nbytes(1);
  DeviceBuffer scratch(4096);
  Outcome o = Invoke(ZipcclEncodeCuda, ctx, {{XLA_FFI_DataType_S32, {1, 64}, x.data()}},
                     {{XLA_FFI_DataType_U8, {1, 200}, payload.data()}, {XLA_FFI_DataType_S64, {1}, nbytes.data()},
                      {XLA_FFI_DataType_U8, {4096}, scratch.data()}},
                     {{"checksum", false}});
  CHECK(!o.ok);
  CHECK_EQ(int(o.errc), int(XLA_FFI_Error_Code_INVALID_ARGUMENT));
  CHECK(o.message.find("unsupported dtype") != std::string::npos) << o.message;
  ExpectClean(ctx, "bad operands");
}

TEST(zero_frames_need_no_scratch) {
  CHECK_EQ(zipccl::cuda::EncodeScratchResultBytes(0, 10), uint64_t(0));
  CHECK_EQ(zipccl::cuda::DecodeScratchResultBytes(0, 10), uint64_t(0));
  XLA_FFI_ExecutionContext ctx;
  uint8_t dummy = 0;
  Outcome o = Invoke(ZipcclEncodeCuda, ctx, {{XLA_FFI_DataType_BF16, {0, 10}, &dummy}},
                     {{XLA_FFI_DataType_U8, {0, 64}, &dummy}, {XLA_FFI_DataType_S64, {0}, &dummy},
                      {XLA_FFI_DataType_U8, {0}, &dummy}},
                     {{"checksum", false}});
  CHECK(o.ok) << o.message;
  ExpectClean(ctx, "empty");
}

// ---- The emulator's detectors, each fed the bug it exists for -------------------------------------------
// A CTA storing 16 bytes per thread at out + offset: a GPU faults unless offset keeps the uint4 aligned.
struct VectorStoreKernel {
  static constexpr const char* kName = "test_vector_store";
  static constexpr int kBlockThreads = 8;
  struct Params {
    uint8_t* out;
    int offset;
  };
  struct Shared {
    int unused;
  };
  template <class Cta>
  static void Run(Cta& cta, Shared&, const Params& p) {
    const uint32_t w[4] = {cta.tid(), 1, 2, 3};
    zipccl::cuda::Store16B(p.out + p.offset + 16 * cta.tid(), w);
  }
};

TEST(emulator_faults_on_a_misaligned_uint4_store) {
  alignas(16) static uint8_t buf[16 * 9];
  zipccl::cuda::emu::EmuLauncher ok(true, 1);
  ok.Launch<VectorStoreKernel>(1, {buf, 16});  // aligned: no fault
  std::string fault;
  try {
    zipccl::cuda::emu::EmuLauncher bad(true, 1);
    bad.Launch<VectorStoreKernel>(1, {buf, 4});  // the seeded bug
  } catch (const std::exception& e) {
    fault = e.what();
  }
  CHECK(fault.find("misaligned 16-byte (uint4) store in test_vector_store") != std::string::npos) << fault;
}

// Thread 0 publishes a value in shared memory that every thread reads; `barrier` says whether a barrier
// separates the write from the reads.
struct PublishKernel {
  static constexpr const char* kName = "test_publish";
  static constexpr int kBlockThreads = 32;
  struct Params {
    uint32_t* out;
    bool barrier;
  };
  struct Shared {
    uint32_t value;
  };
  template <class Cta>
  static void Run(Cta& cta, Shared& sm, const Params& p) {
    if (cta.tid() == 0) sm.value = 42;
    if (p.barrier) cta.sync();
    p.out[cta.tid()] = sm.value;
  }
};

// Runs K in the emulator; the error it raised, or "".
template <class K>
std::string EmulatorError(const typename K::Params& p, uint64_t seed) {
  try {
    zipccl::cuda::emu::EmuLauncher l(true, seed);
    l.Launch<K>(1, p);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(emulator_shows_a_dropped_syncthreads) {
  CHECK(zipccl::cuda::emu::EmuInstrumented()) << "this test must be built with the race instrumentation";
  uint32_t out[32];
  int wrong_with = 0, wrong_without = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    for (bool barrier : {true, false}) {
      const std::string err = EmulatorError<PublishKernel>({out, barrier}, seed);
      int wrong = 0;
      for (uint32_t v : out) wrong += v != 42;
      (barrier ? wrong_with : wrong_without) += wrong;
      if (barrier) {
        CHECK(err.empty()) << err;
      } else {  // the race detector names the store and a load of the same interval
        CHECK(err.find("shared-memory race in test_publish (CTA 0, barrier interval 0): byte 0 of its Shared "
                       "struct (4 bytes): thread ") != std::string::npos) << err;
        CHECK(err.find("plain store") != std::string::npos && err.find("plain load") != std::string::npos) << err;
      }
    }
  }
  CHECK_EQ(wrong_with, 0);
  CHECK(wrong_without > 0) << "shuffled thread order and garbage-filled shared memory must expose the race";
}

// Every thread sets its bit in one of two shared words (as WriteKernel ORs codes into its staging words),
// atomically (AtomicOrShared) or, the seeded bug, with a plain `|=`.
struct OrKernel {
  static constexpr const char* kName = "test_or";
  static constexpr int kBlockThreads = 64;
  struct Params {
    uint32_t* out;
    bool atomic;
  };
  struct Shared {
    uint32_t words[2];
  };
  template <class Cta>
  static void Run(Cta& cta, Shared& sm, const Params& p) {
    const uint32_t t = cta.tid();
    if (t < 2) sm.words[t] = 0;
    cta.sync();
    if (p.atomic)
      zipccl::cuda::AtomicOrShared(&sm.words[t / 32], 1u << (t % 32));
    else
      sm.words[t / 32] |= 1u << (t % 32);
    cta.sync();
    if (t < 2) p.out[t] = sm.words[t];
  }
};

TEST(emulator_race_detector_catches_a_plain_or_in_place_of_atomicor) {
  CHECK(zipccl::cuda::emu::EmuInstrumented()) << "this test must be built with the race instrumentation";
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    uint32_t out[2] = {0, 0};
    const std::string ok = EmulatorError<OrKernel>({out, true}, seed);
    CHECK(ok.empty()) << "atomics on one word are not a race: " << ok;
    CHECK(out[0] == ~0u && out[1] == ~0u) << std::hex << out[0] << " " << out[1];
    const std::string err = EmulatorError<OrKernel>({out, false}, seed);  // the seeded bug
    CHECK(err.find("emulator: shared-memory race in test_or (CTA 0, barrier interval 1): byte ") !=
          std::string::npos) << err;
    CHECK(err.find("of its Shared struct (8 bytes): thread ") != std::string::npos) << err;
    CHECK(err.find("no barrier between them") != std::string::npos) << err;
  }
}

// Each thread takes two tickets from a shared counter with atomics in one barrier interval: they are
// consecutive unless another thread ran in between, which only a yield inside the interval allows.
struct TicketKernel {
  static constexpr const char* kName = "test_tickets";
  static constexpr int kBlockThreads = 64;
  struct Params {
    uint32_t* gaps;
  };
  struct Shared {
    uint32_t next;
  };
  template <class Cta>
  static void Run(Cta& cta, Shared& sm, const Params& p) {
    if (cta.tid() == 0) sm.next = 0;
    cta.sync();
    const uint32_t a = __atomic_fetch_add(&sm.next, 1u, __ATOMIC_RELAXED);
    const uint32_t b = __atomic_fetch_add(&sm.next, 1u, __ATOMIC_RELAXED);
    p.gaps[cta.tid()] = b != a + 1;
  }
};

TEST(emulator_yields_at_random_inside_a_barrier_interval) {
  CHECK(zipccl::cuda::emu::EmuInstrumented()) << "this test must be built with the race instrumentation";
  uint32_t gaps[64];
  int interleaved = 0;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    const std::string err = EmulatorError<TicketKernel>({gaps}, seed);
    CHECK(err.empty()) << err;
    for (uint32_t g : gaps) interleaved += int(g);
  }
  CHECK(interleaved > 0) << "no thread was interrupted between two atomics";
}

}  // namespace

ZIPCCL_TEST_MAIN
