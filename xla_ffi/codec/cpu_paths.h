// The CPU driver's code paths: which vector tier the build compiles, the test
// switch to the portable loops, and the register-table lookup both passes use.
// Private to cpu_driver.cc (its anonymous namespace); pure C++17 and intrinsics.
#pragma once

#include <cstdint>
#include <cstdlib>

#include "format.h"

// AVX-512 paths, in two tiers. Both step a segment's 32 lanes in one register:
// the encoder with table lookups by register permutes, the decoder with the
// code lengths from a permute and the canonical code's limits, and gathers
// for the symbols of long codes.
// - VBMI2 (AVX-512 F, BW, VL, VBMI, VBMI2 and GFNI: Ice Lake, Sapphire Rapids,
//   Zen 4): byte permutes (vpermi2b), GFNI bit reversal, vpcompressw /
//   vpexpandw for the units' slots and the refills ("the lanes that need a
//   unit take the next ones, in lane order" is exactly an expand-load), and
//   vpcompressb / vpexpandb for the raw bytes.
// - AVX-512BW (F, BW, VL: Skylake-SP, Cascade Lake): word permutes
//   (vpermi2w), a nibble-table bit reversal, and AVX-512F's dword compress
//   and expand (vpcompressd / vpexpandd, two halves of 16 lanes) where VBMI2
//   compresses and expands words and bytes; float32's three raw bytes per
//   element are packed and unpacked by vpshufb within 128-bit lanes and a
//   vpermd across them (12 bytes = 3 dwords a lane) around the dword
//   compress / expand.
// The build uses -march=native; other targets take the portable loops. Every
// path produces the same bytes and the same verdicts (ZIPCCL_CPU_PORTABLE=1 in
// the environment selects the portable loops, for the tests).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__BMI2__)
#define ZIPCCL_CPU_AVX512 1
#include <immintrin.h>
// GCC 12 takes the intrinsics' deliberately undefined pass-through operands
// for uninitialised variables.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#if defined(__AVX512VBMI2__) && defined(__AVX512VBMI__) && defined(__GFNI__)
#define ZIPCCL_CPU_VBMI2 1
#else
#define ZIPCCL_CPU_VBMI2 0
#endif
#else
#define ZIPCCL_CPU_AVX512 0
#define ZIPCCL_CPU_VBMI2 0
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the CPU driver stores words with memcpy and assumes a little-endian host"
#endif

namespace zipccl::cpu {
namespace {

// The driver holds no writable globals (tests/test_hardening.py): the test
// switch to the portable loops is the environment, read once per frame.
inline bool UseVector() {
  if (!ZIPCCL_CPU_AVX512) return false;
  const char* v = std::getenv("ZIPCCL_CPU_PORTABLE");
  return !(v && v[0] && !(v[0] == '0' && v[1] == 0));
}

#if ZIPCCL_CPU_AVX512
// Entries s of a 256-entry u16 table held in eight registers of 32 entries
// (t[0..7]), for 32 bytes s in the low bytes of u16 lanes: four two-register
// permutes, whose index is the low 6 bits of s (VBMI: byte permutes picking
// the entry's two bytes; BW: word permutes), blended by bits 6 and 7.
inline __m512i Lookup256(const __m512i* t, __m512i s) {
#if ZIPCCL_CPU_VBMI2
  const __m512i w = _mm512_and_si512(_mm512_slli_epi16(s, 1), _mm512_set1_epi16(0x7E));
  const __m512i idx = _mm512_or_si512(_mm512_or_si512(w, _mm512_slli_epi16(w, 8)),
                                      _mm512_set1_epi16(0x0100));
  auto pick = [&](int i) { return _mm512_permutex2var_epi8(t[i], idx, t[i + 1]); };
#else
  const __m512i idx = _mm512_and_si512(s, _mm512_set1_epi16(63));
  auto pick = [&](int i) { return _mm512_permutex2var_epi16(t[i], idx, t[i + 1]); };
#endif
  const __m512i r0 = pick(0), r1 = pick(2), r2 = pick(4), r3 = pick(6);
  const __mmask32 b6 = _mm512_test_epi16_mask(s, _mm512_set1_epi16(64));
  const __mmask32 b7 = _mm512_test_epi16_mask(s, _mm512_set1_epi16(128));
  return _mm512_mask_blend_epi16(b7, _mm512_mask_blend_epi16(b6, r0, r1),
                                 _mm512_mask_blend_epi16(b6, r2, r3));
}
#endif

}  // namespace
}  // namespace zipccl::cpu
