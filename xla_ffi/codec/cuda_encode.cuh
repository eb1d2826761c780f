// CUDA driver of the zipccl codec: the encoder's kernel bodies (histogram,
// plan and units count in one kernel, block writer, frame finish, zero tail),
// in launch order. Templates over
// a CTA type (see cuda_common.cuh); compiles with nvcc and a host compiler.
#pragma once

#include "cuda_common.cuh"

namespace zipccl::cuda {

// =============================================================================
// Encoder kernels
// =============================================================================

// 1. Analyse: one CTA of kSegThreads per block, three phases on one read of
//    the block (the second pass reads it again, from L2 mostly):
//    - histogram: warp-private sub-histograms in shared memory; runs of
//      equal symbols within a thread's 8 elements are added at once (zeros and
//      flat exponent regions cost one atomic); whether all elements are equal
//      and (float32) all low halves zero;
//    - plan: a CONST block is sized at once; else the threads place the used
//      symbols in sorted order in parallel (SymbolRank), thread 0 builds the
//      Huffman tree and the table step of the plan (CodeLengthsFromOrder,
//      PlanTable: the CPU driver's functions) on shared-memory work arrays;
//    - units: warp w adds up the code lengths of segment w's lanes (lane l:
//      elements 32 t + l, a coalesced load per step); each lane's units
//      (LaneUnits) and the non-zero elements go into the segment's totals,
//      and thread 0 finishes the plan (PlanFinish: HUFF or RAW), writes the
//      block's size and the plan.
//    Skipped frames' blocks get size 0 and no plan; the extra CTA `total`
//    writes the trailing 0 that makes the scan's last entry the grand total.
constexpr int kWriteBatch = 8;  // steps whose element loads a lane issues together
static_assert(kSegmentSteps % kWriteBatch == 0, "batches tile a segment");

template <typename T>
struct AnalyseKernel {
  static constexpr const char* kName = "zipccl_analyse";
  static constexpr int kBlockThreads = kSegThreads;
  static constexpr int kWarps = kSegThreads / kLanes;
  using Params = EncodeParams;
  struct Shared {
    uint32_t sub[kWarps][kNumSymbols];  // the histogram phase's warp-private counts
    // Padded to whole 16-byte words: ptxas vectorizes SymbolRank's loop over hist[0, 257) into 128-bit
    // loads, whose last one reads 12 bytes past hist[256]; unpadded, those were the next field, which
    // other threads write in the same phase (compute-sanitizer racecheck on an H200 reported it for v1).
    uint32_t hist[(kNumSymbols + 3) / 4 * 4];
    HuffmanWork work;
    BlockPlan plan;
    uint32_t seg_units[kMaxSegmentsPerBlock], seg_nnz[kMaxSegmentsPerBlock];
  };
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared& sm, const Params& p) {
    const uint64_t g = cta.block();
    const uint32_t tid = cta.tid();
    if (g >= p.total || Skipped(p, g / p.nb)) {  // uniform over the CTA
      if (tid == 0) p.sizes[g] = 0;
      return;
    }
    const uint64_t f = g / p.nb, b = g % p.nb;
    const uint64_t m = BlockElems(p.n, b);
    const uint8_t* xb = p.x + (f * p.n + (b << kBlockLog2)) * sizeof(T);
    uint32_t first = 0;
    int low16 = 0;
    if (Histogram(cta, sm, xb, m, &first, &low16)) {  // all equal: CONST
      if (tid == 0) {
        PlanConstBlock(first, &p.plans[g]);
        p.sizes[g] = kBlockHeaderBytes;
      }
      return;
    }
    Plan(cta, sm, m, low16 != 0, ElemBytes(p.dtype));
    CountUnits(cta, sm, xb, m);
    if (tid == 0) {
      BlockPlan& pl = sm.plan;
      pl.units = 0;
      for (int k = 0; k < kMaxSegmentsPerBlock; ++k) {
        pl.seg_units[k] = uint16_t(sm.seg_units[k]);
        pl.seg_nnz[k] = uint16_t(sm.seg_nnz[k]);
        pl.units += sm.seg_units[k];
      }
      PlanFinish(m, int(sizeof(T)), &pl);
      p.sizes[g] = pl.block_bytes;
    }
    cta.sync();
    CopyPlan(cta, sm.plan, &p.plans[g]);
  }
  // The histogram into sm.hist; returns whether every element equals the
  // first (*first); *low16: (float32) every element's low 16 bits are zero.
  template <class Cta>
  ZIPCCL_HD static bool Histogram(Cta& cta, Shared& sm, const uint8_t* xb, uint64_t m, uint32_t* first,
                                  int* low16) {
    const uint32_t tid = cta.tid(), warp = tid / kLanes;
    uint32_t* flat = &sm.sub[0][0];
    for (uint32_t i = tid; i < uint32_t(kWarps * kNumSymbols); i += kSegThreads) flat[i] = 0;
    cta.sync();
    *first = LoadElem<T>(xb);
    uint32_t diff = 0, low = 0;
    constexpr uint64_t kTile = uint64_t(kSegThreads) * kElemsPerThread;
    for (uint64_t tile = 0; tile * kTile < m; ++tile) {
      uint32_t v[kElemsPerThread];
      const int cnt = LoadElems8<T>(xb, m, tile * kTile + tid * kElemsPerThread, v);
      int prev = -1;
      uint32_t run = 0;
      for (int j = 0; j < cnt; ++j) {
        const int s = SymbolOf<T>(v[j]);
        diff |= v[j] ^ *first;
        low |= v[j];
        if (s == prev) {
          ++run;
        } else {
          if (run) AtomicAddShared(&sm.sub[warp][prev], run);
          prev = s;
          run = 1;
        }
      }
      if (run) AtomicAddShared(&sm.sub[warp][prev], run);
    }
    const int any_diff = cta.sync_or(diff != 0);  // also a barrier
    *low16 = sizeof(T) == 4 && !cta.sync_or((low & 0xFFFFu) != 0);
    for (uint32_t s = tid; s < uint32_t(kNumSymbols); s += kSegThreads) {
      uint32_t c = 0;
      for (int w = 0; w < kWarps; ++w) c += sm.sub[w][s];
      sm.hist[s] = c;
    }
    cta.sync();
    return !any_diff;
  }
  // The table step of the plan into sm.plan (lens, enc, table, raw width).
  template <class Cta>
  ZIPCCL_HD static void Plan(Cta& cta, Shared& sm, uint64_t m, bool low16, int elem_bytes) {
    const uint32_t tid = cta.tid();
    uint32_t used = 0;
    for (uint32_t s = tid; s < uint32_t(kNumSymbols); s += kSegThreads) {
      used += sm.hist[s] != 0;
      if (sm.hist[s]) sm.work.order[SymbolRank(sm.hist, int(s))] = uint16_t(s);
    }
    uint32_t n_used = 0;
    cta.exclusive_sum(used, &n_used);  // the count of used symbols; barriers on both sides
    if (tid == 0) {
      CodeLengthsFromOrder(sm.hist, int(n_used), sm.work, sm.plan.lens);
      PlanTable(sm.hist, m, elem_bytes, low16, &sm.plan);
    }
    if (tid < uint32_t(kMaxSegmentsPerBlock)) sm.seg_units[tid] = sm.seg_nnz[tid] = 0;
    cta.sync();
  }
  // Each segment's units and non-zero elements (warp w: segment w).
  template <class Cta>
  ZIPCCL_HD static void CountUnits(Cta& cta, Shared& sm, const uint8_t* xb, uint64_t m) {
    const uint32_t tid = cta.tid(), warp = tid / kLanes, lane = tid % kLanes;
    const uint32_t seg_m = warp < uint32_t(NumSegments(m)) ? SegmentElemsOf(m, int(warp)) : 0;
    const uint8_t* xs = xb + (uint64_t(warp) << kSegmentLog2) * sizeof(T);
    uint32_t bits = 0, nnz = 0;
    for (uint32_t e0 = lane; e0 < seg_m; e0 += kLanes * kWriteBatch) {
      uint32_t vs[kWriteBatch];  // loads in flight together, as in the writer
      for (int k = 0; k < kWriteBatch; ++k) {
        const uint32_t e = e0 + uint32_t(k) * kLanes;
        vs[k] = e < seg_m ? LoadElem<T>(xs + uint64_t(e) * sizeof(T)) : 0;
      }
      for (int k = 0; k < kWriteBatch; ++k) {
        if (e0 + uint32_t(k) * kLanes >= seg_m) break;
        bits += sm.plan.enc[SymbolOf<T>(vs[k])] >> 16;
        nnz += vs[k] != 0;
      }
    }
    if (seg_m) {
      AtomicAddShared(&sm.seg_units[warp], LaneUnits(bits));
      AtomicAddShared(&sm.seg_nnz[warp], nnz);
    }
    cta.sync();
  }
  template <class Cta>
  ZIPCCL_HD static void CopyPlan(Cta& cta, const BlockPlan& pl, BlockPlan* out) {
    const uint32_t tid = cta.tid();
    for (uint32_t s = tid; s < uint32_t(kNumSymbols); s += kSegThreads) {
      out->lens[s] = pl.lens[s];
      out->enc[s] = pl.enc[s];
    }
    if (tid == 0) {
      out->mode = pl.mode;
      out->flags = pl.flags;
      out->const_value = pl.const_value;
      out->block_bytes = pl.block_bytes;
      out->lo = pl.lo;
      out->hi = pl.hi;
      out->table_bytes = pl.table_bytes;
      out->nnz = pl.nnz;
      out->raw_width = pl.raw_width;
      out->n_segs = pl.n_segs;
      out->units = pl.units;
      for (int k = 0; k < kMaxSegmentsPerBlock; ++k) {
        out->seg_units[k] = pl.seg_units[k];
        out->seg_nnz[k] = pl.seg_nnz[k];
      }
    }
  }
};

// 2. (between 1 and 3) ScanKernel (cuda_scan.cuh): sizes -> offsets.

// Little-endian 16-bit unit and raw bytes at any byte address (HUFF regions
// start at arbitrary offsets: tables have variable length, rows sit at f * cap).
ZIPCCL_HD void StoreUnit(uint8_t* q, uint32_t u) {
  q[0] = uint8_t(u);
  q[1] = uint8_t(u >> 8);
}
template <typename T>
ZIPCCL_HD void StoreRaw(uint8_t* q, uint32_t v, bool low16) {
  if (sizeof(T) == 2 || (sizeof(T) == 4 && low16)) {
    q[0] = uint8_t(Raw16(sizeof(T) == 2 ? v : v >> 16));
  } else if (sizeof(T) == 4) {
    const uint32_t w3 = Raw32(v);
    q[0] = uint8_t(w3);
    q[1] = uint8_t(w3 >> 8);
    q[2] = uint8_t(w3 >> 16);
  }
}

// 3. Block writer: one CTA of kSegThreads per block, skipped when the frame
//    overflows or the caller skips the frame. Thread 0 writes the directory
//    entry, the block header and, for HUFF, the table and the segment
//    directory; RAW bodies are copied by all threads. HUFF: warp w writes
//    segment w, step by step (lane l codes element 32 t + l):
//    - a lane whose code holds a unit's first bit (StartsUnit) takes the next
//      unit slot: a ballot and a population count over the lanes below it,
//      the cursor advancing by the ballot's count; so the slots follow the
//      (step, lane) order the decoder takes them in;
//    - a lane ORs its code into the bits of its open unit and stores a unit
//      once full (two byte stores; the last, partial one after the loop);
//    - non-zero elements take raw-byte slots the same way (a second ballot).
//    Every warp runs the block's BlockSteps (idle lanes vote 0); a lane loads
//    the elements of kWriteBatch steps before coding them, so their loads are
//    in flight together.
template <typename T>
struct WriteKernel {
  static constexpr const char* kName = "zipccl_write";
  static constexpr int kBlockThreads = kSegThreads;
  using Params = EncodeParams;
  struct Shared {
    uint32_t enc[kNumSymbols];
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
    // HUFF only: a CONST plan's table fields are not set (PlanConstBlock)
    uint8_t* const dir = mode == kModeHuff ? blk + kBlockHeaderBytes + pl.table_bytes : blk;
    if (tid == 0) {
      Store32(frame + kFrameHeaderBytes + b * kDirEntryBytes, uint32_t(pl.block_bytes));
      WriteBlockHeader(blk, pl);
      if (mode == kModeHuff) {
        WriteTable(blk + kBlockHeaderBytes, pl);
        for (int k = 0; k < pl.n_segs; ++k) {
          Store16(dir + uint64_t(k) * kSegDirEntryBytes, pl.seg_units[k]);
          Store16(dir + uint64_t(k) * kSegDirEntryBytes + 2, pl.seg_nnz[k]);
        }
      }
    }
    if (mode == kModeConst) return;
    if (mode == kModeRaw) {
      uint8_t* body = blk + kBlockHeaderBytes;
      for (uint64_t e = tid; e < m; e += kSegThreads) {
        const uint32_t v = LoadElem<T>(xb + e * sizeof(T));
        for (unsigned i = 0; i < sizeof(T); ++i) body[e * sizeof(T) + i] = uint8_t(v >> (8 * i));
      }
      return;
    }
    for (uint32_t s = tid; s < uint32_t(kNumSymbols); s += kSegThreads) sm.enc[s] = pl.enc[s];
    cta.sync();
    const uint32_t warp = tid / kLanes, lane = tid % kLanes, below = (1u << lane) - 1;
    const int seg = int(warp);
    const uint32_t seg_m = seg < pl.n_segs ? SegmentElemsOf(m, seg) : 0;
    uint32_t unit0 = 0, raw0 = 0;  // the segment's first unit and raw slot in the block
    for (int k = 0; k < seg && k < pl.n_segs; ++k) {
      unit0 += pl.seg_units[k];
      raw0 += pl.seg_nnz[k];
    }
    const int raw_w = pl.raw_width;
    const bool low16 = (pl.flags & kBlockFlagLow16) != 0;
    uint8_t* const units = dir + uint64_t(pl.n_segs) * kSegDirEntryBytes + 2 * uint64_t(unit0);
    uint8_t* const raw = dir + uint64_t(pl.n_segs) * kSegDirEntryBytes + 2 * pl.units + uint64_t(raw0) * raw_w;
    const uint8_t* xs = xb + (uint64_t(seg) << kSegmentLog2) * sizeof(T);
    uint32_t acc = 0, nacc = 0, used = 0, slot = 0;  // the lane's open unit: bits, count, slot
    uint32_t cursor = 0, raw_cursor = 0;              // the warp's next unit and raw slots
    const int steps = BlockSteps(m);  // uniform over the CTA
    for (int t0 = 0; t0 < steps; t0 += kWriteBatch) {
      uint32_t vs[kWriteBatch];  // the batch's elements, loaded before the steps that use them
      for (int k = 0; k < kWriteBatch; ++k) {
        const uint32_t e = uint32_t(t0 + k) * kLanes + lane;
        vs[k] = e < seg_m ? LoadElem<T>(xs + uint64_t(e) * sizeof(T)) : 0;
      }
      for (int k = 0; k < kWriteBatch; ++k) {
        const uint32_t e = uint32_t(t0 + k) * kLanes + lane, v = vs[k];
        const bool active = e < seg_m;
        const uint32_t code = active ? sm.enc[SymbolOf<T>(v)] : 0, len = code >> 16;
        const bool starts = active && StartsUnit(used, len);
        const uint32_t start_mask = cta.ballot(starts);
        const uint32_t new_slot = cursor + Popc(start_mask & below);
        cursor += Popc(start_mask);
        if (active) {
          if (nacc == 0) slot = new_slot;  // a lane whose unit is full or unopened starts one
          acc |= (code & 0xFFFFu) << nacc;
          nacc += len;
          used += len;
          if (nacc >= uint32_t(kUnitBits)) {
            StoreUnit(units + 2 * uint64_t(slot), acc);
            acc >>= kUnitBits;
            nacc -= kUnitBits;
            slot = new_slot;  // the code ran into the unit it started (if nacc > 0)
          }
        }
        const bool nz = active && v != 0;
        const uint32_t nz_mask = cta.ballot(nz);
        if (nz && raw_w) StoreRaw<T>(raw + uint64_t(raw_cursor + Popc(nz_mask & below)) * raw_w, v, low16);
        raw_cursor += Popc(nz_mask);
      }
    }
    if (nacc) StoreUnit(units + 2 * uint64_t(slot), acc);  // the lane's last unit, zero-padded
  }
};

// 4. Finish: one CTA of kSumThreads per frame. Thread 0 writes the frame
//    header (or, on overflow, the header alone with frame_bytes = the size
//    needed) and the frame size (0 and no header for a skipped frame); the CTA
//    then computes the optional checksum (CtaFrameChecksum), which thread 0
//    stores.
struct FinishEncodeKernel {
  static constexpr const char* kName = "zipccl_finish";
  static constexpr int kBlockThreads = kSumThreads;
  using Params = EncodeParams;
  struct Shared {
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
      const uint32_t sum =
          CtaFrameChecksum(cta, out, sm.hash_bytes, p.nb, p.offsets, f * p.nb, p.hashes + f * p.nb);
      if (cta.tid() == 0) Store32(out + 28, sum);
    }
  }
};

// 5. Zero the payload past the frame (past the header after an overflow), as
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
