// CUDA driver of the zipccl codec, common part: geometry, platform primitives,
// kernel parameters, scratch layout and frame arithmetic. No XLA includes
// (xla_ffi/handlers_cuda.cu adapts the driver to XLA FFI).
//
// The driver is split the way dietgpu splits GpuFloatCompress/Decompress:
//   cuda_common.cuh  this file
//   cuda_encode.cuh  encoder kernel bodies
//   cuda_decode.cuh  decoder kernel bodies
//   cuda_scan.cuh    the block-size scan kernel body
//   cuda_kernels.cuh the list of kernels (extern "C" entry names)
//   cuda_launch.cuh  launch sequences (RunEncode/RunDecode) and the host API
//
// Everything a kernel does lives in a `Run` template over a "CTA" type that
// provides the thread index, barriers, a CTA-wide exclusive scan and warp
// primitives (ballot(pred): the mask of the lanes of the caller's warp whose
// pred is non-zero; shfl(v, src): lane src's v; warp_sync()); every thread of
// the CTA must reach each warp primitive, because the emulator runs them as
// CTA barriers:
//   - codec/kernels.cu instantiates the bodies with DeviceCta (threadIdx,
//     __syncthreads, a warp-shuffle scan) inside extern "C" __global__ entries,
//     compiled by NVRTC; codec/kernels_host.cc runs the launch sequence
//     (RunEncode/RunDecode) through the CUDA driver API;
//   - xla_ffi/cuda_host_bindings.cc instantiates the same bodies and the same
//     launch sequence with a host SIMT emulator (one fiber per thread, barriers
//     as context switches, threads run in a shuffled order between barriers,
//     shared and scratch memory filled with garbage), so the kernels' bytes are
//     checked against the CPU driver on a machine without a GPU.
// The format logic itself is not here: the bodies call the shared
// __host__ __device__ functions of format.h, block.h, huffman.h and xxhash32.h
// (PlanBlock, WriteBlockHeader, WriteTable, ParseHuffLayout, BuildEncodeTable,
// CanonicalCodeOf, SortByCode, DecodeEntryAt, Symbol16/32, Merge16/32,
// ValidateFrameHeader, FrameChecksum).
//
// These headers compile with NVRTC (and nvcc) and with a plain C++17 host compiler.
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
// Histogram and RAW/CONST work: one CTA of kThreads threads per 65536-element
// block, walking it in tiles of kTileElems, each thread owning kElemsPerThread
// consecutive elements of a tile.
constexpr int kThreads = 256;
constexpr int kElemsPerThread = 8;
constexpr uint64_t kTileElems = uint64_t(kThreads) * kElemsPerThread;  // 2048
// Per-item kernels (plan, directory gather, frame check/finish, status): one
// thread per block or per frame, in CTAs of kItemThreads.
constexpr int kItemThreads = 64;
// Segment kernels (units count, block writer, block decoder): one CTA per
// block, warp w working on the block's segment w (FORMAT.md "HUFF blocks"):
// lane l of it codes the segment's elements 32 t + l at step t, so each step's
// element loads and stores, unit loads and raw bytes are contiguous. A block
// that has fewer segments leaves warps idle; every warp still runs the steps
// of the block's longest segment (BlockSteps), so a ballot (a CTA barrier in the emulator) is reached
// the same number of times by every thread.
constexpr int kSegThreads = kLanes * kMaxSegmentsPerBlock;  // 128

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
// On the host, atomics are the compiler's atomic builtins (relaxed, like
// CUDA's atomics): the emulator (simt_emulator.h) runs one fiber at a time, but
// its instrumented builds see them as atomic accesses (and may switch fibers
// there), where a plain read-modify-write would be a race. A GPU faults on a vector or word access that is not aligned to its size
// (cudaErrorMisalignedAddress), where the host's memcpy would not: the host
// versions record the first such access in EmuFault(), which the emulator
// (simt_emulator.h) turns into an error after the CTA.
#if !defined(__CUDA_ARCH__)
inline const char*& EmuFault() {
  static thread_local const char* fault = nullptr;
  return fault;
}
inline void EmuCheckAligned(const void* p, uintptr_t bytes, const char* what) {
  if ((reinterpret_cast<uintptr_t>(p) & (bytes - 1)) != 0 && EmuFault() == nullptr) EmuFault() = what;
}
#endif
ZIPCCL_HD void AtomicAddShared(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(p, v);
#else
  __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
#endif
}
ZIPCCL_HD void AtomicOrShared(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  atomicOr(p, v);
#else
  __atomic_fetch_or(p, v, __ATOMIC_RELAXED);
#endif
}
ZIPCCL_HD void AtomicMinGlobal(unsigned long long* p, unsigned long long v) {
#if defined(__CUDA_ARCH__)
  atomicMin(p, v);
#else
  unsigned long long cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v < cur && !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
#endif
}
ZIPCCL_HD uint32_t Popc(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __popc(v);
#else
  return uint32_t(__builtin_popcount(v));
#endif
}
// 16 aligned bytes as four little-endian words.
ZIPCCL_HD void Load16B(const uint8_t* p, uint32_t* w) {
#if defined(__CUDA_ARCH__)
  uint4 v = *reinterpret_cast<const uint4*>(p);
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#else
  EmuCheckAligned(p, 16, "misaligned 16-byte (uint4) load");
  std::memcpy(w, p, 16);
#endif
}
ZIPCCL_HD void Store16B(uint8_t* p, const uint32_t* w) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
#else
  EmuCheckAligned(p, 16, "misaligned 16-byte (uint4) store");
  std::memcpy(p, w, 16);
#endif
}
ZIPCCL_HD uint32_t LoadAligned32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  EmuCheckAligned(p, 4, "misaligned 32-bit load");
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
ZIPCCL_HD void StoreAligned32(uint8_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint32_t*>(p) = v;
#else
  EmuCheckAligned(p, 4, "misaligned 32-bit store");
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
  EmuCheckAligned(p, sizeof(T), "misaligned element load");
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
  EmuCheckAligned(p, sizeof(T), "misaligned element store");
  T t = T(v);
  std::memcpy(p, &t, sizeof(T));
#endif
}

// Loads the kElemsPerThread elements [first, first + 8) of a block of m
// elements at xb (16-byte vector loads, or two words for one-byte elements,
// when aligned and complete). Returns how many exist.
template <typename T>
ZIPCCL_HD int LoadElems8(const uint8_t* xb, uint64_t m, uint64_t first, uint32_t* v) {
  if (first >= m) return 0;
  const uint64_t left = m - first;
  const int cnt = left < uint64_t(kElemsPerThread) ? int(left) : kElemsPerThread;
  const uint8_t* p = xb + first * sizeof(T);
  if (sizeof(T) == 1 && cnt == kElemsPerThread && (reinterpret_cast<uintptr_t>(p) & 7) == 0) {
    // One-byte elements: two aligned words (a warp reads 256 contiguous bytes).
    const uint32_t lo = LoadAligned32(p), hi = LoadAligned32(p + 4);
    for (int j = 0; j < 4; ++j) {
      v[j] = (lo >> (8 * j)) & 0xFFu;
      v[4 + j] = (hi >> (8 * j)) & 0xFFu;
    }
    return cnt;
  }
  if (sizeof(T) > 1 && cnt == kElemsPerThread && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
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
  BlockPlan* plans;    // [total]
  uint64_t* sizes;     // [total + 1]: block_bytes, then 0
  uint64_t* offsets;   // [total + 1]: exclusive prefix sum of sizes
  uint32_t* hashes;    // [frames * nb]: the checksum's block hashes
};

struct DecodeParams {
  const uint8_t* payload;  // frames * cap bytes
  uint64_t frames, cap, n, nb, total;
  uint8_t dtype;
  uint8_t* out;             // frame f's n elements from element f * out_row
  uint64_t out_row;         // elements from one frame's output to the next (>= n; n: contiguous)
  int32_t* status;          // [frames] or null
  const uint8_t* skip;      // [frames] or null: non-zero = not read, output zero, status 0
  uint64_t* sizes;          // [total + 1]: directory entries, then 0
  uint64_t* offsets;        // [total + 1]
  unsigned long long* ferr; // [frames]: frame-level error key (header, checksum)
  unsigned long long* berr; // [frames]: min over block error keys
  uint32_t* hashes;         // [frames * nb]: the checksum's block hashes
};

// ---- Scratch layout -----------------------------------------------------------
// One scratch allocation per call, carved into 256-byte aligned sections; its
// size depends only on the call's shape.
constexpr uint64_t kScratchAlign = 256;
ZIPCCL_HD uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct EncodeLayout {
  uint64_t frames, n, nb, total;
  uint64_t plans_off, sizes_off, offsets_off, hashes_off;
  uint64_t scratch_bytes;  // 0 when there is no block to code
};

struct DecodeLayout {
  uint64_t frames, n, nb, total;
  uint64_t sizes_off, offsets_off, ferr_off, berr_off, hashes_off;
  uint64_t scratch_bytes;
};

// Reserves `bytes` at offset *at and returns that offset; *at moves to the
// next aligned start.
inline uint64_t CarveSection(uint64_t* at, uint64_t bytes) {
  const uint64_t off = *at;
  *at = AlignUp(off + bytes, kScratchAlign);
  return off;
}
// The sections both layouts end with: the block sizes and their prefix sums
// ([total + 1] each; the scan kernel needs no other storage).
template <class Layout>
void CarveScanSections(uint64_t* at, Layout* L) {
  L->sizes_off = CarveSection(at, (L->total + 1) * sizeof(uint64_t));
  L->offsets_off = CarveSection(at, (L->total + 1) * sizeof(uint64_t));
}

inline EncodeLayout MakeEncodeLayout(uint64_t frames, uint64_t n) {
  EncodeLayout L{};
  L.frames = frames;
  L.n = n;
  L.nb = NumBlocks(n);
  L.total = frames * L.nb;
  if (L.total == 0) return L;  // only frame headers: no scratch
  uint64_t at = 0;
  L.plans_off = CarveSection(&at, L.total * sizeof(BlockPlan));
  CarveScanSections(&at, &L);
  L.hashes_off = CarveSection(&at, L.total * sizeof(uint32_t));
  L.scratch_bytes = at;
  return L;
}

inline DecodeLayout MakeDecodeLayout(uint64_t frames, uint64_t n) {
  DecodeLayout L{};
  L.frames = frames;
  L.n = n;
  L.nb = NumBlocks(n);
  L.total = frames * L.nb;
  uint64_t at = 0;
  L.ferr_off = CarveSection(&at, frames * sizeof(unsigned long long));
  L.berr_off = CarveSection(&at, frames * sizeof(unsigned long long));
  if (L.total) {
    CarveScanSections(&at, &L);
    L.hashes_off = CarveSection(&at, L.total * sizeof(uint32_t));
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
    p.plans = reinterpret_cast<BlockPlan*>(scratch + L.plans_off);
    p.sizes = reinterpret_cast<uint64_t*>(scratch + L.sizes_off);
    p.offsets = reinterpret_cast<uint64_t*>(scratch + L.offsets_off);
    p.hashes = reinterpret_cast<uint32_t*>(scratch + L.hashes_off);
  }
  return p;
}

inline DecodeParams MakeDecodeParams(const DecodeLayout& L, const uint8_t* payload, uint64_t cap,
                                     uint8_t dtype, void* out, uint64_t out_row, int32_t* status,
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
  p.out_row = out_row;
  p.status = status;
  p.skip = skip;
  p.ferr = reinterpret_cast<unsigned long long*>(scratch + L.ferr_off);
  p.berr = reinterpret_cast<unsigned long long*>(scratch + L.berr_off);
  if (L.total) {
    p.hashes = reinterpret_cast<uint32_t*>(scratch + L.hashes_off);
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

// ---- Checksum by a CTA ------------------------------------------------------------
// FrameChecksum of xxhash32.h (format v2: XXH32 of the parts' XXH32s) by the
// kSumThreads threads of a CTA: the blocks hash independently, so thread t
// hashes blocks t, t + kSumThreads, ... (clipped to the frame as FrameChecksum
// clips them) into hashes[0, nb), and thread 0 then hashes part 0 (the header,
// read with a zero checksum field, and the directory) and folds the parts in
// order. The blocks' offsets come from the scan of the directory (offsets,
// from the frame's first block g0 = f * nb). The per-part hash is serial, over
// 128 KB at most for a bfloat16 block; a frame of many blocks keeps every
// thread of the CTA busy. Every thread calls this with the same arguments; the
// result is in thread 0 (unspecified in the others); barriers on both sides.
constexpr int kSumThreads = kItemThreads;

template <class Cta>
ZIPCCL_HD uint32_t CtaFrameChecksum(Cta& cta, const uint8_t* frame, uint64_t frame_bytes, uint64_t nb,
                                    const uint64_t* offsets, uint64_t g0, uint32_t* hashes) {
  cta.sync();
  const uint64_t body = kFrameHeaderBytes + nb * kDirEntryBytes;
  for (uint64_t b = cta.tid(); b < nb; b += kSumThreads) {
    const uint64_t lo = body + (offsets[g0 + b] - offsets[g0]);
    const uint64_t hi = body + (offsets[g0 + b + 1] - offsets[g0]);
    const uint64_t a = lo < frame_bytes ? lo : frame_bytes, e = hi < frame_bytes ? hi : frame_bytes;
    hashes[b] = Xxh32Bytes(frame + a, e - a, kChecksumSeed);
  }
  cta.sync();
  uint32_t h = 0;
  if (cta.tid() == 0) {
    Xxh32Words outer;
    outer.Init();
    outer.Add(ChecksumHeadPart(frame, nb));  // part 0, then the blocks in order
    for (uint64_t b = 0; b < nb; ++b) outer.Add(hashes[b]);
    h = outer.Finish();
  }
  cta.sync();
  return h;
}

// ---- Kernel shapes ------------------------------------------------------------------
// A kernel is a struct with kName, kBlockThreads, Params, Shared and a static
// Run(cta, shared, params) template (cuda_launch.cuh launches it). These bases
// give the parts most kernels have in common.
struct NoShared {
  struct Shared {
    int unused;  // a __shared__ variable cannot have an empty type
  };
};
// One thread per item (a frame or a block) in CTAs of kItemThreads.
template <class P>
struct PerItemKernel : NoShared {
  static constexpr int kBlockThreads = kItemThreads;
  using Params = P;
  // This thread's item; past the last one in the grid's last CTA.
  template <class Cta>
  ZIPCCL_HD static uint64_t Item(const Cta& cta) {
    return cta.block() * kItemThreads + cta.tid();
  }
};

}  // namespace zipccl::cuda
