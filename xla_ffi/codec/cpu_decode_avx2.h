// The CPU decoder's AVX2 tier (cpu_paths.h): a HUFF segment's symbols, and
// their merge with the raw bytes. Same elements and verdicts as the portable
// loops of cpu_decode.h, which includes this header and calls it.
// Private to cpu_driver.cc (its anonymous namespace).
#pragma once

#include <cstdint>
#include <cstring>

#include "block.h"
#include "cpu_paths.h"
#include "format.h"
#include "huffman.h"

#if ZIPCCL_CPU_AVX2
namespace zipccl::cpu {
namespace {

// The canonical code's limits (CodeLimits) less one, by length 0..7 and
// 8..11, as NeedsUnit's permutes take them.
struct Avx2Limits {
  __m256i below_lo, below_hi;
};

inline void BuildAvx2Limits(const uint8_t* lens, Avx2Limits* a) {
  uint16_t lim[kMaxCodeLen + 1];
  CodeLimits(lens, lim);
  alignas(32) int32_t b[16];
  for (int l = 0; l < 16; ++l) b[l] = int(lim[l <= kMaxCodeLen ? l : kMaxCodeLen]) - 1;
  a->below_lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(b));
  a->below_hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + 8));
}

// Which lanes need a unit: those whose code is missing or longer than the nb
// bits they hold (first bit lowest in buf, the bits above nb zero). The codes
// of at most nb bits are the windows below lim[min(nb, 11)], so a lane needs
// one iff its window W (the first 11 bits, first bit highest: each byte's
// bits reversed by two nibble lookups, the bytes swapped) reaches that limit,
// looked up by nb (two vpermd of eight limits each).
inline __m256i NeedsUnit(const Avx2Limits& a, __m256i buf, __m256i nb) {
  const __m256i rev4 = _mm256_setr_epi8(0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15,
                                        0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15);
  const __m256i swap = _mm256_setr_epi8(1, 0, -1, -1, 5, 4, -1, -1, 9, 8, -1, -1, 13, 12, -1, -1,
                                        1, 0, -1, -1, 5, 4, -1, -1, 9, 8, -1, -1, 13, 12, -1, -1);
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i lo4 = _mm256_shuffle_epi8(rev4, _mm256_and_si256(buf, nib));
  const __m256i hi4 = _mm256_shuffle_epi8(rev4, _mm256_and_si256(_mm256_srli_epi32(buf, 4), nib));
  const __m256i rb = _mm256_or_si256(_mm256_slli_epi32(lo4, 4), hi4);  // no carry across bytes: both < 16
  const __m256i w = _mm256_srli_epi32(_mm256_shuffle_epi8(rb, swap), 16 - kMaxCodeLen);
  const __m256i held = _mm256_min_epu32(nb, _mm256_set1_epi32(kMaxCodeLen));
  const __m256i below = _mm256_blendv_epi8(_mm256_permutevar8x32_epi32(a.below_lo, held),
                                           _mm256_permutevar8x32_epi32(a.below_hi, held),
                                           _mm256_cmpgt_epi32(held, _mm256_set1_epi32(7)));
  return _mm256_cmpgt_epi32(w, below);
}

// A segment's 32 lanes in four groups of eight 32-bit lanes: each lane's bits
// in `buf` (first bit lowest; at most 10 + 16 held) and their count `nb`. A
// lane that needs a unit (NeedsUnit) takes the segment's next one, lanes in
// order (vpermd by LaneTables' rank); then a gather of the decode table gives
// every lane's symbol (bits 0..15) and code length (16..23). Units are read
// only below the segment's seg_units; a lane that needs one when none is left
// rejects the segment. Symbols go to syms (which has room for whole steps).
inline Status DecodeSegmentAvx2(const DecodeEntry* table, const Avx2Limits& lim, const uint8_t* units,
                                uint32_t su, uint32_t m, uint16_t* syms) {
  static_assert(sizeof(DecodeEntry) == 4, "the gathers read DecodeEntry as one 32-bit word");
  const int* t = reinterpret_cast<const int*>(table);
  const __m256i c16 = _mm256_set1_epi32(16), index = _mm256_set1_epi32(kTableSize - 1);
  const __m256i zero = _mm256_setzero_si256();
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i buf[4], nb[4];
  for (int g = 0; g < 4; ++g) buf[g] = nb[g] = zero;
  __m256i bad = zero;
  uint32_t cursor = 0;
  for (uint32_t e = 0; e < m; e += kLanes) {
    const int live = int(m - e < uint32_t(kLanes) ? m - e : uint32_t(kLanes));
    for (int g = 0; g < 4; ++g) {
      const __m256i act = _mm256_cmpgt_epi32(_mm256_set1_epi32(live - 8 * g), iota);
      const __m256i need = _mm256_and_si256(act, NeedsUnit(lim, buf[g], nb[g]));
      const uint32_t nm = LaneMask(need);
      const uint32_t cnt = uint32_t(__builtin_popcount(nm));
      if (cursor + cnt > su) return kErrStream;  // more units than seg_units: never read past them
      __m128i u8;
      if (cursor + 8 <= su) {
        u8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(units + 2 * uint64_t(cursor)));
      } else {
        alignas(16) uint16_t last[8] = {0};
        std::memcpy(last, units + 2 * uint64_t(cursor), 2 * uint64_t(su - cursor));
        u8 = _mm_load_si128(reinterpret_cast<const __m128i*>(last));
      }
      const __m256i u = _mm256_and_si256(
          need, _mm256_permutevar8x32_epi32(_mm256_cvtepu16_epi32(u8), LaneIndices(kLaneTables.rank[nm])));
      cursor += cnt;
      buf[g] = _mm256_or_si256(buf[g], _mm256_sllv_epi32(u, nb[g]));
      nb[g] = _mm256_add_epi32(nb[g], _mm256_and_si256(need, c16));
      const __m256i d = _mm256_i32gather_epi32(t, _mm256_and_si256(buf[g], index), 4);
      __m256i len = _mm256_and_si256(_mm256_srli_epi32(d, 16), _mm256_set1_epi32(0xFF));
      // Still no code, or one longer than the bits held: a corrupt stream.
      bad = _mm256_or_si256(bad, _mm256_and_si256(act, _mm256_or_si256(_mm256_cmpeq_epi32(len, zero),
                                                                        _mm256_cmpgt_epi32(len, nb[g]))));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(syms + e + 8 * g), Low16s(d));
      len = _mm256_and_si256(len, act);  // lanes past the segment's end keep their bits: padding, checked below
      buf[g] = _mm256_srlv_epi32(buf[g], len);
      nb[g] = _mm256_sub_epi32(nb[g], len);
    }
    // A failed lookup ends the segment: it is rejected, and a lane whose
    // lookups kept failing would only pile up bits.
    if (!_mm256_testz_si256(bad, bad)) return kErrStream;
  }
  if (cursor != su) return kErrStream;
  const __m256i pad = _mm256_or_si256(_mm256_or_si256(buf[0], buf[1]), _mm256_or_si256(buf[2], buf[3]));
  return _mm256_testz_si256(pad, pad) ? kOk : kErrReserved;
}

// Joins a segment's symbols (m, from syms, which may be read in whole steps
// of eight) with its raw bytes (nnz elements' worth at raw, never read past)
// into elements at out (exactly m written). Returns false if the non-ZERO
// symbols are not exactly nnz. A step spreads the next raw bytes to its
// non-ZERO lanes with vpshufb, whose indices are LaneTables' rank. One-byte
// floats have no raw bytes: the portable loop is theirs.
template <typename T>
bool MergeAvx2(const uint16_t* syms, uint32_t m, const uint8_t* raw, uint32_t nnz, bool low16, T* out) {
  static_assert(sizeof(T) != 1, "one-byte floats merge in the portable loop");
  const bool wide = sizeof(T) == 4 && !low16;  // three raw bytes per element
  const uint64_t width = wide ? 3 : 1, limit = width * nnz;
  const __m128i zs = _mm_set1_epi16(kZeroSymbol), iota = _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7);
  uint64_t rb = 0;
  for (uint32_t j = 0; j < m; j += 8) {
    const int live = int(m - j < 8 ? m - j : 8);
    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(syms + j));
    const __m128i act = _mm_cmpgt_epi16(_mm_set1_epi16(short(live)), iota);
    const __m128i nz = _mm_andnot_si128(_mm_cmpeq_epi16(s, zs), act);
    const uint32_t nm = uint32_t(_mm_movemask_epi8(_mm_packs_epi16(nz, nz))) & 0xFF;
    const uint64_t cnt = width * uint64_t(__builtin_popcount(nm));
    if (rb + cnt > limit) return false;
    // The step's raw bytes: a whole load while the segment's raw bytes reach
    // past it, else exactly those left, copied.
    __m128i rl;
    if (rb + 16 <= limit) {
      rl = _mm_loadu_si128(reinterpret_cast<const __m128i*>(raw + rb));
    } else {
      alignas(16) uint8_t last[16] = {0};
      std::memcpy(last, raw + rb, limit - rb);
      rl = _mm_load_si128(reinterpret_cast<const __m128i*>(last));
    }
    const __m128i rank = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(kLaneTables.rank[nm])));
    alignas(32) T tail[8];  // the last, short step's elements: never written past out + m
    T* step = live == 8 ? out + j : tail;
    if (!wide) {
      // u16 lane l: its raw byte (index rank[l]) below the symbol byte, rotated right by one.
      const __m128i spread = _mm_or_si128(_mm_or_si128(rank, _mm_set1_epi16(short(0x8000))),
                                          _mm_andnot_si128(nz, _mm_set1_epi16(0x0080)));
      const __m128i v0 = _mm_or_si128(_mm_slli_epi16(s, 8), _mm_shuffle_epi8(rl, spread));
      const __m128i v = _mm_and_si128(nz, _mm_or_si128(_mm_srli_epi16(v0, 1), _mm_slli_epi16(v0, 15)));
      if constexpr (sizeof(T) == 2) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(step), v);
      } else {  // LOW16: the 16 bits are the element's high half
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(step), _mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
      }
    } else if constexpr (sizeof(T) == 4) {
      // u32 lane l: its three raw bytes (indices 3 rank[l] + 0..2) below the
      // symbol byte, rotated right by one; the two halves of four lanes
      // shuffle from the step's bytes and from those past the first half's.
      // The first half's lanes take bytes from rl; the second half's from the
      // bytes after the first half's lanes' (3 x their non-ZERO count).
      const int first = __builtin_popcount(nm & 0xF);
      const __m256i r3 = _mm256_mullo_epi32(_mm256_cvtepu16_epi32(rank), _mm256_set1_epi32(3));
      const __m256i nz32 = _mm256_cvtepi16_epi32(nz);
      const __m256i base = _mm256_sub_epi32(r3, _mm256_setr_epi32(0, 0, 0, 0, 3 * first, 3 * first,
                                                                  3 * first, 3 * first));
      // Each lane's bytes: base, base + 1, base + 2 (base < 12: no carries), then none (0x80).
      const __m256i idx = _mm256_add_epi32(_mm256_mullo_epi32(base, _mm256_set1_epi32(0x010101)),
                                           _mm256_set1_epi32(int(0x80020100)));
      const __m256i spread = _mm256_or_si256(idx, _mm256_andnot_si256(nz32, _mm256_set1_epi32(int(0x80808080))));
      __m128i rl2;
      const uint64_t at = rb + 3 * uint64_t(first);
      if (at + 16 <= limit) {
        rl2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(raw + at));
      } else {
        alignas(16) uint8_t last[16] = {0};
        if (at < limit) std::memcpy(last, raw + at, limit - at);
        rl2 = _mm_load_si128(reinterpret_cast<const __m128i*>(last));
      }
      const __m256i b = _mm256_shuffle_epi8(_mm256_set_m128i(rl2, rl), spread);
      const __m256i s32 = _mm256_slli_epi32(_mm256_cvtepu16_epi32(s), 24);
      const __m256i v0 = _mm256_or_si256(b, s32);
      const __m256i rot = _mm256_or_si256(_mm256_srli_epi32(v0, 1), _mm256_slli_epi32(v0, 31));
      const __m256i v = _mm256_and_si256(nz32, rot);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(step), v);
    }
    if (live < 8) std::memcpy(out + j, tail, uint64_t(live) * sizeof(T));
    rb += cnt;
  }
  return rb == limit;
}

}  // namespace
}  // namespace zipccl::cpu
#endif
