// CUDA driver of the zipccl codec: the decoder's kernel bodies (frame check,
// directory gather, block decoder, poison, status), in launch order. Templates
// over a CTA type (see cuda_common.cuh); compiles with nvcc and a host compiler.
#pragma once

#include "cuda_common.cuh"

namespace zipccl::cuda {

// =============================================================================
// Decoder kernels
// =============================================================================

// 3. Frame check: one CTA of kSumThreads per frame, after the directory scan
//    (the checksum's parts are the blocks the directory delimits). Thread 0
//    validates the header; if the frame has a checksum, the CTA recomputes it
//    (CtaFrameChecksum). A skipped frame is not read: it gets kSkippedKey,
//    which keeps the block decoder away from it and makes the poison kernel
//    write zeros.
struct FrameCheckKernel {
  static constexpr const char* kName = "zipccl_frame_check";
  static constexpr int kBlockThreads = kSumThreads;
  using Params = DecodeParams;
  struct Shared {
    uint64_t frame_bytes;
    unsigned long long key;
    uint32_t expect;  // the header's checksum
    int hash;         // the header is valid and has a checksum
  };
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared& sm, const Params& p) {
    const uint64_t f = cta.block();
    if (f >= p.frames) return;
    const uint8_t* in = p.payload + f * p.cap;
    if (cta.tid() == 0) {
      unsigned long long key = kNoError;
      int hash = 0;
      FrameHeader h{};
      if (Skipped(p, f)) {
        key = kSkippedKey;
      } else if (p.cap < kFrameHeaderBytes) {
        key = kErrTruncated;
      } else {
        h = ParseFrameHeader(in);
        const Status st = ValidateFrameHeader(h, p.dtype, p.n, p.cap);
        if (st != kOk) key = st;
        else hash = (h.flags & kFrameFlagChecksum) != 0;
      }
      sm.key = key;
      sm.hash = hash;
      sm.frame_bytes = h.frame_bytes;
      sm.expect = h.checksum;
    }
    cta.sync();
    if (sm.hash) {
      const uint32_t sum =
          CtaFrameChecksum(cta, in, sm.frame_bytes, p.nb, p.offsets, f * p.nb, p.hashes + f * p.nb);
      if (cta.tid() == 0 && sum != sm.expect) sm.key = kErrChecksum;
    }
    if (cta.tid() == 0) {
      p.ferr[f] = sm.key;
      p.berr[f] = kNoError;
    }
  }
};

// 1. Directory gather: one thread per block copies its directory entry (0 if
//    the payload cannot hold it; such a frame fails its header check anyway;
//    0 without reading it for a skipped frame).
struct DirKernel : PerItemKernel<DecodeParams> {
  static constexpr const char* kName = "zipccl_dir";
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared&, const Params& p) {
    const uint64_t g = Item(cta);
    if (g > p.total) return;
    if (g == p.total) {
      p.sizes[g] = 0;
      return;
    }
    const uint64_t f = g / p.nb, b = g % p.nb;
    const uint64_t at = kFrameHeaderBytes + b * kDirEntryBytes;
    p.sizes[g] = !Skipped(p, f) && at + kDirEntryBytes <= p.cap
                     ? Load32(p.payload + f * p.cap + at)
                     : 0;
  }
};

// 2. (between 1 and 3) ScanKernel (cuda_scan.cuh): sizes -> offsets.

// The element of symbol s with its raw bytes at q (the inverse of SymbolOf<T>
// and Raw16/32: one-byte floats have none; LOW16 float32 blocks one).
template <typename T>
ZIPCCL_HD uint32_t MergeElem(int s, const uint8_t* q, bool low16) {
  if (sizeof(T) == 1) return Merge8(s);
  if (sizeof(T) == 2) return Merge16(s, q[0]);
  if (low16) return Merge16(s, q[0]) << 16;
  return Merge32(s, q[0] | (uint32_t(q[1]) << 8) | (uint32_t(q[2]) << 16));
}

// The element of symbol s with its raw bytes packed little-endian in r (the
// raw bytes MergeElem reads from memory).
template <typename T>
ZIPCCL_HD uint32_t MergePacked(int s, uint32_t r, bool low16) {
  if (sizeof(T) == 1) return Merge8(s);
  if (sizeof(T) == 2) return Merge16(s, r & 0xFFu);
  if (low16) return Merge16(s, r & 0xFFu) << 16;
  return Merge32(s, r & 0xFFFFFFu);
}

// 4. Block decoder: one CTA of kSegThreads per block.
//    - Thread 0 checks the block header, parses the table and segment
//      directory (ParseHuffLayout), checks Kraft and derives the canonical
//      code (CanonicalCodeOf) and the symbols in code order (SortByCode). Then
//      every thread fills kTableSize / kSegThreads = 16 entries of the lookup
//      table in shared memory (DecodeEntryAt: entries tid, tid + 128, ...), so
//      the fill is balanced whatever the code lengths and every entry is
//      written once, behind one barrier.
//    - Warp w decodes segment w in rounds of kRoundSteps steps; at step t lane
//      l decodes element 32 t + l. Decode phase: a lane looks its code up in
//      the bits it holds; the lanes that need a unit (NeedsUnit) take the
//      segment's next units, in lane order, from one cursor (a ballot and a
//      population count: no per-lane offsets), and look up again. The units
//      come from a window in registers: lane k holds units base + k, + 32 and
//      + 64 (coalesced loads issued a window ahead), and a lane reads unit
//      `slot` from lane (slot - base) mod 32 with two shuffles, so no global
//      load is on the chain of lookups. Each step's symbols go to shared
//      memory with the ballot of its non-zero elements. Merge phase: lane l
//      joins the round's symbols of its lane with their raw bytes (the raw
//      index is a running count over the round's ballots, so the loads are
//      independent of each other) and the warp stores 32 elements side by
//      side per step.
//    - A lane that fails (no code, the segment's units exhausted) ends its
//      warp's decoding at the end of the round. The block's verdict, in the
//      CPU decoder's order: kErrStream if a segment failed to decode or took
//      fewer units than seg_units; else kErrReserved if a lane's leftover bits
//      are not zero; else kErrStream if a segment's non-ZERO symbols are not
//      seg_nnz (the merge never reads past a segment's raw bytes). A rejected
//      block's elements are overwritten by zipccl_poison.
constexpr int kRoundSteps = 32;
static_assert(kSegmentSteps % kRoundSteps == 0, "rounds tile a segment");

template <typename T>
struct DecodeBlockKernel {
  static constexpr const char* kName = "zipccl_decode_block";
  static constexpr int kBlockThreads = kSegThreads;
  using Params = DecodeParams;
  static constexpr uint16_t kNoSym = 0xFFFF;  // a lane with no element at that step
  struct Shared {
    DecodeEntry table[kTableSize];
    uint16_t syms[kMaxSegmentsPerBlock][kRoundSteps][kLanes];  // a round's symbols, per warp
    uint32_t nz[kMaxSegmentsPerBlock][kRoundSteps];            // and each step's non-zero ballot
    uint8_t lens[kNumSymbols];
    CanonicalCode code;
    uint16_t sorted[kNumSymbols];
    HuffLayout L;
    int status;
    uint32_t value;
    uint8_t mode, flags;
  };
  // Thread 0: the block header and, for HUFF, the layout and the code.
  ZIPCCL_HD static Status CheckBlock(Shared& sm, const uint8_t* blk, uint64_t bb, uint64_t m, int w) {
    if (bb < kBlockHeaderBytes) return kErrBlockSize;
    sm.mode = blk[0];
    sm.flags = blk[1];
    sm.value = Load32(blk + 4);
    if (blk[2] || blk[3]) return kErrReserved;
    if (sm.mode == kModeRaw) {
      if (sm.flags) return kErrBlockMode;
      if (sm.value) return kErrReserved;
      return bb != kBlockHeaderBytes + m * w ? kErrBlockSize : kOk;
    }
    if (sm.mode == kModeConst) {
      if (sm.flags) return kErrBlockMode;
      if (uint64_t(sm.value) >> (8 * w)) return kErrReserved;  // bits above the element
      return bb != kBlockHeaderBytes ? kErrBlockSize : kOk;
    }
    if (sm.mode != kModeHuff) return kErrBlockMode;
    if (sm.flags & kBlockFlagsReserved) return kErrReserved;
    if (sm.value) return kErrReserved;
    Status st = ParseHuffLayout(blk, bb, m, w, sm.flags, sm.lens, &sm.L);
    if (st == kOk && !CanonicalCodeOf(sm.lens, sm.code)) st = kErrTable;  // Kraft: the CPU's test
    if (st == kOk) SortByCode(sm.lens, sm.code, sm.sorted);
    return st;
  }
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared& sm, const Params& p) {
    const uint64_t g = cta.block();
    const uint64_t f = g / p.nb, b = g % p.nb;
    if (p.ferr[f] != kNoError) return;  // the frame is rejected as a whole, or skipped
    const uint8_t* in = p.payload + f * p.cap;
    const uint32_t tid = cta.tid();
    // The blocks must tile the frame (the same test in every CTA of the frame).
    if (FrameBytesFromOffsets(p.offsets, p.nb, f) != Load64(in + 16)) {
      if (tid == 0) AtomicMinGlobal(&p.berr[f], kErrFrameSize);
      return;
    }
    const uint64_t m = BlockElems(p.n, b);
    const uint64_t bb = p.sizes[g];
    const uint8_t* blk = in + BlockOffsetInFrame(p.offsets, p.nb, g);
    uint8_t* out = p.out + (f * p.out_row + (b << kBlockLog2)) * sizeof(T);
    const int w = int(sizeof(T));
    if (tid == 0) sm.status = CheckBlock(sm, blk, bb, m, w);
    cta.sync();
    if (sm.status != kOk) {
      if (tid == 0) AtomicMinGlobal(&p.berr[f], BlockErrorKey(b, sm.status));
      return;
    }
    if (sm.mode == kModeRaw) {
      const uint8_t* body = blk + kBlockHeaderBytes;
      for (uint64_t e = tid; e < m; e += kSegThreads) {
        uint32_t v = 0;
        for (int i = 0; i < w; ++i) v |= uint32_t(body[e * w + i]) << (8 * i);
        StoreElem<T>(out + e * w, v);
      }
      return;
    }
    if (sm.mode == kModeConst) {
      for (uint64_t e = tid; e < m; e += kSegThreads) StoreElem<T>(out + e * w, sm.value);
      return;
    }
    for (uint32_t i = tid; i < uint32_t(kTableSize); i += kSegThreads)
      sm.table[i] = DecodeEntryAt(i, sm.code, sm.sorted);
    cta.sync();
    const int status = DecodeSegment(cta, sm, blk, m, out);
    if (status != kOk && tid == 0) AtomicMinGlobal(&p.berr[f], BlockErrorKey(b, status));
  }
  // Warp w's segment (above); every thread returns the block's status.
  template <class Cta>
  ZIPCCL_HD static int DecodeSegment(Cta& cta, Shared& sm, const uint8_t* blk, uint64_t m, uint8_t* out) {
    const uint32_t tid = cta.tid(), warp = tid / kLanes, lane = tid % kLanes, below = (1u << lane) - 1;
    const int seg = int(warp);
    const HuffLayout& L = sm.L;
    const bool has_seg = seg < L.n_segs;
    const uint32_t seg_m = has_seg ? SegmentElemsOf(m, seg) : 0;
    const uint32_t seg_units = has_seg ? L.seg_units[seg] : 0, seg_nnz = has_seg ? L.seg_nnz[seg] : 0;
    const uint8_t* units = blk + L.units_off + 2 * uint64_t(has_seg ? L.seg_unit0[seg] : 0);
    const int raw_w = L.raw_width;
    const uint8_t* raw = blk + L.raw_off + uint64_t(has_seg ? L.seg_raw0[seg] : 0) * raw_w;
    const bool low16 = (sm.flags & kBlockFlagLow16) != 0;
    uint8_t* const os = out + (uint64_t(seg) << kSegmentLog2) * sizeof(T);
    auto unit_at = [&](uint32_t i) -> uint32_t {
      return i < seg_units ? uint32_t(units[2 * uint64_t(i)]) | (uint32_t(units[2 * uint64_t(i) + 1]) << 8) : 0u;
    };
    uint32_t base = 0, win0 = unit_at(lane), win1 = unit_at(kLanes + lane), win2 = unit_at(2 * kLanes + lane);
    uint32_t buf = 0, nbits = 0;          // the lane's next bits (first in bit 0), zeros above
    uint32_t cursor = 0, raw_cursor = 0;  // the warp's next unit and raw slots
    bool bad = false, warp_bad = false, raw_bad = false;
    const int rounds = (BlockSteps(m) + kRoundSteps - 1) / kRoundSteps;  // uniform over the CTA
    for (int r = 0; r < rounds; ++r) {
      for (int j = 0; j < kRoundSteps; ++j) {  // decode phase
        const uint32_t e = uint32_t(r * kRoundSteps + j) * kLanes + lane;
        const bool active = !warp_bad && !bad && e < seg_m;
        DecodeEntry ent = sm.table[buf & (kTableSize - 1)];
        const bool need = active && NeedsUnit(ent, nbits);
        const uint32_t need_mask = cta.ballot(need);
        const uint32_t slot = cursor + Popc(need_mask & below), off = slot - base;  // off < 64
        const uint32_t lo = cta.shfl(win0, off % kLanes), hi = cta.shfl(win1, off % kLanes);
        if (need) {
          if (slot >= seg_units) {
            bad = true;
          } else {
            buf |= (off < uint32_t(kLanes) ? lo : hi) << nbits;  // nbits <= 25: no bits lost
            nbits += kUnitBits;
            ent = sm.table[buf & (kTableSize - 1)];
            if (NeedsUnit(ent, nbits)) bad = true;
          }
        }
        cursor += Popc(need_mask);
        if (cursor - base >= uint32_t(kLanes)) {  // uniform over the warp: slide the window
          base += kLanes;
          win0 = win1;
          win1 = win2;
          win2 = unit_at(base + 2 * kLanes + lane);
        }
        const bool ok = active && !bad;
        if (ok) {
          buf >>= ent.len;
          nbits -= ent.len;
        }
        sm.syms[warp][j][lane] = ok ? ent.sym : kNoSym;
        const uint32_t nz_mask = cta.ballot(ok && ent.sym != kZeroSymbol);
        if (lane == 0) sm.nz[warp][j] = nz_mask;
      }
      warp_bad = cta.ballot(bad) != 0;
      cta.warp_sync();  // the round's symbols and ballots, from every lane of the warp
      for (int j = 0; j < kRoundSteps && !warp_bad; ++j) {  // merge phase
        const uint32_t e = uint32_t(r * kRoundSteps + j) * kLanes + lane;
        const uint32_t nz = sm.nz[warp][j], ri = raw_cursor + Popc(nz & below);
        const int s = sm.syms[warp][j][lane];
        raw_cursor += Popc(nz);
        if (s == kNoSym) continue;
        uint32_t v = 0;
        if (s != kZeroSymbol) {
          if (ri >= seg_nnz) {  // more non-ZERO symbols than seg_nnz: judged after the padding
            raw_bad = true;
            continue;
          }
          uint32_t packed = 0;
          for (int k = 0; k < raw_w; ++k) packed |= uint32_t(raw[uint64_t(ri) * raw_w + k]) << (8 * k);
          v = MergePacked<T>(s, packed, low16);
        }
        StoreElem<T>(os + uint64_t(e) * sizeof(T), v);
      }
      cta.warp_sync();  // the merge has read the round's symbols before the next round writes them
    }
    // The CPU decoder's order of verdicts: decoding errors, then padding, then the non-ZERO count.
    if (has_seg && !warp_bad && cursor != seg_units) bad = true;
    if (has_seg && raw_cursor != seg_nnz) raw_bad = true;
    const bool pad = buf != 0;  // a lane's leftover bits after its last code are reserved
    int status = cta.sync_or(bad) ? kErrStream : kOk;
    if (cta.sync_or(pad) && status == kOk) status = kErrReserved;
    if (cta.sync_or(raw_bad) && status == kOk) status = kErrStream;
    return status;
  }
};

// 5. Poison: the elements of a rejected frame are all set to a quiet NaN, so
//    a decode error cannot pass silently (the status output, when requested,
//    says why); those of a skipped frame to zero. One CTA per block.
template <typename T>
struct PoisonKernel : NoShared {
  static constexpr const char* kName = "zipccl_poison";
  static constexpr int kBlockThreads = kThreads;
  using Params = DecodeParams;
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared&, const Params& p) {
    const uint64_t g = cta.block();
    const uint64_t f = g / p.nb, b = g % p.nb;
    if (p.ferr[f] == kNoError && p.berr[f] == kNoError) return;
    const uint32_t fill = p.ferr[f] == kSkippedKey ? 0u : RejectedFillBits(p.dtype);
    const uint64_t m = BlockElems(p.n, b);
    uint8_t* out = p.out + (f * p.out_row + (b << kBlockLog2)) * sizeof(T);
    for (uint64_t e = cta.tid(); e < m; e += kThreads) StoreElem<T>(out + e * sizeof(T), fill);
  }
};

// 6. Status (only when the caller asked for it): int32 per frame, 0 or the
//    Status code of format.h.
struct StatusKernel : PerItemKernel<DecodeParams> {
  static constexpr const char* kName = "zipccl_status";
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared&, const Params& p) {
    const uint64_t f = Item(cta);
    if (f >= p.frames) return;
    const unsigned long long key = p.ferr[f] < p.berr[f] ? p.ferr[f] : p.berr[f];
    p.status[f] = KeyStatus(key);
  }
};

}  // namespace zipccl::cuda
