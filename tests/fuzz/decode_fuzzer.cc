// libFuzzer harness: zipccl::cpu::DecodeFrame on arbitrary bytes, across dtypes and element counts.
//
// Input layout: [ctl] [frame bytes ...]
//   ctl bits 0-1  expected dtype: 0 = the frame's own dtype byte (bfloat16 if that is no dtype code; the
//                 one-byte floats 4..11 are reached this way),
//                 1 = bfloat16, 2 = float16, 3 = float32
//   ctl bit  2    expect one element more than the header says (n_elems mismatch)
//   ctl bit  3    decode from an exactly frame_bytes-sized copy as well (must agree with the full buffer)
// The expected element count is the header's n_elems when that is at most kMaxElems, so seeds (valid frames)
// decode and mutations reach the block decoders; larger claims are folded below kMaxElems (and rejected).
//
// Checked, beyond "no crash, no sanitizer report" (ASan sees any read past the input or write past the
// exactly-sized output):
//   - a rejection carries a defined, decoder-side Status;
//   - an accepted frame is within the size bound, is rejected when cut by one byte, decodes identically
//     from an exact-size copy, and its output survives encode -> decode bit-exactly;
//   - the decoder never writes the output when n_elems is 0;
//   - the portable loops (ZIPCCL_CPU_PORTABLE) give the vector path's verdict, block and bits (the build
//     compiles the widest vector path the machine runs, tests/fuzz/run_fuzz.sh).
// tests/fuzz/corpus/decode holds the seeds (make_corpus.py), tests/fuzz/regressions/decode past crashers.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "cpu_driver.h"
#include "format.h"

namespace {

constexpr uint64_t kMaxElems = uint64_t{1} << 18;  // 1 MiB of float32 output at most

[[noreturn]] void Fail(const char* what, int status) {
  std::fprintf(stderr, "decode_fuzzer: property violated: %s (status %d: %s)\n", what, status,
               zipccl::StatusMessage(status));
  std::abort();
}

zipccl::cpu::DecodeResult DecodeCopy(const uint8_t* frame, uint64_t len, uint8_t dtype, uint64_t n,
                                     uint8_t* out) {
  // Exactly-sized heap copy, so that ASan flags a read of even one byte past `len`.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[len ? len : 1]);
  if (len) std::memcpy(copy.get(), frame, len);
  return zipccl::cpu::DecodeFrame(copy.get(), len, dtype, n, out);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t ctl = data[0];
  const uint8_t* frame = data + 1;
  const uint64_t len = size - 1;

  uint8_t dtype = ctl & 3;
  uint64_t hdr_n = 0, hdr_frame_bytes = 0;
  if (len >= zipccl::kFrameHeaderBytes) {
    hdr_n = zipccl::Load64(frame + 8);
    hdr_frame_bytes = zipccl::Load64(frame + 16);
    if (dtype == 0) dtype = frame[5];
  }
  if (zipccl::ElemBytes(dtype) == 0) dtype = zipccl::kBF16;
  uint64_t n = hdr_n <= kMaxElems ? hdr_n : hdr_n % (kMaxElems + 1);
  if (ctl & 4) n += 1;
  const uint64_t w = uint64_t(zipccl::ElemBytes(dtype));

  // Exactly-sized output; a sentinel buffer for n == 0 checks that nothing is written.
  std::vector<uint8_t> out(n * w ? n * w : 8, 0xA5);
  auto r = zipccl::cpu::DecodeFrame(frame, len, dtype, n, out.data());
  if (*zipccl::cpu::CompiledCodePaths()) {  // the same verdict and bits from the portable loops
    std::vector<uint8_t> outp(out.size(), 0xA5);
    setenv("ZIPCCL_CPU_PORTABLE", "1", 1);
    const auto rp = zipccl::cpu::DecodeFrame(frame, len, dtype, n, outp.data());
    unsetenv("ZIPCCL_CPU_PORTABLE");
    if (rp.status != r.status || rp.block != r.block) Fail("the portable loops give another verdict", rp.status);
    if (r.status == zipccl::kOk && outp != out) Fail("the portable loops decode other bits", 0);
  }
  if (n == 0)
    for (uint8_t b : out)
      if (b != 0xA5) Fail("wrote output for n_elems = 0", r.status);

  if (r.status != zipccl::kOk) {
    if (r.status <= zipccl::kOk || r.status >= zipccl::kNumStatus || r.status == zipccl::kErrCapacity)
      Fail("undefined status on rejection", r.status);
    if (ctl & 8) {  // the decision must not depend on readable slack beyond the header's frame size
      uint64_t cut = hdr_frame_bytes < len ? hdr_frame_bytes : len;
      std::vector<uint8_t> out2(n * w ? n * w : 8);
      auto r2 = DecodeCopy(frame, cut, dtype, n, out2.data());
      if (r2.status == zipccl::kOk) Fail("accepted at frame_bytes, rejected with more bytes", r.status);
    }
    return 0;
  }

  // Accepted: the frame must be self-consistent.
  if (len < zipccl::kFrameHeaderBytes || hdr_frame_bytes > len ||
      hdr_frame_bytes > zipccl::MaxEncodedBytes(n, dtype))
    Fail("accepted a frame outside its size bounds", r.status);
  {
    std::vector<uint8_t> out2(n * w ? n * w : 8);
    auto r2 = DecodeCopy(frame, hdr_frame_bytes, dtype, n, out2.data());
    if (r2.status != zipccl::kOk) Fail("rejected at exactly frame_bytes", r2.status);
    if (n && std::memcmp(out.data(), out2.data(), n * w) != 0)
      Fail("output depends on bytes beyond frame_bytes", 0);
    auto r3 = DecodeCopy(frame, hdr_frame_bytes - 1, dtype, n, out2.data());
    if (r3.status != zipccl::kErrTruncated) Fail("accepted a frame cut by one byte", r3.status);
  }
  // Whatever a frame decodes to must survive the encoder and the decoder bit-exactly.
  const uint64_t cap = zipccl::MaxEncodedBytes(n, dtype);
  std::vector<uint8_t> enc(cap);
  const uint64_t need = zipccl::cpu::EncodeFrame(out.data(), n, dtype, (ctl >> 4) & 1, enc.data(), cap);
  if (need > cap) Fail("encoder exceeded max_encoded_bytes", 0);
  std::vector<uint8_t> back(n * w ? n * w : 8);
  auto r4 = DecodeCopy(enc.data(), need, dtype, n, back.data());
  if (r4.status != zipccl::kOk) Fail("re-encoded frame rejected", r4.status);
  if (n && std::memcmp(out.data(), back.data(), n * w) != 0) Fail("re-encode round trip differs", 0);
  return 0;
}
