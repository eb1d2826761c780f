#include "codec_cpu.h"

#include <cstring>
#include <memory>

#include "block.h"
#include "format.h"
#include "huffman.h"
#include "xxhash32.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the CPU driver stores words with memcpy and assumes a little-endian host"
#endif

namespace zipccl::cpu {
namespace {

inline uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline void StoreU32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// ---- Pass 1: histogram and block properties --------------------------------
struct Analysis {
  uint32_t hist[kNumSymbols];
  bool all_equal;
  bool low16;
  uint32_t first;
};

// Four sub-histograms break the store-to-load chain on runs of equal symbols.
template <typename T>
void Analyse(const T* x, uint64_t n, Analysis* a) {
  uint32_t h[4][kNumSymbols];
  std::memset(h, 0, sizeof(h));
  const T first = x[0];
  T diff = 0, low = 0;
  uint64_t j = 0;
  auto sym = [](T v) {
    return sizeof(T) == 2 ? Symbol16(v) : Symbol32(v);
  };
  for (; j + 4 <= n; j += 4) {
    T v0 = x[j], v1 = x[j + 1], v2 = x[j + 2], v3 = x[j + 3];
    ++h[0][sym(v0)];
    ++h[1][sym(v1)];
    ++h[2][sym(v2)];
    ++h[3][sym(v3)];
    diff |= (v0 ^ first) | (v1 ^ first) | (v2 ^ first) | (v3 ^ first);
    low |= v0 | v1 | v2 | v3;
  }
  for (; j < n; ++j) {
    ++h[0][sym(x[j])];
    diff |= x[j] ^ first;
    low |= x[j];
  }
  for (int s = 0; s < kNumSymbols; ++s) a->hist[s] = h[0][s] + h[1][s] + h[2][s] + h[3][s];
  a->all_equal = diff == 0;
  a->low16 = sizeof(T) == 4 && (uint32_t(low) & 0xFFFFu) == 0;
  a->first = uint32_t(first);
}

// ---- Pass 2: HUFF block writer ----------------------------------------------
// Bitstream: codes are appended at increasing bit positions, bit i living in
// byte i / 8 at bit i % 8; the encoder keeps a 64-bit accumulator and spills
// whole 32-bit words, so it writes exactly ceil(total_bits / 8) bytes.
template <typename T>
void WriteHuffBlock(const T* x, uint64_t n, const BlockPlan& p, uint8_t* block) {
  WriteBlockHeader(block, p);
  WriteTable(block + kBlockHeaderBytes, p);
  uint8_t* dir = block + kBlockHeaderBytes + p.table_bytes;
  uint8_t* bits = dir + uint64_t(p.n_streams) * kStreamDirEntryBytes;
  uint8_t* raw = bits + (p.total_bits + 7) / 8;
  const bool low16 = p.flags & kBlockFlagLow16;
  auto sym = [low16](T v) {
    if (sizeof(T) == 2) return Symbol16(v);
    return low16 ? Symbol16(uint32_t(v) >> 16) : Symbol32(v);
  };

  uint64_t acc = 0;
  int nacc = 0;
  uint8_t* bp = bits;
  for (int k = 0; k < p.n_streams; ++k) {
    uint64_t lo = uint64_t(k) * kStreamElems;
    uint64_t hi = lo + kStreamElems < n ? lo + kStreamElems : n;
    uint32_t stream_bits = 0, zeros = 0;
    for (uint64_t j = lo; j < hi; ++j) {
      T v = x[j];
      uint32_t e = p.enc[sym(v)];
      acc |= uint64_t(e & 0xFFFFu) << nacc;
      nacc += int(e >> 16);
      stream_bits += e >> 16;
      zeros += v == 0;
      if (nacc >= 32) {
        StoreU32(bp, uint32_t(acc));
        bp += 4;
        acc >>= 32;
        nacc -= 32;
      }
    }
    Store16(dir + uint64_t(k) * kStreamDirEntryBytes, uint16_t(stream_bits));
    Store16(dir + uint64_t(k) * kStreamDirEntryBytes + 2, uint16_t((hi - lo) - zeros));
  }
  for (; nacc > 0; nacc -= 8, acc >>= 8) *bp++ = uint8_t(acc);

  // Raw bytes of the non-zero elements, in element order.
  if (p.nnz == n) {
    if (sizeof(T) == 2) {
      for (uint64_t j = 0; j < n; ++j) raw[j] = uint8_t(Raw16(x[j]));
    } else if (low16) {
      for (uint64_t j = 0; j < n; ++j) raw[j] = uint8_t(Raw16(uint32_t(x[j]) >> 16));
    } else {
      for (uint64_t j = 0; j < n; ++j) {
        uint32_t r = Raw32(x[j]);
        raw[3 * j] = uint8_t(r);
        raw[3 * j + 1] = uint8_t(r >> 8);
        raw[3 * j + 2] = uint8_t(r >> 16);
      }
    }
    return;
  }
  uint64_t r = 0;
  for (uint64_t j = 0; j < n; ++j) {
    uint32_t v = uint32_t(x[j]);
    if (!v) continue;
    if (sizeof(T) == 2 || low16) {
      raw[r++] = uint8_t(Raw16(sizeof(T) == 2 ? v : v >> 16));
    } else {
      uint32_t w = Raw32(v);
      raw[r] = uint8_t(w);
      raw[r + 1] = uint8_t(w >> 8);
      raw[r + 2] = uint8_t(w >> 16);
      r += 3;
    }
  }
}

template <typename T>
void WriteBlock(const T* x, uint64_t n, const BlockPlan& p, uint8_t* block) {
  if (p.mode == kModeHuff) {
    WriteHuffBlock(x, n, p, block);
    return;
  }
  WriteBlockHeader(block, p);
  if (p.mode == kModeRaw) std::memcpy(block + kBlockHeaderBytes, x, n * sizeof(T));
}

template <typename T>
uint64_t EncodeTyped(const T* x, uint64_t n, uint8_t dtype, bool checksum,
                     uint8_t* out, uint64_t cap) {
  const uint64_t nb = NumBlocks(n);
  uint64_t used = kFrameHeaderBytes + nb * kDirEntryBytes;
  bool fits = used <= cap;
  auto plan = std::make_unique<BlockPlan>();  // ~1.3 KB, kept off the stack
  Analysis a;
  for (uint64_t b = 0; b < nb; ++b) {
    const T* xb = x + (b << kBlockLog2);
    uint64_t nbe = BlockElems(n, b);
    Analyse(xb, nbe, &a);
    PlanBlock(a.hist, nbe, int(sizeof(T)), a.all_equal, a.first, a.low16, plan.get());
    if (fits && used + plan->block_bytes <= cap) {
      WriteBlock(xb, nbe, *plan, out + used);
      Store32(out + kFrameHeaderBytes + b * kDirEntryBytes, uint32_t(plan->block_bytes));
    } else {
      fits = false;
    }
    used += plan->block_bytes;
  }
  if (!fits) {
    if (cap >= kFrameHeaderBytes) WriteFrameHeader(out, dtype, 0, n, used, 0);
    return used;
  }
  uint8_t flags = checksum ? kFrameFlagChecksum : 0;
  WriteFrameHeader(out, dtype, flags, n, used, 0);
  if (checksum) Store32(out + 28, FrameChecksum(out, used));
  return used;
}

// ---- Decoder -----------------------------------------------------------------
struct DecodeTables {
  DecodeEntry single[kTableSize];
  MultiEntry multi[kTableSize];
};

// Symbols of one stream. `bits` points at the block's bitstream, whose
// readable extent (up to the end of the caller's buffer) is `readable` bytes.
struct StreamCursor {
  uint64_t pos;    // bit position, relative to `bits`
  uint64_t i;      // symbols decoded so far
  uint64_t count;  // symbols in the stream
  uint16_t* syms;
};

// One table lookup yielding up to three symbols. The caller guarantees that
// 8 bytes can be read at pos / 8 and that three symbol slots are writable.
inline bool MultiStep(const uint8_t* bits, const MultiEntry* multi, StreamCursor& c) {
  uint64_t w = LoadU64(bits + (c.pos >> 3)) >> (c.pos & 7);
  MultiEntry e = multi[w & (kTableSize - 1)];
  std::memcpy(c.syms + c.i, &e, 8);  // three symbols and one spare slot
  c.i += e.n;
  c.pos += e.bits;
  return e.n != 0;
}

// Safe single-symbol decoding for the ends of streams: bytes past the
// bitstream read as zero and are caught by the exact length check later.
inline bool SlowStep(const uint8_t* bits, uint64_t bit_bytes, const DecodeEntry* single,
                     StreamCursor& c) {
  uint64_t byte = c.pos >> 3;
  uint32_t w = 0;
  for (int k = 0; k < 3; ++k)
    if (byte + k < bit_bytes) w |= uint32_t(bits[byte + k]) << (8 * k);
  w >>= (c.pos & 7);
  DecodeEntry d = single[w & (kTableSize - 1)];
  if (d.len == 0) return false;
  c.syms[c.i++] = d.sym;
  c.pos += d.len;
  return true;
}

// Decodes 1..4 streams in lockstep so that their table lookups overlap.
template <int K>
bool DecodeStreams(const uint8_t* bits, uint64_t bit_bytes, uint64_t readable,
                   const DecodeTables& t, StreamCursor* c) {
  for (;;) {
    bool go = true;
    for (int k = 0; k < K; ++k)
      go &= (c[k].i + kMultiSyms <= c[k].count) && ((c[k].pos >> 3) + 8 <= readable);
    if (!go) break;
    bool ok = true;
    for (int k = 0; k < K; ++k) ok &= MultiStep(bits, t.multi, c[k]);
    if (!ok) return false;
  }
  for (int k = 0; k < K; ++k) {
    while (c[k].i + kMultiSyms <= c[k].count && (c[k].pos >> 3) + 8 <= readable)
      if (!MultiStep(bits, t.multi, c[k])) return false;
    while (c[k].i < c[k].count)
      if (!SlowStep(bits, bit_bytes, t.single, c[k])) return false;
  }
  return true;
}

// Joins symbols with their raw bytes. Returns false if the stream's zero
// count disagrees with its directory entry.
template <typename T>
bool MergeStream(const uint16_t* syms, uint64_t count, const uint8_t* raw,
                 uint64_t nnz, int raw_width, bool low16, T* out) {
  if (nnz == count) {  // no zeros: a straight, vectorisable loop
    uint32_t bad = 0;
    if (sizeof(T) == 2) {
      for (uint64_t j = 0; j < count; ++j) {
        bad |= syms[j];
        out[j] = T(Rotr16((uint32_t(syms[j]) << 8) | raw[j]));
      }
    } else if (low16) {
      for (uint64_t j = 0; j < count; ++j) {
        bad |= syms[j];
        out[j] = T(Rotr16((uint32_t(syms[j]) << 8) | raw[j]) << 16);
      }
    } else {
      for (uint64_t j = 0; j < count; ++j) {
        bad |= syms[j];
        uint32_t r = raw[3 * j] | (uint32_t(raw[3 * j + 1]) << 8) |
                     (uint32_t(raw[3 * j + 2]) << 16);
        out[j] = T(Rotr32((uint32_t(syms[j]) << 24) | r));
      }
    }
    return (bad >> 8) == 0;  // no zero symbol may appear
  }
  if (nnz == 0) {
    uint32_t bad = 0;
    for (uint64_t j = 0; j < count; ++j) {
      bad |= syms[j] ^ kZeroSymbol;
      out[j] = 0;
    }
    return bad == 0;
  }
  uint64_t r = 0;
  for (uint64_t j = 0; j < count; ++j) {
    uint32_t s = syms[j];
    uint64_t at = r < nnz ? r : nnz - 1;  // clamp: never read past the stream
    uint32_t v;
    if (sizeof(T) == 2 || low16) {
      v = Rotr16((s << 8) | raw[at]);
      if (low16) v <<= 16;
    } else {
      const uint8_t* q = raw + 3 * at;
      v = Rotr32((s << 24) | q[0] | (uint32_t(q[1]) << 8) | (uint32_t(q[2]) << 16));
    }
    bool nz = s != kZeroSymbol;
    out[j] = nz ? T(v) : T(0);
    r += nz;
  }
  return r == nnz;
}

template <typename T>
Status DecodeHuffBlock(const uint8_t* block, uint64_t block_bytes, uint64_t readable,
                       uint64_t n, uint8_t flags, DecodeTables* t, uint16_t* syms,
                       T* out) {
  uint8_t lens[kNumSymbols];
  HuffLayout L;
  Status st = ParseHuffLayout(block, block_bytes, n, int(sizeof(T)), flags, lens, &L);
  if (st != kOk) return st;
  uint32_t enc[kNumSymbols];
  if (!BuildEncodeTable(lens, enc)) return kErrTable;
  BuildDecodeTable(enc, t->single);
  BuildMultiTable(t->single, t->multi);

  const uint8_t* bits = block + L.bits_off;
  const uint64_t bit_bytes = (L.total_bits + 7) / 8;
  const uint64_t bits_readable = readable - L.bits_off;
  const bool low16 = flags & kBlockFlagLow16;
  uint64_t pos = 0, raw_at = 0;
  constexpr int kLanes = 4;
  for (int k0 = 0; k0 < L.n_streams; k0 += kLanes) {
    int lanes = L.n_streams - k0 < kLanes ? L.n_streams - k0 : kLanes;
    StreamCursor c[kLanes];
    uint64_t end[kLanes], nnz[kLanes], raw_off[kLanes];
    for (int q = 0; q < lanes; ++q) {
      int k = k0 + q;
      const uint8_t* d = block + L.dir_off + uint64_t(k) * kStreamDirEntryBytes;
      uint64_t first = uint64_t(k) * kStreamElems;
      c[q] = StreamCursor{pos, 0, n - first < uint64_t(kStreamElems) ? n - first
                                                                      : uint64_t(kStreamElems),
                          syms + q * (kStreamElems + 4)};
      end[q] = pos + Load16(d);
      pos = end[q];
      nnz[q] = Load16(d + 2);
      raw_off[q] = raw_at;
      raw_at += nnz[q] * uint64_t(L.raw_width);
    }
    bool ok = lanes == kLanes ? DecodeStreams<kLanes>(bits, bit_bytes, bits_readable, *t, c)
                              : DecodeStreams<1>(bits, bit_bytes, bits_readable, *t, c);
    for (int q = 1; ok && q < lanes && lanes != kLanes; ++q)
      ok = DecodeStreams<1>(bits, bit_bytes, bits_readable, *t, c + q);
    if (!ok) return kErrStream;
    for (int q = 0; q < lanes; ++q) {
      if (c[q].pos != end[q]) return kErrStream;
      T* o = out + uint64_t(k0 + q) * kStreamElems;
      if (!MergeStream(c[q].syms, c[q].count, block + L.raw_off + raw_off[q], nnz[q],
                       L.raw_width, low16, o))
        return kErrStream;
    }
  }
  // Padding bits after the last code must be zero.
  if ((L.total_bits & 7) && (bits[bit_bytes - 1] >> (L.total_bits & 7)) != 0)
    return kErrReserved;
  return kOk;
}

template <typename T>
DecodeResult DecodeTyped(const uint8_t* in, uint64_t in_bytes, uint8_t dtype, uint64_t n,
                         T* out) {
  if (in_bytes < kFrameHeaderBytes) return {kErrTruncated, -1};
  FrameHeader h = ParseFrameHeader(in);
  Status st = ValidateFrameHeader(h, dtype, n, in_bytes);
  if (st != kOk) return {st, -1};
  const uint64_t frame_bytes = h.frame_bytes;
  if ((h.flags & kFrameFlagChecksum) && FrameChecksum(in, frame_bytes) != h.checksum)
    return {kErrChecksum, -1};
  const uint64_t nb = NumBlocks(n);
  uint64_t off = kFrameHeaderBytes + nb * kDirEntryBytes;
  // Directory first: the blocks must tile the frame exactly.
  uint64_t total = off;
  for (uint64_t b = 0; b < nb; ++b) total += Load32(in + kFrameHeaderBytes + b * kDirEntryBytes);
  if (total != frame_bytes) return {kErrFrameSize, -1};

  std::unique_ptr<DecodeTables> tables;
  std::unique_ptr<uint16_t[]> syms;
  for (uint64_t b = 0; b < nb; ++b) {
    const uint64_t bb = Load32(in + kFrameHeaderBytes + b * kDirEntryBytes);
    const uint64_t nbe = BlockElems(n, b);
    const uint8_t* blk = in + off;
    T* ob = out + (b << kBlockLog2);
    if (bb < kBlockHeaderBytes) return {kErrBlockSize, int64_t(b)};
    const uint8_t mode = blk[0], flags = blk[1];
    if (blk[2] || blk[3]) return {kErrReserved, int64_t(b)};
    const uint32_t value = Load32(blk + 4);
    if (mode == kModeRaw) {
      if (flags) return {kErrBlockMode, int64_t(b)};
      if (value) return {kErrReserved, int64_t(b)};
      if (bb != kBlockHeaderBytes + nbe * sizeof(T)) return {kErrBlockSize, int64_t(b)};
      std::memcpy(ob, blk + kBlockHeaderBytes, nbe * sizeof(T));
    } else if (mode == kModeConst) {
      if (flags) return {kErrBlockMode, int64_t(b)};
      if (sizeof(T) == 2 && (value >> 16)) return {kErrReserved, int64_t(b)};
      if (bb != kBlockHeaderBytes) return {kErrBlockSize, int64_t(b)};
      for (uint64_t j = 0; j < nbe; ++j) ob[j] = T(value);
    } else if (mode == kModeHuff) {
      if (flags & kBlockFlagsReserved) return {kErrReserved, int64_t(b)};
      if (value) return {kErrReserved, int64_t(b)};
      if (!tables) {
        tables = std::make_unique<DecodeTables>();
        syms = std::make_unique<uint16_t[]>(4 * (kStreamElems + 4));
      }
      st = DecodeHuffBlock(blk, bb, in_bytes - off, nbe, flags, tables.get(), syms.get(), ob);
      if (st != kOk) return {st, int64_t(b)};
    } else {
      return {kErrBlockMode, int64_t(b)};
    }
    off += bb;
  }
  return {kOk, -1};
}

}  // namespace

uint64_t EncodeFrame(const void* x, uint64_t n, uint8_t dtype, bool checksum, uint8_t* out,
                     uint64_t cap) {
  if (ElemBytes(dtype) == 4)
    return EncodeTyped(static_cast<const uint32_t*>(x), n, dtype, checksum, out, cap);
  return EncodeTyped(static_cast<const uint16_t*>(x), n, dtype, checksum, out, cap);
}

DecodeResult DecodeFrame(const uint8_t* in, uint64_t in_bytes, uint8_t dtype, uint64_t n,
                         void* out) {
  if (ElemBytes(dtype) == 0) return {kErrDType, -1};
  if (ElemBytes(dtype) == 4)
    return DecodeTyped(in, in_bytes, dtype, n, static_cast<uint32_t*>(out));
  return DecodeTyped(in, in_bytes, dtype, n, static_cast<uint16_t*>(out));
}

}  // namespace zipccl::cpu
