// Per-block logic shared by the CPU driver and the CUDA kernels: how an element
// splits into a Huffman symbol and raw bytes, how a block chooses its mode, and
// how the HUFF block's table, segment directory and units are laid out and
// validated.
#pragma once

#include <cstdint>

#include "format.h"
#include "huffman.h"

namespace zipccl {

// ---- Element <-> (symbol, raw bits) ---------------------------------------
// Rotating left by one moves the sign bit to the bottom, so the top byte of a
// bfloat16 or float32 is exactly its exponent and the low bits are mantissa
// and sign, which are close to uniformly random and are stored verbatim. For
// float16 the top byte is the 5-bit exponent and the 3 high mantissa bits.
ZIPCCL_HD uint32_t Rotl16(uint32_t v) { return ((v << 1) | (v >> 15)) & 0xFFFFu; }
ZIPCCL_HD uint32_t Rotr16(uint32_t v) { return ((v >> 1) | (v << 15)) & 0xFFFFu; }
ZIPCCL_HD uint32_t Rotl32(uint32_t v) { return (v << 1) | (v >> 31); }
ZIPCCL_HD uint32_t Rotr32(uint32_t v) { return (v >> 1) | (v << 31); }

ZIPCCL_HD int Symbol16(uint32_t v) { return v ? int(Rotl16(v) >> 8) : kZeroSymbol; }
ZIPCCL_HD uint32_t Raw16(uint32_t v) { return Rotl16(v) & 0xFFu; }
ZIPCCL_HD uint32_t Merge16(int sym, uint32_t raw) {
  return sym == kZeroSymbol ? 0u : Rotr16((uint32_t(sym) << 8) | raw);
}
ZIPCCL_HD int Symbol32(uint32_t v) { return v ? int(Rotl32(v) >> 24) : kZeroSymbol; }
ZIPCCL_HD uint32_t Raw32(uint32_t v) { return Rotl32(v) & 0xFFFFFFu; }
ZIPCCL_HD uint32_t Merge32(int sym, uint32_t raw) {
  return sym == kZeroSymbol ? 0u : Rotr32((uint32_t(sym) << 24) | raw);
}
// One-byte floats: the symbol is the whole rotated byte, and there are no raw
// bytes (FORMAT.md "Symbols"). Rotl8(v) is 0 only for v == 0, which is ZERO,
// so symbol 0 never occurs in a compliant frame.
ZIPCCL_HD uint32_t Rotl8(uint32_t v) { return ((v << 1) | (v >> 7)) & 0xFFu; }
ZIPCCL_HD uint32_t Rotr8(uint32_t v) { return ((v >> 1) | (v << 7)) & 0xFFu; }
ZIPCCL_HD int Symbol8(uint32_t v) { return v ? int(Rotl8(v)) : kZeroSymbol; }
ZIPCCL_HD uint32_t Merge8(int sym) { return sym == kZeroSymbol ? 0u : Rotr8(uint32_t(sym)); }
// The symbol of an element of width sizeof(T).
template <typename T>
ZIPCCL_HD int SymbolOf(uint32_t v) {
  return sizeof(T) == 1 ? Symbol8(v) : sizeof(T) == 2 ? Symbol16(v) : Symbol32(v);
}
// Note: for a float32 whose low 16 bits are zero, Symbol32(v) equals
// Symbol16(v >> 16), so one histogram serves both the plain and LOW16 coding.

// ---- Segments, lanes and units ------------------------------------------------
// Elements of segment `seg` of a block of m elements (the last may be short).
ZIPCCL_HD int NumSegments(uint64_t m) { return int((m + uint64_t(kSegmentElems) - 1) >> kSegmentLog2); }
ZIPCCL_HD uint32_t SegmentElemsOf(uint64_t m, int seg) {
  const uint64_t left = m - (uint64_t(seg) << kSegmentLog2);
  return left < uint64_t(kSegmentElems) ? uint32_t(left) : uint32_t(kSegmentElems);
}
// Elements lane l codes in a segment of seg_m elements: kLanes * t + l < seg_m.
ZIPCCL_HD uint32_t LaneElems(uint32_t seg_m, uint32_t lane) {
  return seg_m > lane ? (seg_m - lane + kLanes - 1) / kLanes : 0;
}
// Steps of the longest segment of a block of m elements (its first): what
// every warp of a block's CTA runs, so a warp primitive is reached alike.
ZIPCCL_HD int BlockSteps(uint64_t m) {
  const uint64_t first = m < uint64_t(kSegmentElems) ? m : uint64_t(kSegmentElems);
  return int((first + kLanes - 1) / kLanes);
}
// Units a lane of `bits` bits fills (the last one padded with zero bits).
ZIPCCL_HD uint32_t LaneUnits(uint32_t bits) { return (bits + kUnitBits - 1) / kUnitBits; }
// Whether a code of `len` bits after the lane's first `before` bits holds the
// first bit of a unit, i.e. takes the segment's next unit: encoders allocate
// the unit's slot at that step, decoders load it then.
ZIPCCL_HD bool StartsUnit(uint32_t before, uint32_t len) { return LaneUnits(before + len) > LaneUnits(before); }
// The fewest and most units a segment of seg_m elements can take (every code
// of 1 bit, of kMaxCodeLen bits): a decoder's first check of seg_units.
ZIPCCL_HD void SegmentUnitBounds(uint32_t seg_m, uint32_t* lo, uint32_t* hi) {
  *lo = *hi = 0;
  for (uint32_t l = 0; l < uint32_t(kLanes); ++l) {
    const uint32_t e = LaneElems(seg_m, l);
    *lo += LaneUnits(e);
    *hi += LaneUnits(e * kMaxCodeLen);
  }
}

// ---- Block plan ------------------------------------------------------------
// What the passes over a block decide, and the exact coded size. A HUFF plan is
// made in two steps: PlanTable from the histogram (the code, the table, the
// raw bytes), then, once a pass over the block has added up each segment's
// units and non-zero elements (seg_units, seg_nnz), PlanFinish, which compares
// the exact HUFF size with RAW.
struct BlockPlan {
  uint8_t mode;
  uint8_t flags;
  uint32_t const_value;     // CONST: the repeated element bits
  uint64_t block_bytes;     // exact coded size, header included (after PlanFinish)
  // HUFF only:
  uint8_t lens[kNumSymbols];
  uint32_t enc[kNumSymbols];  // reversed code | length << 16
  int lo, hi;               // range of used non-zero symbols in the table
  uint64_t table_bytes;
  uint64_t nnz;             // elements that carry raw bytes
  int raw_width;            // raw bytes per non-zero element: 0, 1 or 3
  int n_segs;
  uint64_t units;           // 16-bit units over all segments
  uint16_t seg_units[kMaxSegmentsPerBlock];
  uint16_t seg_nnz[kMaxSegmentsPerBlock];
};

ZIPCCL_HD uint64_t TableBytes(int lo, int hi) {
  return 2 + (uint64_t(hi - lo + 2) + 1) / 2;
}

// The plan of a block whose elements all have the bits first_value.
ZIPCCL_HD void PlanConstBlock(uint32_t first_value, BlockPlan* p) {
  p->mode = kModeConst;
  p->flags = 0;
  p->const_value = first_value;
  p->block_bytes = kBlockHeaderBytes;
}

// Step 1 of a HUFF plan, once p->lens holds BuildCodeLengths(hist): canonical
// codes, table range, raw width, segment count. The mode is HUFF until
// PlanFinish says otherwise; units and seg_* are zero.
ZIPCCL_HD void PlanTable(const uint32_t* hist, uint64_t n, int elem_bytes, bool low16, BlockPlan* p) {
  p->const_value = 0;
  BuildEncodeTable(p->lens, p->enc);
  int lo = -1, hi = 0;
  for (int s = 0; s < kZeroSymbol; ++s) {
    if (hist[s]) {
      if (lo < 0) lo = s;
      hi = s;
    }
  }
  if (lo < 0) lo = 0;
  const bool use_low16 = low16 && elem_bytes == 4;
  p->lo = lo;
  p->hi = hi;
  p->table_bytes = TableBytes(lo, hi);
  p->nnz = n - hist[kZeroSymbol];
  p->raw_width = use_low16 ? 1 : elem_bytes - 1;
  p->n_segs = NumSegments(n);
  p->units = 0;
  for (int k = 0; k < kMaxSegmentsPerBlock; ++k) p->seg_units[k] = p->seg_nnz[k] = 0;
  p->mode = kModeHuff;
  p->flags = use_low16 ? kBlockFlagLow16 : 0;
}

// The exact size of the HUFF coding of a planned block with p->units units.
ZIPCCL_HD uint64_t HuffBlockBytes(const BlockPlan& p) {
  return kBlockHeaderBytes + p.table_bytes + uint64_t(p.n_segs) * kSegDirEntryBytes + 2 * p.units +
         p.nnz * uint64_t(p.raw_width);
}

// Step 2: HUFF if smaller than RAW (encoder rule 2), else RAW.
ZIPCCL_HD void PlanFinish(uint64_t n, int elem_bytes, BlockPlan* p) {
  const uint64_t raw_bytes = kBlockHeaderBytes + n * uint64_t(elem_bytes);
  const uint64_t huff = HuffBlockBytes(*p);
  if (huff < raw_bytes) {
    p->mode = kModeHuff;
    p->block_bytes = huff;
  } else {
    p->mode = kModeRaw;
    p->flags = 0;
    p->block_bytes = raw_bytes;
  }
}

// Step 1 of the plan. hist: symbol counts of the block; all_equal: every
// element has the bits of first_value; low16: (float32 only) every element's
// low 16 bits are zero. A HUFF plan still needs its units and PlanFinish.
ZIPCCL_HD void PlanBlock(const uint32_t* hist, uint64_t n, int elem_bytes,
                         bool all_equal, uint32_t first_value, bool low16,
                         BlockPlan* p, HuffmanWork& work) {
  if (all_equal) {
    PlanConstBlock(first_value, p);
    return;
  }
  BuildCodeLengths(hist, p->lens, work);
  PlanTable(hist, n, elem_bytes, low16, p);
}

ZIPCCL_HD void WriteBlockHeader(uint8_t* out, const BlockPlan& p) {
  out[0] = p.mode;
  out[1] = p.flags;
  out[2] = out[3] = 0;
  Store32(out + 4, p.const_value);
}

// Table: u8 lo, u8 hi, then 4-bit lengths (low nibble first) of the zero
// symbol and of symbols lo..hi; an odd count leaves a zero high nibble.
ZIPCCL_HD void WriteTable(uint8_t* out, const BlockPlan& p) {
  out[0] = uint8_t(p.lo);
  out[1] = uint8_t(p.hi);
  int n_nib = p.hi - p.lo + 2;
  for (int i = 0; i < n_nib; i += 2) {
    int a = p.lens[kZeroSymbol];
    if (i > 0) a = p.lens[p.lo + i - 1];
    int b = i + 1 < n_nib ? p.lens[p.lo + i] : 0;
    out[2 + i / 2] = uint8_t(a | (b << 4));
  }
}

// Parses a table from at most `avail` bytes. On success fills lens[257] and
// *table_bytes.
ZIPCCL_HD Status ParseTable(const uint8_t* in, uint64_t avail, uint8_t* lens,
                            uint64_t* table_bytes) {
  if (avail < 2) return kErrBlockSize;
  int lo = in[0], hi = in[1];
  if (hi < lo) return kErrTable;
  uint64_t tb = TableBytes(lo, hi);
  if (tb > avail) return kErrBlockSize;
  for (int s = 0; s < kNumSymbols; ++s) lens[s] = 0;
  int n_nib = hi - lo + 2;
  int used = 0;
  for (int i = 0; i < n_nib; ++i) {
    int nib = (in[2 + i / 2] >> (4 * (i & 1))) & 0xF;
    if (nib > kMaxCodeLen) return kErrTable;
    lens[i == 0 ? kZeroSymbol : lo + i - 1] = uint8_t(nib);
    used += nib != 0;
  }
  if ((n_nib & 1) && (in[2 + n_nib / 2] >> 4) != 0) return kErrReserved;
  if (used == 0) return kErrTable;
  *table_bytes = tb;
  return kOk;
}

// Layout of a HUFF block body after the 8-byte header, with every size
// checked against block_bytes. Offsets are relative to the block start; the
// units and raw bytes of segment k start seg_unit0[k] units and seg_raw0[k]
// non-zero elements into their regions.
struct HuffLayout {
  uint64_t table_off, dir_off, units_off, raw_off;
  uint64_t units, nnz;
  int raw_width, n_segs;
  uint32_t seg_units[kMaxSegmentsPerBlock], seg_nnz[kMaxSegmentsPerBlock];
  uint32_t seg_unit0[kMaxSegmentsPerBlock], seg_raw0[kMaxSegmentsPerBlock];
};

// Checks the segment directory: each segment's seg_nnz is at most its element
// count, its seg_units within SegmentUnitBounds, and the sizes add up to
// exactly block_bytes.
ZIPCCL_HD Status ParseHuffLayout(const uint8_t* block, uint64_t block_bytes,
                                 uint64_t n, int elem_bytes, uint8_t flags,
                                 uint8_t* lens, HuffLayout* L) {
  if ((flags & kBlockFlagLow16) && elem_bytes != 4) return kErrBlockMode;
  L->raw_width = (flags & kBlockFlagLow16) ? 1 : elem_bytes - 1;
  L->table_off = kBlockHeaderBytes;
  uint64_t tb = 0;
  Status st = ParseTable(block + L->table_off, block_bytes - L->table_off, lens, &tb);
  if (st != kOk) return st;
  L->n_segs = NumSegments(n);
  L->dir_off = L->table_off + tb;
  L->units_off = L->dir_off + uint64_t(L->n_segs) * kSegDirEntryBytes;
  if (L->units_off > block_bytes) return kErrBlockSize;
  uint32_t units = 0, nnz = 0;
  for (int k = 0; k < L->n_segs; ++k) {
    const uint8_t* d = block + L->dir_off + uint64_t(k) * kSegDirEntryBytes;
    const uint32_t seg_m = SegmentElemsOf(n, k), su = Load16(d), sn = Load16(d + 2);
    uint32_t lo = 0, hi = 0;
    SegmentUnitBounds(seg_m, &lo, &hi);
    if (sn > seg_m || su < lo || su > hi) return kErrStream;
    L->seg_units[k] = su;
    L->seg_nnz[k] = sn;
    L->seg_unit0[k] = units;
    L->seg_raw0[k] = nnz;
    units += su;
    nnz += sn;
  }
  L->units = units;
  L->nnz = nnz;
  L->raw_off = L->units_off + 2 * uint64_t(units);
  if (L->raw_off + uint64_t(nnz) * uint64_t(L->raw_width) != block_bytes) return kErrBlockSize;
  return kOk;
}

// One decoding step of a lane (both decoders): `buf` holds the lane's next
// `nbits` bits (the first in bit 0, zeros above). The lane takes the
// segment's next unit when the code its bits begin with is longer than them
// or matches no code (entry.len == 0): that is exactly when its code holds a
// unit's first bit (StartsUnit), so the decoder and the encoder agree on the
// order of the units without storing it.
ZIPCCL_HD bool NeedsUnit(const DecodeEntry& e, uint32_t nbits) { return e.len == 0 || e.len > nbits; }

}  // namespace zipccl
