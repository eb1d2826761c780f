// Wire format v2 of zipccl: constants, byte layouts and size bounds.
//
// FORMAT.md at the repository root is the normative description; this header
// mirrors it field for field, and zipccl_jax/format.py mirrors this header (a
// test compares the two). Everything here is usable from host and device code.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define ZIPCCL_HD __host__ __device__ __forceinline__
#else
#define ZIPCCL_HD inline
#endif

namespace zipccl {

// ---- Frame --------------------------------------------------------------
// One frame codes one flat array. Offsets are in bytes, fields little-endian.
//   [0,4)   magic        0x4C43435A ("ZCCL" in byte order)
//   [4]     version      2 (a frame of another version is refused: kErrVersion)
//   [5]     dtype        DType below
//   [6]     flags        bit 0: checksum present; bits 1..7 reserved (0)
//   [7]     block_log2   log2 of elements per block; 16 is the only value
//   [8,16)  n_elems      u64, element count
//   [16,24) frame_bytes  u64, total frame size including this header
//   [24,28) reserved     0
//   [28,32) checksum     XXH32 (seed 0) of the frame with this field zeroed;
//                        0 when the checksum flag is clear
//   [32, 32 + 4*n_blocks)  block directory: u32 coded size of each block
//   then the blocks, back to back.
constexpr uint32_t kMagic = 0x4C43435Au;
constexpr uint8_t kVersion = 2;
constexpr uint64_t kFrameHeaderBytes = 32;
constexpr uint64_t kDirEntryBytes = 4;
constexpr uint8_t kFrameFlagChecksum = 0x01;
constexpr uint8_t kFrameFlagsReserved = 0xFE;
constexpr uint32_t kChecksumSeed = 0;

constexpr int kBlockLog2 = 16;
constexpr int64_t kBlockElems = int64_t{1} << kBlockLog2;  // 65536 elements
// A HUFF block is cut into segments of kSegmentElems elements, one GPU warp's
// work: lane l of the kLanes codes the segment's elements kLanes * t + l
// (step t = 0, 1, ...), so the warp's loads and stores at one step are
// contiguous. A lane's bits are read kUnitBits at a time, and the segment's
// units are stored in the order the warp needs them: by the step whose code
// holds the unit's first bit, then by lane (FORMAT.md "HUFF blocks").
constexpr int kSegmentLog2 = 14;
constexpr int64_t kSegmentElems = int64_t{1} << kSegmentLog2;  // 16384 elements
constexpr int kMaxSegmentsPerBlock = int(kBlockElems / kSegmentElems);  // 4
constexpr int kLanes = 32;
constexpr int kSegmentSteps = int(kSegmentElems / kLanes);  // 512 steps: a lane's serial chain
constexpr int kUnitBits = 16;

// ---- Block --------------------------------------------------------------
//   [0]     mode     BlockMode below
//   [1]     flags    bit 0 (LOW16): float32 block whose elements all have
//                    zero low 16 bits, coded as the bfloat16 v >> 16
//                    (HUFF only); bits 1..7 reserved (0)
//   [2,4)   reserved 0
//   [4,8)   value    CONST: the element's bits, zero-extended; otherwise 0
// RAW body:  n_block_elems * elem_bytes bytes, the elements verbatim.
// CONST body: empty.
// HUFF body: code-length table, segment directory, units, raw bytes.
constexpr uint64_t kBlockHeaderBytes = 8;
enum BlockMode : uint8_t { kModeRaw = 0, kModeConst = 1, kModeHuff = 2 };
constexpr uint8_t kBlockFlagLow16 = 0x01;
constexpr uint8_t kBlockFlagsReserved = 0xFE;

// ---- Huffman alphabet ---------------------------------------------------
// Symbol s < 256 is the top byte of rotl(v, 1) (the exponent for bfloat16 and
// float32, the whole rotated byte for the one-byte floats); kZeroSymbol stands
// for the all-zero element (+0.0), which carries no raw bytes.
constexpr int kNumSymbols = 257;
constexpr int kZeroSymbol = 256;
constexpr int kMaxCodeLen = 11;  // bits; also the decoder's lookup width
constexpr uint64_t kSegDirEntryBytes = 4;  // u16 seg_units, u16 seg_nnz

// Codes 4..11 are the one-byte floats (FORMAT.md "Dtype codes"); the codec
// treats them all alike, as bytes, and only the rejected-frame fill differs.
enum DType : uint8_t {
  kDTypeInvalid = 0,
  kBF16 = 1,
  kF16 = 2,
  kF32 = 3,
  kF8E4M3FN = 4,
  kF8E5M2 = 5,
  kF8E4M3FNUZ = 6,
  kF8E5M2FNUZ = 7,
  kF8E4M3B11FNUZ = 8,
  kF8E4M3 = 9,
  kF8E3M4 = 10,
  kF8E8M0FNU = 11,
};

ZIPCCL_HD int ElemBytes(uint8_t dtype) {
  return dtype == kF32                                  ? 4
         : (dtype == kBF16 || dtype == kF16)            ? 2
         : (dtype >= kF8E4M3FN && dtype <= kF8E8M0FNU)  ? 1
                                                        : 0;
}

// What a decoder writes to every element of a rejected frame (a status result
// says why): a quiet NaN of the dtype, so corruption cannot pass silently into
// training. The CPU handler and the CUDA poison kernel write the same bits.
constexpr uint32_t kRejectedFillBF16 = 0x7FC0u;
constexpr uint32_t kRejectedFillF16 = 0x7E00u;
constexpr uint32_t kRejectedFillF32 = 0x7FC00000u;
// One-byte floats: a NaN each (the quiet-NaN bit set where the type has one;
// the fnuz types have a single NaN, 0x80; e8m0fnu's is 0xFF).
constexpr uint32_t kRejectedFillF8E4M3FN = 0x7Fu;
constexpr uint32_t kRejectedFillF8E5M2 = 0x7Eu;
constexpr uint32_t kRejectedFillF8Fnuz = 0x80u;  // e4m3fnuz, e5m2fnuz, e4m3b11fnuz
constexpr uint32_t kRejectedFillF8E4M3 = 0x7Cu;
constexpr uint32_t kRejectedFillF8E3M4 = 0x78u;
constexpr uint32_t kRejectedFillF8E8M0FNU = 0xFFu;

ZIPCCL_HD uint32_t RejectedFillBits(uint8_t dtype) {
  switch (dtype) {
    case kBF16: return kRejectedFillBF16;
    case kF32: return kRejectedFillF32;
    case kF8E4M3FN: return kRejectedFillF8E4M3FN;
    case kF8E5M2: return kRejectedFillF8E5M2;
    case kF8E4M3FNUZ:
    case kF8E5M2FNUZ:
    case kF8E4M3B11FNUZ: return kRejectedFillF8Fnuz;
    case kF8E4M3: return kRejectedFillF8E4M3;
    case kF8E3M4: return kRejectedFillF8E3M4;
    case kF8E8M0FNU: return kRejectedFillF8E8M0FNU;
    default: return kRejectedFillF16;
  }
}

ZIPCCL_HD uint64_t NumBlocks(uint64_t n_elems) {
  return (n_elems + uint64_t(kBlockElems) - 1) >> kBlockLog2;
}

ZIPCCL_HD uint64_t BlockElems(uint64_t n_elems, uint64_t block) {
  uint64_t start = block << kBlockLog2;
  uint64_t left = n_elems - start;
  return left < uint64_t(kBlockElems) ? left : uint64_t(kBlockElems);
}

// The largest frame an encoder may produce for n_elems elements: every block
// stored RAW. The overhead is 32 bytes plus 12 bytes per 65536 elements.
ZIPCCL_HD uint64_t MaxEncodedBytes(uint64_t n_elems, uint8_t dtype) {
  uint64_t nb = NumBlocks(n_elems);
  return kFrameHeaderBytes + nb * (kDirEntryBytes + kBlockHeaderBytes) +
         n_elems * uint64_t(ElemBytes(dtype));
}

// ---- Errors -------------------------------------------------------------
enum Status : int {
  kOk = 0,
  kErrTruncated,       // buffer shorter than the header or frame_bytes
  kErrMagic,           // not a zipccl frame
  kErrVersion,         // unknown version
  kErrDType,           // dtype field differs from the expected dtype
  kErrReserved,        // a reserved bit or field is set
  kErrBlockLog2,       // unsupported block size
  kErrCount,           // n_elems differs from the expected element count
  kErrFrameSize,       // frame_bytes inconsistent with the block directory
  kErrChecksum,        // checksum mismatch
  kErrBlockMode,       // unknown block mode, or a flag invalid for the mode
  kErrBlockSize,       // block directory size inconsistent with the block
  kErrTable,           // malformed code-length table
  kErrStream,          // malformed segment directory or units
  kErrCapacity,        // output capacity too small (encoder)
  kNumStatus
};

inline const char* StatusMessage(int s) {
  switch (s) {
    case kOk: return "ok";
    case kErrTruncated: return "payload is truncated (shorter than its frame)";
    case kErrMagic: return "bad magic number: not a zipccl frame";
    case kErrVersion: return "frame of another format version (this build reads version 2; peers must run the same zipccl_jax)";
    case kErrDType: return "frame dtype does not match the requested dtype";
    case kErrReserved: return "a reserved field or bit is set";
    case kErrBlockLog2: return "unsupported block size";
    case kErrCount: return "frame element count does not match the requested shape";
    case kErrFrameSize: return "frame size does not match its block directory";
    case kErrChecksum: return "checksum mismatch: the payload is corrupted";
    case kErrBlockMode: return "unknown block mode or invalid block flags";
    case kErrBlockSize: return "block size does not match its contents";
    case kErrTable: return "malformed code-length table";
    case kErrStream: return "malformed units or segment directory";
    case kErrCapacity: return "output capacity too small";
    default: return "unknown error";
  }
}

// ---- Little-endian helpers ----------------------------------------------
ZIPCCL_HD uint16_t Load16(const uint8_t* p) {
  return uint16_t(p[0] | (uint16_t(p[1]) << 8));
}
ZIPCCL_HD uint32_t Load32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) |
         (uint32_t(p[3]) << 24);
}
ZIPCCL_HD uint64_t Load64(const uint8_t* p) {
  return uint64_t(Load32(p)) | (uint64_t(Load32(p + 4)) << 32);
}
ZIPCCL_HD void Store16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v);
  p[1] = uint8_t(v >> 8);
}
ZIPCCL_HD void Store32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
ZIPCCL_HD void Store64(uint8_t* p, uint64_t v) {
  Store32(p, uint32_t(v));
  Store32(p + 4, uint32_t(v >> 32));
}

// Parsed frame header; Validate* below checks it against the caller's view.
struct FrameHeader {
  uint32_t magic;
  uint8_t version, dtype, flags, block_log2;
  uint64_t n_elems, frame_bytes;
  uint32_t reserved, checksum;
};

ZIPCCL_HD FrameHeader ParseFrameHeader(const uint8_t* p) {
  FrameHeader h;
  h.magic = Load32(p);
  h.version = p[4];
  h.dtype = p[5];
  h.flags = p[6];
  h.block_log2 = p[7];
  h.n_elems = Load64(p + 8);
  h.frame_bytes = Load64(p + 16);
  h.reserved = Load32(p + 24);
  h.checksum = Load32(p + 28);
  return h;
}

ZIPCCL_HD void WriteFrameHeader(uint8_t* p, uint8_t dtype, uint8_t flags,
                                uint64_t n_elems, uint64_t frame_bytes,
                                uint32_t checksum) {
  Store32(p, kMagic);
  p[4] = kVersion;
  p[5] = dtype;
  p[6] = flags;
  p[7] = uint8_t(kBlockLog2);
  Store64(p + 8, n_elems);
  Store64(p + 16, frame_bytes);
  Store32(p + 24, 0);
  Store32(p + 28, checksum);
}

// Checks every header field that does not need the frame body. in_bytes is the
// number of payload bytes the caller can read.
ZIPCCL_HD Status ValidateFrameHeader(const FrameHeader& h, uint8_t dtype,
                                     uint64_t n_elems, uint64_t in_bytes) {
  if (h.magic != kMagic) return kErrMagic;
  if (h.version != kVersion) return kErrVersion;
  if (h.dtype != dtype) return kErrDType;
  if ((h.flags & kFrameFlagsReserved) || h.reserved != 0) return kErrReserved;
  if (!(h.flags & kFrameFlagChecksum) && h.checksum != 0) return kErrReserved;
  if (h.block_log2 != kBlockLog2) return kErrBlockLog2;
  if (h.n_elems != n_elems) return kErrCount;
  if (h.frame_bytes > in_bytes) return kErrTruncated;
  uint64_t nb = NumBlocks(n_elems);
  if (h.frame_bytes < kFrameHeaderBytes + nb * kDirEntryBytes ||
      h.frame_bytes > MaxEncodedBytes(n_elems, dtype))
    return kErrFrameSize;
  return kOk;
}

}  // namespace zipccl
