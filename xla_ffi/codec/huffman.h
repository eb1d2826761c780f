// Length-limited canonical Huffman code over the 257-symbol alphabet, shared by
// host and device. Every function is deterministic for a given histogram, so a
// CPU encoder, a CUDA encoder and the NumPy reference emit identical bytes.
//
// Why Huffman per block rather than a fixed Gaussian window: exponents of
// near-Gaussian data follow a discretised log-normal whose shape is fixed by
// theory, but its position (the block's scale) and its tail (gradients are
// heavy-tailed) vary. A per-block histogram is one counting pass, and the
// Huffman lengths it yields land within 1-3% of the block's exponent entropy,
// where a fixed window leaves 5-13% (measured in DESIGN.md).
#pragma once

#include <cstdint>

#include "format.h"

namespace zipccl {

// Work arrays of BuildCodeLengths (~5.7 KB). The CPU driver keeps one on the
// heap; the CUDA plan kernel keeps one in shared memory, so the kernel has no
// stack frame (as locals they took 4.6 KB of local memory per thread, which the
// driver reserves for every thread that can be resident on the device).
struct HuffmanWork {
  uint16_t order[kNumSymbols];  // used symbols by (count, symbol) ascending
  uint32_t weight[2 * kNumSymbols];
  uint16_t parent[2 * kNumSymbols];
  uint16_t depth[2 * kNumSymbols];
  int count[kNumSymbols + 1];
};

// Step 1 of BuildCodeLengths: order[0, m) = the used symbols sorted by (count
// ascending, symbol ascending); returns m.
ZIPCCL_HD int SortUsedSymbols(const uint32_t* hist, uint16_t* order) {
  int m = 0;
  for (int s = 0; s < kNumSymbols; ++s) {
    if (hist[s]) {
      // Insertion into the sorted prefix; m <= 257 so this stays cheap.
      int j = m++;
      while (j > 0 && (hist[order[j - 1]] > hist[s])) {
        order[j] = order[j - 1];
        --j;
      }
      order[j] = uint16_t(s);
    }
  }
  return m;
}

// The position of used symbol s in SortUsedSymbols' order, computed alone, so
// that the threads of a warp can place the symbols in parallel.
ZIPCCL_HD int SymbolRank(const uint32_t* hist, int s) {
  const uint32_t c = hist[s];
  int r = 0;
  for (int t = 0; t < kNumSymbols; ++t) r += hist[t] != 0 && (hist[t] < c || (hist[t] == c && t < s));
  return r;
}

// Steps 2-4 of BuildCodeLengths, from w.order[0, m).
ZIPCCL_HD void CodeLengthsFromOrder(const uint32_t* hist, int m, HuffmanWork& w, uint8_t* lens) {
  for (int s = 0; s < kNumSymbols; ++s) lens[s] = 0;
  const uint16_t* order = w.order;
  if (m == 0) return;
  if (m == 1) {
    lens[order[0]] = 1;
    return;
  }
  // Two-queue Huffman: nodes [0, m) are leaves in sorted order, [m, 2m-1)
  // internal nodes in creation order (their weights are non-decreasing).
  uint32_t* weight = w.weight;
  uint16_t* parent = w.parent;
  for (int i = 0; i < m; ++i) weight[i] = hist[order[i]];
  int next_leaf = 0, next_node = m, n_nodes = m;
  for (int k = 0; k < m - 1; ++k) {
    int pick[2];
    for (int t = 0; t < 2; ++t) {
      bool leaf = next_leaf < m &&
                  (next_node >= n_nodes || weight[next_leaf] <= weight[next_node]);
      pick[t] = leaf ? next_leaf++ : next_node++;
    }
    weight[n_nodes] = weight[pick[0]] + weight[pick[1]];
    parent[pick[0]] = parent[pick[1]] = uint16_t(n_nodes);
    ++n_nodes;
  }
  // Depths: the root is the last node; parents always have larger indices. A
  // tree of m leaves is at most m - 1 deep, so count[] is used up to m - 1 (the
  // bounds below keep the serial work of one GPU thread proportional to m).
  uint16_t* depth = w.depth;
  depth[n_nodes - 1] = 0;
  int* count = w.count;
  const int top = m > kMaxCodeLen ? m : kMaxCodeLen;
  for (int l = 0; l <= top; ++l) count[l] = 0;
  for (int i = n_nodes - 2; i >= 0; --i) {
    depth[i] = uint16_t(depth[parent[i]] + 1);
    if (i < m) ++count[depth[i]];
  }
  // Clamp to kMaxCodeLen and repair Kraft's inequality.
  for (int l = kMaxCodeLen + 1; l <= top; ++l) {
    count[kMaxCodeLen] += count[l];
    count[l] = 0;
  }
  uint32_t total = 0;
  for (int l = 1; l <= kMaxCodeLen; ++l) total += uint32_t(count[l]) << (kMaxCodeLen - l);
  while (total > (1u << kMaxCodeLen)) {
    --count[kMaxCodeLen];
    for (int l = kMaxCodeLen - 1; l > 0; --l) {
      if (count[l]) {
        --count[l];
        count[l + 1] += 2;
        break;
      }
    }
    --total;
  }
  int pos = 0;
  for (int l = kMaxCodeLen; l >= 1; --l)
    for (int c = 0; c < count[l]; ++c) lens[order[pos++]] = uint8_t(l);
}

// Code lengths in bits (0 = symbol unused) from a histogram of counts.
// Algorithm (normative for byte-identical encoders, see FORMAT.md):
//   1. sort used symbols by (count ascending, symbol ascending);
//   2. build a Huffman tree with the two-queue method, taking the leaf on ties;
//   3. if the tree is deeper than kMaxCodeLen, clamp and repair the Kraft sum
//      the way miniz does (move one code down a level per step);
//   4. hand lengths out again in sorted order, longest lengths to the rarest.
// A lone used symbol gets length 1.
ZIPCCL_HD void BuildCodeLengths(const uint32_t* hist, uint8_t* lens, HuffmanWork& w) {
  CodeLengthsFromOrder(hist, SortUsedSymbols(hist, w.order), w, lens);
}

// The low n bits of v in reverse order (n in [1, 32]). On the device one
// bit-reverse instruction (__brev); elsewhere (the CPU driver, the emulator,
// which runs the kernel bodies as host code) a loop with the same result.
ZIPCCL_HD uint32_t ReverseBits(uint32_t v, int n) {
#if defined(__CUDA_ARCH__)
  return __brev(v) >> (32 - n);
#else
  uint32_t r = 0;
  for (int i = 0; i < n; ++i) r |= ((v >> i) & 1u) << (n - 1 - i);
  return r;
#endif
}

// A canonical code (DEFLATE's rule: by length, then symbol) by code length l
// in bits, 1..kMaxCodeLen (index 0 unused): the codes of one length are
// consecutive in symbol order, and the first code of length l + 1 is
// (first[l] + count[l]) << 1. Each field fits 16 bits when the Kraft sum is at
// most 1 (first[l] + count[l] <= 2^l <= 2048, base[l] <= 257).
struct CanonicalCode {
  uint16_t first[kMaxCodeLen + 1];  // first (not reversed) code of length l
  uint16_t count[kMaxCodeLen + 1];  // symbols of length l
  uint16_t base[kMaxCodeLen + 1];   // position of the first of them in canonical order
};

// The canonical code of the code lengths lens[257] (0 = unused, at most
// kMaxCodeLen). Returns false if the lengths over-subscribe the code space
// (Kraft sum > 1); cc is then not a code.
ZIPCCL_HD bool CanonicalCodeOf(const uint8_t* lens, CanonicalCode& cc) {
  for (int l = 0; l <= kMaxCodeLen; ++l) cc.count[l] = 0;
  for (int s = 0; s < kNumSymbols; ++s) ++cc.count[lens[s]];
  cc.count[0] = 0;
  uint32_t code = 0, base = 0, kraft = 0;  // kraft in units of 2^-kMaxCodeLen
  for (int l = 1; l <= kMaxCodeLen; ++l) {
    code = (code + cc.count[l - 1]) << 1;
    cc.first[l] = uint16_t(code);
    cc.base[l] = uint16_t(base);
    base += cc.count[l];
    kraft += uint32_t(cc.count[l]) << (kMaxCodeLen - l);
  }
  return kraft <= (1u << kMaxCodeLen);
}

// sorted[0, used) = the used symbols in canonical order, so that the symbol of
// code cc.first[l] + k (k < cc.count[l]) is sorted[cc.base[l] + k].
ZIPCCL_HD void SortByCode(const uint8_t* lens, CanonicalCode& cc, uint16_t* sorted) {
  // cc.base[l] serves as the next free position of length l, so no cursor
  // array is needed (a kernel's locals would be local memory); it is restored
  // below, after the count[l] symbols of length l have been placed.
  for (int s = 0; s < kNumSymbols; ++s)
    if (lens[s]) sorted[cc.base[lens[s]]++] = uint16_t(s);
  for (int l = 1; l <= kMaxCodeLen; ++l) cc.base[l] = uint16_t(cc.base[l] - cc.count[l]);
}

// Canonical codes, stored bit reversed because the bitstream is filled from
// the least significant bit. enc[s] = reversed_code | (length << 16). Returns
// false if the lengths over-subscribe the code space (Kraft sum > 1).
ZIPCCL_HD bool BuildEncodeTable(const uint8_t* lens, uint32_t* enc) {
  CanonicalCode cc;
  if (!CanonicalCodeOf(lens, cc)) return false;
  for (int s = 0; s < kNumSymbols; ++s) {
    const int l = lens[s];
    // cc.first[l] counts up through the codes of length l, in symbol order.
    enc[s] = l ? (ReverseBits(cc.first[l]++, l) | (uint32_t(l) << 16)) : 0;
  }
  return true;
}

// One-symbol lookup: indexed by the next kMaxCodeLen stream bits.
struct DecodeEntry {
  uint16_t sym;
  uint8_t len;  // 0: no code starts with these bits (corrupt stream)
  uint8_t pad;
};

constexpr int kTableSize = 1 << kMaxCodeLen;

// Table entry i (the next kMaxCodeLen stream bits, the first in bit 0) of a
// valid canonical code, computed alone, so that the threads of a CTA can each
// fill their own entries (every thread the same number, whatever the code
// lengths). Reversed, i is a code prefix c; the codes of length l cover the
// prefixes [first[l] << (kMaxCodeLen - l), (first[l] + count[l]) << (kMaxCodeLen - l)),
// and these ranges follow each other from 0 as l grows (the lower end of l is
// the upper end of l - 1), so the first length whose upper end exceeds c is
// c's. Prefixes past the last range (an incomplete code) get {0, 0, 0}.
ZIPCCL_HD DecodeEntry DecodeEntryAt(uint32_t i, const CanonicalCode& cc, const uint16_t* sorted) {
  const uint32_t c = ReverseBits(i, kMaxCodeLen);
  for (int l = 1; l <= kMaxCodeLen; ++l) {
    const int shift = kMaxCodeLen - l;
    const uint32_t first = cc.first[l];
    if (c < ((first + cc.count[l]) << shift))
      return DecodeEntry{sorted[cc.base[l] + (c >> shift) - first], uint8_t(l), 0};
  }
  return DecodeEntry{0, 0, 0};
}

// The entries of symbol s in a zeroed table: every index whose low l bits are
// its (reversed) code. The codes are prefix-free, so symbols fill disjoint
// entries. The CPU driver's fill, and the reference that DecodeEntryAt is
// tested against (tests/cc/decode_table_test.cc).
ZIPCCL_HD void FillDecodeEntries(const uint32_t* enc, int s, DecodeEntry* table) {
  const int l = int(enc[s] >> 16);
  if (!l) return;
  for (uint32_t i = enc[s] & 0xFFFFu; i < uint32_t(kTableSize); i += 1u << l)
    table[i] = DecodeEntry{uint16_t(s), uint8_t(l), 0};
}

ZIPCCL_HD void BuildDecodeTable(const uint32_t* enc, DecodeEntry* table) {
  for (int i = 0; i < kTableSize; ++i) table[i] = DecodeEntry{0, 0, 0};
  for (int s = 0; s < kNumSymbols; ++s) FillDecodeEntries(enc, s, table);
}

}  // namespace zipccl
