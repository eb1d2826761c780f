// The Python emulator bindings' two entry points (zipccl_jax._zipccl.cuda_host.emulate_encode /
// emulate_decode) as a command-line program, so that tests/test_emulator_sanitized.py can run the tests of
// tests/test_cuda.py and tests/test_fp8.py through a build under ASan + UBSan with the emulator's race
// detector and random yields (tests/sanitized_build.py). Both run EmulateEncode / EmulateDecode of
// xla_ffi/simt_emulator.h, as the bindings do. Arrays travel as raw files; outputs are read first (device
// memory starts as garbage) and written back.
//
//   emulator_driver encode FRAMES N DTYPE CHECKSUM SEED X OUT NBYTES [SKIP]
//   emulator_driver decode FRAMES N DTYPE SEED PAYLOAD OUT STATUS [SKIP]
//
// Prints "instrumented <0|1> yields <count>"; exit 0, or 1 with the emulator's error on stderr.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "xla_ffi/codec/format.h"
#include "xla_ffi/simt_emulator.h"

namespace {

std::vector<uint8_t> Read(const char* path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(std::string("cannot read ") + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void Write(const char* path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!f) throw std::runtime_error(std::string("cannot write ") + path);
}

void Expect(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(what);
}

uint64_t U64(const char* s) { return std::strtoull(s, nullptr, 10); }

// FRAMES N DTYPE (argv[2..4]) and the optional SKIP file, argv[skip_arg] when argc says it is there.
struct Call {
  uint64_t frames, n, elem_bytes;
  int dtype;
  std::vector<uint8_t> skip_flags;
  const uint8_t* skip = nullptr;

  Call(int argc, char** argv, int skip_arg)
      : frames(U64(argv[2])), n(U64(argv[3])), elem_bytes(zipccl::ElemBytes(uint8_t(U64(argv[4])))),
        dtype(int(U64(argv[4]))) {
    Expect(elem_bytes != 0, "unsupported dtype code");
    if (argc == skip_arg + 1) {
      skip_flags = Read(argv[skip_arg]);
      Expect(skip_flags.size() == frames, "skip must hold one uint8 flag per frame");
      skip = skip_flags.data();
    }
  }
  // The per-frame row of `rows` bytes (frames * row), 0 without frames.
  uint64_t Row(const std::vector<uint8_t>& rows, const char* what) const {
    Expect(frames == 0 || rows.size() % frames == 0, what);
    return frames ? rows.size() / frames : 0;
  }
};

void Encode(int argc, char** argv) {
  Expect(argc == 10 || argc == 11, "encode FRAMES N DTYPE CHECKSUM SEED X OUT NBYTES [SKIP]");
  const Call c(argc, argv, 10);
  const std::vector<uint8_t> x = Read(argv[7]);
  std::vector<uint8_t> out = Read(argv[8]), nbytes = Read(argv[9]);
  Expect(x.size() == c.frames * c.n * c.elem_bytes, "x must hold frames * n elements");
  Expect(nbytes.size() == c.frames * sizeof(int64_t), "nbytes must hold one int64 per frame");
  const uint64_t cap = c.Row(out, "out must hold frames * cap bytes");
  zipccl::cuda::emu::EmulateEncode(x.data(), c.frames, c.n, c.dtype, U64(argv[5]) != 0, out.data(), cap,
                                   reinterpret_cast<int64_t*>(nbytes.data()), c.skip, /*execute=*/true,
                                   U64(argv[6]));
  Write(argv[8], out);
  Write(argv[9], nbytes);
}

void Decode(int argc, char** argv) {
  Expect(argc == 9 || argc == 10, "decode FRAMES N DTYPE SEED PAYLOAD OUT STATUS [SKIP]");
  const Call c(argc, argv, 9);
  const std::vector<uint8_t> payload = Read(argv[6]);
  std::vector<uint8_t> out = Read(argv[7]), status = Read(argv[8]);
  Expect(out.size() == c.frames * c.n * c.elem_bytes, "out must hold frames * n elements");
  Expect(status.size() == c.frames * sizeof(int32_t), "status must hold one int32 per frame");
  const uint64_t cap = c.Row(payload, "payload must hold frames * cap bytes");
  zipccl::cuda::emu::EmulateDecode(payload.data(), c.frames, cap, c.dtype, c.n, out.data(),
                                   reinterpret_cast<int32_t*>(status.data()), c.skip, /*execute=*/true,
                                   U64(argv[5]));
  Write(argv[7], out);
  Write(argv[8], status);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string op = argc > 1 ? argv[1] : "";
  try {
    if (op == "encode") Encode(argc, argv);
    else if (op == "decode") Decode(argc, argv);
    else throw std::invalid_argument("usage: emulator_driver encode|decode ...");
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "invalid argument: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  std::printf("instrumented %d yields %llu\n", int(zipccl::cuda::emu::EmuInstrumented()),
              static_cast<unsigned long long>(zipccl::cuda::emu::Emu().yields));
  return 0;
}
