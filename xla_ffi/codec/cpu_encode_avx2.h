// The CPU encoder's AVX2 tier (cpu_paths.h): Analyse's scan, a segment's
// units, and a block's raw bytes (with and without zeros). Same bytes as the
// portable loops of cpu_encode.h, which includes this header and calls it.
// Private to cpu_driver.cc (its anonymous namespace).
#pragma once

#include <cstdint>
#include <cstring>

#include "block.h"
#include "cpu_paths.h"
#include "format.h"

#if ZIPCCL_CPU_AVX2
namespace zipccl::cpu {
namespace {

// The symbol bytes (SymbolByte) of eight elements at x in 32-bit lanes, and
// which of them are zero (all-ones lanes).
template <typename T>
inline __m256i SymbolBytes8(const T* x, __m256i* zero) {
  __m256i v, s;
  if constexpr (sizeof(T) == 2) {
    v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    s = _mm256_srli_epi32(v, 7);
  } else if constexpr (sizeof(T) == 4) {
    v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    s = _mm256_srli_epi32(v, 23);
  } else {
    v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x)));
    s = _mm256_or_si256(_mm256_slli_epi32(v, 1), _mm256_srli_epi32(v, 7));  // Rotl8
  }
  *zero = _mm256_cmpeq_epi32(v, _mm256_setzero_si256());
  return _mm256_and_si256(s, _mm256_set1_epi32(0xFF));
}

// Analyse's scan of x[0, n) in whole 32-byte steps: ORs every element into
// *low and its difference from `first` into *diff, adds the zeros to *zeros;
// returns how many elements it took (the rest are the caller's).
template <typename T>
uint64_t ScanAvx2(const T* x, uint64_t n, T first, T* diff, T* low, uint32_t* zeros) {
  constexpr uint64_t kStep = 32 / sizeof(T);
  __m256i f, d = _mm256_setzero_si256(), lw = d, zero = d;
  if constexpr (sizeof(T) == 1) f = _mm256_set1_epi8(char(first));
  else if constexpr (sizeof(T) == 2) f = _mm256_set1_epi16(short(first));
  else f = _mm256_set1_epi32(int(first));
  uint32_t z = 0;
  uint64_t j = 0;
  for (; j + kStep <= n; j += kStep) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
    d = _mm256_or_si256(d, _mm256_xor_si256(v, f));
    lw = _mm256_or_si256(lw, v);
    __m256i eq;
    if constexpr (sizeof(T) == 1) eq = _mm256_cmpeq_epi8(v, zero);
    else if constexpr (sizeof(T) == 2) eq = _mm256_cmpeq_epi16(v, zero);
    else eq = _mm256_cmpeq_epi32(v, zero);
    z += uint32_t(__builtin_popcount(uint32_t(_mm256_movemask_epi8(eq))));
  }
  alignas(32) T dl[2][kStep];
  _mm256_store_si256(reinterpret_cast<__m256i*>(dl[0]), d);
  _mm256_store_si256(reinterpret_cast<__m256i*>(dl[1]), lw);
  for (uint64_t i = 0; i < kStep; ++i) {
    *diff |= dl[0][i];
    *low |= dl[1][i];
  }
  *zeros += z / uint32_t(sizeof(T));
  return j;
}

// The raw bytes of x[0, n), every element non-zero, at raw, in whole steps
// that store only inside the region; returns how many elements they took.
template <typename T>
uint64_t WriteRawAllAvx2(const T* x, uint64_t n, bool low16, uint8_t* raw) {
  uint64_t j = 0;
  if constexpr (sizeof(T) == 2) {
    // Sixteen elements a step: Raw16 is the low byte of the element rotated left by one.
    const __m256i pick = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
    for (; j + 16 <= n; j += 16) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
      const __m256i rot = _mm256_or_si256(_mm256_slli_epi16(v, 1), _mm256_srli_epi16(v, 15));
      const __m256i b = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(rot, pick), 0x08);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(raw + j), _mm256_castsi256_si128(b));
    }
  } else if constexpr (sizeof(T) == 4) {
    if (low16) {
      // Eight elements a step: the high half's Raw16 is byte 2 of the element rotated left by one
      // within that half.
      const __m256i pick = _mm256_setr_epi8(2, 6, 10, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                            2, 6, 10, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
      for (; j + 8 <= n; j += 8) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
        const __m256i rot = _mm256_or_si256(_mm256_slli_epi16(v, 1), _mm256_srli_epi16(v, 15));
        const __m256i b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(rot, pick),
                                                      _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(raw + j), _mm256_castsi256_si128(b));
      }
    } else {
      // Eight elements a step, rotated left by one: each 128-bit half's low three bytes of four
      // lanes packed (12 bytes) and stored one after the other, the second store 4 bytes past 24.
      const __m256i pack = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                                            0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
      for (; 3 * (j + 8) + 4 <= 3 * n; j += 8) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
        const __m256i rot = _mm256_or_si256(_mm256_slli_epi32(v, 1), _mm256_srli_epi32(v, 31));
        const __m256i b = _mm256_shuffle_epi8(rot, pack);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(raw + 3 * j), _mm256_castsi256_si128(b));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(raw + 3 * j + 12), _mm256_extracti128_si256(b, 1));
      }
    }
  }
  return j;
}

// One segment (m elements at x, PackCode entries: code_of[256] by symbol
// byte, zero_code for zeros), a step of 32 lanes per iteration in four groups
// of eight 32-bit lanes, group by group in lane order. The codes of a batch
// of steps are gathered first, so that the gathers' latency stays off the
// lanes' chain. Each lane's open unit is `lo` (its bits so far), `nb` (how
// many; 16 before its first) and `slot`. A completed unit is squeezed into
// `done` with its slot into `dslot` (vpermd by LaneTables' squeeze; both with
// room for the segment's units + 8), then every one is stored at its slot.
template <typename T>
uint32_t EncodeSegmentAvx2(const T* x, uint32_t m, const uint32_t* code_of, uint16_t zero_code,
                           uint16_t* units, uint16_t* done, uint16_t* dslot) {
  constexpr uint32_t kBatch = 8 * kLanes;  // elements whose codes are gathered at once (1 KiB)
  const __m256i c16 = _mm256_set1_epi32(16), zcode = _mm256_set1_epi32(zero_code);
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int* table = reinterpret_cast<const int*>(code_of);
  __m256i lo[4], nb[4], slot[4];
  for (int g = 0; g < 4; ++g) {
    lo[g] = slot[g] = _mm256_setzero_si256();
    nb[g] = c16;
  }
  uint32_t started = 0, cursor = 0, nd = 0;
  alignas(32) uint32_t codes[kBatch];
  T tail[kBatch];  // the last, short batch's elements, zero-padded: never read past x + m
  for (uint32_t b = 0; b < m; b += kBatch) {
    const T* xs = x + b;
    const uint32_t live = m - b < kBatch ? m - b : kBatch;
    if (live < kBatch) {
      std::memset(tail, 0, sizeof(tail));
      std::memcpy(tail, xs, live * sizeof(T));
      xs = tail;
    }
    for (uint32_t i = 0; i < live; i += 8) {
      __m256i zero;
      const __m256i sb = SymbolBytes8(xs + i, &zero);
      __m256i c = _mm256_blendv_epi8(_mm256_i32gather_epi32(table, sb, 4), zcode, zero);
      // Lanes past the segment's end code nothing.
      c = _mm256_and_si256(c, _mm256_cmpgt_epi32(_mm256_set1_epi32(int(live - i)), iota));
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + i), c);
    }
    for (uint32_t i = (live + 7) & ~7u; i % kLanes; i += 8)  // the last step's lanes past the end
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + i), _mm256_setzero_si256());
    for (uint32_t e = 0; e < live; e += kLanes) {
      for (int g = 0; g < 4; ++g) {
        const __m256i c = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + e + 8 * g));
        const __m256i code = _mm256_and_si256(c, _mm256_set1_epi32(0x7FF));
        const __m256i len = _mm256_srli_epi32(c, 11);
        const __m256i cur = _mm256_or_si256(lo[g], _mm256_sllv_epi32(code, nb[g]));
        const __m256i nbn = _mm256_add_epi32(nb[g], len);
        const __m256i full = _mm256_cmpgt_epi32(nbn, c16);
        const uint32_t fm = LaneMask(full);
        const uint32_t emit = fm & (started >> (8 * g)) & 0xFF;
        const __m256i pick = LaneIndices(kLaneTables.squeeze[emit]);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(done + nd), Low16s(_mm256_permutevar8x32_epi32(cur, pick)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dslot + nd),
                         Low16s(_mm256_permutevar8x32_epi32(slot[g], pick)));
        nd += uint32_t(__builtin_popcount(emit));
        const __m256i fresh = _mm256_add_epi32(LaneIndices(kLaneTables.rank[fm]), _mm256_set1_epi32(int(cursor)));
        slot[g] = _mm256_blendv_epi8(slot[g], fresh, full);
        cursor += uint32_t(__builtin_popcount(fm));
        started |= fm << (8 * g);
        const __m256i drop = _mm256_and_si256(full, c16);  // 16 where the unit completed
        lo[g] = _mm256_srlv_epi32(cur, drop);
        nb[g] = _mm256_sub_epi32(nbn, drop);
      }
    }
  }
  // Every lane with elements has an open unit left: it is complete now.
  alignas(32) uint32_t open_lo[kLanes], open_slot[kLanes];
  for (int g = 0; g < 4; ++g) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(open_lo + 8 * g), lo[g]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(open_slot + 8 * g), slot[g]);
  }
  for (uint32_t i = 0; i < nd; ++i) units[dslot[i]] = done[i];
  for (uint32_t l = 0; l < kLanes && l < m; ++l) units[open_slot[l]] = uint16_t(open_lo[l]);
  return cursor;
}

// The raw bytes of the non-zero elements of x[0, n) at raw, in element order,
// for as many elements as the vector steps take (nnz_bytes: the region's
// size, never written past); returns how many, with *r the bytes written. A
// step squeezes its non-zero elements' raw bytes together with vpshufb and
// stores a whole register, whose bytes past them the next step overwrites.
template <typename T>
uint64_t WriteRawCompactedAvx2(const T* x, uint64_t n, bool low16, uint8_t* raw, uint64_t nnz_bytes,
                               uint64_t* r_out) {
  uint64_t j = 0, r = 0;
  if (sizeof(T) == 2 || low16) {
    // Eight elements a step: the Raw16 byte of each is the low byte of its
    // (high, for LOW16) 16 bits rotated left by one.
    for (; j + 8 <= n && r + 8 <= nnz_bytes; j += 8) {
      __m128i v;
      if constexpr (sizeof(T) == 2) {
        v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + j));
      } else {
        const __m256i w = _mm256_srli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j)), 16);
        v = _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
      }
      const __m128i rot = _mm_or_si128(_mm_slli_epi16(v, 1), _mm_srli_epi16(v, 15));
      const __m128i zero = _mm_cmpeq_epi16(v, _mm_setzero_si128());
      const uint32_t keep = ~uint32_t(_mm_movemask_epi8(_mm_packs_epi16(zero, zero))) & 0xFF;
      const __m128i sq = _mm_cvtsi64_si128(int64_t(kLaneTables.squeeze[keep]));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(raw + r), _mm_shuffle_epi8(rot, _mm_add_epi8(sq, sq)));
      r += uint32_t(__builtin_popcount(keep));
    }
  } else if constexpr (sizeof(T) == 4) {
    // float32: eight elements a step, rotated left by one (bytes 0-2 of each
    // lane are its raw bytes); the non-zero lanes squeezed together (vpermd),
    // then each 128-bit half's three low bytes of four lanes packed (vpshufb)
    // and stored one after the other.
    const __m256i pack = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                                          0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    for (; j + 8 <= n && r + 28 <= nnz_bytes; j += 8) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
      const __m256i rot = _mm256_or_si256(_mm256_slli_epi32(v, 1), _mm256_srli_epi32(v, 31));
      const uint32_t keep = ~LaneMask(_mm256_cmpeq_epi32(v, _mm256_setzero_si256())) & 0xFF;
      const uint32_t cnt = uint32_t(__builtin_popcount(keep));
      const __m256i sq = _mm256_shuffle_epi8(
          _mm256_permutevar8x32_epi32(rot, LaneIndices(kLaneTables.squeeze[keep])), pack);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(raw + r), _mm256_castsi256_si128(sq));
      if (cnt > 4)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(raw + r + 12), _mm256_extracti128_si256(sq, 1));
      r += 3 * cnt;
    }
  }
  *r_out = r;
  return j;
}

}  // namespace
}  // namespace zipccl::cpu
#endif
