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
// And an AVX2 tier (AVX2 and POPCNT without AVX-512: Haswell to Alder Lake,
// Zen 1-3), cpu_encode_avx2.h and cpu_decode_avx2.h: a segment's 32 lanes in
// four registers of eight 32-bit lanes, the table lookups by gathers, and the
// squeezes and spreads of lanes (AVX-512's compress and expand) by permutes
// whose indices come from the LaneTables below.
// The build uses -march=native; other targets take the portable loops. Every
// path produces the same bytes and the same verdicts (ZIPCCL_CPU_PORTABLE=1 in
// the environment selects the portable loops, for the tests).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__BMI2__)
#define ZIPCCL_CPU_AVX512 1
#define ZIPCCL_CPU_AVX2 0
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
#elif defined(__AVX2__) && defined(__POPCNT__)
#define ZIPCCL_CPU_AVX512 0
#define ZIPCCL_CPU_VBMI2 0
#define ZIPCCL_CPU_AVX2 1
#include <immintrin.h>
#else
#define ZIPCCL_CPU_AVX512 0
#define ZIPCCL_CPU_VBMI2 0
#define ZIPCCL_CPU_AVX2 0
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the CPU driver stores words with memcpy and assumes a little-endian host"
#endif

namespace zipccl::cpu {
namespace {

// The driver holds no writable globals (tests/test_hardening.py): the test
// switch to the portable loops is the environment, read once per frame.
inline bool UseVector() {
  if (!ZIPCCL_CPU_AVX512 && !ZIPCCL_CPU_AVX2) return false;
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

// The canonical code's limits in the 11-bit window W (the code's first
// kMaxCodeLen bits, first bit highest): the windows of the codes of length
// <= l are [0, lim[l]) (FORMAT.md's canonical order), so a window's code has
// the least l with W < lim[l], and none if W >= lim[kMaxCodeLen]. The vector
// decoders find code lengths by comparing windows with them.
inline void CodeLimits(const uint8_t* lens, uint16_t* lim) {
  uint32_t count[kMaxCodeLen + 1] = {0};
  for (int s = 0; s < kNumSymbols; ++s) ++count[lens[s]];
  uint32_t code = 0;
  lim[0] = 0;
  for (int l = 1; l <= kMaxCodeLen; ++l) {  // canonical: first[l] = (first[l-1] + count[l-1]) << 1
    code = (code + (l > 1 ? count[l - 1] : 0)) << (l > 1 ? 1 : 0);
    lim[l] = uint16_t((code + count[l]) << (kMaxCodeLen - l));  // <= 2048 (Kraft, checked before)
  }
}

#if ZIPCCL_CPU_AVX2
// Eight 32-bit lanes and a mask m of them (bit l: lane l), as byte tables
// that _mm256_cvtepu8_epi32 widens into vpermd indices:
// - squeeze[m]: byte i is the lane of the i-th set bit (the set lanes moved
//   to the bottom, in order: AVX-512's compress);
// - rank[m]: byte l is the number of set bits below bit l (where lane l's
//   item sits among the set lanes': AVX-512's expand).
struct LaneTables {
  uint64_t squeeze[256];
  uint64_t rank[256];
};

constexpr LaneTables MakeLaneTables() {
  LaneTables t{};
  for (int m = 0; m < 256; ++m) {
    int n = 0;
    for (int l = 0; l < 8; ++l) {
      t.rank[m] |= uint64_t(n) << (8 * l);
      if (m >> l & 1) t.squeeze[m] |= uint64_t(l) << (8 * n++);
    }
  }
  return t;
}

constexpr LaneTables kLaneTables = MakeLaneTables();

// The vpermd indices of a table entry.
inline __m256i LaneIndices(uint64_t entry) { return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(entry))); }

// Bit l: lane l of v has its top bit set (a comparison's all-ones lanes).
inline uint32_t LaneMask(__m256i v) { return uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(v))); }

// The low 16 bits of each 32-bit lane, as eight u16.
inline __m128i Low16s(__m256i v) {
  const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, pick), 0x08));
}
#endif

}  // namespace
}  // namespace zipccl::cpu
