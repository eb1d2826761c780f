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

// Hash of `head` (exactly 32 bytes, normally a copy of the frame header with
// the checksum field zeroed) followed by `rest` (rest_bytes bytes).
ZIPCCL_HD uint32_t Xxh32Frame(const uint8_t* head, const uint8_t* rest,
                              uint64_t rest_bytes, uint32_t seed) {
  uint32_t v1 = seed + kXxhP1 + kXxhP2, v2 = seed + kXxhP2, v3 = seed,
           v4 = seed - kXxhP1;
  for (int s = 0; s < 2; ++s) {
    const uint8_t* p = head + 16 * s;
    v1 = XxhRound(v1, Load32(p));
    v2 = XxhRound(v2, Load32(p + 4));
    v3 = XxhRound(v3, Load32(p + 8));
    v4 = XxhRound(v4, Load32(p + 12));
  }
  const uint8_t* p = rest;
  const uint8_t* end = rest + rest_bytes;
  while (end - p >= 16) {
    v1 = XxhRound(v1, Load32(p));
    v2 = XxhRound(v2, Load32(p + 4));
    v3 = XxhRound(v3, Load32(p + 8));
    v4 = XxhRound(v4, Load32(p + 12));
    p += 16;
  }
  uint32_t h = XxhRotl(v1, 1) + XxhRotl(v2, 7) + XxhRotl(v3, 12) + XxhRotl(v4, 18);
  h += uint32_t(32 + rest_bytes);  // XXH32 folds the length in mod 2^32
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

// Checksum of a complete frame of frame_bytes bytes starting at `frame`.
ZIPCCL_HD uint32_t FrameChecksum(const uint8_t* frame, uint64_t frame_bytes) {
  uint8_t head[kFrameHeaderBytes];
  for (uint64_t i = 0; i < kFrameHeaderBytes; ++i) head[i] = i < 28 ? frame[i] : 0;
  return Xxh32Frame(head, frame + kFrameHeaderBytes,
                    frame_bytes - kFrameHeaderBytes, kChecksumSeed);
}

}  // namespace zipccl
