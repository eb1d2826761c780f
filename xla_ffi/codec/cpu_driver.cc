#include "cpu_driver.h"

#include <cstring>
#include <initializer_list>
#include <memory>

#include "block.h"
#include "format.h"
#include "huffman.h"
#include "xxhash32.h"

// AVX-512 VBMI2 (vpcompressb) compacts the raw bytes of blocks with zeros; the
// build uses -march=native, and other targets take the portable loops.
#if defined(__AVX512VBMI2__) && defined(__AVX512VL__) && defined(__AVX512BW__) && defined(__BMI2__)
#define ZIPCCL_CPU_VBMI2 1
#include <immintrin.h>
#else
#define ZIPCCL_CPU_VBMI2 0
#endif

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

// ---- Pass 1: histogram and block properties --------------------------------
struct Analysis {
  uint32_t hist[kNumSymbols];
  uint32_t stream_zeros[kMaxStreamsPerBlock];
  bool all_equal;
  bool low16;
  uint32_t first;
};

// The symbol byte of an element: SymbolOf<T>(v) for v != 0, and 0 for v == 0
// (zeros are counted apart and move to kZeroSymbol). For 16- and 32-bit
// elements it is the byte at bit 7 / 23 (the exponent), for bytes rotl8(v).
template <typename T>
inline uint32_t SymbolByte(T v) {
  if constexpr (sizeof(T) == 1)
    return Rotl8(v);
  else
    return (v >> (sizeof(T) == 2 ? 7 : 23)) & 0xFF;
}

template <typename T>
void Analyse(const T* x, uint64_t n, Analysis* a) {
  // Element properties, one vectorisable pass per stream.
  const T first = x[0];
  T diff = 0, low = 0;
  uint64_t zeros = 0;
  for (uint64_t lo = 0, k = 0; lo < n; lo += kStreamElems, ++k) {
    uint64_t hi = lo + kStreamElems < n ? lo + kStreamElems : n;
    uint32_t z = 0;
    for (uint64_t j = lo; j < hi; ++j) {
      diff |= x[j] ^ first;
      low |= x[j];
      z += x[j] == 0;
    }
    a->stream_zeros[k] = z;
    zeros += z;
  }
  // Exponent-byte histogram; four sub-histograms break the store-to-load
  // chain on runs of equal exponents. Zeros land in bin 0 and move to 256.
  uint32_t h[4][256];
  std::memset(h, 0, sizeof(h));
  uint64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    ++h[0][SymbolByte(x[j])];
    ++h[1][SymbolByte(x[j + 1])];
    ++h[2][SymbolByte(x[j + 2])];
    ++h[3][SymbolByte(x[j + 3])];
  }
  for (; j < n; ++j) ++h[0][SymbolByte(x[j])];
  for (int s = 0; s < 256; ++s) a->hist[s] = h[0][s] + h[1][s] + h[2][s] + h[3][s];
  a->hist[0] -= uint32_t(zeros);
  a->hist[kZeroSymbol] = uint32_t(zeros);
  a->all_equal = diff == 0;
  a->low16 = sizeof(T) == 4 && (uint32_t(low) & 0xFFFFu) == 0;
  a->first = uint32_t(first);
}

// ---- Pass 2: HUFF block writer ----------------------------------------------
// Bitstream: codes are appended at increasing bit positions, bit i living in
// byte i / 8 at bit i % 8. Four codes (<= 44 bits) go into a 64-bit
// accumulator, which is then stored whole and advanced by its complete bytes;
// the store may run up to 8 bytes past the bitstream, into the raw region
// written afterwards, so the caller guarantees 8 bytes of slack (kWide) or we
// flush byte by byte.
template <typename T, bool kWide, bool kZeros>
uint64_t PackStreams(const T* x, uint64_t n, const BlockPlan& p, const uint32_t* stream_zeros,
                     uint8_t* dir, uint8_t* bits) {
  // The LOW16 coding of a float32 has the same symbols (see block.h).
  uint64_t enc[kNumSymbols];  // code in the low 32 bits, length in the high 32
  for (int s = 0; s < kNumSymbols; ++s)
    enc[s] = (p.enc[s] & 0xFFFFu) | (uint64_t(p.enc[s] >> 16) << 32);
  // kZeros false: the symbol is the exponent byte alone, which spares a
  // compare and a select per element. That is exact without zeros in the
  // block, and also with zeros when no non-zero element has exponent byte 0
  // (no -0.0, no subnormal of that byte; hist[0] == 0): a zero's exponent byte
  // is 0, so entry 0 then carries the ZERO symbol's code.
  if (!kZeros && p.lens[0] == 0) enc[0] = enc[kZeroSymbol];
  auto sym = [](T v) -> uint32_t {
    uint32_t e = SymbolByte(v);
    return (!kZeros || v) ? e : uint32_t(kZeroSymbol);
  };
  uint64_t acc = 0;
  uint64_t nacc = 0;
  uint8_t* bp = bits;
  uint64_t prev_bits = 0;
  for (int k = 0; k < p.n_streams; ++k) {
    uint64_t lo = uint64_t(k) * kStreamElems;
    uint64_t hi = lo + kStreamElems < n ? lo + kStreamElems : n;
    uint64_t j = lo;
    if (kWide) {
      for (; j + 4 <= hi; j += 4) {
        uint64_t t0 = enc[sym(x[j])], t1 = enc[sym(x[j + 1])];
        uint64_t t2 = enc[sym(x[j + 2])], t3 = enc[sym(x[j + 3])];
        acc |= uint64_t(uint32_t(t0)) << nacc;
        nacc += t0 >> 32;
        acc |= uint64_t(uint32_t(t1)) << nacc;
        nacc += t1 >> 32;
        acc |= uint64_t(uint32_t(t2)) << nacc;
        nacc += t2 >> 32;
        acc |= uint64_t(uint32_t(t3)) << nacc;
        nacc += t3 >> 32;
        std::memcpy(bp, &acc, 8);
        bp += nacc >> 3;
        acc >>= nacc & 56;
        nacc &= 7;
      }
    }
    for (; j < hi; ++j) {
      uint64_t t = enc[sym(x[j])];
      acc |= uint64_t(uint32_t(t)) << nacc;
      nacc += t >> 32;
      while (nacc >= 8) {
        *bp++ = uint8_t(acc);
        acc >>= 8;
        nacc -= 8;
      }
    }
    uint64_t now = uint64_t(bp - bits) * 8 + nacc;
    Store16(dir + uint64_t(k) * kStreamDirEntryBytes, uint16_t(now - prev_bits));
    Store16(dir + uint64_t(k) * kStreamDirEntryBytes + 2,
            uint16_t((hi - lo) - stream_zeros[k]));
    prev_bits = now;
  }
  if (nacc) *bp++ = uint8_t(acc);
  return prev_bits;
}

// Raw bytes of the non-zero elements of x[0, n), in element order, at raw.
// Writes exactly the raw region and nothing past it, so it needs no slack.
template <typename T>
void WriteRawCompacted(const T* x, uint64_t n, bool low16, uint8_t* raw) {
  const bool one = sizeof(T) == 2 || low16;  // one raw byte per element, else three
  uint64_t j = 0, r = 0;
#if ZIPCCL_CPU_VBMI2
  // 64 bytes of elements per step: rotate every element left by one (a funnel
  // shift of the lane with itself), so that its raw bytes sit in place, spread
  // the non-zero mask over those bytes, squeeze them together with vpcompressb
  // and store exactly them with a masked store: nothing lands past the region.
  // Raw bytes per lane: 16-bit dtype, byte 0 of rotl16(v); LOW16, byte 2 of
  // the lane (the low byte of rotl16(v >> 16)); float32, bytes 0-2 of rotl32(v).
  constexpr uint64_t kElems = 64 / sizeof(T);
  const uint64_t spread = sizeof(T) == 2 ? 0x5555555555555555ull
                          : low16        ? 0x4444444444444444ull
                                         : 0x1111111111111111ull;
  const uint64_t width = one ? 1 : 3;
  for (; j + kElems <= n; j += kElems) {
    const __m512i v = _mm512_loadu_si512(x + j);
    uint64_t keep;
    __m512i rot;
    if constexpr (sizeof(T) == 2) {
      keep = _mm512_test_epi16_mask(v, v);
      rot = _mm512_shldi_epi16(v, v, 1);
    } else {
      keep = _mm512_test_epi32_mask(v, v);
      rot = low16 ? _mm512_shldi_epi16(v, v, 1) : _mm512_shldi_epi32(v, v, 1);
    }
    uint64_t keep_bytes = _pdep_u64(keep, spread);
    if (width == 3) keep_bytes *= 7;  // bit 4i -> bits 4i, 4i+1, 4i+2
    const uint64_t cnt = width * uint64_t(__builtin_popcountll(keep));
    _mm512_mask_storeu_epi8(raw + r, _bzhi_u64(~0ull, unsigned(cnt)),
                            _mm512_maskz_compress_epi8(keep_bytes, rot));
    r += cnt;
  }
#endif
  // Branchless tail (the whole block without VBMI2): store the element's raw
  // bytes at r whether it is zero or not, and advance r only past non-zero
  // ones. A zero element's store lands where the next non-zero element's bytes
  // go, so it is harmless as long as a non-zero element follows; the trailing
  // zeros are therefore cut off first. Then r <= (nnz - 1) * width at every
  // store and nothing is written past the raw region.
  uint64_t last = n;
  while (last > j && !x[last - 1]) --last;
  for (; j < last; ++j) {
    const uint32_t v = uint32_t(x[j]);
    if (one) {
      raw[r] = uint8_t(Raw16(sizeof(T) == 2 ? v : v >> 16));
      r += v != 0;
    } else {
      const uint32_t w = Raw32(v);
      raw[r] = uint8_t(w);
      raw[r + 1] = uint8_t(w >> 8);
      raw[r + 2] = uint8_t(w >> 16);
      r += v ? 3 : 0;
    }
  }
}

template <typename T>
void WriteHuffBlock(const T* x, uint64_t n, const BlockPlan& p, const Analysis& a,
                    uint8_t* block, const uint8_t* out_end) {
  WriteBlockHeader(block, p);
  WriteTable(block + kBlockHeaderBytes, p);
  uint8_t* dir = block + kBlockHeaderBytes + p.table_bytes;
  uint8_t* bits = dir + uint64_t(p.n_streams) * kStreamDirEntryBytes;
  uint8_t* raw = bits + (p.total_bits + 7) / 8;
  const bool low16 = p.flags & kBlockFlagLow16;
  if (raw + 8 <= out_end)
    (p.nnz == n || p.lens[0] == 0 ? PackStreams<T, true, false>
                                  : PackStreams<T, true, true>)(x, n, p, a.stream_zeros, dir, bits);
  else
    PackStreams<T, false, true>(x, n, p, a.stream_zeros, dir, bits);
  if constexpr (sizeof(T) == 1) return;  // one-byte floats: the symbols are everything

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
  WriteRawCompacted(x, n, low16, raw);
}

template <typename T>
void WriteBlock(const T* x, uint64_t n, const BlockPlan& p, const Analysis& a, uint8_t* block,
                const uint8_t* out_end) {
  if (p.mode == kModeHuff) {
    WriteHuffBlock(x, n, p, a, block, out_end);
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
      WriteBlock(xb, nbe, *plan, a, out + used, out + cap);
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
// Symbols decode into bytes when the block leaves some exponent value unused:
// that value then stands in for the zero symbol (the "alias"), and one 8-byte
// table entry carries up to six symbols. A block that uses all 256 exponents
// and zero decodes into uint16 symbols, three per entry. Either way the symbol
// buffer holds what MergeStream joins with the raw bytes.
template <typename S>
struct MultiEntry {
  static constexpr int kSyms = 6 / int(sizeof(S));
  S sym[kSyms];
  uint8_t n;     // symbols in this entry; 0 marks a prefix no code starts
  uint8_t bits;  // bits they span
};
static_assert(sizeof(MultiEntry<uint8_t>) == 8 && sizeof(MultiEntry<uint16_t>) == 8);

template <typename S>
void BuildMultiTable(const DecodeEntry* single, S zero_code, MultiEntry<S>* multi) {
  for (int i = 0; i < kTableSize; ++i) {
    MultiEntry<S> e{};
    uint32_t cur = uint32_t(i);
    int avail = kMaxCodeLen;
    while (e.n < MultiEntry<S>::kSyms) {
      DecodeEntry d = single[cur & (kTableSize - 1)];
      if (d.len == 0 || d.len > avail) break;
      e.sym[e.n++] = d.sym == kZeroSymbol ? zero_code : S(d.sym);
      e.bits = uint8_t(e.bits + d.len);
      avail -= d.len;
      cur >>= d.len;
    }
    multi[i] = e;
  }
}

// The byte-symbol table, built in one pass of increasing index with SWAR
// arithmetic instead of a walk per entry. Entry i starts with the symbol d of
// i's low bits, followed by as many leading symbols of entry (i >> d.len) as
// end within the remaining 11 - d.len bits (i >> d.len < i, so that entry is
// ready). cum[i] holds, per byte k, the bits consumed after k + 1 symbols
// (0xFF past the end), which is what the truncation test needs.
inline void BuildMultiTable8(const DecodeEntry* single, uint8_t zero_code,
                             MultiEntry<uint8_t>* multi, uint64_t* cum) {
  constexpr uint64_t kL = 0x0101010101010101ull, kH = 0x8080808080808080ull;
  constexpr uint64_t kSymMask = 0x0000FFFFFFFFFFFFull;
  {  // Entry 0 refers to itself (0 >> len == 0), so it is walked directly.
    MultiEntry<uint8_t> e{};
    uint64_t c = ~0ull;
    uint32_t cur = 0;
    int avail = kMaxCodeLen;
    while (e.n < MultiEntry<uint8_t>::kSyms) {
      DecodeEntry d = single[cur & (kTableSize - 1)];
      if (d.len == 0 || d.len > avail) break;
      e.sym[e.n] = d.sym == kZeroSymbol ? zero_code : uint8_t(d.sym);
      e.bits = uint8_t(e.bits + d.len);
      c = (c & ~(0xFFull << (8 * e.n))) | (uint64_t(e.bits) << (8 * e.n));
      ++e.n;
      avail -= d.len;
      cur >>= d.len;
    }
    multi[0] = e;
    cum[0] = c;
  }
  for (int i = 1; i < kTableSize; ++i) {
    const DecodeEntry d = single[i];
    if (d.len == 0) {
      multi[i] = MultiEntry<uint8_t>{};
      cum[i] = ~0ull;
      continue;
    }
    const uint64_t l = d.len;
    const uint64_t j = uint64_t(i) >> l;
    uint64_t cj = cum[j] | 0xFFFFFF0000000000ull;  // take at most 5 from entry j
    uint64_t ge = ((cj | kH) - (12 - l) * kL) & kH;  // byte >= 11 - l + 1
    uint64_t take = uint64_t(__builtin_ctzll(ge)) >> 3;
    uint64_t n = 1 + take;
    uint64_t sj;
    std::memcpy(&sj, &multi[j], 8);
    uint8_t s0 = d.sym == kZeroSymbol ? zero_code : uint8_t(d.sym);
    uint64_t syms = ((sj << 8) | s0) & kSymMask;
    uint64_t ci = (((cj + l * kL) << 8) | l) | (~0ull << (8 * n));
    uint64_t bits = (ci >> (8 * (n - 1))) & 0xFF;
    uint64_t word = syms | (n << 48) | (bits << 56);
    std::memcpy(&multi[i], &word, 8);
    cum[i] = ci;
  }
}

struct DecodeScratch {
  DecodeEntry single[kTableSize];
  MultiEntry<uint8_t> multi8[kTableSize];
  MultiEntry<uint16_t> multi16[kTableSize];
  uint64_t cum[kTableSize];
  // Lanes of symbols, plus slack for the 8-byte entry stores.
  uint16_t syms[8 * (kStreamElems + 8)];
};

// Cursor over one stream of the block's bitstream.
template <typename S>
struct StreamCursor {
  uint64_t pos;    // bit position, relative to the bitstream start
  uint64_t i;      // symbols decoded so far
  uint64_t count;  // symbols in the stream
  S* syms;
};

// One lookup yielding up to kSyms symbols. The caller guarantees that 8 bytes
// are readable at pos / 8 and that kSyms + 2 symbol slots are writable.
template <typename S>
inline bool MultiStep(const uint8_t* bits, const MultiEntry<S>* multi, StreamCursor<S>& c) {
  uint64_t w = LoadU64(bits + (c.pos >> 3)) >> (c.pos & 7);
  MultiEntry<S> e = multi[w & (kTableSize - 1)];
  std::memcpy(c.syms + c.i, &e, 8);  // the symbols, and two bytes of spill
  c.i += e.n;
  c.pos += e.bits;
  return e.n != 0;
}

// Safe single-symbol decoding for the ends of streams: bytes past the
// bitstream read as zero and are caught by the exact length check later.
template <typename S>
inline bool SlowStep(const uint8_t* bits, uint64_t bit_bytes, const DecodeEntry* single,
                     S zero_code, StreamCursor<S>& c) {
  uint64_t byte = c.pos >> 3;
  uint32_t w = 0;
  for (int k = 0; k < 3; ++k)
    if (byte + k < bit_bytes) w |= uint32_t(bits[byte + k]) << (8 * k);
  w >>= (c.pos & 7);
  DecodeEntry d = single[w & (kTableSize - 1)];
  if (d.len == 0) return false;
  c.syms[c.i++] = d.sym == kZeroSymbol ? zero_code : S(d.sym);
  c.pos += d.len;
  return true;
}

// Finishes one stream: multi-symbol lookups while they are safe, then single
// symbols up to the stream's exact count.
template <typename S>
bool FinishStream(const uint8_t* bits, uint64_t bit_bytes, uint64_t readable,
                  const DecodeEntry* single, const MultiEntry<S>* multi, S zero_code,
                  StreamCursor<S>& c) {
  constexpr uint64_t kStep = MultiEntry<S>::kSyms;
  while (c.i + kStep <= c.count && (c.pos >> 3) + 8 <= readable)
    if (!MultiStep(bits, multi, c)) return false;
  while (c.i < c.count)
    if (!SlowStep(bits, bit_bytes, single, zero_code, c)) return false;
  return true;
}

// Joins one stream's symbols with its raw bytes into elements. Returns false
// if the stream's zero count disagrees with its directory entry.
template <typename T, typename S>
bool MergeStream(const S* syms, uint64_t count, S zero_code, const uint8_t* raw, uint64_t nnz,
                 bool low16, T* out) {
  if constexpr (sizeof(T) == 1) {  // one-byte floats: the element is the symbol, rotated back
    uint64_t r = 0;
    for (uint64_t j = 0; j < count; ++j) {
      const bool nz = syms[j] != zero_code;
      out[j] = nz ? T(Rotr8(syms[j])) : T(0);
      r += nz;
    }
    return r == nnz;
  }
  if (nnz == count) {  // no zeros: straight, vectorisable loops
    uint32_t bad = 0;
    if (sizeof(T) == 2) {
      for (uint64_t j = 0; j < count; ++j) {
        bad |= syms[j] == zero_code;
        out[j] = T(Rotr16((uint32_t(syms[j]) << 8) | raw[j]));
      }
    } else if (low16) {
      for (uint64_t j = 0; j < count; ++j) {
        bad |= syms[j] == zero_code;
        out[j] = T(Rotr16((uint32_t(syms[j]) << 8) | raw[j]) << 16);
      }
    } else {
      for (uint64_t j = 0; j < count; ++j) {
        bad |= syms[j] == zero_code;
        uint32_t r = raw[3 * j] | (uint32_t(raw[3 * j + 1]) << 8) |
                     (uint32_t(raw[3 * j + 2]) << 16);
        out[j] = T(Rotr32((uint32_t(syms[j]) << 24) | r));
      }
    }
    return bad == 0;
  }
  if (nnz == 0) {
    uint32_t bad = 0;
    for (uint64_t j = 0; j < count; ++j) {
      bad |= syms[j] != zero_code;
      out[j] = 0;
    }
    return bad == 0;
  }
  uint64_t r = 0, j = 0;
#if ZIPCCL_CPU_VBMI2
  // 16-bit elements with byte symbols, 32 per step: load exactly the raw bytes
  // the step's non-zero symbols need (a masked load, so never past the raw
  // region), spread them to those symbols' positions with vpexpandb, join and
  // rotate, and zero the ZERO positions.
  if constexpr (sizeof(T) == 2 && sizeof(S) == 1) {
    const __m256i zc = _mm256_set1_epi8(char(zero_code));
    for (; j + 32 <= count; j += 32) {
      const __m256i sv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(syms + j));
      const __mmask32 nz = _mm256_cmpneq_epi8_mask(sv, zc);
      const uint64_t cnt = uint64_t(__builtin_popcount(nz));
      if (r + cnt > nnz) return false;  // more non-zero symbols than the directory says
      const __m256i rv = _mm256_maskz_expand_epi8(
          nz, _mm256_maskz_loadu_epi8(_bzhi_u32(~0u, unsigned(cnt)), raw + r));
      const __m512i v = _mm512_or_si512(_mm512_slli_epi16(_mm512_cvtepu8_epi16(sv), 8),
                                        _mm512_cvtepu8_epi16(rv));
      _mm512_storeu_si512(out + j, _mm512_maskz_shrdi_epi16(nz, v, v, 1));  // Rotr16
      r += cnt;
    }
  }
#endif
  for (; j < count; ++j) {
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
    bool nz = s != zero_code;
    out[j] = nz ? T(v) : T(0);
    r += nz;
  }
  return r == nnz;
}

// Where one stream of a HUFF block lives, read from the stream directory once
// per block so that streams can be started in any order.
struct StreamSpan {
  uint64_t start, end;  // bit offsets from the bitstream start: [start, end)
  uint64_t raw_off;     // byte offset of its raw bytes from the raw region start
  uint32_t count;       // elements (symbols) in the stream
  uint32_t nnz;         // of which non-ZERO, per the directory
};

// Checks a stream whose directory says it holds no non-ZERO element. Decoding
// it would accept exactly when its bits are `count` back-to-back copies of the
// ZERO code and nothing more: the code is prefix-free, so any other bits either
// decode to another symbol (which fails the nnz check), match no code, or end
// elsewhere than `end`. That is what this compares, 56 bits (a whole number of
// codes) per load instead of one table lookup per six symbols. zero_code is the
// ZERO code as it sits in the bitstream (first bit lowest), zero_len its length
// in bits, 0 when ZERO has no code.
inline bool ZeroStreamValid(const uint8_t* bits, uint64_t readable, const StreamSpan& s,
                            uint32_t zero_code, int zero_len) {
  if (zero_len == 0 || s.end - s.start != uint64_t(s.count) * uint64_t(zero_len)) return false;
  const int chunk = (56 / zero_len) * zero_len;  // bits per comparison, <= 56
  uint64_t pat = 0;  // the code repeated from bit 0; a chunk starts at phase 0
  for (int j = 0; j < 64; ++j) pat |= uint64_t((zero_code >> (j % zero_len)) & 1u) << j;
  uint64_t diff = 0;
  for (uint64_t pos = s.start; pos < s.end; pos += uint64_t(chunk)) {
    const uint64_t left = s.end - pos;
    const int nb = left < uint64_t(chunk) ? int(left) : chunk;
    const uint64_t byte = pos >> 3;
    uint64_t w;
    if (byte + 8 <= readable) {
      w = LoadU64(bits + byte);
    } else {  // the end of the buffer: the stream's own bits are readable, the rest are not
      w = 0;
      for (uint64_t b = 0; byte + b < readable && b < 8; ++b) w |= uint64_t(bits[byte + b]) << (8 * b);
    }
    diff |= ((w >> (pos & 7)) ^ pat) & ((uint64_t(1) << nb) - 1);
  }
  return diff == 0;
}

template <typename S>
struct PoolCtx {
  const uint8_t* bits;  // bitstream start
  uint64_t bit_bytes;   // bytes the bitstream occupies
  uint64_t readable;    // bytes readable from `bits` (the bitstream, the raw region, and on)
  const DecodeEntry* single;
  const MultiEntry<S>* multi;
  S zero_code;
  const uint8_t* raw;  // raw region start
  bool low16;
  const StreamSpan* span;
};

// Completes stream k from cursor c (single symbols near its end), checks that
// it used exactly its directory's bits and writes its elements. Out of line:
// it is called from every lane of the unrolled pool loop.
template <typename T, typename S>
__attribute__((noinline)) bool FinishLane(const PoolCtx<S>& x, int k, StreamCursor<S>& c,
                                          T* out) {
  if (!FinishStream(x.bits, x.bit_bytes, x.readable, x.single, x.multi, x.zero_code, c))
    return false;
  const StreamSpan& s = x.span[k];
  if (c.pos != s.end) return false;
  return MergeStream(c.syms, c.count, x.zero_code, x.raw + s.raw_off, s.nnz, x.low16,
                     out + uint64_t(k) * kStreamElems);
}

// Lockstep bursts shorter than this many steps are not worth their setup: a
// lane whose bound allows fewer is finished on its own (at most ~kMinBurst
// multi-symbol lookups plus < kSyms single ones) and its slot refilled.
constexpr uint64_t kMinBurst = 2;

// Decodes the streams q[0, qn) (qn >= K) with K lanes in lockstep, so that their
// table lookups overlap. The lanes start on q[0, K); a lane whose stream is
// about to end finishes it alone (FinishLane) and takes the next listed
// stream, so all K lanes stay busy however unequal the streams' lookup counts
// (all-ZERO and mostly-ZERO streams take ~6 symbols per lookup, others ~2-3).
// When a lane ends with the list exhausted, the unfinished streams' cursors
// are saved in cur and their indices moved to q[0, r); returns r (< K), or -1
// on a malformed stream. Lane state lives in registers: arrays of scalars that
// the unrolled loops scalarise. A listed stream whose cursor has no symbol
// buffer yet takes the buffer of the lane it replaces, whose symbols are
// merged by then.
template <int K, typename T, typename S>
int DecodePool(const PoolCtx<S>& x, StreamCursor<S>* cur, int* q, int qn, T* out) {
  constexpr uint64_t kStep = MultiEntry<S>::kSyms;
  uint64_t p[K];    // bit position
  S* o[K];          // next symbol slot
  S* base[K];       // symbol buffer of the lane's stream
  uint64_t lim[K];  // symbols in the lane's stream
  int sid[K];       // the lane's stream, -1 once the list ran dry
#pragma GCC unroll 8
  for (int k = 0; k < K; ++k) {
    const StreamCursor<S>& c = cur[q[k]];
    sid[k] = q[k];
    p[k] = c.pos;
    base[k] = c.syms;
    o[k] = c.syms + c.i;
    lim[k] = c.count;
  }
  int next = K;
  // A step advances a lane by at most kStep symbols and kMaxCodeLen bits and
  // reads 8 bytes at its bit position. A lane's bound is how many steps it can
  // take before either limit could be hit; a burst runs the smallest bound
  // without checks.
  const uint64_t bit_limit = x.readable >= 8 ? (x.readable - 8) * 8 : 0;
  auto bound = [&](int k) {
    const uint64_t by_count = (lim[k] - uint64_t(o[k] - base[k])) / kStep;
    const uint64_t by_bits = p[k] <= bit_limit ? (bit_limit - p[k]) / kMaxCodeLen : 0;
    return by_count < by_bits ? by_count : by_bits;
  };
  const uint8_t* bits = x.bits;
  const MultiEntry<S>* multi = x.multi;
  for (;;) {
    uint64_t safe = ~0ull;
#pragma GCC unroll 8
    for (int k = 0; k < K; ++k) {
      const uint64_t b = bound(k);
      safe = b < safe ? b : safe;
    }
    if (safe >= kMinBurst) {
      S* start[K];
#pragma GCC unroll 8
      for (int k = 0; k < K; ++k) start[k] = o[k];
      for (uint64_t t = safe; t; --t) {
#pragma GCC unroll 8
        for (int k = 0; k < K; ++k) {
          MultiEntry<S> e = multi[(LoadU64(bits + (p[k] >> 3)) >> (p[k] & 7)) & (kTableSize - 1)];
          std::memcpy(o[k], &e, 8);
          o[k] += e.n;
          p[k] += e.bits;
        }
      }
      // A prefix that no code starts has n == 0 and bits == 0: its lane
      // stalls. Every other step yields at least one symbol, so a lane that
      // gained fewer than `safe` symbols met corrupt input.
      bool bad = false;
#pragma GCC unroll 8
      for (int k = 0; k < K; ++k) bad |= uint64_t(o[k] - start[k]) < safe;
      if (bad) return -1;
      continue;
    }
    // Retire the lanes at their streams' ends and refill them.
    bool dry = false;
#pragma GCC unroll 8
    for (int k = 0; k < K; ++k) {
      if (bound(k) >= kMinBurst) continue;
      StreamCursor<S> c{p[k], uint64_t(o[k] - base[k]), lim[k], base[k]};
      if (!FinishLane(x, sid[k], c, out)) return -1;
      if (next < qn) {
        StreamCursor<S>& n = cur[q[next]];
        if (!n.syms) n.syms = base[k];
        sid[k] = q[next++];
        p[k] = n.pos;
        base[k] = n.syms;
        o[k] = n.syms + n.i;
        lim[k] = n.count;
      } else {
        sid[k] = -1;
        dry = true;
      }
    }
    if (dry) {
      int r = 0;
#pragma GCC unroll 8
      for (int k = 0; k < K; ++k) {
        if (sid[k] < 0) continue;
        cur[sid[k]] = StreamCursor<S>{p[k], uint64_t(o[k] - base[k]), lim[k], base[k]};
        q[r++] = sid[k];
      }
      return r;
    }
  }
}

template <typename T, typename S>
Status DecodeHuffStreams(const uint8_t* block, const HuffLayout& L, uint64_t readable,
                         uint64_t n, bool low16, const DecodeEntry* single,
                         const MultiEntry<S>* multi, S zero_code, uint32_t zero_enc, S* syms,
                         T* out) {
  const uint8_t* bits = block + L.bits_off;
  const uint64_t bit_bytes = (L.total_bits + 7) / 8;
  const uint64_t bits_readable = readable - L.bits_off;
  // The whole directory up front: every stream's bits, raw bytes and counts.
  StreamSpan span[kMaxStreamsPerBlock];
  StreamCursor<S> cur[kMaxStreamsPerBlock];
  int q[kMaxStreamsPerBlock];  // streams left for the lanes, in block order
  int qn = 0;
  uint64_t pos = 0, raw_at = 0;
  for (int k = 0; k < L.n_streams; ++k) {
    const uint8_t* d = block + L.dir_off + uint64_t(k) * kStreamDirEntryBytes;
    const uint64_t first = uint64_t(k) * kStreamElems;
    StreamSpan& s = span[k];
    s.count = uint32_t(n - first < uint64_t(kStreamElems) ? n - first : kStreamElems);
    s.start = pos;
    s.end = pos + Load16(d);
    s.nnz = Load16(d + 2);
    s.raw_off = raw_at;
    pos = s.end;
    raw_at += uint64_t(s.nnz) * uint64_t(L.raw_width);
    if (s.nnz == 0) {
      // All ZERO (MoE capacity padding): a bit comparison instead of the lanes.
      if (!ZeroStreamValid(bits, bits_readable, s, zero_enc & 0xFFFFu, int(zero_enc >> 16)))
        return kErrStream;
      std::memset(out + first, 0, s.count * sizeof(T));
      continue;
    }
    cur[k] = StreamCursor<S>{s.start, 0, s.count, nullptr};
    q[qn++] = k;
  }
  // Eight streams in flight hide the ~14-cycle chain of one lookup (position
  // -> load -> table -> position); four left the core idle half the time. The
  // first eight listed streams get the eight symbol buffers; later ones take
  // over the buffer of the lane they refill.
  constexpr int kLanes = 8;
  for (int j = 0; j < qn && j < kLanes; ++j) cur[q[j]].syms = syms + j * (kStreamElems + 8);
  const PoolCtx<S> x{bits, bit_bytes, bits_readable, single, multi, zero_code,
                     block + L.raw_off, low16, span};
  // Once the list runs dry the remaining streams drain on fewer lanes.
  int left = qn;
  if (left >= kLanes) left = DecodePool<kLanes, T, S>(x, cur, q, left, out);
  if (left >= 4) left = DecodePool<4, T, S>(x, cur, q, left, out);
  if (left >= 2) left = DecodePool<2, T, S>(x, cur, q, left, out);
  if (left == 1 && !FinishLane(x, q[0], cur[q[0]], out)) return kErrStream;
  if (left < 0) return kErrStream;
  // Padding bits after the last code must be zero.
  if ((L.total_bits & 7) && (bits[bit_bytes - 1] >> (L.total_bits & 7)) != 0)
    return kErrReserved;
  return kOk;
}

template <typename T>
Status DecodeHuffBlock(const uint8_t* block, uint64_t block_bytes, uint64_t readable,
                       uint64_t n, uint8_t flags, DecodeScratch* t, T* out) {
  uint8_t lens[kNumSymbols];
  HuffLayout L;
  Status st = ParseHuffLayout(block, block_bytes, n, int(sizeof(T)), flags, lens, &L);
  if (st != kOk) return st;
  uint32_t enc[kNumSymbols];
  if (!BuildEncodeTable(lens, enc)) return kErrTable;
  BuildDecodeTable(enc, t->single);
  const bool low16 = flags & kBlockFlagLow16;
  int alias = -1;  // an exponent value this block never codes
  for (int s = 0; s < 256 && alias < 0; ++s)
    if (!lens[s]) alias = s;
  if (alias >= 0) {
    BuildMultiTable8(t->single, uint8_t(alias), t->multi8, t->cum);
    return DecodeHuffStreams<T, uint8_t>(block, L, readable, n, low16, t->single, t->multi8,
                                         uint8_t(alias), enc[kZeroSymbol],
                                         reinterpret_cast<uint8_t*>(t->syms), out);
  }
  BuildMultiTable<uint16_t>(t->single, uint16_t(kZeroSymbol), t->multi16);
  return DecodeHuffStreams<T, uint16_t>(block, L, readable, n, low16, t->single, t->multi16,
                                        uint16_t(kZeroSymbol), enc[kZeroSymbol], t->syms, out);
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

  std::unique_ptr<DecodeScratch> scratch;  // ~50 KB, only for HUFF blocks
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
      if constexpr (sizeof(T) < 4) {  // the bits above the element are reserved
        if (value >> (8 * sizeof(T))) return {kErrReserved, int64_t(b)};
      }
      if (bb != kBlockHeaderBytes) return {kErrBlockSize, int64_t(b)};
      for (uint64_t j = 0; j < nbe; ++j) ob[j] = T(value);
    } else if (mode == kModeHuff) {
      if (flags & kBlockFlagsReserved) return {kErrReserved, int64_t(b)};
      if (value) return {kErrReserved, int64_t(b)};
      if (!scratch) scratch.reset(new DecodeScratch);
      st = DecodeHuffBlock(blk, bb, in_bytes - off, nbe, flags, scratch.get(), ob);
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
  if (ElemBytes(dtype) == 1)
    return EncodeTyped(static_cast<const uint8_t*>(x), n, dtype, checksum, out, cap);
  if (ElemBytes(dtype) == 4)
    return EncodeTyped(static_cast<const uint32_t*>(x), n, dtype, checksum, out, cap);
  return EncodeTyped(static_cast<const uint16_t*>(x), n, dtype, checksum, out, cap);
}

DecodeResult DecodeFrame(const uint8_t* in, uint64_t in_bytes, uint8_t dtype, uint64_t n,
                         void* out) {
  if (ElemBytes(dtype) == 0) return {kErrDType, -1};
  if (ElemBytes(dtype) == 1)
    return DecodeTyped(in, in_bytes, dtype, n, static_cast<uint8_t*>(out));
  if (ElemBytes(dtype) == 4)
    return DecodeTyped(in, in_bytes, dtype, n, static_cast<uint32_t*>(out));
  return DecodeTyped(in, in_bytes, dtype, n, static_cast<uint16_t*>(out));
}

}  // namespace zipccl::cpu
