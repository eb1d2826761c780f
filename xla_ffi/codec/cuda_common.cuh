// CUDA driver for the zipccl codec: kernel bodies, launch sequence and scratch
// layout. No XLA includes (xla_ffi/codec_cuda.cu adapts this to XLA FFI).
//
// Everything a kernel does lives in a `Run` template over a "CTA" type that
// provides the thread index, barriers and a CTA-wide exclusive scan:
//   - codec_cuda.cu instantiates the bodies with DeviceCta (threadIdx,
//     __syncthreads, cub::BlockScan) inside __global__ wrappers, and runs the
//     launch sequence (RunEncode/RunDecode below) with CUB's DeviceScan;
//   - xla_ffi/cuda_host_bindings.cc instantiates the same bodies and the same
//     launch sequence with a host SIMT emulator (one fiber per thread, barriers
//     as context switches, threads run in a shuffled order between barriers,
//     shared and scratch memory filled with garbage), so the kernels' bytes are
//     checked against the CPU driver on a machine without a GPU.
// The format logic itself is not here: the bodies call the shared
// __host__ __device__ functions of format.h, block.h, huffman.h and xxhash32.h
// (PlanBlock, WriteBlockHeader, WriteTable, ParseHuffLayout, BuildEncodeTable,
// BuildDecodeTable, Symbol16/32, Merge16/32, ValidateFrameHeader, FrameChecksum).
//
// This header compiles with nvcc and with a plain C++17 host compiler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "block.h"
#include "format.h"
#include "huffman.h"
#include "xxhash32.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*; no CUDA headers needed here.

namespace zipccl::cuda {

// ---- Geometry ---------------------------------------------------------------
// Per-block kernels (histogram, block writer, block decoder, poison): one CTA of
// kThreads threads per 65536-element block. A tile is one 2048-element stream:
// each thread owns kElemsPerThread consecutive elements of it.
constexpr int kThreads = 256;
constexpr int kElemsPerThread = 8;
static_assert(kThreads * kElemsPerThread == kStreamElems, "one tile is one stream");
// Per-item kernels (plan, directory gather, frame check/finish, status): one
// thread per block or per frame, in CTAs of kItemThreads.
constexpr int kItemThreads = 64;
// Decoder: each stream's thread decodes kRoundSyms symbols per round into
// shared memory; then all threads merge them with the raw bytes, 8 threads
// (kElemsPerThread elements each) per stream.
constexpr int kRoundSyms = kElemsPerThread * (kThreads / kMaxStreamsPerBlock);
static_assert(kRoundSyms == 64, "8 merge threads of 8 elements per stream");
static_assert(kStreamElems % kRoundSyms == 0, "rounds tile a stream");
// Encoder staging, per tile: the bitstream words a tile can touch (up to 31
// bits of carry from the previous tile + 11 bits per element, plus one word of
// slack for a 128-bit OR), and the raw bytes (3 alignment bytes + 3 per element).
constexpr int kBitStageWords = (31 + kStreamElems * kMaxCodeLen) / 32 + 4;
constexpr int kRawStageWords = (3 + kStreamElems * 3) / 4 + 2;

constexpr unsigned long long kNoError = ~0ull;
// Frame-level key of a frame the caller asked to skip (DecodeParams::skip): its
// blocks are not decoded, its output is zero and its status is 0. Above every
// real error key, so an error is never hidden behind it (none can occur: a
// skipped frame is not read).
constexpr unsigned long long kSkippedKey = ~0ull - 1;

// Error key of a frame: frame-level errors (header, checksum, directory sum)
// are key = status, block errors key = (block + 1) << 8 | status. The smallest
// key wins (atomicMin), which is what the CPU driver reports: frame errors
// first, then the first bad block.
ZIPCCL_HD unsigned long long BlockErrorKey(uint64_t block, int status) {
  return ((unsigned long long)(block + 1) << 8) | (unsigned long long)status;
}
ZIPCCL_HD int KeyStatus(unsigned long long key) {
  return key == kNoError || key == kSkippedKey ? int(kOk) : int(key & 0xFF);
}
ZIPCCL_HD int64_t KeyBlock(unsigned long long key) {
  return key == kNoError || key == kSkippedKey ? -1 : int64_t(key >> 8) - 1;
}

ZIPCCL_HD uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// ---- Platform primitives (device intrinsics; plain code in the emulator) ----
// The emulator runs one fiber at a time, so plain read-modify-writes are exact.
ZIPCCL_HD void AtomicAddShared(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(p, v);
#else
  *p += v;
#endif
}
ZIPCCL_HD void AtomicOrShared(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  atomicOr(p, v);
#else
  *p |= v;
#endif
}
ZIPCCL_HD void AtomicMinGlobal(unsigned long long* p, unsigned long long v) {
#if defined(__CUDA_ARCH__)
  atomicMin(p, v);
#else
  if (v < *p) *p = v;
#endif
}
// 16 aligned bytes as four little-endian words.
ZIPCCL_HD void Load16B(const uint8_t* p, uint32_t* w) {
#if defined(__CUDA_ARCH__)
  uint4 v = *reinterpret_cast<const uint4*>(p);
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#else
  std::memcpy(w, p, 16);
#endif
}
ZIPCCL_HD void Store16B(uint8_t* p, const uint32_t* w) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
#else
  std::memcpy(p, w, 16);
#endif
}
ZIPCCL_HD uint32_t LoadAligned32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
ZIPCCL_HD void StoreAligned32(uint8_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint32_t*>(p) = v;
#else
  std::memcpy(p, &v, 4);
#endif
}

// Elements are read and written as unsigned integers of their width through
// element-aligned pointers (XLA buffers are aligned; frames start at multiples
// of the element width).
template <typename T>
ZIPCCL_HD uint32_t LoadElem(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return uint32_t(*reinterpret_cast<const T*>(p));
#else
  T v;
  std::memcpy(&v, p, sizeof(T));
  return uint32_t(v);
#endif
}
template <typename T>
ZIPCCL_HD void StoreElem(uint8_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<T*>(p) = T(v);
#else
  T t = T(v);
  std::memcpy(p, &t, sizeof(T));
#endif
}

// Loads the kElemsPerThread elements [first, first + 8) of a block of m
// elements at xb (16-byte vector loads when aligned and complete). Returns how
// many exist.
template <typename T>
ZIPCCL_HD int LoadElems8(const uint8_t* xb, uint64_t m, uint64_t first, uint32_t* v) {
  if (first >= m) return 0;
  const uint64_t left = m - first;
  const int cnt = left < uint64_t(kElemsPerThread) ? int(left) : kElemsPerThread;
  const uint8_t* p = xb + first * sizeof(T);
  if (cnt == kElemsPerThread && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    uint32_t w[8];
    Load16B(p, w);
    if (sizeof(T) == 4) {
      Load16B(p + 16, w + 4);
      for (int j = 0; j < 8; ++j) v[j] = w[j];
    } else {
      for (int j = 0; j < 4; ++j) {
        v[2 * j] = w[j] & 0xFFFFu;
        v[2 * j + 1] = w[j] >> 16;
      }
    }
    return cnt;
  }
  for (int j = 0; j < cnt; ++j) v[j] = LoadElem<T>(p + j * sizeof(T));
  return cnt;
}

// Stores the 32-bit word `v` destined for the 4-aligned address `word`, but
// only its bytes that fall in [lo, hi); a whole word store when all do.
ZIPCCL_HD void StoreWordClipped(uint8_t* word, uint32_t v, const uint8_t* lo, const uint8_t* hi) {
  if (word >= lo && word + 4 <= hi) {
    StoreAligned32(word, v);
    return;
  }
  for (int i = 0; i < 4; ++i)
    if (word + i >= lo && word + i < hi) word[i] = uint8_t(v >> (8 * i));
}
// Reads the 4-aligned word at `word`, with bytes outside [lo, hi) as zero.
ZIPCCL_HD uint32_t LoadWordClipped(const uint8_t* word, const uint8_t* lo, const uint8_t* hi) {
  if (word >= lo && word + 4 <= hi) return LoadAligned32(word);
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    if (word + i >= lo && word + i < hi) v |= uint32_t(word[i]) << (8 * i);
  return v;
}

// ---- Parameters ---------------------------------------------------------------
// Per-block statistics of the histogram pass (what PlanBlock needs).
struct BlockStats {
  uint32_t hist[kNumSymbols];
  uint32_t first;      // bits of the block's first element
  uint32_t all_equal;  // every element equals `first`
  uint32_t low16;      // float32 only: every element has zero low 16 bits
};

struct EncodeParams {
  const uint8_t* x;    // frames * n elements
  uint64_t frames, n, nb, total;  // nb blocks per frame, total = frames * nb
  uint8_t dtype;
  bool checksum;
  uint8_t* payload;    // frames * cap bytes
  uint64_t cap;
  void* nbytes;        // frames sizes, int32 or int64
  bool nbytes64;
  const uint8_t* skip; // [frames] or null: non-zero = not a frame (zero row, size 0)
  BlockStats* stats;   // [total]
  BlockPlan* plans;    // [total]
  uint64_t* sizes;     // [total + 1]: block_bytes, then 0
  uint64_t* offsets;   // [total + 1]: exclusive prefix sum of sizes
};

struct DecodeParams {
  const uint8_t* payload;  // frames * cap bytes
  uint64_t frames, cap, n, nb, total;
  uint8_t dtype;
  uint8_t* out;             // frames * n elements
  int32_t* status;          // [frames] or null
  const uint8_t* skip;      // [frames] or null: non-zero = not read, output zero, status 0
  uint64_t* sizes;          // [total + 1]: directory entries, then 0
  uint64_t* offsets;        // [total + 1]
  unsigned long long* ferr; // [frames]: frame-level error key (header, checksum)
  unsigned long long* berr; // [frames]: min over block error keys
};

// ---- Scratch layout -----------------------------------------------------------
// One scratch allocation per call, carved into 256-byte aligned sections. The
// CUB temporary storage size is queried at run time (it depends on the device)
// and passed in.
constexpr uint64_t kScratchAlign = 256;
ZIPCCL_HD uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct EncodeLayout {
  uint64_t frames, n, nb, total;
  uint64_t stats_off, plans_off, sizes_off, offsets_off, cub_off, cub_bytes;
  uint64_t scratch_bytes;  // 0 when there is no block to code
};

struct DecodeLayout {
  uint64_t frames, n, nb, total;
  uint64_t sizes_off, offsets_off, ferr_off, berr_off, cub_off, cub_bytes;
  uint64_t scratch_bytes;
};

inline EncodeLayout MakeEncodeLayout(uint64_t frames, uint64_t n, uint64_t cub_bytes) {
  EncodeLayout L{};
  L.frames = frames;
  L.n = n;
  L.nb = NumBlocks(n);
  L.total = frames * L.nb;
  if (L.total == 0) return L;  // only frame headers: no scratch
  uint64_t at = 0;
  L.stats_off = at;
  at = AlignUp(at + L.total * sizeof(BlockStats), kScratchAlign);
  L.plans_off = at;
  at = AlignUp(at + L.total * sizeof(BlockPlan), kScratchAlign);
  L.sizes_off = at;
  at = AlignUp(at + (L.total + 1) * sizeof(uint64_t), kScratchAlign);
  L.offsets_off = at;
  at = AlignUp(at + (L.total + 1) * sizeof(uint64_t), kScratchAlign);
  L.cub_off = at;
  L.cub_bytes = cub_bytes;
  L.scratch_bytes = AlignUp(at + cub_bytes, kScratchAlign);
  return L;
}

inline DecodeLayout MakeDecodeLayout(uint64_t frames, uint64_t n, uint64_t cub_bytes) {
  DecodeLayout L{};
  L.frames = frames;
  L.n = n;
  L.nb = NumBlocks(n);
  L.total = frames * L.nb;
  uint64_t at = 0;
  L.ferr_off = at;
  at = AlignUp(at + frames * sizeof(unsigned long long), kScratchAlign);
  L.berr_off = at;
  at = AlignUp(at + frames * sizeof(unsigned long long), kScratchAlign);
  if (L.total) {
    L.sizes_off = at;
    at = AlignUp(at + (L.total + 1) * sizeof(uint64_t), kScratchAlign);
    L.offsets_off = at;
    at = AlignUp(at + (L.total + 1) * sizeof(uint64_t), kScratchAlign);
    L.cub_off = at;
    L.cub_bytes = cub_bytes;
    at = AlignUp(at + cub_bytes, kScratchAlign);
  }
  L.scratch_bytes = at;
  return L;
}

inline EncodeParams MakeEncodeParams(const EncodeLayout& L, const void* x, uint8_t dtype,
                                     bool checksum, uint8_t* payload, uint64_t cap, void* nbytes,
                                     bool nbytes64, const uint8_t* skip, uint8_t* scratch) {
  EncodeParams p{};
  p.x = static_cast<const uint8_t*>(x);
  p.frames = L.frames;
  p.n = L.n;
  p.nb = L.nb;
  p.total = L.total;
  p.dtype = dtype;
  p.checksum = checksum;
  p.payload = payload;
  p.cap = cap;
  p.nbytes = nbytes;
  p.nbytes64 = nbytes64;
  p.skip = skip;
  if (L.total) {
    p.stats = reinterpret_cast<BlockStats*>(scratch + L.stats_off);
    p.plans = reinterpret_cast<BlockPlan*>(scratch + L.plans_off);
    p.sizes = reinterpret_cast<uint64_t*>(scratch + L.sizes_off);
    p.offsets = reinterpret_cast<uint64_t*>(scratch + L.offsets_off);
  }
  return p;
}

inline DecodeParams MakeDecodeParams(const DecodeLayout& L, const uint8_t* payload, uint64_t cap,
                                     uint8_t dtype, void* out, int32_t* status,
                                     const uint8_t* skip, uint8_t* scratch) {
  DecodeParams p{};
  p.payload = payload;
  p.frames = L.frames;
  p.cap = cap;
  p.n = L.n;
  p.nb = L.nb;
  p.total = L.total;
  p.dtype = dtype;
  p.out = static_cast<uint8_t*>(out);
  p.status = status;
  p.skip = skip;
  p.ferr = reinterpret_cast<unsigned long long*>(scratch + L.ferr_off);
  p.berr = reinterpret_cast<unsigned long long*>(scratch + L.berr_off);
  if (L.total) {
    p.sizes = reinterpret_cast<uint64_t*>(scratch + L.sizes_off);
    p.offsets = reinterpret_cast<uint64_t*>(scratch + L.offsets_off);
  }
  return p;
}

// ---- Frame arithmetic shared by the kernels -------------------------------------
// Whether the caller asked to skip frame f (EncodeParams / DecodeParams).
template <class Params>
ZIPCCL_HD bool Skipped(const Params& p, uint64_t f) {
  return p.skip != nullptr && p.skip[f] != 0;
}
// Size of frame f from the exclusive prefix sum of all frames' block sizes.
ZIPCCL_HD uint64_t FrameBytesFromOffsets(const uint64_t* offsets, uint64_t nb, uint64_t f) {
  uint64_t body = nb ? offsets[(f + 1) * nb] - offsets[f * nb] : 0;
  return kFrameHeaderBytes + nb * kDirEntryBytes + body;
}
// Offset of block g (= f * nb + b) from the start of its frame.
ZIPCCL_HD uint64_t BlockOffsetInFrame(const uint64_t* offsets, uint64_t nb, uint64_t g) {
  uint64_t f = g / nb;
  return kFrameHeaderBytes + nb * kDirEntryBytes + (offsets[g] - offsets[f * nb]);
}

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
        const int s = sizeof(T) == 2 ? Symbol16(v[j]) : Symbol32(v[j]);
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

// 2. Plan: one thread per block runs the shared PlanBlock (code lengths,
//    canonical codes, mode choice, exact size); the extra item `total` writes
//    the trailing 0 that makes the scan's last entry the grand total. Blocks
//    of skipped frames get size 0 and no plan.
struct PlanKernel {
  static constexpr const char* kName = "zipccl_plan";
  static constexpr int kBlockThreads = kItemThreads;
  using Params = EncodeParams;
  struct Shared {
    int unused;
  };
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared&, const Params& p) {
    const uint64_t g = cta.block() * kItemThreads + cta.tid();
    if (g > p.total) return;
    if (g == p.total) {
      p.sizes[g] = 0;
      return;
    }
    if (Skipped(p, g / p.nb)) {
      p.sizes[g] = 0;
      return;
    }
    const BlockStats& st = p.stats[g];
    const int w = ElemBytes(p.dtype);
    PlanBlock(st.hist, BlockElems(p.n, g % p.nb), w, st.all_equal != 0, st.first,
              st.low16 != 0, &p.plans[g]);
    p.sizes[g] = p.plans[g].block_bytes;
  }
};

// 3. (between 2 and 4) cub::DeviceScan::ExclusiveSum(sizes -> offsets).

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
        const int s = sizeof(T) == 2 ? Symbol16(v[j]) : Symbol32(v[j]);
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
      // Raw bytes of the non-zero elements, in element order.
      {
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

// 5. Finish: one thread per frame writes the frame header (or, on overflow,
//    the header alone with frame_bytes = the size needed), the optional
//    checksum, and the frame size (0 and no header for a skipped frame).
struct FinishEncodeKernel {
  static constexpr const char* kName = "zipccl_finish";
  static constexpr int kBlockThreads = kItemThreads;
  using Params = EncodeParams;
  struct Shared {
    int unused;
  };
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared&, const Params& p) {
    const uint64_t f = cta.block() * kItemThreads + cta.tid();
    if (f >= p.frames) return;
    if (Skipped(p, f)) {
      if (p.nbytes64)
        static_cast<int64_t*>(p.nbytes)[f] = 0;
      else
        static_cast<int32_t*>(p.nbytes)[f] = 0;
      return;
    }
    const uint64_t need = FrameBytesFromOffsets(p.offsets, p.nb, f);
    uint8_t* out = p.payload + f * p.cap;
    if (need > p.cap) {
      if (p.cap >= kFrameHeaderBytes) WriteFrameHeader(out, p.dtype, 0, p.n, need, 0);
    } else {
      WriteFrameHeader(out, p.dtype, p.checksum ? kFrameFlagChecksum : 0, p.n, need, 0);
      if (p.checksum) Store32(out + 28, FrameChecksum(out, need));
    }
    if (p.nbytes64)
      static_cast<int64_t*>(p.nbytes)[f] = int64_t(need);
    else
      static_cast<int32_t*>(p.nbytes)[f] = int32_t(need);  // the caller checked the bound
  }
};

// 6. Zero the payload past the frame (past the header after an overflow), as
//    the CPU handler does: the padded transport sends all `cap` bytes, and
//    XLA reuses output buffers, so stale device memory must not reach peers.
//    The whole row of a skipped frame is zeroed. kTilesPerFrame CTAs per frame
//    stride over the tail.
struct ZeroTailKernel {
  static constexpr const char* kName = "zipccl_zero_tail";
  static constexpr int kBlockThreads = kItemThreads;
  static constexpr uint64_t kTilesPerFrame = 16;
  using Params = EncodeParams;
  struct Shared {
    int unused;
  };
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared&, const Params& p) {
    const uint64_t f = cta.block() / kTilesPerFrame, tile = cta.block() % kTilesPerFrame;
    if (f >= p.frames) return;
    const uint64_t need = FrameBytesFromOffsets(p.offsets, p.nb, f);
    const uint64_t keep = Skipped(p, f) ? 0
                          : need <= p.cap ? need
                          : (p.cap < kFrameHeaderBytes ? p.cap : kFrameHeaderBytes);
    uint8_t* out = p.payload + f * p.cap;
    const uint64_t stride = kTilesPerFrame * uint64_t(kItemThreads);
    for (uint64_t i = keep + tile * kItemThreads + cta.tid(); i < p.cap; i += stride) out[i] = 0;
  }
};

// =============================================================================
// Decoder kernels
// =============================================================================

// 1. Frame check: one thread per frame validates the header and, if present,
//    the checksum (XXH32 is sequential by definition: ~1-2 GB/s per frame).
//    A skipped frame is not read: it gets kSkippedKey, which keeps the block
//    decoder away from it and makes the poison kernel write zeros.
struct FrameCheckKernel {
  static constexpr const char* kName = "zipccl_frame_check";
  static constexpr int kBlockThreads = kItemThreads;
  using Params = DecodeParams;
  struct Shared {
    int unused;
  };
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared&, const Params& p) {
    const uint64_t f = cta.block() * kItemThreads + cta.tid();
    if (f >= p.frames) return;
    const uint8_t* in = p.payload + f * p.cap;
    unsigned long long key = kNoError;
    if (Skipped(p, f)) {
      key = kSkippedKey;
    } else if (p.cap < kFrameHeaderBytes) {
      key = kErrTruncated;
    } else {
      const FrameHeader h = ParseFrameHeader(in);
      const Status st = ValidateFrameHeader(h, p.dtype, p.n, p.cap);
      if (st != kOk)
        key = st;
      else if ((h.flags & kFrameFlagChecksum) && FrameChecksum(in, h.frame_bytes) != h.checksum)
        key = kErrChecksum;
    }
    p.ferr[f] = key;
    p.berr[f] = kNoError;
  }
};

// 2. Directory gather: one thread per block copies its directory entry (0 if
//    the payload cannot hold it; such a frame fails its header check anyway;
//    0 without reading it for a skipped frame).
struct DirKernel {
  static constexpr const char* kName = "zipccl_dir";
  static constexpr int kBlockThreads = kItemThreads;
  using Params = DecodeParams;
  struct Shared {
    int unused;
  };
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared&, const Params& p) {
    const uint64_t g = cta.block() * kItemThreads + cta.tid();
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

// 3. (between 2 and 4) cub::DeviceScan::ExclusiveSum(sizes -> offsets).

// 4. Block decoder: one CTA per block.
//    - Thread 0 checks the block header, parses the table and stream directory
//      (ParseHuffLayout) and builds the single-symbol lookup table in shared
//      memory (BuildEncodeTable + BuildDecodeTable). Two CTA scans turn the
//      per-stream bit counts and nnz into stream bit offsets and raw offsets.
//    - Rounds: thread k < n_streams decodes the next 64 symbols of stream k
//      (a 64-bit bit buffer refilled with aligned 32-bit loads) into shared
//      memory; then 8 threads per stream join 8 symbols each with their raw
//      bytes and store the elements (coalesced 16-byte stores).
template <typename T>
struct DecodeBlockKernel {
  static constexpr const char* kName = "zipccl_decode_block";
  static constexpr int kBlockThreads = kThreads;
  using Params = DecodeParams;
  struct Shared {
    DecodeEntry table[kTableSize];
    uint32_t enc[kNumSymbols];
    uint16_t syms[kMaxStreamsPerBlock][kRoundSyms];
    uint32_t round_nz[kMaxStreamsPerBlock];   // nnz of the stream before this round
    uint32_t stream_raw[kMaxStreamsPerBlock]; // first raw byte of the stream
    uint32_t merge_nz[kThreads];
    uint8_t lens[kNumSymbols];
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
          else if (w == 2 && (value >> 16)) st = kErrReserved;
          else if (bb != kBlockHeaderBytes) st = kErrBlockSize;
        } else if (mode == kModeHuff) {
          if (flags & kBlockFlagsReserved) st = kErrReserved;
          else if (value) st = kErrReserved;
          else st = ParseHuffLayout(blk, bb, m, w, flags, sm.lens, &sm.L);
          if (st == kOk) {
            if (!BuildEncodeTable(sm.lens, sm.enc))
              st = kErrTable;
            else
              BuildDecodeTable(sm.enc, sm.table);
          }
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
      for (uint64_t e = tid; e < m; e += kThreads) {
        uint32_t v = 0;
        for (int i = 0; i < w; ++i) v |= uint32_t(body[e * w + i]) << (8 * i);
        StoreElem<T>(out + e * w, v);
      }
      return;
    }
    if (sm.mode == kModeConst) {
      for (uint64_t e = tid; e < m; e += kThreads) StoreElem<T>(out + e * w, sm.value);
      return;
    }
    // HUFF: stream offsets from two CTA scans over the directory.
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
    int bad = 0;
    const uint64_t span = m < uint64_t(kStreamElems) ? m : uint64_t(kStreamElems);
    const int rounds = int(CeilDiv(span, kRoundSyms));
    for (int r = 0; r < rounds; ++r) {
      if (decoder && !bad) {
        const uint64_t done = uint64_t(r) * kRoundSyms;
        const int cnt = done >= my_count ? 0
                        : (my_count - done < uint64_t(kRoundSyms) ? int(my_count - done)
                                                                  : kRoundSyms);
        sm.round_nz[tid] = nz_seen;
        for (int i = 0; i < cnt; ++i) {
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
          sm.syms[tid][i] = e.sym;
          nz_seen += e.sym != kZeroSymbol;
        }
      }
      if (cta.sync_or(bad)) break;
      // Merge: thread -> (stream k, elements [j0, j0 + 8) of this round).
      const uint32_t k = tid / (kThreads / kMaxStreamsPerBlock);
      const uint32_t j0 = (tid % (kThreads / kMaxStreamsPerBlock)) * kElemsPerThread;
      uint64_t first = uint64_t(k) * kStreamElems + uint64_t(r) * kRoundSyms + j0;
      int cnt = 0;
      if (k < uint32_t(n_streams) && first < m) {
        const uint64_t stream_end = uint64_t(k) * kStreamElems + kStreamElems < m
                                        ? uint64_t(k) * kStreamElems + kStreamElems
                                        : m;
        cnt = stream_end - first < uint64_t(kElemsPerThread) ? int(stream_end - first)
                                                             : kElemsPerThread;
      }
      uint32_t nz = 0;
      for (int j = 0; j < cnt; ++j) nz += sm.syms[k][j0 + j] != kZeroSymbol;
      sm.merge_nz[tid] = nz;
      cta.sync();
      int merge_bad = 0;
      if (cnt > 0) {
        uint32_t ri = sm.round_nz[k];
        for (uint32_t t = tid & ~uint32_t(kThreads / kMaxStreamsPerBlock - 1); t < tid; ++t)
          ri += sm.merge_nz[t];
        const uint32_t stream_nnz = Load16(dir + k * kStreamDirEntryBytes + 2);
        const uint8_t* sraw = raw + uint64_t(sm.stream_raw[k]) * raw_w;
        uint32_t v[kElemsPerThread];
        for (int j = 0; j < cnt; ++j) {
          const int s = sm.syms[k][j0 + j];
          v[j] = 0;
          if (s == kZeroSymbol) continue;
          if (ri >= stream_nnz) {
            merge_bad = 1;
            break;
          }
          const uint8_t* q = sraw + uint64_t(ri) * raw_w;
          if (sizeof(T) == 2) {
            v[j] = Merge16(s, q[0]);
          } else if (low16) {
            v[j] = Merge16(s, q[0]) << 16;
          } else {
            v[j] = Merge32(s, q[0] | (uint32_t(q[1]) << 8) | (uint32_t(q[2]) << 16));
          }
          ++ri;
        }
        if (!merge_bad) {
          uint8_t* o = out + first * sizeof(T);
          if (cnt == kElemsPerThread && (reinterpret_cast<uintptr_t>(o) & 15) == 0) {
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
      }
      if (cta.sync_or(merge_bad)) {
        bad = 1;
        break;
      }
    }
    // Every stream must use exactly its bits and non-zero count.
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
struct PoisonKernel {
  static constexpr const char* kName = "zipccl_poison";
  static constexpr int kBlockThreads = kThreads;
  using Params = DecodeParams;
  struct Shared {
    int unused;
  };
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared&, const Params& p) {
    const uint64_t g = cta.block();
    const uint64_t f = g / p.nb, b = g % p.nb;
    if (p.ferr[f] == kNoError && p.berr[f] == kNoError) return;
    const uint32_t nan = p.dtype == kF32 ? 0x7FC00000u : p.dtype == kBF16 ? 0x7FC0u : 0x7E00u;
    const uint32_t fill = p.ferr[f] == kSkippedKey ? 0u : nan;
    const uint64_t m = BlockElems(p.n, b);
    uint8_t* out = p.out + (f * p.n + (b << kBlockLog2)) * sizeof(T);
    for (uint64_t e = cta.tid(); e < m; e += kThreads) StoreElem<T>(out + e * sizeof(T), fill);
  }
};

// 6. Status (only when the caller asked for it): int32 per frame, 0 or the
//    Status code of format.h.
struct StatusKernel {
  static constexpr const char* kName = "zipccl_status";
  static constexpr int kBlockThreads = kItemThreads;
  using Params = DecodeParams;
  struct Shared {
    int unused;
  };
  template <class Cta>
  ZIPCCL_HD static void Run(Cta& cta, Shared&, const Params& p) {
    const uint64_t f = cta.block() * kItemThreads + cta.tid();
    if (f >= p.frames) return;
    const unsigned long long key = p.ferr[f] < p.berr[f] ? p.ferr[f] : p.berr[f];
    p.status[f] = KeyStatus(key);
  }
};

// =============================================================================
// Launch sequences, shared by the CUDA driver and the host emulator
// =============================================================================
// A Launcher provides
//   template <class K> void Launch(uint64_t grid, const typename K::Params&);
//   void ExclusiveSum(const uint64_t* in, uint64_t* out, uint64_t n, void* temp,
//                     uint64_t temp_bytes);
// and remembers the first error itself.

template <class Launcher>
void RunEncode(Launcher& l, const EncodeParams& p, const EncodeLayout& L, uint8_t* scratch) {
  if (p.frames == 0) return;
  if (p.total) {
    const bool f32 = ElemBytes(p.dtype) == 4;
    if (f32)
      l.template Launch<HistKernel<uint32_t>>(p.total, p);
    else
      l.template Launch<HistKernel<uint16_t>>(p.total, p);
    l.template Launch<PlanKernel>(CeilDiv(p.total + 1, kItemThreads), p);
    l.ExclusiveSum(p.sizes, p.offsets, p.total + 1, scratch + L.cub_off, L.cub_bytes);
    if (f32)
      l.template Launch<WriteKernel<uint32_t>>(p.total, p);
    else
      l.template Launch<WriteKernel<uint16_t>>(p.total, p);
  }
  l.template Launch<FinishEncodeKernel>(CeilDiv(p.frames, kItemThreads), p);
  l.template Launch<ZeroTailKernel>(p.frames * ZeroTailKernel::kTilesPerFrame, p);
}

template <class Launcher>
void RunDecode(Launcher& l, const DecodeParams& p, const DecodeLayout& L, uint8_t* scratch) {
  if (p.frames == 0) return;
  l.template Launch<FrameCheckKernel>(CeilDiv(p.frames, kItemThreads), p);
  if (p.total) {
    const bool f32 = ElemBytes(p.dtype) == 4;
    l.template Launch<DirKernel>(CeilDiv(p.total + 1, kItemThreads), p);
    l.ExclusiveSum(p.sizes, p.offsets, p.total + 1, scratch + L.cub_off, L.cub_bytes);
    if (f32) {
      l.template Launch<DecodeBlockKernel<uint32_t>>(p.total, p);
      l.template Launch<PoisonKernel<uint32_t>>(p.total, p);
    } else {
      l.template Launch<DecodeBlockKernel<uint16_t>>(p.total, p);
      l.template Launch<PoisonKernel<uint16_t>>(p.total, p);
    }
  }
  if (p.status) l.template Launch<StatusKernel>(CeilDiv(p.frames, kItemThreads), p);
}

// =============================================================================
// Host API (implemented in codec_cuda.cu; asynchronous on `stream`)
// =============================================================================
// Return values are cudaError_t codes (0 = success).

// Bytes of CUB temporary storage for an exclusive scan of n uint64 values on
// the current device.
int ScanTempBytes(uint64_t n_items, uint64_t* bytes);

// Encodes `frames` frames of n elements each (x: frames * n elements, device
// memory) into payload (frames * cap bytes) and writes each frame's exact size
// to nbytes (int32 or int64 per frame). Semantics equal those of
// cpu::EncodeFrame applied per frame. skip (nullable, device memory, one byte
// per frame): a frame with a non-zero flag is not coded (its blocks are neither
// histogrammed, planned nor written), its payload row is all zero and its size 0. scratch holds L.scratch_bytes bytes
// (256-byte aligned); L comes from MakeEncodeLayout with ScanTempBytes(total + 1).
// The caller guarantees that MaxEncodedBytes(n) fits nbytes' type.
int EncodeAsync(const void* x, uint8_t dtype, bool checksum, uint8_t* payload, uint64_t cap,
                void* nbytes, bool nbytes64, const uint8_t* skip, const EncodeLayout& L,
                void* scratch, CUstream_st* stream);

// Decodes frames (payload: frames * cap bytes) into out (frames * n elements).
// A rejected frame's elements are set to NaN; status (nullable, int32 per
// frame) receives 0 or the Status code of the first error, as the CPU driver
// would report it. skip (nullable, device memory, one byte per frame): a frame
// with a non-zero flag is not read, its elements are zero and its status 0.
int DecodeAsync(const uint8_t* payload, uint64_t cap, uint8_t dtype, void* out, int32_t* status,
                const uint8_t* skip, const DecodeLayout& L, void* scratch, CUstream_st* stream);

const char* ErrorString(int cuda_error);

}  // namespace zipccl::cuda
