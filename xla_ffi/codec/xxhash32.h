// XXH32 (Yann Collet's xxHash, 32-bit variant), written from its public
// specification. The frame checksum is XXH32 with seed 0 over the whole frame
// with header bytes [28, 32) read as zero, so it covers the header too.
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

// Checksum of a complete frame of frame_bytes bytes starting at `frame`.
ZIPCCL_HD uint32_t FrameChecksum(const uint8_t* frame, uint64_t frame_bytes) {
  uint8_t head[kFrameHeaderBytes];
  for (uint64_t i = 0; i < kFrameHeaderBytes; ++i) head[i] = i < 28 ? frame[i] : 0;
  return Xxh32Frame(head, frame + kFrameHeaderBytes,
                    frame_bytes - kFrameHeaderBytes, kChecksumSeed);
}

}  // namespace zipccl
