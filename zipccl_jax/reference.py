"""Pure-NumPy reference codec for the zipccl wire format v1 (FORMAT.md), every dtype code.

This is the test oracle: it is written from FORMAT.md, not from the C++ code,
and must produce byte-identical frames to every zipccl encoder and decode them.
It needs only NumPy and ml_dtypes (no JAX, no compiled extension). It favours
clarity over speed, but the heavy parts are vectorised so that tests stay fast:

- `encode(x, checksum=False) -> bytes` follows the normative "Encoder rules".
- `decode(frame, shape=, dtype=) -> np.ndarray` checks every "Decoder
  compliance" rule and raises `ValueError("zipccl reference decode: <reason>")`
  on the first violation; it never reads outside `frame`.

Helpers, usable on their own: `split_symbols` / `merge_symbols` (the symbol
table), `code_lengths` (encoder rule 3), `canonical_codes` (RFC 1951 order),
`pack_codes` (MSB-first codes into an LSB-first bitstream), `xxh32` (seed 0),
`frame_info` (parse headers without decoding).
"""

from __future__ import annotations

import math
import struct
from typing import Sequence

import ml_dtypes
import numpy as np

from zipccl_jax import format as fmt

__all__ = [
    "encode", "decode", "frame_info", "split_symbols", "merge_symbols", "code_lengths",
    "canonical_codes", "pack_codes", "xxh32", "max_encoded_bytes",
]

MAX_LEN = fmt.MAX_CODE_LEN            # 11
ZERO = fmt.ZERO_SYMBOL                # 256
NSYM = fmt.NUM_SYMBOLS                # 257
_HDR = struct.Struct("<IBBBBQQII")    # magic, version, dtype, flags, block_log2, n, frame_bytes, rsv, csum
_BLK = struct.Struct("<BBHI")         # mode, flags, reserved, value
assert _HDR.size == fmt.FRAME_HEADER_BYTES and _BLK.size == fmt.BLOCK_HEADER_BYTES

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}
_DTYPE_OF_CODE = {code: dt for dt, code in fmt.DTYPE_CODES.items()}

max_encoded_bytes = fmt.max_encoded_bytes


def _width(code: int) -> int:
  return _DTYPE_OF_CODE[code].itemsize


def _raw_width(code: int, low16: bool) -> int:
  """Raw bytes per non-ZERO element: the element's bytes below its symbol byte."""
  return 1 if low16 else _width(code) - 1


# --------------------------------------------------------------------------- symbols

def _rotl(v: np.ndarray, bits: int) -> np.ndarray:
  return (v << 1) | (v >> (bits - 1))


def _rotr(v: np.ndarray, bits: int) -> np.ndarray:
  return (v >> 1) | (v << (bits - 1))


def split_symbols(u: np.ndarray, dtype_code: int, low16: bool = False):
  """Elements (as unsigned ints) -> (symbols uint16 [m], raw bytes uint8 [nnz, r]).

  ZERO (256) for all-zero elements, which have no raw bytes. `r` is 0 for
  one-byte dtypes (the symbol is the whole byte), 1 for 16-bit dtypes and
  for LOW16, else 3 (little-endian low 24 bits).
  """
  if _width(dtype_code) == 1:
    u = np.asarray(u, np.uint8)
    sym = _rotl(u, 8).astype(np.uint16)
    sym[u == 0] = ZERO
    return sym, np.zeros((int(np.count_nonzero(u)), 0), np.uint8)
  if dtype_code == fmt.DTYPE_F32:
    u = np.asarray(u, np.uint32)
    if low16:
      if np.any(u & 0xFFFF):
        raise ValueError("LOW16 needs every element's low 16 bits to be zero")
      u = (u >> 16).astype(np.uint16)
    else:
      rot = _rotl(u, 32)
      sym = (rot >> 24).astype(np.uint16)
      sym[u == 0] = ZERO
      nz = rot[u != 0]
      raw = np.stack([nz & 0xFF, (nz >> 8) & 0xFF, (nz >> 16) & 0xFF], axis=1).astype(np.uint8)
      return sym, raw
  u = np.asarray(u, np.uint16)
  rot = _rotl(u, 16)
  sym = (rot >> 8).astype(np.uint16)
  sym[u == 0] = ZERO
  raw = (rot[u != 0] & 0xFF).astype(np.uint8).reshape(-1, 1)
  return sym, raw


def merge_symbols(sym: np.ndarray, raw: np.ndarray, dtype_code: int, low16: bool = False):
  """Inverse of `split_symbols`: -> uint8, uint16 or uint32 elements."""
  sym = np.asarray(sym)
  nz = sym != ZERO
  if _width(dtype_code) == 1:
    out = np.zeros(sym.shape, np.uint8)
    out[nz] = _rotr(sym[nz].astype(np.uint8), 8)
    return out
  wide = dtype_code == fmt.DTYPE_F32 and not low16
  raw = np.asarray(raw, np.uint8).reshape(int(nz.sum()), 3 if wide else 1)
  if wide:
    out = np.zeros(sym.shape, np.uint32)
    r = raw.astype(np.uint32)
    rot = (sym[nz].astype(np.uint32) << 24) | r[:, 0] | (r[:, 1] << 8) | (r[:, 2] << 16)
    out[nz] = _rotr(rot, 32)
    return out
  out = np.zeros(sym.shape, np.uint16)
  rot = (sym[nz].astype(np.uint16) << 8) | raw[:, 0].astype(np.uint16)
  out[nz] = _rotr(rot, 16)
  if dtype_code == fmt.DTYPE_F32:
    return out.astype(np.uint32) << 16
  return out


# --------------------------------------------------------------------------- codes

def code_lengths(counts: Sequence[int]) -> np.ndarray:
  """Code lengths (uint8 [257]) from a symbol histogram, by encoder rule 3."""
  counts = np.asarray(counts, np.int64)
  if counts.shape != (NSYM,):
    raise ValueError(f"counts must have {NSYM} entries, got shape {counts.shape}")
  lengths = np.zeros(NSYM, np.uint8)
  # 3.1 used symbols sorted by (count ascending, symbol ascending)
  used = sorted((int(c), s) for s, c in enumerate(counts) if c > 0)
  if not used:
    raise ValueError("no symbol is used")
  if len(used) == 1:                                   # 3.2
    lengths[used[0][1]] = 1
    return lengths
  # 3.3 two-queue Huffman. Nodes 0..n-1 are the leaves, n.. the internal nodes.
  n = len(used)
  weight = [c for c, _ in used]
  parent = [0] * (2 * n - 1)
  leaf_i, node_i = 0, n              # fronts of the leaf queue and of the internal queue
  for new in range(n, 2 * n - 1):
    pair = []
    for _ in range(2):
      if leaf_i < n and (node_i >= new or weight[leaf_i] <= weight[node_i]):
        pair.append(leaf_i)
        leaf_i += 1
      else:
        pair.append(node_i)
        node_i += 1
    weight.append(weight[pair[0]] + weight[pair[1]])
    parent[pair[0]] = parent[pair[1]] = new
  depth = [0] * (2 * n - 1)
  for node in range(2 * n - 3, -1, -1):                # root = 2n-2 has depth 0
    depth[node] = depth[parent[node]] + 1
  # 3.4 depth histogram, fold into MAX_LEN, repair Kraft
  bl_count = [0] * (MAX_LEN + 2)
  for leaf in range(n):
    bl_count[min(depth[leaf], MAX_LEN)] += 1
  while sum(bl_count[d] << (MAX_LEN - d) for d in range(1, MAX_LEN + 1)) > (1 << MAX_LEN):
    bl_count[MAX_LEN] -= 1
    d = MAX_LEN - 1
    while bl_count[d] == 0:
      d -= 1
    bl_count[d] -= 1
    bl_count[d + 1] += 2
  # 3.5 hand lengths out again, rarest symbol first, longest length first
  i = 0
  for length in range(MAX_LEN, 0, -1):
    for _ in range(bl_count[length]):
      lengths[used[i][1]] = length
      i += 1
  assert i == n
  return lengths


def canonical_codes(lengths: np.ndarray) -> np.ndarray:
  """DEFLATE canonical codes (uint32 [257]) for `lengths`; ZERO (256) is last."""
  lengths = np.asarray(lengths, np.int64)
  bl_count = np.bincount(lengths, minlength=MAX_LEN + 1)
  bl_count[0] = 0
  next_code = [0] * (MAX_LEN + 2)
  for length in range(2, MAX_LEN + 1):
    next_code[length] = (next_code[length - 1] + int(bl_count[length - 1])) << 1
  codes = np.zeros(NSYM, np.uint32)
  for s in range(NSYM):
    length = int(lengths[s])
    if length:
      codes[s] = next_code[length]
      next_code[length] += 1
  return codes


def pack_codes(codes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  """Packs per-element codes, each MSB first, into an LSB-first bitstream (uint8)."""
  codes = np.asarray(codes, np.uint32)
  lengths = np.asarray(lengths, np.int64)
  total = int(lengths.sum())
  if total == 0:
    return np.zeros(0, np.uint8)
  starts = np.cumsum(lengths) - lengths
  j = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)   # bit index within the code
  shift = np.repeat(lengths, lengths) - 1 - j
  bits = ((np.repeat(codes, lengths) >> shift.astype(np.uint32)) & 1).astype(np.uint8)
  return np.packbits(bits, bitorder="little")


def _kraft_ok(lengths: np.ndarray) -> bool:
  lengths = np.asarray(lengths, np.int64)
  used = lengths[lengths > 0]
  return int(np.sum(1 << (MAX_LEN - used))) <= (1 << MAX_LEN)


# --------------------------------------------------------------------------- xxh32

_P1, _P2, _P3, _P4, _P5 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1
_M32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
  return ((x << r) | (x >> (32 - r))) & _M32


def xxh32(data, seed: int = 0) -> int:
  """XXH32 of `data` (bytes-like or uint8 array) with `seed`."""
  buf = np.frombuffer(bytes(data), np.uint8)
  n = buf.size
  seed &= _M32
  p = 0
  if n >= 16:
    stripes = n // 16
    lanes = buf[:stripes * 16].view("<u4").reshape(stripes, 4).astype(np.uint64)
    lanes = ((lanes * _P2) & _M32).tolist()      # input * PRIME2 mod 2^32, vectorised
    acc = [(seed + _P1 + _P2) & _M32, (seed + _P2) & _M32, seed, (seed - _P1) & _M32]
    a0, a1, a2, a3 = acc
    for l0, l1, l2, l3 in lanes:
      a0 = (_rotl32((a0 + l0) & _M32, 13) * _P1) & _M32
      a1 = (_rotl32((a1 + l1) & _M32, 13) * _P1) & _M32
      a2 = (_rotl32((a2 + l2) & _M32, 13) * _P1) & _M32
      a3 = (_rotl32((a3 + l3) & _M32, 13) * _P1) & _M32
    h = (_rotl32(a0, 1) + _rotl32(a1, 7) + _rotl32(a2, 12) + _rotl32(a3, 18)) & _M32
    p = stripes * 16
  else:
    h = (seed + _P5) & _M32
  h = (h + n) & _M32
  while p + 4 <= n:
    word = int.from_bytes(buf[p:p + 4].tobytes(), "little")
    h = (_rotl32((h + word * _P3) & _M32, 17) * _P4) & _M32
    p += 4
  while p < n:
    h = (_rotl32((h + int(buf[p]) * _P5) & _M32, 11) * _P1) & _M32
    p += 1
  h ^= h >> 15
  h = (h * _P2) & _M32
  h ^= h >> 13
  h = (h * _P3) & _M32
  h ^= h >> 16
  return h


# --------------------------------------------------------------------------- encode

def _as_elements(x) -> tuple[np.ndarray, int]:
  x = np.asarray(x)
  code = fmt.dtype_code(x.dtype, arg="x")
  u = np.ascontiguousarray(x).reshape(-1).view(_UINT[_width(code)])
  return u, code


def _huff_block(u: np.ndarray, code: int) -> bytes:
  """The HUFF coding of one block (rule 3), whatever its size."""
  m = u.size
  low16 = code == fmt.DTYPE_F32 and not np.any(u & 0xFFFF)
  sym, raw = split_symbols(u, code, low16)
  counts = np.bincount(sym, minlength=NSYM)
  lengths = code_lengths(counts)
  codes = canonical_codes(lengths)
  nonzero_used = np.flatnonzero(counts[:ZERO])
  lo, hi = (int(nonzero_used[0]), int(nonzero_used[-1])) if nonzero_used.size else (0, 0)
  nibbles = np.concatenate([[lengths[ZERO]], lengths[lo:hi + 1]]).astype(np.uint8)
  if nibbles.size % 2:
    nibbles = np.append(nibbles, np.uint8(0))
  table = bytes([lo, hi]) + (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8).tobytes()
  elem_len = lengths[sym].astype(np.int64)
  n_streams = -(-m // fmt.STREAM_ELEMS)
  bounds = np.arange(n_streams) * fmt.STREAM_ELEMS
  stream_bits = np.add.reduceat(elem_len, bounds)
  stream_nnz = np.add.reduceat((sym != ZERO).astype(np.int64), bounds)
  sdir = np.empty((n_streams, 2), "<u2")
  sdir[:, 0] = stream_bits
  sdir[:, 1] = stream_nnz
  bitstream = pack_codes(codes[sym], elem_len)
  header = _BLK.pack(fmt.MODE_HUFF, fmt.BLOCK_FLAG_LOW16 if low16 else 0, 0, 0)
  return header + table + sdir.tobytes() + bitstream.tobytes() + raw.tobytes()


def _encode_block(u: np.ndarray, code: int) -> bytes:
  """Rule 2: CONST, else HUFF if smaller than RAW, else RAW."""
  w = _width(code)
  if np.all(u == u[0]):
    return _BLK.pack(fmt.MODE_CONST, 0, 0, int(u[0]))
  huff = _huff_block(u, code)
  if len(huff) < fmt.BLOCK_HEADER_BYTES + u.size * w:
    return huff
  return _BLK.pack(fmt.MODE_RAW, 0, 0, 0) + u.astype(f"<u{w}").tobytes()


def encode(x, *, checksum: bool = False) -> bytes:
  """One frame for the flat (row-major) elements of `x`, as zipccl encoders write it."""
  u, code = _as_elements(x)
  n = u.size
  blocks = [_encode_block(u[s:s + fmt.BLOCK_ELEMS], code) for s in range(0, n, fmt.BLOCK_ELEMS)]
  directory = struct.pack(f"<{len(blocks)}I", *(len(b) for b in blocks))
  frame_bytes = fmt.FRAME_HEADER_BYTES + len(directory) + sum(len(b) for b in blocks)
  flags = fmt.FLAG_CHECKSUM if checksum else 0
  header = _HDR.pack(fmt.MAGIC, fmt.VERSION, code, flags, fmt.BLOCK_LOG2, n, frame_bytes, 0, 0)
  frame = bytearray(header + directory + b"".join(blocks))
  assert len(frame) == frame_bytes <= fmt.max_encoded_bytes(n, _DTYPE_OF_CODE[code])
  if checksum:
    frame[28:32] = struct.pack("<I", xxh32(frame))
  return bytes(frame)


# --------------------------------------------------------------------------- decode

def _as_buf(frame) -> np.ndarray:
  if isinstance(frame, np.ndarray):
    if frame.dtype != np.uint8:
      raise TypeError(f"frame must be bytes or a uint8 array, got dtype {frame.dtype}")
    return np.ascontiguousarray(frame).reshape(-1)
  return np.frombuffer(bytes(frame), np.uint8)


def _fail(reason: str):
  raise ValueError(f"zipccl reference decode: {reason}")


def _parse_header(buf: np.ndarray):
  if buf.size < fmt.FRAME_HEADER_BYTES:
    _fail(f"truncated: {buf.size} readable bytes, a frame header needs {fmt.FRAME_HEADER_BYTES}")
  magic, version, code, flags, block_log2, n, frame_bytes, rsv, csum = _HDR.unpack(
      buf[:fmt.FRAME_HEADER_BYTES].tobytes())
  return dict(magic=magic, version=version, dtype=code, flags=flags, block_log2=block_log2,
              n_elems=n, frame_bytes=frame_bytes, reserved=rsv, checksum=csum)


def _frame_xxh32(frame: bytearray, ranges) -> int:
  """Version 1's checksum: XXH32 of the whole frame (checksum field zeroed)."""
  del ranges
  return xxh32(frame)


def _check_frame(buf: np.ndarray, code: int | None, n_expected: int | None, *,
                 version: int = fmt.VERSION, checksum_of=_frame_xxh32):
  """Frame-level compliance; returns (header dict, list of block byte ranges).

  `version` and `checksum_of(frame with the field zeroed, block ranges)` are the
  frame version's (reference_v2 passes its own); the rest is common to both.
  """
  h = _parse_header(buf)
  if h["magic"] != fmt.MAGIC:
    _fail(f"bad magic 0x{h['magic']:08X} (expected 0x{fmt.MAGIC:08X}, 'ZCCL')")
  if h["version"] != version:
    _fail(f"frame version {h['version']}, this decoder reads version {version} "
          f"(both peers must run the same zipccl_jax)")
  if h["dtype"] not in _DTYPE_OF_CODE:
    _fail(f"invalid dtype code {h['dtype']}")
  if code is not None and h["dtype"] != code:
    _fail(f"dtype mismatch: frame has {_DTYPE_OF_CODE[h['dtype']].name}, "
          f"expected {_DTYPE_OF_CODE[code].name}")
  if h["flags"] & ~fmt.FLAG_CHECKSUM:
    _fail(f"reserved frame flag bits set (flags 0x{h['flags']:02X})")
  if h["block_log2"] != fmt.BLOCK_LOG2:
    _fail(f"unsupported block_log2 {h['block_log2']} (expected {fmt.BLOCK_LOG2})")
  n = h["n_elems"]
  if n_expected is not None and n != n_expected:
    _fail(f"element count mismatch: frame has {n}, expected {n_expected}")
  if h["reserved"] != 0:
    _fail("reserved header field (bytes 24..28) is non-zero")
  has_csum = bool(h["flags"] & fmt.FLAG_CHECKSUM)
  if not has_csum and h["checksum"] != 0:
    _fail("checksum field is non-zero but the CHECKSUM flag is not set")
  fb = h["frame_bytes"]
  if fb > buf.size:
    _fail(f"truncated or overflowed frame: frame_bytes {fb} exceeds the {buf.size} readable bytes")
  w = _width(h["dtype"])
  nb = fmt.num_blocks(n)
  lo_bound = fmt.FRAME_HEADER_BYTES + fmt.DIR_ENTRY_BYTES * nb
  hi_bound = fmt.FRAME_HEADER_BYTES + 12 * nb + n * w
  if fb < lo_bound or fb > hi_bound:
    _fail(f"frame_bytes {fb} outside [{lo_bound}, {hi_bound}] for {n} elements")
  sizes = buf[fmt.FRAME_HEADER_BYTES:lo_bound].view("<u4").astype(np.int64)
  if lo_bound + int(sizes.sum()) != fb:
    _fail(f"block directory sizes add up to {lo_bound + int(sizes.sum())} bytes, "
          f"frame_bytes says {fb}")
  ends = lo_bound + np.cumsum(sizes)
  starts = ends - sizes
  ranges = list(zip(starts.tolist(), ends.tolist()))
  if has_csum:
    frame = bytearray(buf[:fb].tobytes())
    frame[28:32] = b"\0\0\0\0"
    want = checksum_of(frame, ranges)
    if want != h["checksum"]:
      _fail(f"checksum mismatch: stored 0x{h['checksum']:08X}, computed 0x{want:08X}")
  return h, ranges


def frame_info(frame) -> dict:
  """Header fields and per-block (mode, flags, bytes) of a frame, after frame-level checks."""
  buf = _as_buf(frame)
  h, ranges = _check_frame(buf, None, None)
  blocks = []
  for s, e in ranges:
    if e - s < fmt.BLOCK_HEADER_BYTES:
      blocks.append(dict(mode=None, flags=None, bytes=e - s))
      continue
    mode, flags, _, value = _BLK.unpack(buf[s:s + fmt.BLOCK_HEADER_BYTES].tobytes())
    blocks.append(dict(mode=mode, flags=flags, bytes=e - s, value=value))
  h["blocks"] = blocks
  return h


def _parse_huff(blk: np.ndarray, m: int, code: int, flags: int, where: str):
  """Validates one HUFF block; returns its decode inputs."""
  size = blk.size
  hb = fmt.BLOCK_HEADER_BYTES
  if size < hb + 2:
    _fail(f"{where}: HUFF block of {size} bytes has no code table")
  lo, hi = int(blk[hb]), int(blk[hb + 1])
  if hi < lo:
    _fail(f"{where}: malformed code table (hi {hi} < lo {lo})")
  n_nib = hi - lo + 2
  tbytes = 2 + (n_nib + 1) // 2
  n_streams = -(-m // fmt.STREAM_ELEMS)
  head = hb + tbytes + fmt.STREAM_DIR_ENTRY_BYTES * n_streams
  if size < head:
    _fail(f"{where}: block size {size} too small for its code table and stream directory")
  packed = blk[hb + 2:hb + tbytes]
  nib = np.empty(packed.size * 2, np.uint8)
  nib[0::2], nib[1::2] = packed & 0xF, packed >> 4
  if n_nib % 2 and nib[-1] != 0:
    _fail(f"{where}: reserved final nibble of the code table is non-zero")
  nib = nib[:n_nib]
  if np.any(nib > MAX_LEN):
    _fail(f"{where}: malformed code table (code length {int(nib.max())} > {MAX_LEN})")
  lengths = np.zeros(NSYM, np.uint8)
  lengths[ZERO] = nib[0]
  lengths[lo:hi + 1] = nib[1:]
  if not np.any(lengths):
    _fail(f"{where}: malformed code table (no used symbol)")
  if not _kraft_ok(lengths):
    _fail(f"{where}: malformed code table (Kraft inequality violated)")
  sdir = blk[hb + tbytes:head].view("<u2").reshape(n_streams, 2).astype(np.int64)
  sbits, snnz = sdir[:, 0], sdir[:, 1]
  cnt = np.minimum(fmt.STREAM_ELEMS, m - np.arange(n_streams) * fmt.STREAM_ELEMS)
  if np.any(snnz > cnt):
    _fail(f"{where}: stream_nnz exceeds the stream's element count")
  if np.any(sbits < cnt) or np.any(sbits > MAX_LEN * cnt):
    _fail(f"{where}: stream_bits outside [elements, {MAX_LEN} x elements]")
  r = _raw_width(code, bool(flags & fmt.BLOCK_FLAG_LOW16))
  total_bits = int(sbits.sum())
  bs_bytes = (total_bits + 7) // 8
  want = head + bs_bytes + r * int(snnz.sum())
  if size != want:
    _fail(f"{where}: HUFF block size {size} inconsistent with its contents ({want} bytes)")
  bitstream = blk[head:head + bs_bytes]
  if total_bits % 8 and int(bitstream[-1]) >> (total_bits % 8):
    _fail(f"{where}: reserved padding bits after the bitstream are non-zero")
  raw = blk[head + bs_bytes:].reshape(int(snnz.sum()), r)
  return dict(lengths=lengths, sbits=sbits, snnz=snnz, cnt=cnt, bitstream=bitstream,
              total_bits=total_bits, raw=raw, low16=bool(flags & fmt.BLOCK_FLAG_LOW16))


def _decode_tables(lengths: np.ndarray):
  """Lookup (symbol, length) by the next MAX_LEN bits read MSB first; length 0 = no code."""
  codes = canonical_codes(lengths)
  sym_t = np.zeros(1 << MAX_LEN, np.int32)
  len_t = np.zeros(1 << MAX_LEN, np.int64)
  for s in np.flatnonzero(lengths):
    ln = int(lengths[s])
    first = int(codes[s]) << (MAX_LEN - ln)
    sym_t[first:first + (1 << (MAX_LEN - ln))] = s
    len_t[first:first + (1 << (MAX_LEN - ln))] = ln
  return sym_t, len_t


def _decode_huff_blocks(blocks: list[dict], where: list[str]) -> list[np.ndarray]:
  """Decodes the symbols of all HUFF blocks at once, without a per-element Python loop.

  For every bit position p of the (concatenated) bitstreams, the code starting at p has
  a length L[p] (0 if no code matches), so the code after it starts at nxt[p] = p + L[p].
  A stream's code positions are its start iterated through nxt; pointer doubling
  (nxt, nxt^2, nxt^4, ...) produces 2048 of them in 11 vectorised steps.
  """
  if not blocks:
    return []
  sym_ts, len_ts, bit_parts, starts, cnts, owner, block_bits = [], [], [], [], [], [], []
  bit_off = 0
  for b, blk in enumerate(blocks):
    sym_t, len_t = _decode_tables(blk["lengths"])
    sym_ts.append(sym_t)
    len_ts.append(len_t)
    bit_parts.append(np.unpackbits(blk["bitstream"], bitorder="little"))
    starts.append(bit_off + np.cumsum(blk["sbits"]) - blk["sbits"])
    cnts.append(blk["cnt"])
    owner.append(np.full(blk["cnt"].size, b, np.int64))
    block_bits.append(bit_parts[-1].size)
    bit_off += bit_parts[-1].size
  nbits = bit_off
  bits = np.concatenate(bit_parts + [np.zeros(MAX_LEN, np.uint8)])
  # window[p]: the MAX_LEN bits from position p, the first one most significant
  window = np.zeros(nbits + 1, np.int64)
  for j in range(MAX_LEN):
    window |= bits[j:j + nbits + 1].astype(np.int64) << (MAX_LEN - 1 - j)
  block_of = np.repeat(np.arange(len(blocks)), block_bits)
  block_of = np.append(block_of, len(blocks) - 1)          # position nbits: end of the data
  t = (block_of << MAX_LEN) + window
  sym_at = np.append(np.concatenate(sym_ts)[t], -1)        # + sentinel position nbits + 1
  len_at = np.append(np.concatenate(len_ts)[t], 0)
  sentinel = nbits + 1                                     # absorbs codes running off the end
  nxt = np.minimum(np.arange(nbits + 2) + len_at, sentinel)
  start = np.concatenate(starts).astype(np.int64)
  sbits = np.concatenate([blk["sbits"] for blk in blocks])
  cnt = np.concatenate(cnts)
  owner = np.concatenate(owner)
  pos = np.empty((start.size, fmt.STREAM_ELEMS), np.int64)  # pos[k, i]: start of code i
  pos[:, 0] = start
  jump, step = nxt, 1
  while step < fmt.STREAM_ELEMS:
    pos[:, step:2 * step] = jump[pos[:, :step]]
    jump = jump[jump]
    step *= 2
  active = np.arange(fmt.STREAM_ELEMS) < cnt[:, None]
  bad = np.any(active & (len_at[pos] == 0) & (pos < sentinel), axis=1)
  if bad.any():
    k = int(np.flatnonzero(bad)[0])
    _fail(f"{where[owner[k]]}: a bit prefix matches no code")
  final = nxt[pos[np.arange(start.size), cnt - 1]]
  if np.any(final != start + sbits):
    k = int(np.flatnonzero(final != start + sbits)[0])
    _fail(f"{where[owner[k]]}: stream does not decode to its element count in exactly "
          f"stream_bits bits")
  syms = np.where(active, sym_at[pos], -1)
  out = []
  row = 0
  for b, blk in enumerate(blocks):
    k = blk["cnt"].size
    s = syms[row:row + k]
    nnz = np.sum((s != ZERO) & (s >= 0), axis=1)
    if np.any(nnz != blk["snnz"]):
      _fail(f"{where[b]}: non-ZERO symbols of a stream differ from its stream_nnz")
    out.append(s[s >= 0])
    row += k
  return out


def _check_block_header(blk: np.ndarray, m: int, w: int, code: int, where: str):
  """A block's header rules (every version): returns (mode, flags) of a valid header."""
  if blk.size < fmt.BLOCK_HEADER_BYTES:
    _fail(f"{where}: {blk.size} bytes is smaller than a block header")
  mode, flags, rsv, value = _BLK.unpack(blk[:fmt.BLOCK_HEADER_BYTES].tobytes())
  if rsv:
    _fail(f"{where}: reserved block header field is non-zero")
  if mode == fmt.MODE_RAW:
    if flags:
      _fail(f"{where}: flag 0x{flags:02X} not allowed for a RAW block")
    if value:
      _fail(f"{where}: reserved value field of a RAW block is non-zero")
    if blk.size != fmt.BLOCK_HEADER_BYTES + m * w:
      _fail(f"{where}: RAW block size {blk.size} inconsistent with its {m} elements")
  elif mode == fmt.MODE_CONST:
    if flags:
      _fail(f"{where}: flag 0x{flags:02X} not allowed for a CONST block")
    if w < 4 and value >> (8 * w):
      _fail(f"{where}: reserved upper {32 - 8 * w} bits of a CONST value are non-zero")
    if blk.size != fmt.BLOCK_HEADER_BYTES:
      _fail(f"{where}: CONST block size {blk.size} is not {fmt.BLOCK_HEADER_BYTES}")
  elif mode == fmt.MODE_HUFF:
    allowed = fmt.BLOCK_FLAG_LOW16 if code == fmt.DTYPE_F32 else 0
    if flags & ~allowed:
      _fail(f"{where}: flag 0x{flags:02X} not allowed for a HUFF block of "
            f"{_DTYPE_OF_CODE[code].name}")
    if value:
      _fail(f"{where}: reserved value field of a HUFF block is non-zero")
  else:
    _fail(f"{where}: unknown block mode {mode}")
  return mode, flags


def _plain_block(blk: np.ndarray, m: int, w: int, mode: int) -> np.ndarray:
  """The elements of a checked RAW or CONST block."""
  if mode == fmt.MODE_RAW:
    return blk[fmt.BLOCK_HEADER_BYTES:].view(f"<u{w}")
  return np.full(m, _BLK.unpack(blk[:fmt.BLOCK_HEADER_BYTES].tobytes())[3], _UINT[w])


def decode(frame, *, shape, dtype) -> np.ndarray:
  """Decodes one frame (exactly the readable bytes given) into an array of `shape`, `dtype`.

  Raises TypeError for an unsupported `dtype`, ValueError naming the reason for
  any frame that breaks FORMAT.md's decoder-compliance rules.
  """
  code = fmt.dtype_code(dtype)
  dt = _DTYPE_OF_CODE[code]
  shape = tuple(int(d) for d in shape) if np.ndim(shape) else (int(shape),)
  buf = _as_buf(frame)
  n = math.prod(shape)
  w = _width(code)
  h, ranges = _check_frame(buf, code, n)
  out = np.zeros(n, _UINT[w])
  huff, huff_where, huff_slices = [], [], []
  for b, (s, e) in enumerate(ranges):
    where = f"block {b}"
    blk = buf[s:e]
    m = min(fmt.BLOCK_ELEMS, n - b * fmt.BLOCK_ELEMS)
    sl = slice(b * fmt.BLOCK_ELEMS, b * fmt.BLOCK_ELEMS + m)
    mode, flags = _check_block_header(blk, m, w, code, where)
    if mode == fmt.MODE_HUFF:
      huff.append(_parse_huff(blk, m, code, flags, where))
      huff_where.append(where)
      huff_slices.append(sl)
    else:
      out[sl] = _plain_block(blk, m, w, mode)
  for blk, sl, syms in zip(huff, huff_slices, _decode_huff_blocks(huff, huff_where)):
    out[sl] = merge_symbols(syms, blk["raw"], code, blk["low16"])
  return out.view(dt).reshape(shape)
