// Round trips of the CPU frame driver (xla_ffi/codec/cpu_driver.h): bit-exact for every dtype, size and block
// mode; frame header fields; the RAW fallback on incompressible data; capacity overflow; determinism.
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "tests/cc/check.h"
#include "tests/cc/codec_test_util.h"

using namespace zipccl;
using namespace zipccl_test;

namespace {

// Element counts around the lane (32), segment (16384) and block (65536) boundaries.
constexpr uint64_t kSizes[] = {0,     1,     2,     3,     7,     31,    32,    33,         4099,
                               16383, 16384, 16385, 65535, 65536, 65537, 2 * 65536 + 3001};

// Encodes, checks the header against the input, decodes and compares bits. Returns the frame.
std::vector<uint8_t> CheckRoundTrip(const Array& a, bool checksum, const char* what) {
  std::vector<uint8_t> frame = Encode(a, checksum);
  CHECK(!frame.empty()) << what << DTypeName(a.dtype) << a.n;
  if (frame.empty()) return frame;
  CHECK(frame.size() <= MaxEncodedBytes(a.n, a.dtype)) << what;
  FrameHeader h = ParseFrameHeader(frame.data());
  CHECK_EQ(h.magic, kMagic) << what;
  CHECK_EQ(h.version, kVersion) << what;
  CHECK_EQ(h.dtype, a.dtype) << what;
  CHECK_EQ(h.flags, checksum ? kFrameFlagChecksum : 0) << what;
  CHECK_EQ(h.block_log2, kBlockLog2) << what;
  CHECK_EQ(h.n_elems, a.n) << what;
  CHECK_EQ(h.frame_bytes, frame.size()) << what;
  CHECK_EQ(h.reserved, 0u) << what;
  if (!checksum) {
    CHECK_EQ(h.checksum, 0u) << what;
  }

  Array out;
  cpu::DecodeResult r = Decode(frame, a.dtype, a.n, &out);
  CHECK_EQ(r.status, kOk) << what << DTypeName(a.dtype) << "n=" << a.n << StatusMessage(r.status)
                          << "block" << r.block;
  CHECK(out.bytes == a.bytes) << what << DTypeName(a.dtype) << "n=" << a.n << "decoded bits differ";
  // Extra readable bytes after the frame (a padded payload) change nothing.
  std::vector<uint8_t> padded = frame;
  padded.resize(frame.size() + 100, 0xAB);
  Array out2;
  r = Decode(padded, a.dtype, a.n, &out2);
  CHECK_EQ(r.status, kOk) << what << "padded payload";
  CHECK(out2.bytes == a.bytes) << what << "padded payload";
  return frame;
}

double Ratio(const Array& a, const std::vector<uint8_t>& frame) {
  return double(a.bytes.size()) / double(frame.size());
}

}  // namespace

TEST(RoundTripGaussianEveryDTypeAndSize) {
  uint32_t seed = 1;
  for (uint8_t dtype : kDTypes)
    for (uint64_t n : kSizes)
      for (bool checksum : {false, true}) CheckRoundTrip(Gaussian(dtype, n, seed++), checksum, "gaussian");
}

TEST(RoundTripScalesAndZeros) {
  // Tiny and huge magnitudes (subnormals, overflow to inf in f16), and sparse data like MoE dispatch
  // buffers (21% zeros) and embedding gradients (88% zeros).
  uint32_t seed = 100;
  for (uint8_t dtype : kDTypes)
    for (float scale : {1e-30f, 1e-6f, 1.0f, 3e4f, 1e30f})
      for (double zeros : {0.0, 0.21, 0.88, 0.999}) {
        ++seed;
        CheckRoundTrip(Gaussian(dtype, 70000, seed, scale, zeros), seed % 2 == 0, "scale/zeros");
      }
}

TEST(RoundTripSpecialValues) {
  // Signed zeros, infinities, NaNs with assorted payloads, subnormals, extremes, interleaved with Gaussian data.
  const uint32_t specials16[] = {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x0001,
                                 0x8001, 0x007F, 0x7F7F, 0xFF7F, 0x7C00, 0xFC00, 0x7E01, 0x03FF, 0xFFFF};
  const uint32_t specials32[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                                 0xFFC00001u, 0x7F800001u, 0x00000001u, 0x80000001u, 0x007FFFFFu,
                                 0x7F7FFFFFu, 0xFF7FFFFFu, 0xFFFFFFFFu, 0x3F800000u, 0x00010000u};
  for (uint8_t dtype : kDTypes) {
    Array a = Gaussian(dtype, 3 * 4096 + 5, 7);
    for (uint64_t i = 0; i < a.n; i += 3) {
      uint32_t v = dtype == kF32 ? specials32[(i / 3) % (sizeof(specials32) / 4)]
                                 : specials16[(i / 3) % (sizeof(specials16) / 4)];
      SetElem(a, i, v);
    }
    CheckRoundTrip(a, false, "specials");
    CheckRoundTrip(a, true, "specials");
    // Only special values, no Gaussian data at all.
    Array s = MakeArray(dtype, 5000);
    for (uint64_t i = 0; i < s.n; ++i)
      SetElem(s, i, dtype == kF32 ? specials32[i % (sizeof(specials32) / 4)] : specials16[i % (sizeof(specials16) / 4)]);
    CheckRoundTrip(s, false, "only specials");
  }
}

TEST(ZeroPatternsIntoExactlySizedBuffers) {
  // The encoder's zero path (raw bytes compacted past zero elements, zeros coded by the plain exponent-byte
  // lookup when exponent byte 0 is otherwise unused) on MoE-like zero layouts: runs at the end of 128-wide
  // rows, scattered zeros, a frame ending in a run of zeros, one non-zero element. Each frame is also encoded
  // into a heap buffer of exactly its size (ASan sees any store past it) and must come out identical.
  uint32_t seed = 500;
  for (int variant = 0; variant < 4; ++variant) {  // bf16, f16, f32, f32 LOW16
    const uint8_t dtype = variant == 0 ? kBF16 : variant == 1 ? kF16 : kF32;
    for (int pattern = 0; pattern < 5; ++pattern)
      for (bool neg_zero : {false, true}) {
        const uint64_t n = 65536 + 4096 + 77;
        Array a = Gaussian(dtype, n, ++seed, 0.05f);
        std::mt19937 rng(seed);
        for (uint64_t i = 0; i < n; ++i) {
          uint32_t v = GetElem(a, i);
          if (variant == 3) v = FloatToElem(0.05f * float(int(rng() % 2001) - 1000) / 1000.0f, kBF16) << 16;
          const bool zero = pattern == 0   ? i % 128 >= 100
                            : pattern == 1 ? rng() % 100 < 22
                            : pattern == 2 ? i + 3000 >= n
                            : pattern == 3 ? i != 40000
                                           : (i / 64) % 3 == 1 || i + 5 >= n;
          if (zero) v = 0;
          if (neg_zero && i % 997 == 5) v = dtype == kF32 ? 0x80000000u : 0x8000u;  // symbol 0 in use
          SetElem(a, i, v);
        }
        std::vector<uint8_t> frame = CheckRoundTrip(a, false, "zero pattern");
        if (frame.empty()) continue;
        if (variant == 3) {
          CHECK_EQ(frame[BlockOffset(frame, n, 0) + 1], kBlockFlagLow16) << "pattern" << pattern;
        }
        std::unique_ptr<uint8_t[]> exact(new uint8_t[frame.size()]);
        CHECK_EQ(cpu::EncodeFrame(a.bytes.data(), n, dtype, false, exact.get(), frame.size()), frame.size())
            << "variant" << variant << "pattern" << pattern;
        CHECK(std::equal(frame.begin(), frame.end(), exact.get()))
            << "variant" << variant << "pattern" << pattern << "exactly sized buffer";
      }
  }
}

TEST(CompressesGaussian) {
  // DESIGN.md bounds on Gaussian data with sign and mantissa stored raw: BF16 16/(8+2.544) = 1.517x,
  // FP32 about 1.206x. A per-block Huffman code gets within a few percent of them.
  const uint64_t n = 4 * 65536;
  double bf16 = Ratio(Gaussian(kBF16, n, 11), Encode(Gaussian(kBF16, n, 11), false));
  double f32 = Ratio(Gaussian(kF32, n, 12), Encode(Gaussian(kF32, n, 12), false));
  std::printf("gaussian ratio: bf16 %.4f f32 %.4f\n", bf16, f32);
  CHECK(bf16 > 1.45 && bf16 < 1.52) << "bf16 ratio" << bf16;
  CHECK(f32 > 1.18 && f32 < 1.21) << "f32 ratio" << f32;
  std::vector<uint8_t> frame = Encode(Gaussian(kBF16, n, 11), false);
  for (uint64_t b = 0; b < NumBlocks(n); ++b) CHECK_EQ(ModeOfBlock(frame, n, b), kModeHuff) << "block" << b;
}

TEST(Float32UpcastFromBFloat16UsesLow16) {
  // float32 values that are upcast bfloat16 (low 16 bits zero) code as bfloat16: past 2x.
  const uint64_t n = 2 * 65536 + 77;
  Array bf = Gaussian(kBF16, n, 21);
  Array a = MakeArray(kF32, n);
  for (uint64_t i = 0; i < n; ++i) SetElem(a, i, GetElem(bf, i) << 16);
  std::vector<uint8_t> frame = CheckRoundTrip(a, false, "upcast");
  CHECK(Ratio(a, frame) > 2.0) << "ratio" << Ratio(a, frame);
  for (uint64_t b = 0; b < NumBlocks(n); ++b) {
    uint64_t off = BlockOffset(frame, n, b);
    CHECK_EQ(frame[off], kModeHuff) << "block" << b;
    CHECK_EQ(frame[off + 1], kBlockFlagLow16) << "block" << b;
  }
  // One element with a non-zero low half turns LOW16 off for its block only.
  SetElem(a, 5, GetElem(a, 5) | 1u);
  frame = CheckRoundTrip(a, false, "upcast with one full f32");
  CHECK_EQ(frame[BlockOffset(frame, n, 0) + 1], 0) << "block 0 flags";
  CHECK_EQ(frame[BlockOffset(frame, n, 1) + 1], kBlockFlagLow16) << "block 1 flags";
}

TEST(ConstantBlocks) {
  // All-equal blocks (zeros, -0.0, a NaN pattern, 1.0) code as CONST: 8 bytes per block.
  for (uint8_t dtype : kDTypes) {
    const uint32_t values[] = {0u, dtype == kF32 ? 0x80000000u : 0x8000u, dtype == kF32 ? 0x7FC00001u : 0x7FC1u,
                               FloatToElem(1.0f, dtype)};
    for (uint32_t v : values) {
      const uint64_t n = 3 * 65536 + 1;
      Array a = MakeArray(dtype, n);
      for (uint64_t i = 0; i < n; ++i) SetElem(a, i, v);
      std::vector<uint8_t> frame = CheckRoundTrip(a, false, "const");
      CHECK_EQ(frame.size(), kFrameHeaderBytes + NumBlocks(n) * (kDirEntryBytes + kBlockHeaderBytes));
      for (uint64_t b = 0; b < NumBlocks(n); ++b) {
        uint64_t off = BlockOffset(frame, n, b);
        CHECK_EQ(frame[off], kModeConst) << DTypeName(dtype) << "block" << b;
        CHECK_EQ(Load32(frame.data() + off + 4), v) << DTypeName(dtype) << "block" << b;
      }
    }
  }
}

TEST(RawFallbackOnRandomBits) {
  // Incompressible data: every block RAW, and the frame is exactly MaxEncodedBytes (header + 12 B/block).
  for (uint8_t dtype : kDTypes)
    for (uint64_t n : {uint64_t(2049), uint64_t(65536), uint64_t(2 * 65536 + 9)}) {
      Array a = RandomBits(dtype, n, uint32_t(n) + dtype);
      std::vector<uint8_t> frame = CheckRoundTrip(a, false, "random bits");
      CHECK_EQ(frame.size(), MaxEncodedBytes(n, dtype)) << DTypeName(dtype) << n;
      for (uint64_t b = 0; b < NumBlocks(n); ++b)
        CHECK_EQ(ModeOfBlock(frame, n, b), kModeRaw) << DTypeName(dtype) << n << "block" << b;
    }
}

TEST(ModeIsChosenPerBlock) {
  // Block 0 random bits, block 1 Gaussian, block 2 constant, block 3 (partial) Gaussian with zeros.
  for (uint8_t dtype : kDTypes) {
    const uint64_t n = 3 * 65536 + 1000;
    Array a = MakeArray(dtype, n);
    Array rnd = RandomBits(dtype, 65536, 3), gauss = Gaussian(dtype, 65536, 4),
          sparse = Gaussian(dtype, 1000, 5, 1.0f, 0.5);
    for (uint64_t i = 0; i < 65536; ++i) {
      SetElem(a, i, GetElem(rnd, i));
      SetElem(a, 65536 + i, GetElem(gauss, i));
      SetElem(a, 2 * 65536 + i, FloatToElem(-2.5f, dtype));
    }
    for (uint64_t i = 0; i < 1000; ++i) SetElem(a, 3 * 65536 + i, GetElem(sparse, i));
    std::vector<uint8_t> frame = CheckRoundTrip(a, true, "mixed");
    CHECK_EQ(ModeOfBlock(frame, n, 0), kModeRaw) << DTypeName(dtype);
    CHECK_EQ(ModeOfBlock(frame, n, 1), kModeHuff) << DTypeName(dtype);
    CHECK_EQ(ModeOfBlock(frame, n, 2), kModeConst) << DTypeName(dtype);
    CHECK_EQ(ModeOfBlock(frame, n, 3), kModeHuff) << DTypeName(dtype);
  }
}

TEST(EncodingIsDeterministic) {
  // Same input, same bytes; the checksum variant differs only in the flags byte and the checksum field.
  for (uint8_t dtype : kDTypes) {
    Array a = Gaussian(dtype, 65536 + 4321, 31, 1.0f, 0.1);
    std::vector<uint8_t> f1 = Encode(a, false), f2 = Encode(a, false), fc = Encode(a, true);
    CHECK(f1 == f2) << DTypeName(dtype);
    CHECK_EQ(f1.size(), fc.size()) << DTypeName(dtype);
    for (size_t i = 0; i < f1.size() && i < fc.size(); ++i) {
      if (i != 6 && (i < 28 || i >= 32)) {
        CHECK_EQ(f1[i], fc[i]) << DTypeName(dtype) << "byte" << i;
      }
    }
    CHECK_EQ(fc[6], kFrameFlagChecksum);
    // A larger capacity writes the same frame.
    std::vector<uint8_t> big(f1.size() + 1000, 0);
    CHECK_EQ(cpu::EncodeFrame(a.bytes.data(), a.n, dtype, false, big.data(), big.size()), f1.size());
    CHECK(std::equal(f1.begin(), f1.end(), big.begin())) << DTypeName(dtype);
  }
}

TEST(CapacityOverflow) {
  for (uint8_t dtype : kDTypes) {
    Array a = Gaussian(dtype, 2 * 65536 + 100, 41);
    const uint64_t need = Encode(a, false).size();
    // Exactly enough: the frame is written and decodes.
    {
      std::vector<uint8_t> out(need);
      CHECK_EQ(cpu::EncodeFrame(a.bytes.data(), a.n, dtype, true, out.data(), out.size()), need);
      Array back;
      CHECK_EQ(Decode(out, dtype, a.n, &back).status, kOk) << DTypeName(dtype);
      CHECK(back.bytes == a.bytes) << DTypeName(dtype);
    }
    // Too small (in the middle of block 1, and below the directory): the return value is the size that was
    // needed, the header says so, and a receiver of the truncated payload sees a truncated frame.
    for (uint64_t cap : {need - 1, need / 2, kFrameHeaderBytes + 4, kFrameHeaderBytes}) {
      std::vector<uint8_t> out(cap, 0xEE);
      CHECK_EQ(cpu::EncodeFrame(a.bytes.data(), a.n, dtype, true, out.data(), out.size()), need)
          << DTypeName(dtype) << "cap" << cap;
      FrameHeader h = ParseFrameHeader(out.data());
      CHECK_EQ(h.magic, kMagic) << "cap" << cap;
      CHECK_EQ(h.frame_bytes, need) << "cap" << cap;
      CHECK_EQ(h.n_elems, a.n) << "cap" << cap;
      Array back;
      CHECK_EQ(Decode(out, dtype, a.n, &back).status, kErrTruncated) << DTypeName(dtype) << "cap" << cap;
    }
    // Smaller than the header: nothing is written.
    std::vector<uint8_t> tiny(kFrameHeaderBytes - 1, 0xEE);
    CHECK_EQ(cpu::EncodeFrame(a.bytes.data(), a.n, dtype, false, tiny.data(), tiny.size()), need);
    for (uint8_t b : tiny) CHECK_EQ(b, 0xEE) << DTypeName(dtype) << "byte written below the header size";
  }
}

ZIPCCL_TEST_MAIN
