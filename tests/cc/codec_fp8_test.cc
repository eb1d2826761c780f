// One-byte float dtypes (codes 4..11) in the CPU frame driver: every bit pattern round-trips bit-exactly in
// every block mode, the symbol is rotl8 of the byte with no raw region, and FP8-specific malformations
// (CONST reserved bits, LOW16, a mismatched or unknown dtype, truncation, bit flips) are rejected.
#include <cstring>
#include <random>
#include <vector>

#include "tests/cc/check.h"
#include "tests/cc/codec_test_util.h"
#include "xla_ffi/codec/block.h"

using namespace zipccl;
using namespace zipccl_test;

namespace {

constexpr uint8_t kFp8[] = {kF8E4M3FN, kF8E5M2,     kF8E4M3FNUZ, kF8E5M2FNUZ,
                            kF8E4M3B11FNUZ, kF8E4M3, kF8E3M4,     kF8E8M0FNU};

// FP8-like bytes: random sign and 3 mantissa bits, a 4-bit exponent around 12 (amax-scaled activations sit
// a few binades below the top); `zero_fraction` of them exactly +0.
Array Fp8Like(uint8_t dtype, uint64_t n, uint32_t seed, double zero_fraction = 0.0) {
  Array a = MakeArray(dtype, n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(12.0f, 1.5f);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  for (uint64_t i = 0; i < n; ++i) {
    int e = int(normal(rng) + 0.5f);
    e = e < 0 ? 0 : e > 15 ? 15 : e;
    uint32_t v = ((rng() & 1u) << 7) | (uint32_t(e) << 3) | (rng() & 7u);
    a.bytes[i] = unif(rng) < zero_fraction ? 0 : uint8_t(v);
  }
  return a;
}

bool RoundTrips(const Array& a, bool checksum, std::vector<uint8_t>* frame_out = nullptr) {
  std::vector<uint8_t> frame = Encode(a, checksum);
  if (frame.empty() || frame.size() > MaxEncodedBytes(a.n, a.dtype)) return false;
  Array out;
  cpu::DecodeResult r = Decode(frame, a.dtype, a.n, &out);
  if (frame_out) *frame_out = frame;
  return r.status == kOk && out.bytes == a.bytes;
}

}  // namespace

TEST(Fp8DTypesAreOneByteWide) {
  for (uint8_t d : kFp8) {
    CHECK_EQ(ElemBytes(d), 1) << int(d);
    CHECK_EQ(MaxEncodedBytes(65537, d), 32u + 2 * 12 + 65537) << int(d);
  }
  CHECK_EQ(ElemBytes(12), 0);
  CHECK_EQ(RejectedFillBits(kF8E4M3FN), 0x7Fu);
  CHECK_EQ(RejectedFillBits(kF8E5M2), 0x7Eu);
}

TEST(Fp8SymbolIsTheRotatedByte) {
  for (uint32_t v = 1; v < 256; ++v) {
    CHECK_EQ(Symbol8(v), int(((v << 1) | (v >> 7)) & 0xFF)) << v;
    CHECK_EQ(Merge8(Symbol8(v)), v) << v;
  }
  CHECK_EQ(Symbol8(0), kZeroSymbol);
  CHECK_EQ(Merge8(kZeroSymbol), 0u);
  CHECK_EQ(SymbolOf<uint8_t>(0x80), 1);  // -0: symbol 1
}

TEST(Fp8EveryBitPatternEveryMode) {
  for (uint8_t d : kFp8) {
    Array all = MakeArray(d, 256);
    for (uint32_t v = 0; v < 256; ++v) all.bytes[v] = uint8_t(v);
    for (bool checksum : {false, true}) {
      std::vector<uint8_t> frame;
      CHECK(RoundTrips(all, checksum, &frame)) << "all patterns, dtype" << int(d);
      CHECK_EQ(ModeOfBlock(frame, all.n, 0), kModeRaw) << int(d);
      // Every pattern inside a HUFF block, and across a block boundary.
      Array mixed = Fp8Like(d, 65536 + 4000, 11 + d, 0.2);
      for (uint32_t v = 0; v < 256; ++v) {
        mixed.bytes[1000 + 7 * v] = uint8_t(v);
        mixed.bytes[65536 + 3 * v] = uint8_t(v);
      }
      CHECK(RoundTrips(mixed, checksum, &frame)) << "HUFF with every pattern, dtype" << int(d);
      CHECK_EQ(ModeOfBlock(frame, mixed.n, 0), kModeHuff) << int(d);
      CHECK_EQ(ModeOfBlock(frame, mixed.n, 1), kModeHuff) << int(d);
    }
    for (uint32_t v : {0x00u, 0x80u, 0x7Fu, 0xFFu, 0x01u, 0x7Cu, 0xFCu}) {  // CONST: zeros, NaNs, Inf
      Array c = MakeArray(d, 65536 + 5);
      std::memset(c.bytes.data(), int(v), c.bytes.size());
      std::vector<uint8_t> frame;
      CHECK(RoundTrips(c, false, &frame)) << "CONST" << v;
      CHECK_EQ(ModeOfBlock(frame, c.n, 0), kModeConst) << v;
      CHECK_EQ(Load32(frame.data() + BlockOffset(frame, c.n, 0) + 4), v) << "CONST value zero-extended";
    }
  }
}

TEST(Fp8SizesAroundSegmentLaneAndBlockBoundaries) {
  for (uint64_t n : {0ull, 1ull, 2ull, 7ull, 31ull, 32ull, 33ull, 16383ull, 16384ull, 16385ull, 65535ull,
                     65536ull, 65537ull, 2 * 65536ull + 3001ull}) {
    for (double z : {0.0, 0.5, 0.97}) {
      CHECK(RoundTrips(Fp8Like(kF8E4M3FN, n, uint32_t(n) + 1, z), false)) << n << z;
      CHECK(RoundTrips(Fp8Like(kF8E5M2, n, uint32_t(n) + 2, z), true)) << n << z;
    }
  }
}

TEST(Fp8HuffBlockHasNoRawRegion) {
  Array a = Fp8Like(kF8E4M3FN, 5000, 3, 0.3);
  std::vector<uint8_t> frame = Encode(a, false);
  const uint64_t at = BlockOffset(frame, a.n, 0);
  CHECK_EQ(frame[at], kModeHuff);
  const int lo = frame[at + 8], hi = frame[at + 9];
  const uint64_t table = 2 + uint64_t(hi - lo + 3) / 2;
  uint64_t units = 0, nnz = 0;
  for (int k = 0; k < 1; ++k) {  // 5000 elements: one segment
    units += Load16(frame.data() + at + 8 + table + 4 * k);
    nnz += Load16(frame.data() + at + 8 + table + 4 * k + 2);
  }
  uint64_t want_nnz = 0;
  for (uint8_t b : a.bytes) want_nnz += b != 0;
  CHECK_EQ(nnz, want_nnz);
  CHECK_EQ(Load32(frame.data() + DirEntryOffset(0)), 8 + table + 4 + 2 * units);  // no raw region
  CHECK(double(a.n) / double(frame.size()) > 1.2) << "FP8-like data compresses";
}

TEST(Fp8MalformedFramesAreRejected) {
  Array a = Fp8Like(kF8E5M2, 3000, 5, 0.1);
  const std::vector<uint8_t> frame = Encode(a, false);
  const uint64_t at = BlockOffset(frame, a.n, 0);
  Array out;
  auto expect = [&](std::vector<uint8_t> f, uint8_t dtype, Status want, const char* what) {
    cpu::DecodeResult r = Decode(f, dtype, a.n, &out);
    CHECK_EQ(r.status, want) << what << StatusMessage(r.status);
  };
  std::vector<uint8_t> f = frame;
  f[at + 1] = kBlockFlagLow16;
  expect(f, kF8E5M2, kErrBlockMode, "LOW16 on a one-byte dtype");
  expect(frame, kBF16, kErrDType, "an FP8 frame asked for as bfloat16");
  expect(frame, kF8E4M3FN, kErrDType, "e5m2 frame asked for as e4m3fn");
  f = frame;
  f[5] = 12;
  expect(f, kF8E5M2, kErrDType, "unknown dtype code");
  expect(std::vector<uint8_t>(frame.begin(), frame.end() - 1), kF8E5M2, kErrTruncated, "cut by one byte");
  // CONST: bits 8..31 of the value are reserved for a one-byte dtype.
  Array c = MakeArray(kF8E4M3FN, 3000);
  std::memset(c.bytes.data(), 0x7F, c.bytes.size());
  std::vector<uint8_t> cf = Encode(c, false);
  for (int byte = 5; byte < 8; ++byte) {
    std::vector<uint8_t> g = cf;
    g[BlockOffset(cf, c.n, 0) + uint64_t(byte)] = 1;
    cpu::DecodeResult r = Decode(g, kF8E4M3FN, c.n, &out);
    CHECK_EQ(r.status, kErrReserved) << "CONST value byte" << byte;
  }
}

TEST(Fp8EveryBitFlipIsSafeAndCaughtByTheChecksum) {
  Array a = Fp8Like(kF8E4M3FN, 2500, 9, 0.4);
  for (bool checksum : {false, true}) {
    const std::vector<uint8_t> frame = Encode(a, checksum);
    for (uint64_t i = 0; i < frame.size() * 8; ++i) {
      std::vector<uint8_t> f = frame;
      f[i / 8] ^= uint8_t(1u << (i % 8));
      Array out;
      cpu::DecodeResult r = Decode(f, kF8E4M3FN, a.n, &out);
      if (checksum) {
        CHECK(r.status != kOk) << "flip" << i << "passed the checksum";
      }
      if (r.status == kOk) {  // undetectable without the checksum: whatever decodes must re-encode exactly
        std::vector<uint8_t> again = Encode(out, false);
        Array back;
        CHECK_EQ(Decode(again, kF8E4M3FN, a.n, &back).status, kOk) << i;
        CHECK(back.bytes == out.bytes) << i;
      }
    }
  }
}

ZIPCCL_TEST_MAIN
