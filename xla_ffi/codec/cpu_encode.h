// The CPU encoder: a block's histogram and plan, its units lane by lane (the
// portable loops or a vector tier of cpu_paths.h), its raw bytes, and the frame.
// Private to cpu_driver.cc (its anonymous namespace).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

#include "block.h"
#include "cpu_encode_avx2.h"
#include "cpu_paths.h"
#include "format.h"
#include "huffman.h"
#include "xxhash32.h"

namespace zipccl::cpu {
namespace {

// The most units a block's segments can take (every code kMaxCodeLen bits).
constexpr uint32_t kMaxSegUnits = uint32_t((kSegmentElems * kMaxCodeLen + kUnitBits - 1) / kUnitBits) + kLanes;
constexpr uint32_t kMaxBlockUnits = kMaxSegUnits * kMaxSegmentsPerBlock;

// ---- Pass 1: histogram and block properties --------------------------------
struct Analysis {
  uint32_t hist[kNumSymbols];
  uint32_t seg_zeros[kMaxSegmentsPerBlock];
  bool all_equal;
  bool low16;
  uint32_t first;
};

// The symbol byte of an element: SymbolOf<T>(v) for v != 0, and 0 for v == 0
// (zeros are counted apart and move to kZeroSymbol). For 16- and 32-bit
// elements it is the byte at bit 7 / 23 (the exponent), for bytes rotl8(v).
template <typename T>
inline uint32_t SymbolByte(T v) {
  if constexpr (sizeof(T) == 1)
    return Rotl8(v);
  else
    return (v >> (sizeof(T) == 2 ? 7 : 23)) & 0xFF;
}

template <typename T>
void Analyse(const T* x, uint64_t n, Analysis* a) {
  // Element properties, one vectorisable pass per segment.
  const T first = x[0];
  T diff = 0, low = 0;
  uint64_t zeros = 0;
#if ZIPCCL_CPU_AVX2
  const bool vec = UseVector();
#endif
  for (uint64_t lo = 0, k = 0; lo < n; lo += kSegmentElems, ++k) {
    uint64_t hi = lo + kSegmentElems < n ? lo + kSegmentElems : n;
    uint32_t z = 0;
    uint64_t j = lo;
#if ZIPCCL_CPU_AVX2
    if (vec) j += ScanAvx2(x + lo, hi - lo, first, &diff, &low, &z);
#endif
    for (; j < hi; ++j) {
      diff |= x[j] ^ first;
      low |= x[j];
      z += x[j] == 0;
    }
    a->seg_zeros[k] = z;
    zeros += z;
  }
  // Exponent-byte histogram; four sub-histograms break the store-to-load
  // chain on runs of equal exponents. Zeros land in bin 0 and move to 256.
  uint32_t h[4][256];
  std::memset(h, 0, sizeof(h));
  uint64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    ++h[0][SymbolByte(x[j])];
    ++h[1][SymbolByte(x[j + 1])];
    ++h[2][SymbolByte(x[j + 2])];
    ++h[3][SymbolByte(x[j + 3])];
  }
  for (; j < n; ++j) ++h[0][SymbolByte(x[j])];
  for (int s = 0; s < 256; ++s) a->hist[s] = h[0][s] + h[1][s] + h[2][s] + h[3][s];
  a->hist[0] -= uint32_t(zeros);
  a->hist[kZeroSymbol] = uint32_t(zeros);
  a->all_equal = diff == 0;
  a->low16 = sizeof(T) == 4 && (uint32_t(low) & 0xFFFFu) == 0;
  a->first = uint32_t(first);
}

// ---- Pass 2: the units of a HUFF block ---------------------------------------
// A code as the lane pass takes it: the reversed code (first bit lowest) in
// bits 0..10 and its length in bits 11..15.
inline uint16_t PackCode(uint32_t enc) { return uint16_t((enc & 0x7FFu) | ((enc >> 16) << 11)); }

struct EncodeScratch {
  uint16_t units[kMaxBlockUnits + 64];  // a block's units when they cannot go in place
  uint16_t done[kMaxSegUnits + 64];     // completed units, in completion order
  uint16_t slot[kMaxSegUnits + 64];     // and the slot each goes to
};

// Each lane holds its open unit: `lo` its bits so far, `nb` how many (1..16;
// 16 with no unit yet, a phantom one), `slot` where it is stored. A code of
// len bits after nb bits holds the first bit of the next unit iff nb + len >
// 16 (StartsUnit): the open unit is then complete, and the new one takes the
// segment's next slot, lanes of one step in increasing order.
//
// Portable: element by element, each lane's state in small arrays; a unit is
// stored when it is complete (the phantom one into a dummy).
template <typename T>
uint32_t EncodeSegmentScalar(const T* x, uint32_t m, const uint16_t* code_of, uint16_t zero_code,
                             uint16_t* units) {
  uint32_t lo[kLanes], nb[kLanes];
  uint16_t* at[kLanes];
  uint16_t dummy = 0;
  for (int l = 0; l < kLanes; ++l) {
    lo[l] = 0;
    nb[l] = 16;
    at[l] = &dummy;
  }
  uint32_t cursor = 0;
  for (uint32_t e = 0; e < m; ++e) {
    const uint32_t l = e & (kLanes - 1);
    const T v = x[e];
    const uint32_t c = v ? code_of[SymbolByte(v)] : zero_code;
    const uint32_t cur = lo[l] | ((c & 0x7FFu) << nb[l]);
    const uint32_t nbn = nb[l] + (c >> 11);
    *at[l] = uint16_t(cur);  // the open unit's bits so far; complete when full
    const bool full = nbn > 16;
    at[l] = full ? units + cursor : at[l];
    cursor += full;
    lo[l] = full ? cur >> 16 : cur;
    nb[l] = full ? nbn - 16 : nbn;
  }
  for (uint32_t l = 0; l < kLanes && l < m; ++l) *at[l] = uint16_t(lo[l]);
  return cursor;
}

#if ZIPCCL_CPU_AVX512
// The code table for the permutes: 256 u16 entries (PackCode of each symbol byte)
// in eight registers, 64 entries per pair.
struct VecCodeTable {
  __m512i t[8];
  __m512i zero;
};

inline void LoadVecCodeTable(const uint16_t* code_of, uint16_t zero_code, VecCodeTable* vt) {
  for (int i = 0; i < 8; ++i) vt->t[i] = _mm512_loadu_si512(code_of + 32 * i);
  vt->zero = _mm512_set1_epi16(short(zero_code));
}


// The packed codes of 32 symbol bytes s (u16 lanes, 0..255), ZERO where `zero`.
inline __m512i LookupCodes(const VecCodeTable& vt, __m512i s, __mmask32 zero) {
  return _mm512_mask_blend_epi16(zero, Lookup256(vt.t, s), vt.zero);
}

// 32 elements (the lanes in `act`) -> their symbol bytes in u16 lanes, and
// which of them are zero.
template <typename T>
inline __m512i SymbolBytes32(const T* x, __mmask32 act, __mmask32* zero) {
  if constexpr (sizeof(T) == 2) {
    const __m512i v = _mm512_maskz_loadu_epi16(act, x);
    *zero = _mm512_testn_epi16_mask(v, v);
    return _mm512_and_si512(_mm512_srli_epi16(v, 7), _mm512_set1_epi16(0xFF));
  } else if constexpr (sizeof(T) == 4) {
    const __m512i v0 = _mm512_maskz_loadu_epi32(__mmask16(act), x);
    const __m512i v1 = _mm512_maskz_loadu_epi32(__mmask16(act >> 16), x + 16);
    *zero = _mm512_kunpackw(_mm512_testn_epi32_mask(v1, v1), _mm512_testn_epi32_mask(v0, v0));
    const __m512i s0 = _mm512_srli_epi32(v0, 23), s1 = _mm512_srli_epi32(v1, 23);
    const __m512i s = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(s0)),
                                         _mm512_cvtepi32_epi16(s1), 1);
    return _mm512_and_si512(s, _mm512_set1_epi16(0xFF));
  } else {
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(act, x));
    *zero = _mm512_testn_epi16_mask(v, v);
    return _mm512_and_si512(_mm512_or_si512(_mm512_slli_epi16(v, 1), _mm512_srli_epi16(v, 7)),
                            _mm512_set1_epi16(0xFF));
  }
}

// The lanes of v in `keep`, squeezed together, stored at dst (which has room
// for 32 lanes past it).
inline void CompressStore16(uint16_t* dst, __mmask32 keep, __m512i v) {
#if ZIPCCL_CPU_VBMI2
  _mm512_storeu_si512(dst, _mm512_maskz_compress_epi16(keep, v));
#else  // AVX-512F compresses dwords: two halves of 16 lanes
  const __mmask16 k0 = __mmask16(keep), k1 = __mmask16(keep >> 16);
  const __m512i v0 = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(v));
  const __m512i v1 = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(k0, v0)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + __builtin_popcount(k0)),
                      _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(k1, v1)));
#endif
}

// v with the lanes of `take` set to first, first + 1, ... in lane order.
inline __m512i ExpandCount16(__m512i v, __mmask32 take, __m512i iota, uint32_t first) {
#if ZIPCCL_CPU_VBMI2
  return _mm512_mask_expand_epi16(v, take, _mm512_add_epi16(iota, _mm512_set1_epi16(short(first))));
#else  // AVX-512F expands dwords: two halves of 16 lanes
  const __mmask16 t0 = __mmask16(take), t1 = __mmask16(take >> 16);
  const __m512i i32 = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(iota));
  const __m512i e0 = _mm512_maskz_expand_epi32(t0, _mm512_add_epi32(i32, _mm512_set1_epi32(int(first))));
  const __m512i e1 = _mm512_maskz_expand_epi32(
      t1, _mm512_add_epi32(i32, _mm512_set1_epi32(int(first + uint32_t(__builtin_popcount(t0))))));
  const __m512i e = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(e0)), _mm512_cvtepi32_epi16(e1), 1);
  return _mm512_mask_mov_epi16(v, take, e);
#endif
}

// One segment, a step (32 lanes) per iteration. Completed units are compressed
// into sc->done with their slots in sc->slot, then stored at their slots.
template <typename T>
uint32_t EncodeSegmentVec(const T* x, uint32_t m, const VecCodeTable& vt, uint16_t* units,
                          EncodeScratch* sc) {
  const __m512i c16 = _mm512_set1_epi16(16);
  const __m512i iota = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17,
                                        16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  __m512i lo = _mm512_setzero_si512(), nb = c16;
  __mmask32 started = 0;
  uint32_t cursor = 0;
  __m512i slot = _mm512_setzero_si512();
  uint32_t nd = 0;
  uint16_t* done = sc->done;
  uint16_t* dslot = sc->slot;
  for (uint32_t e = 0; e < m; e += kLanes) {
    const __mmask32 act = m - e >= uint32_t(kLanes) ? ~__mmask32(0) : _bzhi_u32(~0u, m - e);
    __mmask32 zero;
    const __m512i s = SymbolBytes32(x + e, act, &zero);
    const __m512i c = _mm512_maskz_mov_epi16(act, LookupCodes(vt, s, zero));
    const __m512i code = _mm512_and_si512(c, _mm512_set1_epi16(0x7FF));
    const __m512i len = _mm512_srli_epi16(c, 11);
    const __m512i cur = _mm512_or_si512(lo, _mm512_sllv_epi16(code, nb));
    const __m512i spill = _mm512_srlv_epi16(code, _mm512_sub_epi16(c16, nb));
    const __m512i nbn = _mm512_add_epi16(nb, len);
    const __mmask32 full = _mm512_cmpgt_epu16_mask(nbn, c16);
    const __mmask32 emit = full & started;
    CompressStore16(done + nd, emit, cur);
    CompressStore16(dslot + nd, emit, slot);
    nd += uint32_t(__builtin_popcount(emit));
    slot = ExpandCount16(slot, full, iota, cursor);
    cursor += uint32_t(__builtin_popcount(full));
    started |= full;
    lo = _mm512_mask_mov_epi16(cur, full, spill);
    nb = _mm512_mask_sub_epi16(nbn, full, nbn, c16);
  }
  // Every lane with elements has an open unit left: it is complete now.
  const __mmask32 lanes = m >= uint32_t(kLanes) ? ~__mmask32(0) : _bzhi_u32(~0u, m);
  CompressStore16(done + nd, lanes, lo);
  CompressStore16(dslot + nd, lanes, slot);
  nd += uint32_t(__builtin_popcount(lanes));
  for (uint32_t i = 0; i < nd; ++i) units[dslot[i]] = done[i];
  return cursor;
}
#endif

// Raw bytes of the nnz non-zero elements of x[0, n), in element order, at raw.
// Writes exactly the raw region and nothing past it, so it needs no slack.
template <typename T>
void WriteRawCompacted(const T* x, uint64_t n, uint64_t nnz, bool low16, uint8_t* raw) {
  const bool one = sizeof(T) == 2 || low16;  // one raw byte per element, else three
  uint64_t j = 0, r = 0;
  (void)nnz;
#if ZIPCCL_CPU_AVX2
  if (UseVector()) j = WriteRawCompactedAvx2(x, n, low16, raw, nnz * (one ? 1 : 3), &r);
#elif ZIPCCL_CPU_VBMI2
  // 64 bytes of elements per step: rotate every element left by one (a funnel
  // shift of the lane with itself), so that its raw bytes sit in place, spread
  // the non-zero mask over those bytes, squeeze them together with vpcompressb
  // and store exactly them with a masked store: nothing lands past the region.
  // Raw bytes per lane: 16-bit dtype, byte 0 of rotl16(v); LOW16, byte 2 of
  // the lane (the low byte of rotl16(v >> 16)); float32, bytes 0-2 of rotl32(v).
  constexpr uint64_t kElems = 64 / sizeof(T);
  const uint64_t spread = sizeof(T) == 2 ? 0x5555555555555555ull
                          : low16        ? 0x4444444444444444ull
                                         : 0x1111111111111111ull;
  const uint64_t width = one ? 1 : 3;
  const uint64_t vec_end = UseVector() ? n : 0;  // the environment read once, not per step
  for (; j + kElems <= vec_end; j += kElems) {
    const __m512i v = _mm512_loadu_si512(x + j);
    uint64_t keep;
    __m512i rot;
    if constexpr (sizeof(T) == 2) {
      keep = _mm512_test_epi16_mask(v, v);
      rot = _mm512_shldi_epi16(v, v, 1);
    } else {
      keep = _mm512_test_epi32_mask(v, v);
      rot = low16 ? _mm512_shldi_epi16(v, v, 1) : _mm512_shldi_epi32(v, v, 1);
    }
    uint64_t keep_bytes = _pdep_u64(keep, spread);
    if (width == 3) keep_bytes *= 7;  // bit 4i -> bits 4i, 4i+1, 4i+2
    const uint64_t cnt = width * uint64_t(__builtin_popcountll(keep));
    _mm512_mask_storeu_epi8(raw + r, _bzhi_u64(~0ull, unsigned(cnt)),
                            _mm512_maskz_compress_epi8(keep_bytes, rot));
    r += cnt;
  }
#elif ZIPCCL_CPU_AVX512
  // One raw byte per element, 16 elements a step in 32-bit lanes (AVX-512F
  // compresses dwords): the 16-bit value's Raw16 byte, the non-zero lanes'
  // squeezed together and narrowed to bytes, exactly those stored.
  const bool vec = UseVector();
  if (vec && one) {
    for (; j + 16 <= n; j += 16) {
      __m512i v;
      if constexpr (sizeof(T) == 2)
        v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j)));
      else
        v = _mm512_srli_epi32(_mm512_loadu_si512(x + j), 16);  // LOW16: the high half
      const __mmask16 keep = _mm512_test_epi32_mask(v, v);
      const __m512i b = _mm512_and_si512(_mm512_or_si512(_mm512_slli_epi32(v, 1), _mm512_srli_epi32(v, 15)),
                                         _mm512_set1_epi32(0xFF));  // Raw16
      const uint32_t cnt = uint32_t(__builtin_popcount(keep));
      _mm_mask_storeu_epi8(raw + r, __mmask16(_bzhi_u32(~0u, cnt)),
                           _mm512_cvtepi32_epi8(_mm512_maskz_compress_epi32(keep, b)));
      r += cnt;
    }
  } else if (vec && sizeof(T) == 4) {
    // float32's three raw bytes, 16 elements a step: rotate every lane left by
    // one (vprold), squeeze the non-zero lanes together (vpcompressd), pack
    // each lane's low three bytes (vpshufb: 12 bytes at the bottom of every
    // 128-bit lane, i.e. 3 dwords), gather those dwords (vpermd) and store
    // exactly 3 x count bytes.
    const __m512i pack = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1));
    const __m512i gather = _mm512_setr_epi32(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, 0, 0, 0, 0);
    for (; j + 16 <= n; j += 16) {
      const __m512i v = _mm512_loadu_si512(x + j);
      const __mmask16 keep = _mm512_test_epi32_mask(v, v);
      const __m512i c = _mm512_maskz_compress_epi32(keep, _mm512_rol_epi32(v, 1));
      const __m512i b = _mm512_permutexvar_epi32(gather, _mm512_shuffle_epi8(c, pack));
      const uint32_t cnt = 3 * uint32_t(__builtin_popcount(keep));
      _mm512_mask_storeu_epi8(raw + r, _bzhi_u64(~0ull, cnt), b);
      r += cnt;
    }
  }
#endif
  // Branchless tail (the elements past the vector steps; the whole block on
  // the portable loops): store the element's raw bytes at r whether it is zero
  // or not, and advance r only past non-zero ones. A zero element's store
  // lands where the next non-zero element's bytes go, so it is harmless as long as a non-zero element follows; the trailing
  // zeros are therefore cut off first. Then r <= (nnz - 1) * width at every
  // store and nothing is written past the raw region.
  uint64_t last = n;
  while (last > j && !x[last - 1]) --last;
  for (; j < last; ++j) {
    const uint32_t v = uint32_t(x[j]);
    if (one) {
      raw[r] = uint8_t(Raw16(sizeof(T) == 2 ? v : v >> 16));
      r += v != 0;
    } else {
      const uint32_t w = Raw32(v);
      raw[r] = uint8_t(w);
      raw[r + 1] = uint8_t(w >> 8);
      raw[r + 2] = uint8_t(w >> 16);
      r += v ? 3 : 0;
    }
  }
}


// The units of every segment of a HUFF block, back to back at `units`, which
// has room for kMaxBlockUnits; fills p->seg_units, seg_nnz and units.
template <typename T>
void EncodeUnits(const T* x, uint64_t n, const Analysis& a, BlockPlan* p, uint16_t* units,
                 EncodeScratch* sc) {
  uint16_t code_of[256];
  for (int s = 0; s < 256; ++s) code_of[s] = PackCode(p->enc[s]);
  const uint16_t zero_code = PackCode(p->enc[kZeroSymbol]);
  uint64_t total = 0;
  (void)sc;
#if ZIPCCL_CPU_AVX512
  VecCodeTable vt;
  const bool vec = UseVector();
  if (vec) LoadVecCodeTable(code_of, zero_code, &vt);
#elif ZIPCCL_CPU_AVX2
  uint32_t code32[256];  // the gathers' table
  for (int s = 0; s < 256; ++s) code32[s] = code_of[s];
  const bool vec = UseVector();
#endif
  for (int k = 0; k < p->n_segs; ++k) {
    const uint32_t m = SegmentElemsOf(n, k);
    const T* xs = x + (uint64_t(k) << kSegmentLog2);
    uint32_t su;
#if ZIPCCL_CPU_AVX512
    if (vec)
      su = EncodeSegmentVec(xs, m, vt, units + total, sc);
    else
#elif ZIPCCL_CPU_AVX2
    if (vec)
      su = EncodeSegmentAvx2(xs, m, code32, zero_code, units + total, sc->done, sc->slot);
    else
#endif
      su = EncodeSegmentScalar(xs, m, code_of, zero_code, units + total);
    p->seg_units[k] = uint16_t(su);
    p->seg_nnz[k] = uint16_t(m - a.seg_zeros[k]);
    total += su;
  }
  p->units = total;
}

template <typename T>
void WriteRaw(const T* x, uint64_t n, const BlockPlan& p, uint8_t* raw) {
  if constexpr (sizeof(T) == 1) return;  // one-byte floats: the symbols are everything
  const bool low16 = p.flags & kBlockFlagLow16;
  if (p.nnz == n) {
    uint64_t j0 = 0;
#if ZIPCCL_CPU_AVX2
    if (UseVector()) j0 = WriteRawAllAvx2(x, n, low16, raw);
#endif
    if (sizeof(T) == 2) {
      for (uint64_t j = j0; j < n; ++j) raw[j] = uint8_t(Raw16(x[j]));
    } else if (low16) {
      for (uint64_t j = j0; j < n; ++j) raw[j] = uint8_t(Raw16(uint32_t(x[j]) >> 16));
    } else {
      for (uint64_t j = j0; j < n; ++j) {
        uint32_t r = Raw32(x[j]);
        raw[3 * j] = uint8_t(r);
        raw[3 * j + 1] = uint8_t(r >> 8);
        raw[3 * j + 2] = uint8_t(r >> 16);
      }
    }
    return;
  }
  WriteRawCompacted(x, n, p.nnz, low16, raw);
}

// Encodes one block at out + at (the output's end at out_end) if it fits;
// returns its size either way.
template <typename T>
uint64_t EncodeBlock(const T* x, uint64_t n, BlockPlan* p, HuffmanWork* work, EncodeScratch* sc,
                     uint8_t* block, const uint8_t* out_end, bool fits) {
  Analysis a;
  Analyse(x, n, &a);
  PlanBlock(a.hist, n, int(sizeof(T)), a.all_equal, a.first, a.low16, p, *work);
  const uint64_t raw_bytes = kBlockHeaderBytes + n * sizeof(T);
  if (p->mode == kModeConst) {
    if (fits && uint64_t(out_end - block) >= p->block_bytes) WriteBlockHeader(block, *p);
    return p->block_bytes;
  }
  // The units go in place when the room they may need lies inside both the
  // output and the block's largest (RAW) coding, else into scratch.
  const uint64_t units_off = kBlockHeaderBytes + p->table_bytes + uint64_t(p->n_segs) * kSegDirEntryBytes;
  uint64_t max_units = 0;
  for (int k = 0; k < p->n_segs; ++k) {
    uint32_t lo, hi;
    SegmentUnitBounds(SegmentElemsOf(n, k), &lo, &hi);
    max_units += hi;
  }
  const uint64_t room = fits && block <= out_end ? uint64_t(out_end - block) : 0;
  const bool in_place = units_off + 2 * max_units <= (room < raw_bytes ? room : raw_bytes);
  uint16_t* units = in_place ? reinterpret_cast<uint16_t*>(block + units_off) : sc->units;
  if (in_place && (reinterpret_cast<uintptr_t>(units) & 1)) {
    // Unaligned u16 stores are fine on x86 but not portable C++: use scratch.
    units = sc->units;
  }
  EncodeUnits(x, n, a, p, units, sc);
  PlanFinish(n, int(sizeof(T)), p);
  if (!fits || room < p->block_bytes) return p->block_bytes;
  WriteBlockHeader(block, *p);
  if (p->mode == kModeRaw) {
    std::memcpy(block + kBlockHeaderBytes, x, n * sizeof(T));
    return p->block_bytes;
  }
  WriteTable(block + kBlockHeaderBytes, *p);
  uint8_t* dir = block + kBlockHeaderBytes + p->table_bytes;
  for (int k = 0; k < p->n_segs; ++k) {
    Store16(dir + uint64_t(k) * kSegDirEntryBytes, p->seg_units[k]);
    Store16(dir + uint64_t(k) * kSegDirEntryBytes + 2, p->seg_nnz[k]);
  }
  if (units != reinterpret_cast<uint16_t*>(block + units_off))
    std::memcpy(block + units_off, units, 2 * p->units);
  WriteRaw(x, n, *p, block + units_off + 2 * p->units);
  return p->block_bytes;
}

template <typename T>
uint64_t EncodeTyped(const T* x, uint64_t n, uint8_t dtype, bool checksum,
                     uint8_t* out, uint64_t cap) {
  const uint64_t nb = NumBlocks(n);
  uint64_t used = kFrameHeaderBytes + nb * kDirEntryBytes;
  bool fits = used <= cap;
  auto plan = std::make_unique<BlockPlan>();
  auto work = std::make_unique<HuffmanWork>();
  std::unique_ptr<EncodeScratch> scratch(nb ? new EncodeScratch : nullptr);  // ~130 KB, per call
  EncodeScratch* sc = scratch.get();
  for (uint64_t b = 0; b < nb; ++b) {
    const T* xb = x + (b << kBlockLog2);
    const uint64_t nbe = BlockElems(n, b);
    const uint64_t bytes = EncodeBlock(xb, nbe, plan.get(), work.get(), sc, fits ? out + used : out,
                                       out + cap, fits);
    if (fits && used + bytes <= cap)
      Store32(out + kFrameHeaderBytes + b * kDirEntryBytes, uint32_t(bytes));
    else
      fits = false;
    used += bytes;
  }
  if (!fits) {
    if (cap >= kFrameHeaderBytes) WriteFrameHeader(out, dtype, 0, n, used, 0);
    return used;
  }
  uint8_t flags = checksum ? kFrameFlagChecksum : 0;
  WriteFrameHeader(out, dtype, flags, n, used, 0);
  if (checksum) Store32(out + 28, FrameChecksum(out, used));
  return used;
}

}  // namespace
}  // namespace zipccl::cpu
