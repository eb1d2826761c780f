// Malformed input to the CPU frame decoder (xla_ffi/codec/cpu_driver.h): every header field, the block
// directory, block headers, Huffman tables, segment directories and units, truncation at every length, every
// single-byte corruption of a checksummed frame, and random corruption. The decoder must return the
// documented Status and never touch memory outside its buffers (the _sanitized variant runs this under
// AddressSanitizer and UndefinedBehaviorSanitizer).
#include <cstring>
#include <random>
#include <vector>

#include "tests/cc/check.h"
#include "xla_ffi/codec/block.h"
#include "tests/cc/codec_test_util.h"

using namespace zipccl;
using namespace zipccl_test;

namespace {

// A frame with one HUFF block and a partial second HUFF block with zeros, per dtype.
struct Sample {
  Array a;
  std::vector<uint8_t> frame;
};

Sample MakeSample(uint8_t dtype, bool checksum, uint64_t n = 65536 + 3000) {
  Sample s{Gaussian(dtype, n, 1234 + dtype, 1.0f, 0.2), {}};
  s.frame = Encode(s.a, checksum);
  return s;
}

Status DecodeStatus(const std::vector<uint8_t>& frame, uint8_t dtype, uint64_t n, int64_t* block = nullptr) {
  Array out;
  cpu::DecodeResult r = Decode(frame, dtype, n, &out);
  if (block) *block = r.block;
  return r.status;
}

void Put32(std::vector<uint8_t>& f, uint64_t off, uint32_t v) { Store32(f.data() + off, v); }
void Put64(std::vector<uint8_t>& f, uint64_t off, uint64_t v) { Store64(f.data() + off, v); }

}  // namespace

TEST(SampleIsValid) {
  for (uint8_t dtype : kDTypes)
    for (bool checksum : {false, true}) {
      Sample s = MakeSample(dtype, checksum);
      CHECK_EQ(DecodeStatus(s.frame, dtype, s.a.n), kOk) << DTypeName(dtype);
      CHECK_EQ(ModeOfBlock(s.frame, s.a.n, 0), kModeHuff) << DTypeName(dtype);
      CHECK_EQ(ModeOfBlock(s.frame, s.a.n, 1), kModeHuff) << DTypeName(dtype);
    }
}

TEST(HeaderFields) {
  for (uint8_t dtype : kDTypes) {
    const Sample s = MakeSample(dtype, false);
    const uint64_t n = s.a.n;
    auto with = [&](auto edit) {
      std::vector<uint8_t> f = s.frame;
      edit(f);
      return DecodeStatus(f, dtype, n);
    };
    CHECK_EQ(with([](auto& f) { f[0] ^= 1; }), kErrMagic) << DTypeName(dtype);
    CHECK_EQ(with([](auto& f) { f[4] = 3; }), kErrVersion) << DTypeName(dtype);
    CHECK_EQ(with([](auto& f) { f[4] = 0; }), kErrVersion) << DTypeName(dtype);
    CHECK_EQ(with([](auto& f) { f[5] = 0; }), kErrDType) << DTypeName(dtype);
    for (int bit = 1; bit < 8; ++bit)
      CHECK_EQ(with([&](auto& f) { f[6] |= uint8_t(1 << bit); }), kErrReserved) << DTypeName(dtype) << bit;
    CHECK_EQ(with([](auto& f) { f[7] = 15; }), kErrBlockLog2) << DTypeName(dtype);
    CHECK_EQ(with([&](auto& f) { Put64(f, 8, n + 1); }), kErrCount) << DTypeName(dtype);
    CHECK_EQ(with([&](auto& f) { Put64(f, 16, f.size() + 1); }), kErrTruncated) << DTypeName(dtype);
    CHECK_EQ(with([&](auto& f) { Put64(f, 16, ~uint64_t(0)); }), kErrTruncated) << DTypeName(dtype);
    CHECK_EQ(with([&](auto& f) { Put64(f, 16, f.size() - 1); }), kErrFrameSize) << DTypeName(dtype);
    CHECK_EQ(with([&](auto& f) { Put64(f, 16, kFrameHeaderBytes); }), kErrFrameSize) << DTypeName(dtype);
    for (int byte = 24; byte < 28; ++byte)
      CHECK_EQ(with([&](auto& f) { f[byte] = 1; }), kErrReserved) << DTypeName(dtype) << byte;
    // A checksum value without the checksum flag.
    CHECK_EQ(with([](auto& f) { f[31] = 1; }), kErrReserved) << DTypeName(dtype);
    // The caller expects another dtype, or another element count.
    for (uint8_t other : {0, 1, 2, 3, 4, 255}) {
      if (other != dtype) {
        CHECK_EQ(DecodeStatus(s.frame, other, n), kErrDType) << DTypeName(dtype) << +other;
      }
    }
    CHECK_EQ(DecodeStatus(s.frame, dtype, n - 1), kErrCount) << DTypeName(dtype);
  }
}

TEST(EveryTruncationIsRejected) {
  for (uint8_t dtype : kDTypes) {
    const Sample s = MakeSample(dtype, false, 5000);
    for (uint64_t len = 0; len < s.frame.size(); ++len) {
      Array out;
      CHECK_EQ(Decode(s.frame, len, dtype, s.a.n, &out).status, kErrTruncated) << DTypeName(dtype) << len;
    }
  }
}

TEST(BlockDirectory) {
  for (uint8_t dtype : kDTypes) {
    const Sample s = MakeSample(dtype, false);
    const uint64_t n = s.a.n;
    const uint32_t d0 = Load32(s.frame.data() + DirEntryOffset(0));
    const uint32_t d1 = Load32(s.frame.data() + DirEntryOffset(1));
    // Directory and frame size disagree.
    std::vector<uint8_t> f = s.frame;
    Put32(f, DirEntryOffset(0), d0 + 1);
    CHECK_EQ(DecodeStatus(f, dtype, n), kErrFrameSize) << DTypeName(dtype);
    Put32(f, DirEntryOffset(0), 0xFFFFFFFFu);
    CHECK_EQ(DecodeStatus(f, dtype, n), kErrFrameSize) << DTypeName(dtype);
    // Same total, wrong split between the blocks: block 0 must notice.
    for (int delta : {-9, -1, 1, 9}) {
      f = s.frame;
      Put32(f, DirEntryOffset(0), d0 + delta);
      Put32(f, DirEntryOffset(1), d1 - delta);
      int64_t block = -2;
      Status st = DecodeStatus(f, dtype, n, &block);
      CHECK(st != kOk) << DTypeName(dtype) << delta;
      CHECK_EQ(block, 0) << DTypeName(dtype) << delta << StatusMessage(st);
    }
    // A block smaller than its header.
    f = s.frame;
    Put32(f, DirEntryOffset(0), 4);
    Put32(f, DirEntryOffset(1), d1 + d0 - 4);
    CHECK_EQ(DecodeStatus(f, dtype, n), kErrBlockSize) << DTypeName(dtype);
  }
}

TEST(BlockHeaders) {
  for (uint8_t dtype : kDTypes) {
    const uint64_t n = 2 * 65536;
    // Block 0 RAW (random bits), block 1 CONST.
    Array a = RandomBits(dtype, n, 5);
    for (uint64_t i = 65536; i < n; ++i) SetElem(a, i, FloatToElem(0.5f, dtype));
    const std::vector<uint8_t> frame = Encode(a, false);
    CHECK_EQ(ModeOfBlock(frame, n, 0), kModeRaw);
    CHECK_EQ(ModeOfBlock(frame, n, 1), kModeConst);
    const uint64_t raw = BlockOffset(frame, n, 0), cst = BlockOffset(frame, n, 1);
    auto with = [&](auto edit, int64_t* block) {
      std::vector<uint8_t> f = frame;
      edit(f);
      return DecodeStatus(f, dtype, n, block);
    };
    int64_t block = -2;
    for (uint8_t mode : {uint8_t(3), uint8_t(4), uint8_t(255)}) {
      CHECK_EQ(with([&](auto& f) { f[raw] = mode; }, &block), kErrBlockMode) << DTypeName(dtype) << +mode;
      CHECK_EQ(block, 0);
      CHECK_EQ(with([&](auto& f) { f[cst] = mode; }, &block), kErrBlockMode) << DTypeName(dtype) << +mode;
      CHECK_EQ(block, 1);
    }
    CHECK_EQ(with([&](auto& f) { f[raw + 1] = kBlockFlagLow16; }, &block), kErrBlockMode) << DTypeName(dtype);
    CHECK_EQ(with([&](auto& f) { f[cst + 1] = 1; }, &block), kErrBlockMode) << DTypeName(dtype);
    CHECK_EQ(with([&](auto& f) { f[raw + 2] = 1; }, &block), kErrReserved) << DTypeName(dtype);
    CHECK_EQ(with([&](auto& f) { f[cst + 3] = 1; }, &block), kErrReserved) << DTypeName(dtype);
    CHECK_EQ(with([&](auto& f) { Put32(f, raw + 4, 1); }, &block), kErrReserved) << DTypeName(dtype);
    if (dtype != kF32) {
      // A 16-bit CONST value with high bits set.
      CHECK_EQ(with([&](auto& f) { f[cst + 6] = 1; }, &block), kErrReserved) << DTypeName(dtype);
    }
    // A CONST block claiming a body, a RAW block one byte short (sizes moved between the blocks).
    CHECK_EQ(with([&](auto& f) {
               Put32(f, DirEntryOffset(0), Load32(f.data() + DirEntryOffset(0)) - 1);
               Put32(f, DirEntryOffset(1), Load32(f.data() + DirEntryOffset(1)) + 1);
             }, &block),
             kErrBlockSize)
        << DTypeName(dtype);
    CHECK_EQ(block, 0);
    // RAW blocks are verbatim, so a RAW-mode header on a HUFF-sized block is a size error, not garbage.
    Sample s = MakeSample(dtype, false);
    std::vector<uint8_t> f = s.frame;
    f[BlockOffset(f, s.a.n, 0)] = kModeRaw;
    CHECK_EQ(DecodeStatus(f, dtype, s.a.n), kErrBlockSize) << DTypeName(dtype);
  }
}

TEST(HuffmanTablesAndSegments) {
  for (uint8_t dtype : kDTypes) {
    const Sample s = MakeSample(dtype, false);
    const uint64_t n = s.a.n;
    const uint64_t blk = BlockOffset(s.frame, n, 0);
    const uint64_t table = blk + kBlockHeaderBytes;
    const int lo = s.frame[table], hi = s.frame[table + 1];
    const uint64_t dir = table + TableBytes(lo, hi);
    auto status = [&](auto edit) {
      std::vector<uint8_t> f = s.frame;
      edit(f);
      int64_t block = -2;
      Status st = DecodeStatus(f, dtype, n, &block);
      CHECK(st == kOk || block == 0) << DTypeName(dtype) << "error blamed on block" << block;
      return st;
    };
    // hi < lo.
    CHECK_EQ(status([&](auto& f) { f[table] = uint8_t(hi + 1); }), kErrTable) << DTypeName(dtype);
    // A code length above kMaxCodeLen (the zero symbol's nibble, then a used symbol's).
    CHECK_EQ(status([&](auto& f) { f[table + 2] = uint8_t((f[table + 2] & 0xF0) | 12); }), kErrTable)
        << DTypeName(dtype);
    CHECK_EQ(status([&](auto& f) { f[table + 2] = uint8_t((f[table + 2] & 0x0F) | 0xF0); }), kErrTable)
        << DTypeName(dtype);
    // No used symbol at all.
    CHECK_EQ(status([&](auto& f) {
               for (uint64_t i = table + 2; i < dir; ++i) f[i] = 0;
             }),
             kErrTable)
        << DTypeName(dtype);
    // Lengths that break the Kraft equality: every used symbol one bit longer or shorter.
    for (int d : {-1, +1}) {
      Status st = status([&](auto& f) {
        for (uint64_t i = table + 2; i < dir; ++i) {
          int a = f[i] & 0xF, b = f[i] >> 4;
          if (a) a = a + d < 1 ? 1 : a + d;
          if (b) b = b + d < 1 ? 1 : b + d;
          f[i] = uint8_t(a | (b << 4));
        }
      });
      CHECK(st != kOk) << DTypeName(dtype) << "kraft" << d;
    }
    // LOW16 on a 16-bit block; a reserved block flag.
    if (dtype != kF32) {
      CHECK_EQ(status([&](auto& f) { f[blk + 1] = kBlockFlagLow16; }), kErrBlockMode) << DTypeName(dtype);
    }
    CHECK_EQ(status([&](auto& f) { f[blk + 1] |= 0x80; }), kErrReserved) << DTypeName(dtype);
    // Segment directory: seg_nnz above the segment's element count; seg_units outside what its lanes'
    // elements can take (every code 1 bit, every code 11 bits).
    uint32_t lo_u = 0, hi_u = 0;
    SegmentUnitBounds(SegmentElemsOf(BlockElems(n, 0), 0), &lo_u, &hi_u);
    CHECK_EQ(status([&](auto& f) { Store16(f.data() + dir + 2, uint16_t(kSegmentElems + 1)); }), kErrStream)
        << DTypeName(dtype);
    CHECK_EQ(status([&](auto& f) { Store16(f.data() + dir, uint16_t(lo_u - 1)); }), kErrStream)
        << DTypeName(dtype);
    CHECK_EQ(status([&](auto& f) { Store16(f.data() + dir, uint16_t(hi_u + 1)); }), kErrStream)
        << DTypeName(dtype);
    CHECK_EQ(status([&](auto& f) { Store16(f.data() + dir, 0xFFFF); }), kErrStream) << DTypeName(dtype);
    // Units moved between two segments (same total): segment 0 decodes with fewer or needs more.
    for (int d : {-1, 1}) {
      CHECK_EQ(status([&](auto& f) {
                 Store16(f.data() + dir, uint16_t(Load16(f.data() + dir) + d));
                 Store16(f.data() + dir + 4, uint16_t(Load16(f.data() + dir + 4) - d));
               }),
               kErrStream)
          << DTypeName(dtype) << d;
    }
    // nnz moved between two segments (same total): the zero symbols no longer match.
    CHECK_EQ(status([&](auto& f) {
               Store16(f.data() + dir + 2, uint16_t(Load16(f.data() + dir + 2) - 1));
               Store16(f.data() + dir + 6, uint16_t(Load16(f.data() + dir + 6) + 1));
             }),
             kErrStream)
        << DTypeName(dtype);
    // The last unit of the block cut off (seg_units and the block size one unit less, the frame kept
    // consistent): a lane of the last segment needs a unit that is not there.
    CHECK_EQ(status([&](auto& f) {
               const uint64_t last = dir + 4 * 3;
               const uint64_t units = Load16(f.data() + dir) + Load16(f.data() + dir + 4) +
                                      Load16(f.data() + dir + 8) + Load16(f.data() + dir + 12);
               const uint64_t end = dir + 16 + 2 * units;
               Store16(f.data() + last, uint16_t(Load16(f.data() + last) - 1));
               f.erase(f.begin() + int64_t(end) - 2, f.begin() + int64_t(end));
               Put32(f, DirEntryOffset(0), Load32(f.data() + DirEntryOffset(0)) - 2);
               Put64(f, 16, Load64(f.data() + 16) - 2);
             }),
             kErrStream)
        << DTypeName(dtype);
    // One unit too many (a zero unit inserted after the last, the frame kept consistent).
    CHECK_EQ(status([&](auto& f) {
               const uint64_t last = dir + 4 * 3;
               const uint64_t units = Load16(f.data() + dir) + Load16(f.data() + dir + 4) +
                                      Load16(f.data() + dir + 8) + Load16(f.data() + dir + 12);
               const uint64_t end = dir + 16 + 2 * units;
               Store16(f.data() + last, uint16_t(Load16(f.data() + last) + 1));
               f.insert(f.begin() + int64_t(end), 2, uint8_t(0));
               Put32(f, DirEntryOffset(0), Load32(f.data() + DirEntryOffset(0)) + 2);
               Put64(f, 16, Load64(f.data() + 16) + 2);
             }),
             kErrStream)
        << DTypeName(dtype);
  }
}

TEST(PaddingAfterALanesLastCodeIsReserved) {
  // 64 elements: each lane codes two, in one unit stored in lane order (step 0), so the top bit of unit l is
  // lane l's padding as long as its two codes take fewer than 16 bits.
  int flips = 0;
  for (uint8_t dtype : kDTypes) {
    Array a = Gaussian(dtype, 64 * 40, 5 + dtype, 1.0f, 0.3);
    a.n = 64;
    a.bytes.resize(64 * ElemBytes(dtype));
    for (uint64_t i = 0; i < 64; ++i)
      if (i % 3 == 0) SetElem(a, i, 0);
    const std::vector<uint8_t> frame = Encode(a, false);
    const uint64_t blk = BlockOffset(frame, a.n, 0);
    if (frame[blk] != kModeHuff) continue;  // too short to pay off for this dtype
    const uint64_t table = blk + kBlockHeaderBytes;
    const uint64_t dir = table + TableBytes(frame[table], frame[table + 1]);
    if (Load16(frame.data() + dir) != kLanes) continue;
    const uint64_t units = dir + kSegDirEntryBytes;
    for (int l = 0; l < kLanes; ++l) {
      const uint16_t u = Load16(frame.data() + units + 2 * l);
      if (u & 0x8000) continue;  // a code bit, not padding
      std::vector<uint8_t> f = frame;
      f[units + 2 * l + 1] |= 0x80;
      CHECK_EQ(DecodeStatus(f, dtype, a.n), kErrReserved) << DTypeName(dtype) << "lane" << l;
      ++flips;
    }
  }
  CHECK(flips >= kLanes) << flips;  // at least one dtype codes HUFF
}

TEST(VersionOneFramesAreRefused) {
  for (uint8_t dtype : kDTypes) {
    Sample s = MakeSample(dtype, false, 5000);
    s.frame[4] = 1;
    CHECK_EQ(DecodeStatus(s.frame, dtype, s.a.n), kErrVersion) << DTypeName(dtype);
    CHECK(std::strstr(StatusMessage(kErrVersion), "version 2") != nullptr);
  }
}

TEST(EveryBitOfAnAllZeroSegmentIsChecked) {
  // Every single-bit flip inside a segment whose directory says nnz == 0, and every shift of its seg_units
  // against a neighbour, must be rejected: a flipped code bit decodes to another symbol or none, a flipped
  // padding bit is reserved. Four segments: data, all zero, mostly zero, and a ragged all-zero last one.
  for (uint8_t dtype : kDTypes) {
    const uint64_t n = 3 * kSegmentElems + 999;
    Array a = Gaussian(dtype, n, 77 + dtype);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t k = i / kSegmentElems, j = i % kSegmentElems;
      if (k == 1 || k == 3 || (k == 2 && j >= 20)) SetElem(a, i, 0);
    }
    const std::vector<uint8_t> frame = Encode(a, false);
    CHECK_EQ(DecodeStatus(frame, dtype, n), kOk) << DTypeName(dtype);
    const uint64_t blk = BlockOffset(frame, n, 0);
    CHECK_EQ(frame[blk], kModeHuff) << DTypeName(dtype);
    const uint64_t table = blk + kBlockHeaderBytes;
    const uint64_t dir = table + TableBytes(frame[table], frame[table + 1]);
    const uint64_t units = dir + 4 * kSegDirEntryBytes;
    uint64_t start = 0;  // in units
    for (int k = 0; k < 4; ++k) {
      const uint64_t su = Load16(frame.data() + dir + 4 * k), nnz = Load16(frame.data() + dir + 4 * k + 2);
      CHECK_EQ(nnz == 0, k == 1 || k == 3) << DTypeName(dtype) << "segment" << k;
      if (nnz == 0) {
        int accepted = 0;
        const uint64_t stride = k == 3 ? 1 : 7;  // every bit of the ragged one, every 7th of the full one
        for (uint64_t b = 16 * start; b < 16 * (start + su); b += stride) {
          std::vector<uint8_t> f = frame;
          f[units + b / 8] ^= uint8_t(1u << (b % 8));
          const Status st = DecodeStatus(f, dtype, n);
          accepted += st != kErrStream && st != kErrReserved;
        }
        CHECK_EQ(accepted, 0) << DTypeName(dtype) << "bit flips in zero segment" << k;
        for (int d : {-2, -1, 1, 2}) {
          std::vector<uint8_t> f = frame;
          const uint64_t other = k == 3 ? 2 : k + 1;
          Store16(f.data() + dir + 4 * k, uint16_t(su + d));
          Store16(f.data() + dir + 4 * other, uint16_t(Load16(f.data() + dir + 4 * other) - d));
          CHECK_EQ(DecodeStatus(f, dtype, n), kErrStream) << DTypeName(dtype) << "zero segment" << k << d;
        }
      }
      start += su;
    }
  }
}

TEST(EverySingleByteCorruptionOfAChecksummedFrameIsRejected) {
  for (uint8_t dtype : kDTypes) {
    const Sample s = MakeSample(dtype, true, 3000);
    for (uint64_t i = 0; i < s.frame.size(); ++i)
      for (uint8_t x : {uint8_t(0x01), uint8_t(0x80), uint8_t(0xFF)}) {
        std::vector<uint8_t> f = s.frame;
        f[i] ^= x;
        CHECK(DecodeStatus(f, dtype, s.a.n) != kOk) << DTypeName(dtype) << "byte" << i << "xor" << +x;
      }
  }
}

TEST(RandomCorruptionNeverCrashes) {
  // Without a checksum a corrupted frame may decode to other values; it must never read or write out of
  // bounds (see the _sanitized variant) and must return a defined Status.
  std::mt19937 rng(77);
  for (uint8_t dtype : kDTypes) {
    const Sample s = MakeSample(dtype, false, 65536 + 2500);
    int rejected = 0;
    const int iters = 300;
    for (int it = 0; it < iters; ++it) {
      std::vector<uint8_t> f = s.frame;
      int flips = 1 + int(rng() % 8);
      for (int k = 0; k < flips; ++k) {
        // Favour the metadata (header, directory, block headers, tables) where parsing decisions are made.
        uint64_t span = rng() % 2 ? f.size() : 400;
        uint64_t pos = rng() % span;
        if (pos >= f.size()) pos = f.size() - 1;
        f[pos] ^= uint8_t(1 + rng() % 255);
      }
      Status st = DecodeStatus(f, dtype, s.a.n);
      CHECK(st >= kOk && st < kNumStatus) << DTypeName(dtype) << int(st);
      rejected += st != kOk;
    }
    std::printf("%s: %d of %d corrupted frames rejected\n", DTypeName(dtype), rejected, iters);
    CHECK(rejected > 0) << DTypeName(dtype);
  }
}

ZIPCCL_TEST_MAIN
