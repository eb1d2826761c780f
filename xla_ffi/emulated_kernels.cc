// See emulated_kernels.h. Checks the host API's contract before running the
// launch sequence: scratch present and kScratchAlign-aligned when the layout
// needs it, the CUB temporary bytes those ScanTempBytes reported.
#include "emulated_kernels.h"

#include <cstdio>
#include <exception>
#include <string>

#include "codec/cuda_launch.cuh"
#include "simt_emulator.h"

namespace zipccl::cuda {
namespace {

struct State {
  emulated::LastCall last;
  uint64_t scan_temp_bytes = 1000;  // not a multiple of anything on purpose
  int driver = emulated::kRuntimeVersion;
  int fail_next = 0;
  uint64_t seed = 1;
};
State& S() {
  static State s;
  return s;
}

// The contract the handlers must keep; an error code if they do not.
int CheckScratch(const void* scratch, uint64_t scratch_bytes, uint64_t cub_bytes) {
  if (scratch_bytes == 0) return 0;
  if (scratch == nullptr) return emulated::kErrorInvalidValue;
  if (reinterpret_cast<uintptr_t>(scratch) % kScratchAlign) return emulated::kErrorMisalignedAddress;
  if (cub_bytes && cub_bytes != S().scan_temp_bytes) return emulated::kErrorInvalidValue;
  return 0;
}

template <class Run>
int Call(CUstream_st* stream, const void* scratch, uint64_t scratch_bytes, uint64_t cub_bytes,
         Run run) {
  State& s = S();
  s.last = emulated::LastCall{stream, scratch, scratch_bytes, 0};
  if (int err = s.fail_next) {
    s.fail_next = 0;
    return err;
  }
  if (int err = CheckScratch(scratch, scratch_bytes, cub_bytes)) return err;
  emu::EmuLauncher l(/*execute=*/true, s.seed++);
  try {
    run(l);
  } catch (const std::exception& e) {  // a kernel bug the emulator caught, as a launch failure
    std::fprintf(stderr, "%s\n", e.what());
    return 719;  // cudaErrorLaunchFailure
  }
  s.last.launches = l.records.size();
  return 0;
}

}  // namespace

int ScanTempBytes(uint64_t, uint64_t* bytes) {
  *bytes = S().scan_temp_bytes;
  return 0;
}

int EncodeAsync(const void* x, uint8_t dtype, bool checksum, uint8_t* payload, uint64_t cap,
                void* nbytes, bool nbytes64, const uint8_t* skip, const EncodeLayout& L,
                void* scratch, CUstream_st* stream) {
  auto* s = static_cast<uint8_t*>(scratch);
  return Call(stream, scratch, L.scratch_bytes, L.cub_bytes, [&](emu::EmuLauncher& l) {
    if (L.scratch_bytes) emu::FillGarbage(s, L.scratch_bytes, l.sched.rng());
    EncodeParams p = MakeEncodeParams(L, x, dtype, checksum, payload, cap, nbytes, nbytes64, skip, s);
    RunEncode(l, p, L, s);
  });
}

int DecodeAsync(const uint8_t* payload, uint64_t cap, uint8_t dtype, void* out, int32_t* status,
                const uint8_t* skip, const DecodeLayout& L, void* scratch, CUstream_st* stream) {
  auto* s = static_cast<uint8_t*>(scratch);
  return Call(stream, scratch, L.scratch_bytes, L.cub_bytes, [&](emu::EmuLauncher& l) {
    if (L.scratch_bytes) emu::FillGarbage(s, L.scratch_bytes, l.sched.rng());
    DecodeParams p = MakeDecodeParams(L, payload, cap, dtype, out, status, skip, s);
    RunDecode(l, p, L, s);
  });
}

int GetVersions(Versions* v) {
  v->runtime = emulated::kRuntimeVersion;
  v->driver = S().driver;
  return 0;
}

const char* DriverError() {
  static thread_local std::string message;
  Versions v;
  GetVersions(&v);
  if (DriverSupports(v.driver, v.runtime)) return nullptr;
  message = DriverMismatchMessage(v.driver, v.runtime, emulated::kMinDriver);
  return message.c_str();
}

const char* ErrorString(int cuda_error) {
  switch (cuda_error) {
    case 0: return "no error";
    case emulated::kErrorInvalidValue: return "invalid argument (emulated)";
    case emulated::kErrorMisalignedAddress: return "misaligned address (emulated)";
    case 719: return "unspecified launch failure (emulated)";
    default: return "emulated CUDA error";
  }
}

namespace emulated {
const LastCall& Last() { return S().last; }
void SetScanTempBytes(uint64_t bytes) { S().scan_temp_bytes = bytes; }
void SetDriverVersion(int driver) { S().driver = driver; }
void FailNextCall(int cuda_error) { S().fail_next = cuda_error; }
void SetSeed(uint64_t seed) { S().seed = seed; }
}  // namespace emulated

}  // namespace zipccl::cuda
