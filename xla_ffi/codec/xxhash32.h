// XXH32 (Yann Collet's xxHash, 32-bit variant), written from its public
// specification, and the frame checksum of format version 2 built on it
// (FORMAT.md "Checksum"): XXH32 (seed 0) of the list of the parts' XXH32
// values as little-endian u32, the parts being the header (bytes [28, 32)
// read as zero) with the block directory, then each block. The blocks hash
// independently, so a GPU hashes them in parallel; the list is short (4 bytes
// per 65536 elements).
#pragma once

#include <cstdint>

#include "format.h"

namespace zipccl {

constexpr uint32_t kXxhP1 = 0x9E3779B1u;
constexpr uint32_t kXxhP2 = 0x85EBCA77u;
constexpr uint32_t kXxhP3 = 0xC2B2AE3Du;
constexpr uint32_t kXxhP4 = 0x27D4EB2Fu;
constexpr uint32_t kXxhP5 = 0x165667B1u;

ZIPCCL_HD uint32_t XxhRotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

ZIPCCL_HD uint32_t XxhRound(uint32_t acc, uint32_t lane) {
  return XxhRotl(acc + lane * kXxhP2, 13) * kXxhP1;
}

// XXH32 in its three steps, so that a CTA can split the work the way the
// algorithm allows (cuda_common.cuh, CtaFrameChecksum): four independent
// accumulators v[0..3], accumulator k taking word k of every 16-byte stripe in
// order (XxhRound is not associative: a stripe range cannot be hashed apart
// from the stripes before it); then XxhMerge folds the accumulators and the
// total length; then XxhFinish hashes the < 16 bytes after the last stripe and
// mixes. Only for inputs of at least 16 bytes (a frame has at least 32).
ZIPCCL_HD void XxhInit(uint32_t seed, uint32_t v[4]) {
  v[0] = seed + kXxhP1 + kXxhP2;
  v[1] = seed + kXxhP2;
  v[2] = seed;
  v[3] = seed - kXxhP1;
}

ZIPCCL_HD uint32_t XxhMerge(const uint32_t v[4], uint64_t total_bytes) {
  const uint32_t h = XxhRotl(v[0], 1) + XxhRotl(v[1], 7) + XxhRotl(v[2], 12) + XxhRotl(v[3], 18);
  return h + uint32_t(total_bytes);  // XXH32 folds the length in mod 2^32
}

// The bytes [p, end) after the last whole stripe (fewer than 16), then the
// final avalanche.
ZIPCCL_HD uint32_t XxhFinish(uint32_t h, const uint8_t* p, const uint8_t* end) {
  while (end - p >= 4) {
    h = XxhRotl(h + Load32(p) * kXxhP3, 17) * kXxhP4;
    p += 4;
  }
  while (p < end) {
    h = XxhRotl(h + (*p) * kXxhP5, 11) * kXxhP1;
    ++p;
  }
  h ^= h >> 15;
  h *= kXxhP2;
  h ^= h >> 13;
  h *= kXxhP3;
  h ^= h >> 16;
  return h;
}

// Hash of `head` (exactly 32 bytes, normally a copy of the frame header with
// the checksum field zeroed) followed by `rest` (rest_bytes bytes).
ZIPCCL_HD uint32_t Xxh32Frame(const uint8_t* head, const uint8_t* rest,
                              uint64_t rest_bytes, uint32_t seed) {
  uint32_t v[4];
  XxhInit(seed, v);
  for (int s = 0; s < 2; ++s)
    for (int k = 0; k < 4; ++k) v[k] = XxhRound(v[k], Load32(head + 16 * s + 4 * k));
  const uint8_t* p = rest;
  const uint8_t* end = rest + rest_bytes;
  for (; end - p >= 16; p += 16)
    for (int k = 0; k < 4; ++k) v[k] = XxhRound(v[k], Load32(p + 4 * k));
  return XxhFinish(XxhMerge(v, 32 + rest_bytes), p, end);
}

// XXH32 of any n bytes at p (fewer than 16 included).
ZIPCCL_HD uint32_t Xxh32Bytes(const uint8_t* p, uint64_t n, uint32_t seed) {
  const uint8_t* end = p + n;
  uint32_t h;
  if (n >= 16) {
    uint32_t v[4];
    XxhInit(seed, v);
    for (; end - p >= 16; p += 16)
      for (int k = 0; k < 4; ++k) v[k] = XxhRound(v[k], Load32(p + 4 * k));
    h = XxhMerge(v, n);
  } else {
    h = seed + kXxhP5 + uint32_t(n);
  }
  return XxhFinish(h, p, end);
}

// Part 0 of the checksum: the 32-byte header with the checksum field read as
// zero, then the nb directory entries.
ZIPCCL_HD uint32_t ChecksumHeadPart(const uint8_t* frame, uint64_t nb) {
  uint8_t head[kFrameHeaderBytes];
  for (uint64_t i = 0; i < kFrameHeaderBytes; ++i) head[i] = i < 28 ? frame[i] : 0;
  return Xxh32Frame(head, frame + kFrameHeaderBytes, nb * kDirEntryBytes, kChecksumSeed);
}

// XXH32 (seed 0) of a list of u32 values as little-endian bytes, fed one value
// at a time: the outer hash of the checksum, over the parts' hashes.
struct Xxh32Words {
  uint32_t v[4];
  uint32_t stripe[4];
  uint64_t words;
  ZIPCCL_HD void Init() {
    XxhInit(kChecksumSeed, v);
    words = 0;
  }
  ZIPCCL_HD void Add(uint32_t w) {
    stripe[words & 3] = w;
    if ((++words & 3) == 0)
      for (int k = 0; k < 4; ++k) v[k] = XxhRound(v[k], stripe[k]);
  }
  ZIPCCL_HD uint32_t Finish() const {
    const uint64_t bytes = 4 * words;
    const uint32_t h = bytes >= 16 ? XxhMerge(v, bytes) : kChecksumSeed + kXxhP5 + uint32_t(bytes);
    uint8_t tail[16];  // the words after the last whole stripe, as the bytes XxhFinish reads
    for (uint64_t k = 0; k < (words & 3); ++k) Store32(tail + 4 * k, stripe[k]);
    return XxhFinish(h, tail, tail + 4 * (words & 3));
  }
};

// Checksum of a complete frame of frame_bytes bytes at `frame` whose header
// and directory have been checked (the directory's sizes add up to
// frame_bytes). The serial form: a GPU hashes the parts in parallel and
// combines them with Xxh32Words in the same order.
ZIPCCL_HD uint32_t FrameChecksum(const uint8_t* frame, uint64_t frame_bytes) {
  const uint64_t nb = NumBlocks(Load64(frame + 8));
  Xxh32Words outer;
  outer.Init();
  outer.Add(ChecksumHeadPart(frame, nb));
  uint64_t at = kFrameHeaderBytes + nb * kDirEntryBytes;
  for (uint64_t b = 0; b < nb; ++b) {
    const uint64_t bytes = Load32(frame + kFrameHeaderBytes + b * kDirEntryBytes);
    const uint64_t take = at + bytes <= frame_bytes ? bytes : (at < frame_bytes ? frame_bytes - at : 0);
    outer.Add(Xxh32Bytes(frame + at, take, kChecksumSeed));
    at += take;
  }
  return outer.Finish();
}

}  // namespace zipccl
