#include "cpu_driver.h"

// The driver's entry points over its two passes: cpu_encode.h and cpu_decode.h,
// each with the portable loops and the vector tiers of cpu_paths.h.
#include "cpu_decode.h"
#include "cpu_encode.h"
#include "cpu_paths.h"

namespace zipccl::cpu {

uint64_t EncodeFrame(const void* x, uint64_t n, uint8_t dtype, bool checksum, uint8_t* out,
                     uint64_t cap) {
  if (ElemBytes(dtype) == 1)
    return EncodeTyped(static_cast<const uint8_t*>(x), n, dtype, checksum, out, cap);
  if (ElemBytes(dtype) == 4)
    return EncodeTyped(static_cast<const uint32_t*>(x), n, dtype, checksum, out, cap);
  return EncodeTyped(static_cast<const uint16_t*>(x), n, dtype, checksum, out, cap);
}

DecodeResult DecodeFrame(const uint8_t* in, uint64_t in_bytes, uint8_t dtype, uint64_t n,
                         void* out) {
  if (ElemBytes(dtype) == 0) return {kErrDType, -1};
  if (ElemBytes(dtype) == 1)
    return DecodeTyped(in, in_bytes, dtype, n, static_cast<uint8_t*>(out));
  if (ElemBytes(dtype) == 4)
    return DecodeTyped(in, in_bytes, dtype, n, static_cast<uint32_t*>(out));
  return DecodeTyped(in, in_bytes, dtype, n, static_cast<uint16_t*>(out));
}

const char* CompiledCodePaths() {
  return ZIPCCL_CPU_VBMI2 ? "avx512_vbmi2" : ZIPCCL_CPU_AVX512 ? "avx512bw" : ZIPCCL_CPU_AVX2 ? "avx2" : "";
}

}  // namespace zipccl::cpu
