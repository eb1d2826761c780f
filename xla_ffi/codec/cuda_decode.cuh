// CUDA driver of the zipccl codec: the decoder's kernel bodies (frame check,
// directory gather, block decoder, poison, status), in launch order. Templates
// over a CTA type (see cuda_common.cuh); compiles with nvcc and a host compiler.
#pragma once

#include "cuda_common.cuh"

namespace zipccl::cuda {

// =============================================================================
// Decoder kernels
// =============================================================================

// 1. Frame check: one CTA of kSumThreads per frame. Thread 0 validates the
//    header; if the frame has a checksum, the CTA recomputes it
//    (CtaFrameChecksum). A skipped frame is not read: it gets kSkippedKey,
//    which keeps the block decoder away from it and makes the poison kernel
//    write zeros.
struct FrameCheckKernel {
  static constexpr const char* kName = "zipccl_frame_check";
  static constexpr int kBlockThreads = kSumThreads;
  using Params = DecodeParams;
  struct Shared {
    ChecksumShared sum;
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
      const uint32_t sum = CtaFrameChecksum(cta, sm.sum, in, sm.frame_bytes);
      if (cta.tid() == 0 && sum != sm.expect) sm.key = kErrChecksum;
    }
    if (cta.tid() == 0) {
      p.ferr[f] = sm.key;
      p.berr[f] = kNoError;
    }
  }
};

// 2. Directory gather: one thread per block copies its directory entry (0 if
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

// 3. (between 2 and 4) ScanKernel (cuda_scan.cuh): sizes -> offsets.

// The element of symbol s with its raw bytes at q (the inverse of SymbolOf<T>
// and Raw16/32: one-byte floats have none; LOW16 float32 blocks one).
template <typename T>
ZIPCCL_HD uint32_t MergeElem(int s, const uint8_t* q, bool low16) {
  if (sizeof(T) == 1) return Merge8(s);
  if (sizeof(T) == 2) return Merge16(s, q[0]);
  if (low16) return Merge16(s, q[0]) << 16;
  return Merge32(s, q[0] | (uint32_t(q[1]) << 8) | (uint32_t(q[2]) << 16));
}

// Stores the cnt <= kElemsPerThread elements v at o: 16-byte vector stores (two
// words for one-byte elements) when all 8 are there and o is aligned for them,
// else element by element. The inverse of LoadElems8.
template <typename T>
ZIPCCL_HD void StoreElems8(uint8_t* o, const uint32_t* v, int cnt) {
  if (sizeof(T) == 1 && cnt == kElemsPerThread && (reinterpret_cast<uintptr_t>(o) & 7) == 0) {
    StoreAligned32(o, v[0] | (v[1] << 8) | (v[2] << 16) | (v[3] << 24));
    StoreAligned32(o + 4, v[4] | (v[5] << 8) | (v[6] << 16) | (v[7] << 24));
  } else if (sizeof(T) > 1 && cnt == kElemsPerThread && (reinterpret_cast<uintptr_t>(o) & 15) == 0) {
    uint32_t wv[8];
    if (sizeof(T) == 4) {
      for (int j = 0; j < 8; ++j) wv[j] = v[j];
      Store16B(o, wv);
      Store16B(o + 16, wv + 4);
    } else {
      for (int j = 0; j < 4; ++j) wv[j] = v[2 * j] | (v[2 * j + 1] << 16);
      Store16B(o, wv);
    }
  } else {
    for (int j = 0; j < cnt; ++j) StoreElem<T>(o + j * sizeof(T), v[j]);
  }
}

// 4. Block decoder: one CTA of kDecodeThreads per block.
//    - Thread 0 checks the block header, parses the table and stream directory
//      (ParseHuffLayout), checks Kraft and derives the canonical code
//      (CanonicalCodeOf: first code, count and sorted-order base per length)
//      and the symbols in code order (SortByCode). Then every thread fills
//      kTableSize / kDecodeThreads = 16 entries of the single-symbol lookup
//      table in shared memory (DecodeEntryAt: entries tid, tid + 128, ...), so
//      the fill is balanced whatever the code lengths (a symbol-per-thread fill
//      left the thread of a 1-bit code 1024 entries) and every entry is written
//      once, with no zeroing pass and one barrier. Two CTA scans turn the
//      per-stream bit counts and nnz into stream bit offsets and raw offsets.
//    - Rounds: thread k < n_streams decodes the next 64 symbols of stream k
//      (a 64-bit bit buffer refilled with aligned 32-bit loads) into shared
//      memory; kMergeThreads threads per stream join kMergeElems symbols each
//      with their raw bytes and store the elements (16-byte stores).
//    - Decode and merge overlap (software pipeline over two symbol buffers):
//      barrier interval r decodes round r into buffer r & 1 while all threads
//      merge round r - 1 from buffer (r - 1) & 1, so warps 1-3 merge while warp
//      0 (the decoders) looks up codes, then warp 0 merges its own share. The
//      decoder records each merge slice's first raw index (slice_nz) as it goes,
//      which replaces the merge threads' nnz prefix and its barrier: rounds + 2
//      barriers per block (34 for a full block) where decode, prefix and merge
//      took 3 x rounds + 1 (97). Each barrier is a sync_or of `bad`, so an
//      element of round r is stored only after every stream decoded round r
//      without error; a block rejected later (a merge, the final bit and nnz
//      counts, the padding bits) has its elements overwritten by zipccl_poison,
//      as before. The overlap's speed-up is unmeasured (no GPU here).
template <typename T>
struct DecodeBlockKernel {
  static constexpr const char* kName = "zipccl_decode_block";
  static constexpr int kBlockThreads = kDecodeThreads;
  using Params = DecodeParams;
  // Round r's symbols live in buffer SymBuffer(r): rounds r and r + 1 share a
  // barrier interval (decode of r + 1, merge of r), so they need different buffers;
  // round r + 2 is decoded only after the barrier that ends round r's merge.
  static constexpr int kSymBuffers = 2;
  ZIPCCL_HD static int SymBuffer(int round) { return round & 1; }
  struct Shared {
    DecodeEntry table[kTableSize];
    // Two symbol buffers (SymBuffer): in one barrier interval the decoding threads
    // fill one round's buffer while the merge reads the previous round's.
    // Rows padded by one 32-bit word: decoder lane t writes row t, so with 128-byte
    // rows all 32 lanes hit one bank; 132-byte rows put lane t in bank (t + i/2) % 32,
    // and the merge threads' reads (8 rows x 4 offsets 8 words apart per warp: bank
    // k + 8q) stay conflict-free. A buffer is 1056 words (a multiple of 32), so
    // both buffers have the same bank mapping.
    uint16_t syms[kSymBuffers][kMaxStreamsPerBlock][kRoundSyms + 2];
    // slice_nz[b][k][q]: nnz of stream k before slice q (symbols
    // [q * kMergeElems, (q + 1) * kMergeElems) of the round in buffer b), i.e.
    // merge thread (k, q)'s first raw element. The decoder writes it at each slice
    // start, so the merge needs no prefix over its group (nor a barrier for one).
    // uint16_t: nnz <= kStreamElems = 2048.
    uint16_t slice_nz[kSymBuffers][kMaxStreamsPerBlock][kMergeThreads];
    uint32_t stream_raw[kMaxStreamsPerBlock]; // first raw byte of the stream
    uint8_t lens[kNumSymbols];
    // Thread 0's canonical code and the used symbols in code order (SortByCode),
    // read by every thread's DecodeEntryAt. Here, not next to `table`: with them
    // there, NVRTC 13.5's ptxas gave <u16> 72 registers instead of 64, i.e. 7
    // CTAs per SM instead of 8 (cuobjdump of sm_80 and sm_90).
    CanonicalCode code;
    uint16_t sorted[kNumSymbols];
    HuffLayout L;
    int status;
    uint32_t value;
    uint8_t mode, flags;
  };
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
    uint8_t* out = p.out + (f * p.n + (b << kBlockLog2)) * sizeof(T);
    const int w = int(sizeof(T));
    if (tid == 0) {
      Status st = kOk;
      uint8_t mode = 0, flags = 0;
      uint32_t value = 0;
      if (bb < kBlockHeaderBytes) {
        st = kErrBlockSize;
      } else {
        mode = blk[0];
        flags = blk[1];
        value = Load32(blk + 4);
        if (blk[2] || blk[3]) {
          st = kErrReserved;
        } else if (mode == kModeRaw) {
          if (flags) st = kErrBlockMode;
          else if (value) st = kErrReserved;
          else if (bb != kBlockHeaderBytes + m * w) st = kErrBlockSize;
        } else if (mode == kModeConst) {
          if (flags) st = kErrBlockMode;
          else if (uint64_t(value) >> (8 * w)) st = kErrReserved;  // bits above the element
          else if (bb != kBlockHeaderBytes) st = kErrBlockSize;
        } else if (mode == kModeHuff) {
          if (flags & kBlockFlagsReserved) st = kErrReserved;
          else if (value) st = kErrReserved;
          else st = ParseHuffLayout(blk, bb, m, w, flags, sm.lens, &sm.L);
          if (st == kOk && !CanonicalCodeOf(sm.lens, sm.code)) st = kErrTable;  // Kraft: the CPU's test
          if (st == kOk) SortByCode(sm.lens, sm.code, sm.sorted);
        } else {
          st = kErrBlockMode;
        }
      }
      sm.status = st;
      sm.mode = mode;
      sm.flags = flags;
      sm.value = value;
    }
    cta.sync();
    if (sm.status != kOk) {
      if (tid == 0) AtomicMinGlobal(&p.berr[f], BlockErrorKey(b, sm.status));
      return;
    }
    if (sm.mode == kModeRaw) {
      const uint8_t* body = blk + kBlockHeaderBytes;
      for (uint64_t e = tid; e < m; e += kDecodeThreads) {
        uint32_t v = 0;
        for (int i = 0; i < w; ++i) v |= uint32_t(body[e * w + i]) << (8 * i);
        StoreElem<T>(out + e * w, v);
      }
      return;
    }
    if (sm.mode == kModeConst) {
      for (uint64_t e = tid; e < m; e += kDecodeThreads) StoreElem<T>(out + e * w, sm.value);
      return;
    }
    // HUFF: the whole CTA builds the lookup table, entry by entry (the table
    // BuildDecodeTable builds symbol by symbol); every entry is written here,
    // uncovered ones as {0, 0, 0}.
    for (uint32_t i = tid; i < uint32_t(kTableSize); i += kDecodeThreads)
      sm.table[i] = DecodeEntryAt(i, sm.code, sm.sorted);
    cta.sync();
    // Stream offsets from two CTA scans over the directory.
    const HuffLayout L = sm.L;
    const int n_streams = L.n_streams;
    const uint8_t* dir = blk + L.dir_off;
    uint32_t my_sb = 0, my_nnz = 0;
    if (tid < uint32_t(n_streams)) {
      my_sb = Load16(dir + tid * kStreamDirEntryBytes);
      my_nnz = Load16(dir + tid * kStreamDirEntryBytes + 2);
    }
    uint32_t agg = 0;
    const uint32_t bit0 = cta.exclusive_sum(my_sb, &agg);
    const uint32_t raw0 = cta.exclusive_sum(my_nnz, &agg);
    const bool low16 = (sm.flags & kBlockFlagLow16) != 0;
    const int raw_w = L.raw_width;
    const uint8_t* bits = blk + L.bits_off;
    const uint64_t bit_bytes = (L.total_bits + 7) / 8;
    const uint8_t* raw = blk + L.raw_off;
    if (tid < uint32_t(n_streams)) sm.stream_raw[tid] = raw0;
    // Decoder state of stream `tid` (threads >= n_streams only merge).
    const bool decoder = tid < uint32_t(n_streams);
    const uint64_t my_count =
        decoder ? (m - uint64_t(tid) * kStreamElems < uint64_t(kStreamElems)
                       ? m - uint64_t(tid) * kStreamElems
                       : uint64_t(kStreamElems))
                : 0;
    const uint8_t* const bits_base = bits - (reinterpret_cast<uintptr_t>(bits) & 3);
    uint64_t word = 0;  // next aligned word to load, relative to bits_base
    uint64_t buf = 0;
    uint32_t nbuf = 0, consumed = 0, nz_seen = 0;
    if (decoder) {
      const uint64_t q = (reinterpret_cast<uintptr_t>(bits) & 3) * 8 + bit0;
      word = q >> 5;
      buf = LoadWordClipped(bits_base + 4 * word, bits, bits + bit_bytes) >> (q & 31);
      nbuf = 32 - uint32_t(q & 31);
      ++word;
    }
    const uint64_t span = m < uint64_t(kStreamElems) ? m : uint64_t(kStreamElems);
    const int rounds = int(CeilDiv(span, kRoundSyms));
    // Merge mapping: thread -> stream k, slice q = elements [j0, j0 + kMergeElems)
    // of each round of stream k.
    const uint32_t k = tid / kMergeThreads, q = tid % kMergeThreads;
    const uint32_t j0 = q * kMergeElems;
    // Barrier interval r (r = 0 .. rounds) decodes round r (r < rounds) and merges
    // round r - 1 (r > 0); the barrier ending it agrees on `bad` from both (see
    // above). The decoder works first: its loop is the long one, and the other
    // warps merge meanwhile. The final count check stays after the loop, behind
    // its own barrier: inside the last round's decode it cost <u16> 72 registers
    // instead of 64 (NVRTC 13.5, sm_80 and sm_90), i.e. 7 CTAs per SM instead of 8.
    int bad = 0;
    for (int r = 0; r <= rounds; ++r) {
      if (decoder && r < rounds) {
        const uint64_t done = uint64_t(r) * kRoundSyms;
        const int cnt = done >= my_count ? 0
                        : (my_count - done < uint64_t(kRoundSyms) ? int(my_count - done)
                                                                  : kRoundSyms);
        const int rb = SymBuffer(r);
        for (int s0 = 0; s0 < cnt && !bad; s0 += kMergeElems) {
          sm.slice_nz[rb][tid][s0 / kMergeElems] = uint16_t(nz_seen);
          const int s1 = cnt - s0 < kMergeElems ? cnt : s0 + kMergeElems;
          for (int i = s0; i < s1; ++i) {
            if (nbuf < uint32_t(kMaxCodeLen)) {
              buf |= uint64_t(LoadWordClipped(bits_base + 4 * word, bits, bits + bit_bytes)) << nbuf;
              nbuf += 32;
              ++word;
            }
            const DecodeEntry e = sm.table[buf & (kTableSize - 1)];
            consumed += e.len;
            if (e.len == 0 || consumed > my_sb) {
              bad = 1;
              break;
            }
            buf >>= e.len;
            nbuf -= e.len;
            sm.syms[rb][tid][i] = e.sym;
            nz_seen += e.sym != kZeroSymbol;
          }
        }
      }
      // Merge round r - 1: (stream k, slice q) joined with its raw bytes and
      // stored 8 at a time. A thread whose decode just failed skips it (the block
      // is rejected at this interval's barrier).
      const uint64_t first = uint64_t(k) * kStreamElems + uint64_t(r - 1) * kRoundSyms + j0;
      int cnt = 0;
      if (r > 0 && !bad && k < uint32_t(n_streams) && first < m) {
        const uint64_t stream_end = uint64_t(k) * kStreamElems + kStreamElems < m
                                        ? uint64_t(k) * kStreamElems + kStreamElems
                                        : m;
        cnt = stream_end - first < uint64_t(kMergeElems) ? int(stream_end - first) : kMergeElems;
      }
      if (cnt > 0) {
        const int mb = SymBuffer(r - 1);
        uint32_t ri = sm.slice_nz[mb][k][q];
        const uint32_t stream_nnz = Load16(dir + k * kStreamDirEntryBytes + 2);
        const uint8_t* sraw = raw + uint64_t(sm.stream_raw[k]) * raw_w;
        for (int g = 0; g < cnt && !bad; g += kElemsPerThread) {
          const int gc = cnt - g < kElemsPerThread ? cnt - g : kElemsPerThread;
          uint32_t v[kElemsPerThread];
          for (int j = 0; j < gc; ++j) {
            const int s = sm.syms[mb][k][j0 + g + j];
            v[j] = 0;
            if (s == kZeroSymbol) continue;
            if (ri >= stream_nnz) {
              bad = 1;
              break;
            }
            v[j] = MergeElem<T>(s, sraw + uint64_t(ri) * raw_w, low16);
            ++ri;
          }
          if (!bad) StoreElems8<T>(out + (first + g) * sizeof(T), v, gc);
        }
      }
      if (cta.sync_or(bad)) break;
    }
    // Every stream must use exactly its bits and non-zero count. (After a break,
    // some thread's `bad` is set, so the barrier below agrees on it.)
    if (decoder && !bad && (consumed != my_sb || nz_seen != my_nnz)) bad = 1;
    int status = cta.sync_or(bad) ? kErrStream : kOk;
    if (status == kOk && (L.total_bits & 7) &&
        (bits[bit_bytes - 1] >> (L.total_bits & 7)) != 0)
      status = kErrReserved;  // padding bits after the last code
    if (status != kOk && tid == 0) AtomicMinGlobal(&p.berr[f], BlockErrorKey(b, status));
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
    uint8_t* out = p.out + (f * p.n + (b << kBlockLog2)) * sizeof(T);
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
