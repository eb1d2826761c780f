// One access of a heap block through a source built with the emulator's instrumentation (RACE in
// tests/sanitized_build.py, no ASan instrumentation of its own): AddressSanitizer sees it only through
// xla_ffi/simt_race_hooks.cc, which forwards each access to ASan's sized check (an access aligned to its
// size) or to its region check (any other). tests/test_emulator_sanitized.py runs it with accesses inside
// the block and past its end, on both paths.
//
//   asan_hooks_probe SIZE OFFSET read|write    SIZE: 1, 2, 4, 8 or 16 bytes; OFFSET: bytes into the block
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr size_t kBlockBytes = 64;

template <typename T>
void Access(uint8_t* at, bool write) {
  typedef T Unaligned __attribute__((aligned(1)));  // any offset is a valid address of it (no UBSan report)
  volatile Unaligned* p = reinterpret_cast<volatile Unaligned*>(at);
  if (write) {
    *p = T(1);
  } else {
    const T v = *p;
    std::printf("read %d\n", int(v != T(0)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s SIZE OFFSET read|write\n", argv[0]);
    return 2;
  }
  const int size = std::atoi(argv[1]);
  const size_t offset = size_t(std::atol(argv[2]));
  const bool write = std::strcmp(argv[3], "write") == 0;
  // A heap block of kBlockBytes, 16-byte aligned (malloc's alignment), zeroed.
  auto* block = static_cast<uint8_t*>(std::calloc(kBlockBytes, 1));
  uint8_t* at = block + offset;
  switch (size) {
    case 1: Access<uint8_t>(at, write); break;
    case 2: Access<uint16_t>(at, write); break;
    case 4: Access<uint32_t>(at, write); break;
    case 8: Access<uint64_t>(at, write); break;
    case 16: Access<unsigned __int128>(at, write); break;
    default: std::fprintf(stderr, "SIZE must be 1, 2, 4, 8 or 16\n"); return 2;
  }
  std::free(block);
  std::printf("ok\n");
  return 0;
}
