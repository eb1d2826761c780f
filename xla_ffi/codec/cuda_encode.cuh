// CUDA driver of the zipccl codec: the encoder's kernel bodies (histogram,
// plan, block writer, frame finish, zero tail), in launch order. Templates over
// a CTA type (see cuda_common.cuh); compiles with nvcc and a host compiler.
#pragma once

#include "cuda_common.cuh"

namespace zipccl::cuda {

// =============================================================================
// Encoder kernels
// =============================================================================

// 1. Histogram: one CTA per block. Warp-private sub-histograms in shared
//    memory; runs of equal symbols within a thread's 8 elements are added at
//    once (zeros and flat exponent regions cost one atomic).
template <typename T>
struct HistKernel {
  static constexpr const char* kName = "zipccl_hist";
  static constexpr int kBlockThreads = kThreads;
  using Params = EncodeParams;
  struct Shared {
    uint32_t hist[kThreads / 32][kNumSymbols];
  };
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared& sm, const Params& p) {
    const uint64_t g = cta.block();
    const uint64_t f = g / p.nb, b = g % p.nb;
    if (Skipped(p, f)) return;  // the whole CTA: no statistics (nothing reads them)
    const uint64_t m = BlockElems(p.n, b);
    const uint8_t* xb = p.x + (f * p.n + (b << kBlockLog2)) * sizeof(T);
    const uint32_t tid = cta.tid(), warp = tid / 32;
    uint32_t* flat = &sm.hist[0][0];
    for (uint32_t i = tid; i < (kThreads / 32) * kNumSymbols; i += kThreads) flat[i] = 0;
    cta.sync();
    const uint32_t first = LoadElem<T>(xb);
    uint32_t diff = 0, low = 0;
    for (uint64_t tile = 0; tile * kStreamElems < m; ++tile) {
      uint32_t v[kElemsPerThread];
      const int cnt = LoadElems8<T>(xb, m, tile * kStreamElems + tid * kElemsPerThread, v);
      int prev = -1;
      uint32_t run = 0;
      for (int j = 0; j < cnt; ++j) {
        const int s = SymbolOf<T>(v[j]);
        diff |= v[j] ^ first;
        low |= v[j];
        if (s == prev) {
          ++run;
        } else {
          if (run) AtomicAddShared(&sm.hist[warp][prev], run);
          prev = s;
          run = 1;
        }
      }
      if (run) AtomicAddShared(&sm.hist[warp][prev], run);
    }
    const int any_diff = cta.sync_or(diff != 0);              // also a barrier
    const int any_low = cta.sync_or((low & 0xFFFFu) != 0);
    BlockStats& st = p.stats[g];
    for (uint32_t s = tid; s < uint32_t(kNumSymbols); s += kThreads) {
      uint32_t c = 0;
      for (int w = 0; w < kThreads / 32; ++w) c += sm.hist[w][s];
      st.hist[s] = c;
    }
    if (tid == 0) {
      st.first = first;
      st.all_equal = !any_diff;
      st.low16 = sizeof(T) == 4 && !any_low;
    }
  }
};

// 2. Plan: one warp (CTA) per block; the extra CTA `total` writes the
//    trailing 0 that makes the scan's last entry the grand total. Blocks of
//    skipped frames get size 0 and no plan. The lanes place the used symbols
//    in sorted order in parallel (SymbolRank), lane 0 builds the Huffman tree
//    and the plan (CodeLengthsFromOrder, PlanFromLengths: the CPU driver's
//    functions) on shared-memory work arrays and the histogram copied to shared
//    memory, then the warp copies the plan out. No local memory.
struct PlanKernel {
  static constexpr const char* kName = "zipccl_plan";
  static constexpr int kBlockThreads = 32;
  using Params = EncodeParams;
  struct Shared {
    // Padded to whole 16-byte words: ptxas vectorizes SymbolRank's loop over hist[0, 257) into 128-bit
    // loads, whose last one reads 12 bytes past hist[256]; unpadded, those were work.order[0, 6), which
    // other lanes write in the same phase (compute-sanitizer racecheck on an H200 reported it).
    uint32_t hist[(kNumSymbols + 3) / 4 * 4];
    HuffmanWork work;
    BlockPlan plan;
  };
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared& sm, const Params& p) {
    const uint64_t g = cta.block();
    const uint32_t tid = cta.tid();
    if (g >= p.total || Skipped(p, g / p.nb)) {  // uniform over the CTA
      if (tid == 0) p.sizes[g] = 0;
      return;
    }
    const BlockStats& st = p.stats[g];
    if (st.all_equal) {
      if (tid == 0) {
        PlanConstBlock(st.first, &p.plans[g]);
        p.sizes[g] = kBlockHeaderBytes;
      }
      return;
    }
    uint32_t used = 0;
    for (uint32_t s = tid; s < uint32_t(kNumSymbols); s += kBlockThreads) {
      sm.hist[s] = st.hist[s];
      used += st.hist[s] != 0;
    }
    cta.sync();
    for (uint32_t s = tid; s < uint32_t(kNumSymbols); s += kBlockThreads)
      if (sm.hist[s]) sm.work.order[SymbolRank(sm.hist, int(s))] = uint16_t(s);
    uint32_t m = 0;
    cta.exclusive_sum(used, &m);  // the count of used symbols; barriers on both sides
    BlockPlan& pl = sm.plan;
    if (tid == 0) {
      CodeLengthsFromOrder(sm.hist, int(m), sm.work, pl.lens);
      PlanFromLengths(sm.hist, BlockElems(p.n, g % p.nb), ElemBytes(p.dtype), st.low16 != 0, &pl);
      p.sizes[g] = pl.block_bytes;
    }
    cta.sync();
    BlockPlan& out = p.plans[g];
    for (uint32_t s = tid; s < uint32_t(kNumSymbols); s += kBlockThreads) {
      out.lens[s] = pl.lens[s];
      out.enc[s] = pl.enc[s];
    }
    if (tid == 0) {
      out.mode = pl.mode;
      out.flags = pl.flags;
      out.const_value = pl.const_value;
      out.block_bytes = pl.block_bytes;
      out.lo = pl.lo;
      out.hi = pl.hi;
      out.table_bytes = pl.table_bytes;
      out.total_bits = pl.total_bits;
      out.nnz = pl.nnz;
      out.raw_width = pl.raw_width;
      out.n_streams = pl.n_streams;
    }
  }
};

// 3. (between 2 and 4) ScanKernel (cuda_scan.cuh): sizes -> offsets.

// 4. Block writer: one CTA per block, skipped when the frame overflows or the
//    caller skips the frame. HUFF
//    blocks are written one 2048-element stream (tile) at a time:
//    - each thread codes its 8 elements; a CTA scan of (bits | nnz << 16)
//      gives its bit and raw-byte offsets and the stream directory entry;
//    - codes are OR-ed into a shared staging area whose words are the
//      4-aligned words of the destination, then whole words are stored
//      (clipped at the bitstream's ends); the last, partial word carries over
//      to the next tile. Raw bytes go through a second staging area the same
//      way, so every global store is a coalesced 32-bit store.
template <typename T>
struct WriteKernel {
  static constexpr const char* kName = "zipccl_write";
  static constexpr int kBlockThreads = kThreads;
  using Params = EncodeParams;
  struct Shared {
    uint32_t enc[kNumSymbols];
    uint32_t bits[kBitStageWords];
    uint32_t raw[kRawStageWords];
    uint32_t carry_bits, carry_raw;
  };
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared& sm, const Params& p) {
    const uint64_t g = cta.block();
    const uint64_t f = g / p.nb, b = g % p.nb;
    if (Skipped(p, f)) return;  // not a frame: ZeroTailKernel zeroes the row
    if (FrameBytesFromOffsets(p.offsets, p.nb, f) > p.cap) return;  // overflow: header only
    const uint64_t m = BlockElems(p.n, b);
    const uint8_t* xb = p.x + (f * p.n + (b << kBlockLog2)) * sizeof(T);
    uint8_t* frame = p.payload + f * p.cap;
    uint8_t* blk = frame + BlockOffsetInFrame(p.offsets, p.nb, g);
    const BlockPlan& pl = p.plans[g];
    const uint32_t tid = cta.tid();
    const uint8_t mode = pl.mode;
    if (tid == 0) {
      Store32(frame + kFrameHeaderBytes + b * kDirEntryBytes, uint32_t(pl.block_bytes));
      WriteBlockHeader(blk, pl);
    }
    if (mode == kModeConst) return;
    if (mode == kModeRaw) {
      uint8_t* body = blk + kBlockHeaderBytes;
      for (uint64_t e = tid; e < m; e += kThreads) {
        const uint32_t v = LoadElem<T>(xb + e * sizeof(T));
        for (unsigned i = 0; i < sizeof(T); ++i) body[e * sizeof(T) + i] = uint8_t(v >> (8 * i));
      }
      return;
    }
    // HUFF.
    if (tid == 0) WriteTable(blk + kBlockHeaderBytes, pl);
    for (uint32_t s = tid; s < uint32_t(kNumSymbols); s += kThreads) sm.enc[s] = pl.enc[s];
    const int n_streams = pl.n_streams;
    uint8_t* dir = blk + kBlockHeaderBytes + pl.table_bytes;
    uint8_t* bits = dir + uint64_t(n_streams) * kStreamDirEntryBytes;
    const uint64_t bit_bytes = (pl.total_bits + 7) / 8;
    uint8_t* raw = bits + bit_bytes;
    const uint64_t raw_bytes = pl.nnz * uint64_t(pl.raw_width);
    const int raw_w = pl.raw_width;
    const bool low16 = (pl.flags & kBlockFlagLow16) != 0;
    // Staging coordinates: stage word 0 is the aligned destination word
    // containing the next bit (byte) to be produced.
    uint8_t* const bits_base = bits - (reinterpret_cast<uintptr_t>(bits) & 3);
    uint8_t* const raw_base = raw - (reinterpret_cast<uintptr_t>(raw) & 3);
    uint64_t bit_q = (reinterpret_cast<uintptr_t>(bits) & 3) * 8;  // bits since bits_base
    uint64_t raw_q = reinterpret_cast<uintptr_t>(raw) & 3;         // bytes since raw_base
    for (int i = tid; i < kBitStageWords; i += kThreads) sm.bits[i] = 0;
    for (int i = tid; i < kRawStageWords; i += kThreads) sm.raw[i] = 0;
    cta.sync();
    for (int k = 0; k < n_streams; ++k) {
      uint32_t v[kElemsPerThread];
      const int cnt = LoadElems8<T>(xb, m, uint64_t(k) * kStreamElems + tid * kElemsPerThread, v);
      uint32_t code[kElemsPerThread];
      uint32_t my_bits = 0, my_nz = 0;
      for (int j = 0; j < cnt; ++j) {
        const int s = SymbolOf<T>(v[j]);
        code[j] = sm.enc[s];
        my_bits += code[j] >> 16;
        my_nz += v[j] != 0;
      }
      uint32_t agg = 0;
      const uint32_t excl = cta.exclusive_sum(my_bits | (my_nz << 16), &agg);
      const uint32_t t_bits = agg & 0xFFFFu, t_nz = agg >> 16;
      if (tid == 0) {
        Store16(dir + uint64_t(k) * kStreamDirEntryBytes, uint16_t(t_bits));
        Store16(dir + uint64_t(k) * kStreamDirEntryBytes + 2, uint16_t(t_nz));
      }
      // Codes: up to 88 bits starting anywhere in a word -> a 128-bit OR.
      {
        const uint32_t at = uint32_t(bit_q & 31) + (excl & 0xFFFFu);
        uint64_t lo = 0, hi = 0;
        uint32_t sh = at & 31;
        for (int j = 0; j < cnt; ++j) {
          const uint64_t c = code[j] & 0xFFFFu;
          const uint32_t len = code[j] >> 16;
          if (sh < 64) {
            lo |= c << sh;
            if (sh + len > 64) hi |= c >> (64 - sh);
          } else {
            hi |= c << (sh - 64);
          }
          sh += len;
        }
        uint32_t* w = sm.bits + (at >> 5);
        if (uint32_t(lo)) AtomicOrShared(w, uint32_t(lo));
        if (uint32_t(lo >> 32)) AtomicOrShared(w + 1, uint32_t(lo >> 32));
        if (uint32_t(hi)) AtomicOrShared(w + 2, uint32_t(hi));
        if (uint32_t(hi >> 32)) AtomicOrShared(w + 3, uint32_t(hi >> 32));
      }
      // Raw bytes of the non-zero elements, in element order (none for one-byte floats).
      if (sizeof(T) > 1) {
        uint8_t* r = reinterpret_cast<uint8_t*>(sm.raw) + (raw_q & 3) + (excl >> 16) * raw_w;
        for (int j = 0; j < cnt; ++j) {
          if (!v[j]) continue;
          if (sizeof(T) == 2 || low16) {
            *r++ = uint8_t(Raw16(sizeof(T) == 2 ? v[j] : v[j] >> 16));
          } else {
            const uint32_t w3 = Raw32(v[j]);
            r[0] = uint8_t(w3);
            r[1] = uint8_t(w3 >> 8);
            r[2] = uint8_t(w3 >> 16);
            r += 3;
          }
        }
      }
      cta.sync();
      const uint64_t end_bits = (bit_q & 31) + t_bits;           // stage-relative
      const uint64_t end_raw = (raw_q & 3) + uint64_t(t_nz) * raw_w;
      const uint32_t full_bits = uint32_t(end_bits >> 5), full_raw = uint32_t(end_raw >> 2);
      uint8_t* const bw = bits_base + (bit_q >> 5) * 4;
      uint8_t* const rw = raw_base + (raw_q >> 2) * 4;
      for (uint32_t i = tid; i < full_bits; i += kThreads)
        StoreWordClipped(bw + 4 * uint64_t(i), sm.bits[i], bits, bits + bit_bytes);
      for (uint32_t i = tid; i < full_raw; i += kThreads)
        StoreWordClipped(rw + 4 * uint64_t(i), sm.raw[i], raw, raw + raw_bytes);
      if (tid == 0) {
        sm.carry_bits = sm.bits[full_bits];
        sm.carry_raw = sm.raw[full_raw];
      }
      cta.sync();
      for (int i = tid; i < kBitStageWords; i += kThreads) sm.bits[i] = i == 0 ? sm.carry_bits : 0;
      for (int i = tid; i < kRawStageWords; i += kThreads) sm.raw[i] = i == 0 ? sm.carry_raw : 0;
      bit_q += t_bits;
      raw_q += uint64_t(t_nz) * raw_w;
      cta.sync();
    }
    // The last, partial words.
    if (tid == 0) {
      StoreWordClipped(bits_base + (bit_q >> 5) * 4, sm.bits[0], bits, bits + bit_bytes);
      StoreWordClipped(raw_base + (raw_q >> 2) * 4, sm.raw[0], raw, raw + raw_bytes);
    }
  }
};

// 5. Finish: one CTA of kSumThreads per frame. Thread 0 writes the frame
//    header (or, on overflow, the header alone with frame_bytes = the size
//    needed) and the frame size (0 and no header for a skipped frame); the CTA
//    then computes the optional checksum (CtaFrameChecksum), which thread 0
//    stores.
struct FinishEncodeKernel {
  static constexpr const char* kName = "zipccl_finish";
  static constexpr int kBlockThreads = kSumThreads;
  using Params = EncodeParams;
  struct Shared {
    ChecksumShared sum;
    uint64_t hash_bytes;  // the frame's size if it gets a checksum, else 0
  };
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared& sm, const Params& p) {
    const uint64_t f = cta.block();
    if (f >= p.frames) return;
    uint8_t* out = p.payload + f * p.cap;
    if (cta.tid() == 0) {
      const uint64_t need = Skipped(p, f) ? 0 : FrameBytesFromOffsets(p.offsets, p.nb, f);
      sm.hash_bytes = 0;
      if (Skipped(p, f)) {
      } else if (need > p.cap) {
        if (p.cap >= kFrameHeaderBytes) WriteFrameHeader(out, p.dtype, 0, p.n, need, 0);
      } else {
        WriteFrameHeader(out, p.dtype, p.checksum ? kFrameFlagChecksum : 0, p.n, need, 0);
        if (p.checksum) sm.hash_bytes = need;
      }
      if (p.nbytes64)
        static_cast<int64_t*>(p.nbytes)[f] = int64_t(need);
      else
        static_cast<int32_t*>(p.nbytes)[f] = int32_t(need);  // the caller checked the bound
    }
    cta.sync();  // the header is in global memory before the CTA hashes it
    if (sm.hash_bytes) {
      const uint32_t sum = CtaFrameChecksum(cta, sm.sum, out, sm.hash_bytes);
      if (cta.tid() == 0) Store32(out + 28, sum);
    }
  }
};

// 6. Zero the payload past the frame (past the header after an overflow), as
//    the CPU handler does: the padded transport sends all `cap` bytes, and
//    XLA reuses output buffers, so stale device memory must not reach peers.
//    The whole row of a skipped frame is zeroed. The grid is sized by bytes:
//    TilesPerFrame(cap) CTAs per frame, each zeroing its kTileBytes of the row
//    with 16-byte stores (byte stores only for the up to 15 bytes at each end
//    of the range, whose alignment is arbitrary: rows start at f * cap).
struct ZeroTailKernel : NoShared {
  static constexpr const char* kName = "zipccl_zero_tail";
  static constexpr int kBlockThreads = kThreads;
  static constexpr uint64_t kTileBytes = 16 * uint64_t(kThreads) * 4;  // 16 KB per CTA
  using Params = EncodeParams;
  ZIPCCL_HD static uint64_t TilesPerFrame(uint64_t cap) { return CeilDiv(cap, kTileBytes); }
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared&, const Params& p) {
    const uint64_t tiles = TilesPerFrame(p.cap);
    const uint64_t f = cta.block() / tiles, tile = cta.block() % tiles;
    if (f >= p.frames) return;
    const uint64_t need = FrameBytesFromOffsets(p.offsets, p.nb, f);
    const uint64_t keep = Skipped(p, f) ? 0
                          : need <= p.cap ? need
                          : (p.cap < kFrameHeaderBytes ? p.cap : kFrameHeaderBytes);
    const uint64_t lo = keep > tile * kTileBytes ? keep : tile * kTileBytes;
    const uint64_t hi = p.cap < (tile + 1) * kTileBytes ? p.cap : (tile + 1) * kTileBytes;
    if (lo >= hi) return;
    uint8_t* const a = p.payload + f * p.cap + lo;
    uint8_t* const b = a + (hi - lo);
    const uintptr_t ua = reinterpret_cast<uintptr_t>(a), ub = reinterpret_cast<uintptr_t>(b);
    uint8_t* const a16 = ((ua + 15) & ~uintptr_t(15)) < ub ? a + (((ua + 15) & ~uintptr_t(15)) - ua) : b;
    uint8_t* const b16 = a16 + ((b - a16) & ~ptrdiff_t(15));
    const uint32_t tid = cta.tid();
    if (tid < uint32_t(a16 - a)) a[tid] = 0;
    if (tid < uint32_t(b - b16)) b16[tid] = 0;
    const uint32_t zero[4] = {0, 0, 0, 0};
    for (uint8_t* q = a16 + 16 * uint64_t(tid); q < b16; q += 16 * uint64_t(kThreads)) Store16B(q, zero);
  }
};

}  // namespace zipccl::cuda
