// Per-block logic shared by the CPU driver and the CUDA kernels: how an element
// splits into a Huffman symbol and raw bytes, how a block chooses its mode, and
// how the HUFF block's table and stream directory are laid out and validated.
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

// ---- Block plan ------------------------------------------------------------
// What the first pass over a block decides, and the exact coded size.
struct BlockPlan {
  uint8_t mode;
  uint8_t flags;
  uint32_t const_value;     // CONST: the repeated element bits
  uint64_t block_bytes;     // exact coded size, header included
  // HUFF only:
  uint8_t lens[kNumSymbols];
  uint32_t enc[kNumSymbols];  // reversed code | length << 16
  int lo, hi;               // range of used non-zero symbols in the table
  uint64_t table_bytes;
  uint64_t total_bits;      // bitstream length over all streams
  uint64_t nnz;             // elements that carry raw bytes
  int raw_width;            // raw bytes per non-zero element: 1 or 3
  int n_streams;
};

ZIPCCL_HD int NumStreams(uint64_t n_block_elems) {
  return int((n_block_elems + uint64_t(kStreamElems) - 1) >> kStreamLog2);
}

ZIPCCL_HD uint64_t TableBytes(int lo, int hi) {
  return 2 + (uint64_t(hi - lo + 2) + 1) / 2;
}

// hist: symbol counts of the block; all_equal: every element has the bits of
// first_value; low16: (float32 only) every element's low 16 bits are zero.
ZIPCCL_HD void PlanBlock(const uint32_t* hist, uint64_t n, int elem_bytes,
                         bool all_equal, uint32_t first_value, bool low16,
                         BlockPlan* p) {
  p->flags = 0;
  p->const_value = 0;
  if (all_equal) {
    p->mode = kModeConst;
    p->const_value = first_value;
    p->block_bytes = kBlockHeaderBytes;
    return;
  }
  uint64_t raw_bytes = kBlockHeaderBytes + n * uint64_t(elem_bytes);
  BuildCodeLengths(hist, p->lens);
  BuildEncodeTable(p->lens, p->enc);
  int lo = -1, hi = 0;
  uint64_t bits = 0;
  for (int s = 0; s < kNumSymbols; ++s) {
    bits += uint64_t(hist[s]) * p->lens[s];
    if (s < kZeroSymbol && hist[s]) {
      if (lo < 0) lo = s;
      hi = s;
    }
  }
  if (lo < 0) lo = 0;
  bool use_low16 = low16 && elem_bytes == 4;
  p->lo = lo;
  p->hi = hi;
  p->table_bytes = TableBytes(lo, hi);
  p->total_bits = bits;
  p->nnz = n - hist[kZeroSymbol];
  p->raw_width = use_low16 ? 1 : elem_bytes - 1;
  p->n_streams = NumStreams(n);
  uint64_t huff = kBlockHeaderBytes + p->table_bytes +
                  uint64_t(p->n_streams) * kStreamDirEntryBytes + (bits + 7) / 8 +
                  p->nnz * uint64_t(p->raw_width);
  if (huff < raw_bytes) {
    p->mode = kModeHuff;
    p->flags = use_low16 ? kBlockFlagLow16 : 0;
    p->block_bytes = huff;
  } else {
    p->mode = kModeRaw;
    p->block_bytes = raw_bytes;
  }
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
// checked against block_bytes. Offsets are relative to the block start.
struct HuffLayout {
  uint64_t table_off, dir_off, bits_off, raw_off;
  uint64_t total_bits, nnz;
  int raw_width, n_streams;
};

// Checks the stream directory: each stream's nnz is at most its element
// count, and the sizes add up to exactly block_bytes.
ZIPCCL_HD Status ParseHuffLayout(const uint8_t* block, uint64_t block_bytes,
                                 uint64_t n, int elem_bytes, uint8_t flags,
                                 uint8_t* lens, HuffLayout* L) {
  if ((flags & kBlockFlagLow16) && elem_bytes != 4) return kErrBlockMode;
  L->raw_width = (flags & kBlockFlagLow16) ? 1 : elem_bytes - 1;
  L->table_off = kBlockHeaderBytes;
  uint64_t tb = 0;
  Status st = ParseTable(block + L->table_off, block_bytes - L->table_off, lens, &tb);
  if (st != kOk) return st;
  L->n_streams = NumStreams(n);
  L->dir_off = L->table_off + tb;
  L->bits_off = L->dir_off + uint64_t(L->n_streams) * kStreamDirEntryBytes;
  if (L->bits_off > block_bytes) return kErrBlockSize;
  uint64_t bits = 0, nnz = 0;
  for (int k = 0; k < L->n_streams; ++k) {
    const uint8_t* d = block + L->dir_off + uint64_t(k) * kStreamDirEntryBytes;
    uint64_t cnt = n - uint64_t(k) * kStreamElems;
    if (cnt > uint64_t(kStreamElems)) cnt = kStreamElems;
    uint64_t sb = Load16(d), sn = Load16(d + 2);
    if (sn > cnt || sb > cnt * kMaxCodeLen || sb < cnt) return kErrStream;
    bits += sb;
    nnz += sn;
  }
  L->total_bits = bits;
  L->nnz = nnz;
  L->raw_off = L->bits_off + (bits + 7) / 8;
  if (L->raw_off + nnz * uint64_t(L->raw_width) != block_bytes) return kErrBlockSize;
  return kOk;
}

}  // namespace zipccl
