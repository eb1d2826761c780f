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
  // Depths: the root is the last node; parents always have larger indices.
  uint16_t* depth = w.depth;
  depth[n_nodes - 1] = 0;
  int* count = w.count;
  for (int l = 0; l <= kNumSymbols; ++l) count[l] = 0;
  for (int i = n_nodes - 2; i >= 0; --i) {
    depth[i] = uint16_t(depth[parent[i]] + 1);
    if (i < m) ++count[depth[i]];
  }
  // Clamp to kMaxCodeLen and repair Kraft's inequality.
  for (int l = kMaxCodeLen + 1; l <= kNumSymbols; ++l) {
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

ZIPCCL_HD uint32_t ReverseBits(uint32_t v, int n) {
  uint32_t r = 0;
  for (int i = 0; i < n; ++i) r |= ((v >> i) & 1u) << (n - 1 - i);
  return r;
}

// Canonical codes (DEFLATE's rule: by length, then symbol), stored bit
// reversed because the bitstream is filled from the least significant bit.
// enc[s] = reversed_code | (length << 16). Returns false if the lengths
// over-subscribe the code space (Kraft sum > 1).
ZIPCCL_HD bool BuildEncodeTable(const uint8_t* lens, uint32_t* enc) {
  uint32_t count[kMaxCodeLen + 1] = {0};
  for (int s = 0; s < kNumSymbols; ++s) ++count[lens[s]];
  count[0] = 0;
  uint32_t next[kMaxCodeLen + 2];
  uint32_t code = 0, kraft = 0;
  for (int l = 1; l <= kMaxCodeLen; ++l) {
    code = (code + count[l - 1]) << 1;
    next[l] = code;
    kraft += count[l] << (kMaxCodeLen - l);
  }
  if (kraft > (1u << kMaxCodeLen)) return false;
  for (int s = 0; s < kNumSymbols; ++s) {
    int l = lens[s];
    enc[s] = l ? (ReverseBits(next[l]++, l) | (uint32_t(l) << 16)) : 0;
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

// The entries of symbol s in a zeroed table: every index whose low l bits are
// its (reversed) code. The codes are prefix-free, so symbols fill disjoint
// entries and the threads of a CTA can fill them in parallel.
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
