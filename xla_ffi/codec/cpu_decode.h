// The CPU decoder: a HUFF block's segments into symbols (the portable loops or
// a vector tier of cpu_paths.h), merged with the raw bytes; every other block
// mode; the frame, verified before any byte is trusted.
// Private to cpu_driver.cc (its anonymous namespace).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

#include "block.h"
#include "cpu_decode_avx2.h"
#include "cpu_paths.h"
#include "format.h"
#include "huffman.h"
#include "xxhash32.h"

namespace zipccl::cpu {
namespace {

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
#if ZIPCCL_CPU_VBMI2
constexpr int kTabledBits = 8;
#else
constexpr int kTabledBits = 6;
#endif

struct VecDecodeTable {
  __m512i len[4];             // code length by the low kTabledBits bits, 0 when longer or none
                              // (VBMI: 256 bytes, four registers; BW: 64 words, two)
  __m512i sym8[8];            // sym | 0x8000-free u16 by the low 8 bits; 0xFFFF when longer
  uint16_t lim[kMaxCodeLen + 1];  // limits in the 11-bit window, first bit highest
  uint32_t full[kTableSize];  // sym by the low 11 bits, for the gathers of long codes
};

inline void BuildVecDecodeTable(const DecodeEntry* table, const uint8_t* lens, VecDecodeTable* vt) {
  alignas(64) uint16_t sym8[256];
  for (int i = 0; i < 256; ++i) {
    const bool shortc = table[i].len && table[i].len <= 8;
    sym8[i] = shortc ? table[i].sym : 0xFFFF;
  }
#if ZIPCCL_CPU_VBMI2
  alignas(64) uint8_t len_t[256];
#else
  alignas(64) uint16_t len_t[64];
#endif
  constexpr int kEntries = 1 << kTabledBits, kPerReg = 64 / int(sizeof(len_t[0]));
  for (int i = 0; i < kEntries; ++i) len_t[i] = table[i].len <= kTabledBits ? table[i].len : 0;
  for (int i = 0; i < kEntries / kPerReg; ++i) vt->len[i] = _mm512_load_si512(len_t + kPerReg * i);
  for (int i = 0; i < 8; ++i) vt->sym8[i] = _mm512_load_si512(sym8 + 32 * i);
  for (int i = 0; i < kTableSize; ++i) vt->full[i] = table[i].sym;
  CodeLimits(lens, vt->lim);
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
  constexpr __mmask64 kLow = 0x5555555555555555ull;  // the low byte of each 16-bit lane
  const __m512i a = _mm512_maskz_permutex2var_epi8(kLow, vt.len[0], lo, vt.len[1]);
  const __m512i b = _mm512_maskz_permutex2var_epi8(kLow, vt.len[2], lo, vt.len[3]);
  __m512i len = _mm512_mask_blend_epi8(_mm512_movepi8_mask(lo), a, b);
#else
  const __m512i low_bits = _mm512_and_si512(lo, _mm512_set1_epi16((1 << kTabledBits) - 1));
  __m512i len = _mm512_permutex2var_epi16(vt.len[0], low_bits, vt.len[1]);
#endif
  const __m512i w = Windows(lo);
  const __m512i one = _mm512_set1_epi16(1);
  len = _mm512_mask_mov_epi16(len, _mm512_cmpge_epu16_mask(w, _mm512_set1_epi16(short(vt.lim[kTabledBits]))),
                              _mm512_set1_epi16(kTabledBits + 1));
#pragma GCC unroll 4
  for (int l = kTabledBits + 1; l < kMaxCodeLen; ++l)
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
  if constexpr (sizeof(T) == 4) {
    if (!low16) {  // three raw bytes per element, 16 elements a step
      const __m512i z32 = _mm512_set1_epi32(kZeroSymbol);
#if !ZIPCCL_CPU_VBMI2
      // The encoder's packing undone: the step's dwords of raw bytes spread
      // three to a 128-bit lane (vpermd), each lane's 12 bytes spread to the
      // low three bytes of its 4 dwords (vpshufb), then those dwords expanded
      // to the non-zero lanes (vpexpandd).
      const __m512i spread = _mm512_setr_epi32(0, 1, 2, 0, 3, 4, 5, 0, 6, 7, 8, 0, 9, 10, 11, 0);
      const __m512i unpack =
          _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1));
#endif
      const uint64_t limit = 3 * uint64_t(nnz);
      uint64_t rb = 0;
      for (uint32_t j = 0; j < m; j += 16) {
        const __mmask16 act = m - j >= 16 ? __mmask16(0xFFFF) : __mmask16(_bzhi_u32(~0u, m - j));
        const __m512i s = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(act, syms + j));
        const __mmask16 nz = _mm512_mask_cmpneq_epi32_mask(act, s, z32);
        const uint64_t cnt = 3 * uint64_t(__builtin_popcount(nz));
        if (rb + cnt > limit) return false;
        const __m512i rl = rb + 64 <= readable ? _mm512_loadu_si512(raw + rb)
                                                : _mm512_maskz_loadu_epi8(_bzhi_u64(~0ull, unsigned(cnt)), raw + rb);
#if ZIPCCL_CPU_VBMI2
        const uint64_t bytes = _pdep_u64(nz, 0x1111111111111111ull) * 7;
        const __m512i rv = _mm512_maskz_expand_epi8(bytes, rl);
        const __m512i v = _mm512_or_si512(rv, _mm512_slli_epi32(s, 24));
        _mm512_mask_storeu_epi32(out + j, act, _mm512_maskz_shrdi_epi32(nz, v, v, 1));
#else
        const __m512i packed = _mm512_shuffle_epi8(_mm512_permutexvar_epi32(spread, rl), unpack);
        const __m512i v = _mm512_or_si512(_mm512_maskz_expand_epi32(nz, packed), _mm512_slli_epi32(s, 24));
        _mm512_mask_storeu_epi32(out + j, act, _mm512_maskz_ror_epi32(nz, v, 1));
#endif
        rb += cnt;
      }
      return rb == limit;
    }
  }
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
#elif ZIPCCL_CPU_AVX2
  if (vec) {
    Avx2Limits lim;
    BuildAvx2Limits(lens, &lim);
    for (int k = 0; k < L.n_segs; ++k)
      note(DecodeSegmentAvx2(t->table, lim, seg[k].units, seg[k].su, seg[k].m, seg[k].syms));
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
#elif ZIPCCL_CPU_AVX2
    if constexpr (sizeof(T) != 1) {
      if (vec)
        ok = MergeAvx2(seg[k].syms, seg[k].m, raw, L.seg_nnz[k], low16, o);
      else
        ok = MergeScalar(seg[k].syms, seg[k].m, raw, L.seg_nnz[k], low16, o);
    } else
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
}  // namespace zipccl::cpu
