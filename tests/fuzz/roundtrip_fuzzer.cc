// libFuzzer harness: zipccl::cpu::EncodeFrame -> DecodeFrame round trips on fuzzer-shaped data.
//
// Input layout: [ctl0] [ctl1] [element bytes ...]
//   ctl0 bits 0-1  dtype: 0 bfloat16, 1 float16, 2 float32, 3 float8_e4m3fn (one-byte symbols; every
//                  float8 variant is coded alike)
//   ctl0 bit  2    checksum
//   ctl0 bits 3-4  shaping of the elements (so that HUFF blocks, not only RAW ones, get fuzzed):
//                  0 the bytes verbatim; 1 exponent squeezed into a window of 8 values around 1.0 (a 16-entry
//                  window for float16, exponent 8..15 for float8); 2 like 1, with every element whose byte is < 64 set to +0 (sparse);
//                  3 like 1, plus low 16 bits cleared (float32 LOW16 blocks), and every byte 0xFF escapes to an
//                  element with exponent 0 or all-ones (subnormal, Inf or NaN)
//   ctl0 bits 5-6  capacity: 0 max_encoded_bytes; 1 exactly the frame size; 2 one byte short (overflow);
//                  3 ctl1 bytes (tiny: a header or less)
//   ctl0 bit  7    long input: the elements are repeated, each copy perturbed, to 65536 + 131 * (ctl1 & 127)
//                  + len elements, so frames span two blocks and every segment of the first
//   ctl1           capacity (mode 3), length (bit 7 of ctl0), and the bit flipped in the corruption check
//
// Checked: the frame size is within [32 + 4 * n_blocks, max_encoded_bytes]; the same input always codes to
// the same bytes, whatever the capacity, as long as it fits; decoding gives the input bits back; an
// overflowed encode returns the needed size, writes only the 32-byte header (frame_bytes = needed, flags 0,
// checksum 0) and nothing past the capacity, and that payload is rejected as truncated; with the checksum on,
// a flipped bit is either rejected or decodes to the original bits; the portable loops (ZIPCCL_CPU_PORTABLE)
// code the same bytes as the vector path that the build compiles where the machine runs one
// (tests/fuzz/run_fuzz.sh). ASan watches every buffer, all of which are exactly sized.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "cpu_driver.h"
#include "format.h"

namespace {

[[noreturn]] void Fail(const char* what, long long a = 0, long long b = 0) {
  std::fprintf(stderr, "roundtrip_fuzzer: property violated: %s (%lld, %lld)\n", what, a, b);
  std::abort();
}

uint32_t Shape(uint32_t v, uint8_t dtype, int mode, uint8_t tag) {
  if (mode == 0) return v;
  if (mode == 2 && tag < 64) return 0;
  if (dtype == zipccl::kF8E4M3FN) {  // exponent bits 3..6 in 8..15; escapes to 0 (subnormal) or 15
    v = (v & 0x87u) | ((8u + ((v >> 3) & 7u)) << 3);
    if (mode == 3 && tag == 0xFF) v = ((v >> 2) & 1) ? (v | 0x78u) : (v & 0x87u);
    return v;
  }
  if (dtype == zipccl::kF16) {  // window of 16 exponent values around 1.0 (15): 8..23
    v = (v & 0x83FFu) | ((8u + ((v >> 10) & 15u)) << 10);
    if (mode == 3 && tag == 0xFF) v = ((v >> 3) & 1) ? (v | 0x7C00u) : (v & 0x83FFu);
    return v;
  }
  const int mbits = dtype == zipccl::kF32 ? 23 : 7;
  const uint32_t emask = 0xFFu << mbits;
  uint32_t e = 124u + ((v >> mbits) & 7u);
  v = (v & ~emask) | (e << mbits);
  if (mode == 3) {
    if (dtype == zipccl::kF32) v &= 0xFFFF0000u;
    if (tag == 0xFF) v = ((v >> (mbits - 4)) & 1) ? (v | emask) : (v & ~emask);  // Inf/NaN or 0/subnormal
  }
  return v;
}

std::vector<uint8_t> EncodeExact(const uint8_t* x, uint64_t n, uint8_t dtype, bool checksum) {
  const uint64_t cap = zipccl::MaxEncodedBytes(n, dtype);
  std::vector<uint8_t> out(cap ? cap : 1);
  const uint64_t need = zipccl::cpu::EncodeFrame(x, n, dtype, checksum, out.data(), cap);
  if (need > cap) Fail("frame exceeds max_encoded_bytes", need, cap);
  out.resize(need);
  return out;
}

zipccl::cpu::DecodeResult DecodeExact(const std::vector<uint8_t>& frame, uint64_t len, uint8_t dtype,
                                      uint64_t n, std::vector<uint8_t>* out) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[len ? len : 1]);
  if (len) std::memcpy(copy.get(), frame.data(), len);
  out->assign(n * zipccl::ElemBytes(dtype), 0);
  return zipccl::cpu::DecodeFrame(copy.get(), len, dtype, n, out->data());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t ctl0 = data[0], ctl1 = data[1];
  const uint8_t dtype = (ctl0 & 3) == 3 ? uint8_t(zipccl::kF8E4M3FN) : uint8_t(1 + (ctl0 & 3));
  const bool checksum = ctl0 & 4;
  const int mode = (ctl0 >> 3) & 3;
  const int cap_mode = (ctl0 >> 5) & 3;
  const uint64_t w = uint64_t(zipccl::ElemBytes(dtype));
  const uint8_t* src = data + 2;
  const uint64_t src_n = (size - 2) / w;

  uint64_t n = src_n;
  if ((ctl0 & 0x80) && src_n) n = 65536 + 131 * uint64_t(ctl1 & 127) + src_n;
  std::vector<uint8_t> x(n * w ? n * w : 1);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t j = i % src_n, rep = i / src_n;
    uint32_t v = 0;
    std::memcpy(&v, src + j * w, w);
    if (rep) v ^= uint32_t(rep * 0x9E3779B1u) & (w == 4 ? 0x0000FFFFu : 0x0007u);  // perturb the mantissa
    v = Shape(v, dtype, mode, src[j * w]);
    std::memcpy(x.data() + i * w, &v, w);
  }
#ifdef ROUNDTRIP_FUZZER_DUMP  // test hook: tests/test_hardening.py checks its Python mirror of the shaping
  if (FILE* f = std::fopen(std::getenv("ROUNDTRIP_FUZZER_DUMP"), "wb")) {
    std::fwrite(x.data(), 1, n * w, f);
    std::fclose(f);
  }
  return 0;
#endif

  const std::vector<uint8_t> frame = EncodeExact(x.data(), n, dtype, checksum);
  const uint64_t need = frame.size();
  if (*zipccl::cpu::CompiledCodePaths()) {
    setenv("ZIPCCL_CPU_PORTABLE", "1", 1);
    const std::vector<uint8_t> portable = EncodeExact(x.data(), n, dtype, checksum);
    unsetenv("ZIPCCL_CPU_PORTABLE");
    if (portable != frame) Fail("the portable loops code other bytes", portable.size(), need);
  }
  const uint64_t nb = zipccl::NumBlocks(n);
  if (need < zipccl::kFrameHeaderBytes + nb * zipccl::kDirEntryBytes) Fail("frame too small", need, nb);
  if (zipccl::Load64(frame.data() + 16) != need) Fail("frame_bytes field differs from the size", need);

  std::vector<uint8_t> y;
  auto r = DecodeExact(frame, need, dtype, n, &y);
  if (r.status != zipccl::kOk) Fail("round trip rejected", r.status, r.block);
  if (n && std::memcmp(x.data(), y.data(), n * w) != 0) Fail("round trip differs");

  // The same input at another capacity: identical bytes if it fits, the overflow protocol if not.
  uint64_t cap = need;
  if (cap_mode == 0) cap = zipccl::MaxEncodedBytes(n, dtype);
  if (cap_mode == 2) cap = need - 1;
  if (cap_mode == 3) cap = ctl1 % 40;
  std::unique_ptr<uint8_t[]> buf(new uint8_t[cap ? cap : 1]);
  std::memset(buf.get(), 0xCD, cap ? cap : 1);
  const uint64_t got = zipccl::cpu::EncodeFrame(x.data(), n, dtype, checksum, buf.get(), cap);
  if (got != need) Fail("size depends on the capacity", got, need);
  if (need <= cap) {
    if (std::memcmp(buf.get(), frame.data(), need) != 0) Fail("bytes depend on the capacity", cap);
  } else {
    if (cap >= zipccl::kFrameHeaderBytes) {
      std::vector<uint8_t> head(buf.get(), buf.get() + cap);
      zipccl::FrameHeader h = zipccl::ParseFrameHeader(head.data());
      if (h.magic != zipccl::kMagic || h.frame_bytes != need || h.flags != 0 || h.checksum != 0 ||
          h.n_elems != n || h.dtype != dtype)
        Fail("overflow header wrong", h.frame_bytes, need);
      std::vector<uint8_t> out;
      auto ro = DecodeExact(head, cap, dtype, n, &out);
      if (ro.status != zipccl::kErrTruncated) Fail("overflowed payload not rejected as truncated", ro.status);
    } else {
      for (uint64_t i = 0; i < cap; ++i)
        if (buf[i] != 0xCD) Fail("wrote into a capacity smaller than the header", cap, i);
    }
  }

  // Checksum: a single flipped bit is rejected, or (the CHECKSUM flag itself, when the hash is 0) harmless.
  if (checksum && need) {
    std::vector<uint8_t> bad = frame;
    const uint64_t bit = (uint64_t(ctl1) * 2654435761u + size * 40503u) % (need * 8);
    bad[bit / 8] ^= uint8_t(1u << (bit % 8));
    std::vector<uint8_t> out;
    auto rb = DecodeExact(bad, need, dtype, n, &out);
    if (rb.status == zipccl::kOk && n && std::memcmp(out.data(), x.data(), n * w) != 0)
      Fail("checksummed frame with a flipped bit decoded to different data", int64_t(bit));
  }
  return 0;
}
