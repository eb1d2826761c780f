#include "cpu_driver.h"

#include <cstdlib>
#include <cstring>
#include <memory>

#include "block.h"
#include "format.h"
#include "huffman.h"
#include "xxhash32.h"

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
//   (vpermi2w), a nibble-table bit reversal, and short scalar loops over the
//   lanes of a step that complete or take a unit (about one in five) where
//   VBMI2 compresses and expands; the raw bytes take the portable loops.
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
  for (uint64_t lo = 0, k = 0; lo < n; lo += kSegmentElems, ++k) {
    uint64_t hi = lo + kSegmentElems < n ? lo + kSegmentElems : n;
    uint32_t z = 0;
    for (uint64_t j = lo; j < hi; ++j) {
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

// Entries s of a 256-entry u16 table held in eight registers of 32 entries
// (t[0..7]), for 32 bytes s in the low bytes of u16 lanes: four two-register
// permutes, whose index is the low 6 bits of s (VBMI: byte permutes picking
// the entry's two bytes; BW: word permutes), blended by bits 6 and 7.
inline __m512i Lookup256(const __m512i* t, __m512i s) {
#if ZIPCCL_CPU_VBMI2
  const __m512i w = _mm512_and_si512(_mm512_slli_epi16(s, 1), _mm512_set1_epi16(0x7E));
  const __m512i idx = _mm512_or_si512(_mm512_or_si512(w, _mm512_slli_epi16(w, 8)),
                                      _mm512_set1_epi16(0x0100));
  const __m512i r0 = _mm512_permutex2var_epi8(t[0], idx, t[1]);
  const __m512i r1 = _mm512_permutex2var_epi8(t[2], idx, t[3]);
  const __m512i r2 = _mm512_permutex2var_epi8(t[4], idx, t[5]);
  const __m512i r3 = _mm512_permutex2var_epi8(t[6], idx, t[7]);
#else
  const __m512i idx = _mm512_and_si512(s, _mm512_set1_epi16(63));
  const __m512i r0 = _mm512_permutex2var_epi16(t[0], idx, t[1]);
  const __m512i r1 = _mm512_permutex2var_epi16(t[2], idx, t[3]);
  const __m512i r2 = _mm512_permutex2var_epi16(t[4], idx, t[5]);
  const __m512i r3 = _mm512_permutex2var_epi16(t[6], idx, t[7]);
#endif
  const __mmask32 b6 = _mm512_test_epi16_mask(s, _mm512_set1_epi16(64));
  const __mmask32 b7 = _mm512_test_epi16_mask(s, _mm512_set1_epi16(128));
  return _mm512_mask_blend_epi16(b7, _mm512_mask_blend_epi16(b6, r0, r1),
                                 _mm512_mask_blend_epi16(b6, r2, r3));
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

// Raw bytes of the non-zero elements of x[0, n), in element order, at raw.
// Writes exactly the raw region and nothing past it, so it needs no slack.
template <typename T>
void WriteRawCompacted(const T* x, uint64_t n, bool low16, uint8_t* raw) {
  const bool one = sizeof(T) == 2 || low16;  // one raw byte per element, else three
  uint64_t j = 0, r = 0;
#if ZIPCCL_CPU_VBMI2
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
  for (; j + kElems <= n; j += kElems) {
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
  if (UseVector() && one) {
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
  }
#endif
  // Branchless tail (the whole block without VBMI2): store the element's raw
  // bytes at r whether it is zero or not, and advance r only past non-zero
  // ones. A zero element's store lands where the next non-zero element's bytes
  // go, so it is harmless as long as a non-zero element follows; the trailing
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
#endif
  for (int k = 0; k < p->n_segs; ++k) {
    const uint32_t m = SegmentElemsOf(n, k);
    const T* xs = x + (uint64_t(k) << kSegmentLog2);
    uint32_t su;
#if ZIPCCL_CPU_AVX512
    if (vec)
      su = EncodeSegmentVec(xs, m, vt, units + total, sc);
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
    if (sizeof(T) == 2) {
      for (uint64_t j = 0; j < n; ++j) raw[j] = uint8_t(Raw16(x[j]));
    } else if (low16) {
      for (uint64_t j = 0; j < n; ++j) raw[j] = uint8_t(Raw16(uint32_t(x[j]) >> 16));
    } else {
      for (uint64_t j = 0; j < n; ++j) {
        uint32_t r = Raw32(x[j]);
        raw[3 * j] = uint8_t(r);
        raw[3 * j + 1] = uint8_t(r >> 8);
        raw[3 * j + 2] = uint8_t(r >> 16);
      }
    }
    return;
  }
  WriteRawCompacted(x, n, low16, raw);
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

// ---- Decoder -----------------------------------------------------------------
// A HUFF block decodes segment by segment into symbols (u16, kZeroSymbol for
// ZERO, in element order), which a merge pass joins with the raw bytes.

struct SegmentIn {
  const uint8_t* units;  // its first unit
  uint32_t su;           // seg_units
  uint32_t m;            // elements
  uint16_t* syms;        // where its symbols go
  uint16_t* win;         // vector path: each step's windows (for the symbols of long codes)
};

// Portable: step by step, lane by lane, branch-free but for the errors. A lane
// that needs a unit when none is left reads the segment's last one (never past
// it) and the segment is rejected.
Status DecodeSegmentScalar(const DecodeEntry* table, const SegmentIn& s) {
  uint32_t buf[kLanes], nb[kLanes];
  for (int l = 0; l < kLanes; ++l) buf[l] = nb[l] = 0;
  uint32_t cursor = 0, bad = 0, over = 0;
  const uint32_t last = s.su ? s.su - 1 : 0;
  for (uint32_t e0 = 0; e0 < s.m; e0 += kLanes) {
    const uint32_t lanes = s.m - e0 < uint32_t(kLanes) ? s.m - e0 : uint32_t(kLanes);
    for (uint32_t l = 0; l < lanes; ++l) {
      uint32_t b = buf[l], n = nb[l];
      DecodeEntry d = table[b & (kTableSize - 1)];
      const uint32_t need = uint32_t(d.len) - 1u >= n;  // no code, or longer than the bits held
      over |= need & (cursor >= s.su);
      const uint32_t u = s.su ? Load16(s.units + 2 * uint64_t(cursor < s.su ? cursor : last)) : 0;
      b |= (u << (n & 31)) & (0u - need);
      n += need << 4;
      cursor += need;
      d = table[b & (kTableSize - 1)];
      bad |= uint32_t(d.len) - 1u >= n;
      s.syms[e0 + l] = d.sym;
      buf[l] = b >> d.len;
      nb[l] = n - d.len;
    }
    if (bad | over) return kErrStream;
  }
  if (cursor != s.su) return kErrStream;
  uint32_t pad = 0;
  for (int l = 0; l < kLanes; ++l) pad |= buf[l];
  return pad ? kErrReserved : kOk;
}

#if ZIPCCL_CPU_AVX512
// The vector decoder runs a segment's 32 lanes in 16-bit lanes of three
// registers: each lane's bits as lo (the first 16) and hi (the next, at most
// 10), and their count nb. The serial chain of a step needs only the code's
// length, which comes without a branch or a gather: the low bits index a
// length table, which holds the length of every code of at most 8 bits (VBMI:
// the low 8 bits, 256 bytes by vpermi2b) or 6 bits (BW: the low 6 bits, 64
// words by vpermi2w); a longer code, or none, is told apart by comparing the
// 11-bit window W, read first bit highest, with the canonical code's limits
// (the windows of the codes of length <= l are [0, limit[l]), FORMAT.md's
// canonical order). Each step also stores the symbols of the codes of at most
// 8 bits (a table like the encoder's, off the chain) and the windows, from
// which LongSymbols completes the others.
struct VecDecodeTable {
  __m512i len8[4];            // VBMI: code length by the low 8 bits, 0 when longer or none
  __m512i len6[2];            // BW: code length by the low 6 bits, 0 when longer or none
  __m512i sym8[8];            // sym | 0x8000-free u16 by the low 8 bits; 0xFFFF when longer
  uint16_t lim[kMaxCodeLen + 1];  // limits in the 11-bit window, first bit highest
  uint32_t full[kTableSize];  // sym by the low 11 bits, for the gathers of long codes
};

inline void BuildVecDecodeTable(const DecodeEntry* table, const uint8_t* lens, VecDecodeTable* vt) {
  alignas(64) uint8_t len8[256];
  alignas(64) uint16_t len6[64];
  alignas(64) uint16_t sym8[256];
  for (int i = 0; i < 256; ++i) {
    const bool shortc = table[i].len && table[i].len <= 8;
    len8[i] = shortc ? table[i].len : 0;
    sym8[i] = shortc ? table[i].sym : 0xFFFF;
  }
  for (int i = 0; i < 64; ++i) len6[i] = table[i].len && table[i].len <= 6 ? table[i].len : 0;
  for (int i = 0; i < 4; ++i) vt->len8[i] = _mm512_load_si512(len8 + 64 * i);
  for (int i = 0; i < 2; ++i) vt->len6[i] = _mm512_load_si512(len6 + 32 * i);
  for (int i = 0; i < 8; ++i) vt->sym8[i] = _mm512_load_si512(sym8 + 32 * i);
  for (int i = 0; i < kTableSize; ++i) vt->full[i] = table[i].sym;
  uint32_t count[kMaxCodeLen + 1] = {0};
  for (int s = 0; s < kNumSymbols; ++s) ++count[lens[s]];
  uint32_t code = 0;
  vt->lim[0] = 0;
  for (int l = 1; l <= kMaxCodeLen; ++l) {  // canonical: first[l] = (first[l-1] + count[l-1]) << 1
    code = (code + (l > 1 ? count[l - 1] : 0)) << (l > 1 ? 1 : 0);
    vt->lim[l] = uint16_t((code + count[l]) << (kMaxCodeLen - l));  // <= 2048 (Kraft, checked before)
  }
}

// The 11-bit windows of lo: its first 11 bits, first bit highest.
inline __m512i Windows(__m512i lo) {
#if ZIPCCL_CPU_VBMI2
  const __m512i rb = _mm512_gf2p8affine_epi64_epi8(lo, _mm512_set1_epi64(0x8040201008040201ll), 0);
  return _mm512_srli_epi16(_mm512_shldi_epi16(rb, rb, 8), 16 - kMaxCodeLen);
#else
  // Each byte's bits reversed by two nibble lookups, then the bytes swapped.
  const __m512i rev4 = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15));
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i lo4 = _mm512_shuffle_epi8(rev4, _mm512_and_si512(lo, nib));
  const __m512i hi4 = _mm512_shuffle_epi8(rev4, _mm512_and_si512(_mm512_srli_epi16(lo, 4), nib));
  const __m512i rb = _mm512_or_si512(_mm512_slli_epi16(lo4, 4), hi4);  // no carry across bytes: both < 16
  const __m512i w = _mm512_or_si512(_mm512_slli_epi16(rb, 8), _mm512_srli_epi16(rb, 8));
  return _mm512_srli_epi16(w, 16 - kMaxCodeLen);
#endif
}

// The code lengths of the windows in lo (0: no code): the table's for the
// short codes (VBMI: up to 8 bits, BW: up to 6), then one more for each limit
// the window reaches, none past the last.
inline __m512i CodeLengths(const VecDecodeTable& vt, __m512i lo) {
#if ZIPCCL_CPU_VBMI2
  constexpr int kTabled = 8;
  constexpr __mmask64 kLow = 0x5555555555555555ull;  // the low byte of each 16-bit lane
  const __m512i a = _mm512_maskz_permutex2var_epi8(kLow, vt.len8[0], lo, vt.len8[1]);
  const __m512i b = _mm512_maskz_permutex2var_epi8(kLow, vt.len8[2], lo, vt.len8[3]);
  __m512i len = _mm512_mask_blend_epi8(_mm512_movepi8_mask(lo), a, b);
#else
  constexpr int kTabled = 6;
  __m512i len = _mm512_permutex2var_epi16(vt.len6[0], _mm512_and_si512(lo, _mm512_set1_epi16(63)), vt.len6[1]);
#endif
  const __m512i w = Windows(lo);
  const __m512i one = _mm512_set1_epi16(1);
  len = _mm512_mask_mov_epi16(len, _mm512_cmpge_epu16_mask(w, _mm512_set1_epi16(short(vt.lim[kTabled]))),
                              _mm512_set1_epi16(kTabled + 1));
#pragma GCC unroll 4
  for (int l = kTabled + 1; l < kMaxCodeLen; ++l)
    len = _mm512_mask_add_epi16(len, _mm512_cmpge_epu16_mask(w, _mm512_set1_epi16(short(vt.lim[l]))), len, one);
  return _mm512_maskz_mov_epi16(~_mm512_cmpge_epu16_mask(w, _mm512_set1_epi16(short(vt.lim[kMaxCodeLen]))), len);
}

// The segment's next units (from `units`, two bytes each) in the lanes of
// `need`, in lane order; zero in the others.
inline __m512i ExpandUnits(__mmask32 need, const uint8_t* units) {
#if ZIPCCL_CPU_VBMI2
  return _mm512_maskz_expandloadu_epi16(need, units);
#else
  // AVX-512F expands dwords: two halves of 16 lanes, each from a masked load
  // of exactly its units (branch-free: the chains of the segments in
  // lockstep overlap).
  const __mmask16 n0 = __mmask16(need), n1 = __mmask16(need >> 16);
  const uint32_t c0 = uint32_t(__builtin_popcount(n0)), c1 = uint32_t(__builtin_popcount(n1));
  const __m256i u0 = _mm256_maskz_loadu_epi16(__mmask16(_bzhi_u32(~0u, c0)), units);
  const __m256i u1 = _mm256_maskz_loadu_epi16(__mmask16(_bzhi_u32(~0u, c1)), units + 2 * c0);
  const __m512i e0 = _mm512_maskz_expand_epi32(n0, _mm512_cvtepu16_epi32(u0));
  const __m512i e1 = _mm512_maskz_expand_epi32(n1, _mm512_cvtepu16_epi32(u1));
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(e0)), _mm512_cvtepi32_epi16(e1), 1);
#endif
}

// The low 16 bits of (hi:lo) >> len, lane by lane (len <= 16).
inline __m512i ShiftPair(__m512i lo, __m512i hi, __m512i len) {
#if ZIPCCL_CPU_VBMI2
  return _mm512_shrdv_epi16(lo, hi, len);
#else
  return _mm512_or_si512(_mm512_srlv_epi16(lo, len), _mm512_sllv_epi16(hi, _mm512_sub_epi16(_mm512_set1_epi16(16), len)));
#endif
}

// K segments in lockstep (their chains overlap). kPartial: the segments may
// be short (then K is 1). Writes each step's windows (lo) to seg[k].syms.
template <int K, bool kPartial>
Status DecodeSegmentsVec(const VecDecodeTable& vt, const SegmentIn* seg) {
  const __m512i one = _mm512_set1_epi16(1), c16 = _mm512_set1_epi16(16);
  __m512i lo[K], hi[K], nb[K];
  uint32_t cursor[K];
  __mmask32 bad = 0;
  bool over = false;
  uint32_t steps = 0;
#pragma GCC unroll 4
  for (int k = 0; k < K; ++k) {
    lo[k] = hi[k] = nb[k] = _mm512_setzero_si512();
    cursor[k] = 0;
    const uint32_t st = (seg[k].m + kLanes - 1) / kLanes;
    steps = st > steps ? st : steps;
  }
  for (uint32_t t = 0; t < steps; ++t) {
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) {
      __mmask32 act = ~__mmask32(0);
      if (kPartial) {
        const uint32_t e = t * kLanes;
        act = seg[k].m - e >= uint32_t(kLanes) ? act : _bzhi_u32(~0u, seg[k].m - e);
      }
      __m512i len = CodeLengths(vt, lo[k]);
      // No code, or longer than the bits held: take the segment's next unit.
      const __mmask32 need = _mm512_mask_cmpge_epu16_mask(act, _mm512_sub_epi16(len, one), nb[k]);
      const uint32_t cnt = uint32_t(__builtin_popcount(need));
      if (cursor[k] + cnt > seg[k].su) {  // more units than seg_units: never read past them
        over = true;
        break;
      }
      const __m512i u = ExpandUnits(need, seg[k].units + 2 * uint64_t(cursor[k]));
      cursor[k] += cnt;
      lo[k] = _mm512_or_si512(lo[k], _mm512_sllv_epi16(u, nb[k]));
      hi[k] = _mm512_or_si512(hi[k], _mm512_srlv_epi16(u, _mm512_sub_epi16(c16, nb[k])));
      nb[k] = _mm512_mask_add_epi16(nb[k], need, nb[k], c16);
      len = _mm512_mask_mov_epi16(len, need, CodeLengths(vt, lo[k]));
      bad |= _mm512_mask_cmpge_epu16_mask(act, _mm512_sub_epi16(len, one), nb[k]);
      // The symbols (of the short codes: off the chain, in its shadow) and
      // the windows.
      uint16_t* out = seg[k].syms + uint64_t(t) * kLanes;
      uint16_t* win = seg[k].win + uint64_t(t) * kLanes;
      const __m512i sym = ShortSymbols(vt, lo[k]);
      if (kPartial) {
        // Lanes past the segment's end keep their bits: their padding is checked below.
        len = _mm512_maskz_mov_epi16(act, len);
        _mm512_mask_storeu_epi16(out, act, sym);
        _mm512_mask_storeu_epi16(win, act, lo[k]);
      } else {
        _mm512_storeu_si512(out, sym);
        _mm512_storeu_si512(win, lo[k]);
      }
      lo[k] = ShiftPair(lo[k], hi[k], len);
      hi[k] = _mm512_srlv_epi16(hi[k], len);
      nb[k] = _mm512_sub_epi16(nb[k], len);
    }
    // A failed lookup ends the segments: they are rejected, and a lane
    // whose lookups kept failing would only pile up bits.
    if (over || bad) return kErrStream;
  }
  bool pad = false;
#pragma GCC unroll 4
  for (int k = 0; k < K; ++k) {
    if (cursor[k] != seg[k].su) return kErrStream;
    pad |= _mm512_test_epi16_mask(_mm512_or_si512(lo[k], hi[k]), _mm512_or_si512(lo[k], hi[k])) != 0;
  }
  return pad ? kErrReserved : kOk;
}

// The symbols of the codes at the windows lo whose codes have at most 8 bits;
// 0xFFFF for longer codes.
inline __m512i ShortSymbols(const VecDecodeTable& vt, __m512i lo) { return Lookup256(vt.sym8, lo); }

// Completes the symbols of a decoded segment: the long codes' (0xFFFF) from
// the full table by their windows.
inline void LongSymbols(const VecDecodeTable& vt, uint16_t* syms, const uint16_t* win, uint32_t m) {
  const int* g = reinterpret_cast<const int*>(vt.full);
  const __m512i ones = _mm512_set1_epi16(-1);
  for (uint32_t j = 0; j < m; j += 32) {
    const __mmask32 act = m - j >= 32 ? ~__mmask32(0) : _bzhi_u32(~0u, m - j);
    __m512i s = _mm512_maskz_loadu_epi16(act, syms + j);
    const __mmask32 esc = _mm512_mask_cmpeq_epi16_mask(act, s, ones);
    if (esc) {
      const __m512i lo = _mm512_maskz_loadu_epi16(act, win + j);
      const __m512i i11 = _mm512_and_si512(lo, _mm512_set1_epi16(kTableSize - 1));
      __m512i g0 = _mm512_setzero_si512(), g1 = _mm512_setzero_si512();
      if (__mmask16(esc))
        g0 = _mm512_mask_i32gather_epi32(g0, __mmask16(esc), _mm512_cvtepu16_epi32(_mm512_castsi512_si256(i11)), g, 4);
      if (__mmask16(esc >> 16))
        g1 = _mm512_mask_i32gather_epi32(g1, __mmask16(esc >> 16),
                                         _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(i11, 1)), g, 4);
      s = _mm512_mask_mov_epi16(s, esc, _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(g0)),
                                                           _mm512_cvtepi32_epi16(g1), 1));
      _mm512_mask_storeu_epi16(syms + j, act, s);
    }
  }
}
#endif

// Joins a segment's symbols with its raw bytes (nnz elements' worth) into
// elements. Returns false if its non-ZERO symbols are not exactly nnz; never
// reads past the nnz elements' raw bytes.
template <typename T>
bool MergeScalar(const uint16_t* syms, uint32_t m, const uint8_t* raw, uint32_t nnz, bool low16,
                 T* out) {
  uint32_t r = 0;
  if constexpr (sizeof(T) == 1) {  // one-byte floats: the element is the symbol, rotated back
    for (uint32_t j = 0; j < m; ++j) {
      const uint32_t s = syms[j];
      const bool nz = s != uint32_t(kZeroSymbol);
      out[j] = nz ? T(Rotr8(s)) : T(0);
      r += nz;
    }
    return r == nnz;
  }
  if (nnz == 0) {
    uint32_t bad = 0;
    for (uint32_t j = 0; j < m; ++j) {
      bad |= syms[j] != uint32_t(kZeroSymbol);
      out[j] = 0;
    }
    return bad == 0;
  }
  for (uint32_t j = 0; j < m; ++j) {
    const uint32_t s = syms[j];
    const uint32_t at = r < nnz ? r : nnz - 1;  // clamp: never read past the segment's raw bytes
    uint32_t v;
    if (sizeof(T) == 2 || low16) {
      v = Rotr16(((s & 0xFF) << 8) | raw[at]);
      if (low16) v <<= 16;
    } else {
      const uint8_t* q = raw + 3 * uint64_t(at);
      v = Rotr32(((s & 0xFF) << 24) | q[0] | (uint32_t(q[1]) << 8) | (uint32_t(q[2]) << 16));
    }
    const bool nz = s != uint32_t(kZeroSymbol);
    out[j] = nz ? T(v) : T(0);
    r += nz;
  }
  return r == nnz;
}

#if ZIPCCL_CPU_AVX512
#if !ZIPCCL_CPU_VBMI2
// The raw bytes at raw (exactly as many as nz has lanes: no byte past them is
// read) in the nz lanes of 32 u16 lanes, in lane order; zero in the others.
// AVX-512F expands dwords: two halves of 16 lanes.
inline __m512i ExpandRawBytes(__mmask32 nz, const uint8_t* raw) {
  const __mmask16 n0 = __mmask16(nz), n1 = __mmask16(nz >> 16);
  const uint32_t c0 = uint32_t(__builtin_popcount(n0)), c1 = uint32_t(__builtin_popcount(n1));
  const __m128i b0 = _mm_maskz_loadu_epi8(__mmask16(_bzhi_u32(~0u, c0)), raw);
  const __m128i b1 = _mm_maskz_loadu_epi8(__mmask16(_bzhi_u32(~0u, c1)), raw + c0);
  const __m512i e0 = _mm512_maskz_expand_epi32(n0, _mm512_cvtepu8_epi32(b0));
  const __m512i e1 = _mm512_maskz_expand_epi32(n1, _mm512_cvtepu8_epi32(b1));
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(e0)), _mm512_cvtepi32_epi16(e1), 1);
}
#endif

template <typename T>
bool MergeVec(const uint16_t* syms, uint32_t m, const uint8_t* raw, uint32_t nnz, bool low16,
              uint64_t readable, T* out) {
  // Raw bytes are loaded whole while `readable` (the bytes from raw to the
  // block's end) allows, else with a mask of exactly the bytes used.
  const __m512i zs = _mm512_set1_epi16(kZeroSymbol);
  uint32_t r = 0;
#if !ZIPCCL_CPU_VBMI2
  if (sizeof(T) == 4 && !low16) return MergeScalar(syms, m, raw, nnz, low16, out);
#else
  if constexpr (sizeof(T) == 4) {
    if (!low16) {  // three raw bytes per element, 16 elements a step
      const __m512i z32 = _mm512_set1_epi32(kZeroSymbol);
      const uint64_t limit = 3 * uint64_t(nnz);
      uint64_t rb = 0;
      for (uint32_t j = 0; j < m; j += 16) {
        const __mmask16 act = m - j >= 16 ? __mmask16(0xFFFF) : __mmask16(_bzhi_u32(~0u, m - j));
        const __m512i s = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(act, syms + j));
        const __mmask16 nz = _mm512_mask_cmpneq_epi32_mask(act, s, z32);
        const uint64_t cnt = 3 * uint64_t(__builtin_popcount(nz));
        if (rb + cnt > limit) return false;
        const uint64_t bytes = _pdep_u64(nz, 0x1111111111111111ull) * 7;
        const __m512i rl = rb + 64 <= readable ? _mm512_loadu_si512(raw + rb)
                                                : _mm512_maskz_loadu_epi8(_bzhi_u64(~0ull, unsigned(cnt)), raw + rb);
        const __m512i rv = _mm512_maskz_expand_epi8(bytes, rl);
        const __m512i v = _mm512_or_si512(rv, _mm512_slli_epi32(s, 24));
        _mm512_mask_storeu_epi32(out + j, act, _mm512_maskz_shrdi_epi32(nz, v, v, 1));
        rb += cnt;
      }
      return rb == limit;
    }
  }
#endif
  for (uint32_t j = 0; j < m; j += 32) {
    const __mmask32 act = m - j >= 32 ? ~__mmask32(0) : _bzhi_u32(~0u, m - j);
    const __m512i s = _mm512_maskz_loadu_epi16(act, syms + j);
    const __mmask32 nz = _mm512_mask_cmpneq_epi16_mask(act, s, zs);
    const uint32_t cnt = uint32_t(__builtin_popcount(nz));
    if (r + cnt > nnz) return false;
    if constexpr (sizeof(T) == 1) {
      const __m512i v = _mm512_or_si512(_mm512_srli_epi16(s, 1), _mm512_slli_epi16(s, 7));
      _mm256_mask_storeu_epi8(out + j, act, _mm512_cvtepi16_epi8(_mm512_maskz_mov_epi16(nz, v)));
    } else {
      // A masked load of exactly the step's raw bytes (never past the
      // segment's), spread to the non-ZERO lanes in registers.
#if ZIPCCL_CPU_VBMI2
      const __m256i rl = r + 32 <= readable
                             ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(raw + r))
                             : _mm256_maskz_loadu_epi8(_bzhi_u32(~0u, cnt), raw + r);
      const __m512i rv = _mm512_cvtepu8_epi16(_mm256_maskz_expand_epi8(nz, rl));
      const __m512i v0 = _mm512_or_si512(_mm512_slli_epi16(s, 8), rv);
      const __m512i v = _mm512_maskz_shrdi_epi16(nz, v0, v0, 1);  // Rotr16, ZERO -> 0
#else
      (void)readable;
      const __m512i v0 = _mm512_or_si512(_mm512_slli_epi16(s, 8), ExpandRawBytes(nz, raw + r));
      const __m512i v = _mm512_maskz_mov_epi16(nz, _mm512_or_si512(_mm512_srli_epi16(v0, 1), _mm512_slli_epi16(v0, 15)));
#endif
      if constexpr (sizeof(T) == 2) {
        _mm512_mask_storeu_epi16(out + j, act, v);
      } else {  // LOW16
        const __m512i w0 = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16);
        const __m512i w1 = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16);
        _mm512_mask_storeu_epi32(out + j, __mmask16(act), w0);
        _mm512_mask_storeu_epi32(out + j + 16, __mmask16(act >> 16), w1);
      }
    }
    r += cnt;
  }
  return r == nnz;
}
#endif

struct DecodeScratch {
  DecodeEntry table[kTableSize];
  alignas(64) uint16_t syms[kMaxSegmentsPerBlock][kSegmentElems];
#if ZIPCCL_CPU_AVX512
  alignas(64) uint16_t win[kMaxSegmentsPerBlock][kSegmentElems];
  VecDecodeTable vec;
#endif
};

template <typename T>
Status DecodeHuffBlock(const uint8_t* block, uint64_t block_bytes, uint64_t n, uint8_t flags,
                       DecodeScratch* t, T* out) {
  uint8_t lens[kNumSymbols];
  HuffLayout L;
  Status st = ParseHuffLayout(block, block_bytes, n, int(sizeof(T)), flags, lens, &L);
  if (st != kOk) return st;
  uint32_t enc[kNumSymbols];
  if (!BuildEncodeTable(lens, enc)) return kErrTable;
  BuildDecodeTable(enc, t->table);
  const bool low16 = flags & kBlockFlagLow16;
  SegmentIn seg[kMaxSegmentsPerBlock];
  for (int k = 0; k < L.n_segs; ++k)
    seg[k] = SegmentIn{block + L.units_off + 2 * uint64_t(L.seg_unit0[k]), L.seg_units[k],
                       SegmentElemsOf(n, k), t->syms[k], nullptr};
#if ZIPCCL_CPU_AVX512
  for (int k = 0; k < L.n_segs; ++k) seg[k].win = t->win[k];
#endif
  // Every segment decodes before any verdict: a stream error anywhere
  // (kErrStream) outranks non-zero padding (kErrReserved), on every path.
  const bool vec = UseVector();
  bool stream_err = false, pad_err = false;
  auto note = [&](Status s) {
    stream_err |= s == kErrStream;
    pad_err |= s == kErrReserved;
  };
#if ZIPCCL_CPU_AVX512
  if (vec) {
    BuildVecDecodeTable(t->table, lens, &t->vec);
    int full = 0;
    while (full < L.n_segs && seg[full].m == uint32_t(kSegmentElems)) ++full;
    int k = 0;
    for (; k + 4 <= full; k += 4) note(DecodeSegmentsVec<4, false>(t->vec, seg + k));
    for (; k + 2 <= full; k += 2) note(DecodeSegmentsVec<2, false>(t->vec, seg + k));
    for (; k < full; ++k) note(DecodeSegmentsVec<1, false>(t->vec, seg + k));
    for (; k < L.n_segs; ++k) note(DecodeSegmentsVec<1, true>(t->vec, seg + k));
  } else
#endif
  {
    for (int k = 0; k < L.n_segs; ++k) note(DecodeSegmentScalar(t->table, seg[k]));
  }
  (void)vec;
  if (stream_err) return kErrStream;
  if (pad_err) return kErrReserved;
  for (int k = 0; k < L.n_segs; ++k) {
    const uint8_t* raw = block + L.raw_off + uint64_t(L.seg_raw0[k]) * uint64_t(L.raw_width);
    T* o = out + (uint64_t(k) << kSegmentLog2);
    bool ok;
#if ZIPCCL_CPU_AVX512
    if (vec) {
      LongSymbols(t->vec, seg[k].syms, seg[k].win, seg[k].m);
      ok = MergeVec(seg[k].syms, seg[k].m, raw, L.seg_nnz[k], low16, uint64_t(block + block_bytes - raw), o);
    }
    else
#endif
      ok = MergeScalar(seg[k].syms, seg[k].m, raw, L.seg_nnz[k], low16, o);
    if (!ok) return kErrStream;
  }
  return kOk;
}

template <typename T>
DecodeResult DecodeTyped(const uint8_t* in, uint64_t in_bytes, uint8_t dtype, uint64_t n,
                         T* out) {
  if (in_bytes < kFrameHeaderBytes) return {kErrTruncated, -1};
  FrameHeader h = ParseFrameHeader(in);
  Status st = ValidateFrameHeader(h, dtype, n, in_bytes);
  if (st != kOk) return {st, -1};
  const uint64_t frame_bytes = h.frame_bytes;
  const uint64_t nb = NumBlocks(n);
  uint64_t off = kFrameHeaderBytes + nb * kDirEntryBytes;
  // Directory first: the blocks must tile the frame exactly.
  uint64_t total = off;
  for (uint64_t b = 0; b < nb; ++b) total += Load32(in + kFrameHeaderBytes + b * kDirEntryBytes);
  // The checksum first (FrameChecksum reads only the frame's bytes whatever
  // the directory says), so that damage anywhere reads as corruption.
  if ((h.flags & kFrameFlagChecksum) && FrameChecksum(in, frame_bytes) != h.checksum)
    return {kErrChecksum, -1};
  if (total != frame_bytes) return {kErrFrameSize, -1};

  std::unique_ptr<DecodeScratch> scratch;  // ~280 KB, per call, only for HUFF blocks
  for (uint64_t b = 0; b < nb; ++b) {
    const uint64_t bb = Load32(in + kFrameHeaderBytes + b * kDirEntryBytes);
    const uint64_t nbe = BlockElems(n, b);
    const uint8_t* blk = in + off;
    T* ob = out + (b << kBlockLog2);
    if (bb < kBlockHeaderBytes) return {kErrBlockSize, int64_t(b)};
    const uint8_t mode = blk[0], flags = blk[1];
    if (blk[2] || blk[3]) return {kErrReserved, int64_t(b)};
    const uint32_t value = Load32(blk + 4);
    if (mode == kModeRaw) {
      if (flags) return {kErrBlockMode, int64_t(b)};
      if (value) return {kErrReserved, int64_t(b)};
      if (bb != kBlockHeaderBytes + nbe * sizeof(T)) return {kErrBlockSize, int64_t(b)};
      std::memcpy(ob, blk + kBlockHeaderBytes, nbe * sizeof(T));
    } else if (mode == kModeConst) {
      if (flags) return {kErrBlockMode, int64_t(b)};
      if constexpr (sizeof(T) < 4) {  // the bits above the element are reserved
        if (value >> (8 * sizeof(T))) return {kErrReserved, int64_t(b)};
      }
      if (bb != kBlockHeaderBytes) return {kErrBlockSize, int64_t(b)};
      for (uint64_t j = 0; j < nbe; ++j) ob[j] = T(value);
    } else if (mode == kModeHuff) {
      if (flags & kBlockFlagsReserved) return {kErrReserved, int64_t(b)};
      if (value) return {kErrReserved, int64_t(b)};
      if (!scratch) scratch.reset(new DecodeScratch);
      st = DecodeHuffBlock(blk, bb, nbe, flags, scratch.get(), ob);
      if (st != kOk) return {st, int64_t(b)};
    } else {
      return {kErrBlockMode, int64_t(b)};
    }
    off += bb;
  }
  return {kOk, -1};
}

}  // namespace

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
  return ZIPCCL_CPU_VBMI2 ? "avx512_vbmi2" : ZIPCCL_CPU_AVX512 ? "avx512bw" : "";
}


}  // namespace zipccl::cpu
