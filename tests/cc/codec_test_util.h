// Shared helpers of the codec C++ tests: test data in the three dtypes and exact-size encode/decode wrappers.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "xla_ffi/codec/cpu_driver.h"
#include "xla_ffi/codec/format.h"

namespace zipccl_test {

using zipccl::kBF16;
using zipccl::kF16;
using zipccl::kF32;

constexpr uint8_t kDTypes[] = {kBF16, kF16, kF32};

inline const char* DTypeName(uint8_t dtype) {
  return dtype == kBF16 ? "bf16" : dtype == kF16 ? "f16" : dtype == kF32 ? "f32" : zipccl::ElemBytes(dtype) == 1 ? "f8" : "?";
}

// Elements as raw little-endian bytes (2 or 4 per element).
struct Array {
  uint8_t dtype;
  uint64_t n;
  std::vector<uint8_t> bytes;
};

inline uint32_t F32Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// bfloat16 by round-to-nearest-even (NaN kept a NaN), float16 by the compiler's conversion.
inline uint32_t FloatToElem(float f, uint8_t dtype) {
  if (dtype == kF32) return F32Bits(f);
  if (dtype == kF16) {
    _Float16 h = static_cast<_Float16>(f);
    uint16_t u;
    std::memcpy(&u, &h, 2);
    return u;
  }
  uint32_t u = F32Bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 0x40u;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

inline Array MakeArray(uint8_t dtype, uint64_t n) {
  return Array{dtype, n, std::vector<uint8_t>(n * uint64_t(zipccl::ElemBytes(dtype)))};
}

inline void SetElem(Array& a, uint64_t i, uint32_t bits) {
  std::memcpy(a.bytes.data() + i * zipccl::ElemBytes(a.dtype), &bits, zipccl::ElemBytes(a.dtype));
}

inline uint32_t GetElem(const Array& a, uint64_t i) {
  uint32_t bits = 0;
  std::memcpy(&bits, a.bytes.data() + i * zipccl::ElemBytes(a.dtype), zipccl::ElemBytes(a.dtype));
  return bits;
}

// Near-Gaussian data like activations: N(0, scale^2); `zero_fraction` of the elements are exactly +0.
inline Array Gaussian(uint8_t dtype, uint64_t n, uint32_t seed, float scale = 1.0f,
                      double zero_fraction = 0.0) {
  Array a = MakeArray(dtype, n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  for (uint64_t i = 0; i < n; ++i) {
    float v = normal(rng);
    SetElem(a, i, unif(rng) < zero_fraction ? 0u : FloatToElem(v, dtype));
  }
  return a;
}

// Uniformly random bit patterns: incompressible, every block must fall back to RAW.
inline Array RandomBits(uint8_t dtype, uint64_t n, uint32_t seed) {
  Array a = MakeArray(dtype, n);
  std::mt19937 rng(seed);
  for (auto& b : a.bytes) b = uint8_t(rng());
  return a;
}

// Exactly-sized frame: encoded with capacity MaxEncodedBytes, then cut to the returned size.
inline std::vector<uint8_t> Encode(const Array& a, bool checksum) {
  std::vector<uint8_t> out(zipccl::MaxEncodedBytes(a.n, a.dtype));
  uint64_t nbytes = zipccl::cpu::EncodeFrame(a.bytes.data(), a.n, a.dtype, checksum, out.data(), out.size());
  out.resize(nbytes <= out.size() ? nbytes : 0);
  return out;
}

// Decodes from an exactly-sized heap copy of in[0, in_bytes), so that a sanitizer catches any read past it,
// into an exactly-sized output.
inline zipccl::cpu::DecodeResult Decode(const std::vector<uint8_t>& in, uint64_t in_bytes, uint8_t dtype,
                                        uint64_t n, Array* out) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[in_bytes ? in_bytes : 1]);
  std::memcpy(copy.get(), in.data(), in_bytes);
  *out = MakeArray(dtype, n);
  return zipccl::cpu::DecodeFrame(copy.get(), in_bytes, dtype, n, out->bytes.data());
}

inline zipccl::cpu::DecodeResult Decode(const std::vector<uint8_t>& in, uint8_t dtype, uint64_t n,
                                        Array* out) {
  return Decode(in, in.size(), dtype, n, out);
}

// Offsets inside a frame.
inline uint64_t DirEntryOffset(uint64_t block) {
  return zipccl::kFrameHeaderBytes + block * zipccl::kDirEntryBytes;
}

inline uint64_t BlockOffset(const std::vector<uint8_t>& frame, uint64_t n, uint64_t block) {
  uint64_t off = zipccl::kFrameHeaderBytes + zipccl::NumBlocks(n) * zipccl::kDirEntryBytes;
  for (uint64_t b = 0; b < block; ++b) off += zipccl::Load32(frame.data() + DirEntryOffset(b));
  return off;
}

inline uint8_t ModeOfBlock(const std::vector<uint8_t>& frame, uint64_t n, uint64_t block) {
  return frame[BlockOffset(frame, n, block)];
}

}  // namespace zipccl_test
