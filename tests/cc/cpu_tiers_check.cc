// The CPU driver's compiled vector tier against its portable loops (tests/test_cpu_tiers.py builds this with
// one tier's instruction-set flags and ASan + UBSan, for every tier the machine runs).
//
// Usage: cpu_tiers_check CASES SEED. Prints the tier compiled in (CompiledCodePaths(), "" for none), then for
// CASES shaped inputs (bfloat16, float16, float32, float8_e4m3fn; near-Gaussian exponents, runs of zeros,
// float32 with the low 16 bits clear, random bits; lengths around lanes, segments and blocks) checks that
// both paths write the same frame, that it decodes to the input bits on both, and that damaged copies of it
// (bytes flipped, checksum on and off) get the same verdict, block and bits from both. Exits 1 on the first
// difference, naming it.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cpu_driver.h"
#include "format.h"

namespace {

using zipccl::cpu::DecodeFrame;
using zipccl::cpu::DecodeResult;
using zipccl::cpu::EncodeFrame;

void UsePortable(bool portable) {
  if (portable)
    setenv("ZIPCCL_CPU_PORTABLE", "1", 1);
  else
    unsetenv("ZIPCCL_CPU_PORTABLE");
}

std::vector<uint8_t> Encode(const std::vector<uint8_t>& x, uint64_t n, uint8_t dtype, bool portable) {
  UsePortable(portable);
  const uint64_t cap = zipccl::MaxEncodedBytes(n, dtype);
  std::vector<uint8_t> out(cap);
  out.resize(EncodeFrame(x.data(), n, dtype, true, out.data(), cap));
  return out;
}

DecodeResult Decode(const std::vector<uint8_t>& frame, uint64_t n, uint8_t dtype, bool portable,
                    std::vector<uint8_t>* out) {
  UsePortable(portable);
  out->assign(n * zipccl::ElemBytes(dtype), 0);
  return DecodeFrame(frame.data(), frame.size(), dtype, n, out->data());
}

// A float of the given width from a near-Gaussian sample (bfloat16 and float16 by truncation, float8 with
// its exponent squeezed into 4 bits), or 0.
uint32_t Shape(float f, int width, uint8_t dtype, bool low16) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (width == 4) return low16 ? u & 0xFFFF0000u : u;
  if (dtype == zipccl::kF16) {
    const int e = int((u >> 23) & 0xFF) - 127 + 15;
    return e <= 0 || e >= 31 ? 0 : ((u >> 16) & 0x8000u) | (uint32_t(e) << 10) | ((u >> 13) & 0x3FFu);
  }
  if (width == 2) return u >> 16;
  const int e = int((u >> 23) & 0xFF) - 127 + 7;
  return e <= 0 || e >= 15 ? 0 : ((u >> 24) & 0x80u) | (uint32_t(e) << 3) | ((u >> 20) & 7u);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CASES SEED\n", argv[0]);
    return 2;
  }
  const int cases = std::atoi(argv[1]);
  std::mt19937_64 rng(std::strtoull(argv[2], nullptr, 10));
  std::printf("tier: %s\n", zipccl::cpu::CompiledCodePaths());
  const uint8_t dtypes[] = {zipccl::kBF16, zipccl::kF16, zipccl::kF32, zipccl::kF8E4M3FN};
  const uint64_t sizes[] = {1, 7, 31, 33, 100, 16383, 16385, 40000, 65536, 65537, 70000};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int damaged = 0, rejected = 0;
  for (int c = 0; c < cases; ++c) {
    const uint8_t dtype = dtypes[c % 4];
    const int width = zipccl::ElemBytes(dtype);
    const uint64_t n = c % 3 == 0 ? sizes[(c / 3) % (sizeof(sizes) / sizeof(sizes[0]))] : 1 + rng() % 90000;
    const double zeros = (c % 5) * 0.2;  // 0 to 80% zeros
    const bool low16 = width == 4 && c % 7 == 3;
    const float scale = std::ldexp(1.0f, int(rng() % 20) - 10);
    std::vector<uint8_t> x(n * width);
    for (uint64_t i = 0; i < n; ++i) {
      uint32_t v = unit(rng) < zeros ? 0 : Shape(normal(rng) * scale, width, dtype, low16);
      if (c % 11 == 5 && i % 4096 < 2048) v = 0;  // runs of zeros: segments with few or no raw bytes
      std::memcpy(&x[i * width], &v, width);
    }
    if (c % 13 == 6)
      for (auto& b : x) b = uint8_t(rng());  // random bits: RAW blocks, long codes
    const std::vector<uint8_t> frame = Encode(x, n, dtype, false);
    if (frame != Encode(x, n, dtype, true)) {
      std::printf("case %d (dtype %d, n %llu): the tier's frame differs from the portable loops'\n", c, dtype,
                  (unsigned long long)n);
      return 1;
    }
    for (int portable = 0; portable < 2; ++portable) {
      std::vector<uint8_t> out;
      const DecodeResult r = Decode(frame, n, dtype, portable, &out);
      if (r.status != zipccl::kOk || out != x) {
        std::printf("case %d (dtype %d, n %llu): the %s round trip fails (status %d)\n", c, dtype,
                    (unsigned long long)n, portable ? "portable" : "tier", int(r.status));
        return 1;
      }
    }
    for (int d = 0; d < 4 && frame.size() > 40; ++d) {
      std::vector<uint8_t> bad = frame;
      for (int k = 0; k <= d % 3; ++k) bad[36 + rng() % (bad.size() - 36)] ^= uint8_t(1 + rng() % 255);
      if (d % 2) {  // the checksum off, so that damage reaches the block decoders
        bad[6] &= uint8_t(~zipccl::kFrameFlagChecksum);
        std::memset(&bad[28], 0, 4);
      }
      std::vector<uint8_t> a, b;
      const DecodeResult ra = Decode(bad, n, dtype, false, &a), rb = Decode(bad, n, dtype, true, &b);
      ++damaged;
      rejected += ra.status != zipccl::kOk;
      if (ra.status != rb.status || ra.block != rb.block || (ra.status == zipccl::kOk && a != b)) {
        std::printf("case %d (dtype %d, n %llu), damage %d: tier status %d block %lld, portable %d block %lld%s\n",
                    c, dtype, (unsigned long long)n, d, int(ra.status), (long long)ra.block, int(rb.status),
                    (long long)rb.block, ra.status == rb.status ? " (different bits)" : "");
        return 1;
      }
    }
  }
  std::printf("ok: %d cases, %d damaged frames (%d rejected)\n", cases, damaged, rejected);
  return 0;
}
