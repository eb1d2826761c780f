"""Pure-NumPy reference codec for the zipccl wire format version 2 (FORMAT.md), every dtype code.

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
`frame_checksum` (version 2's checksum over the parts' hashes), `frame_info`
(parse headers without decoding), `layout_stats` (what decoding a frame asks of
a GPU: warps, the serial chain, units).

A HUFF block's layout is the GPU's (FORMAT.md "HUFF blocks"): segments of 16,384
elements, lane `l` of 32 coding the elements `32 t + l`, each lane's bits in
16-bit units stored in the order a warp takes them from one cursor. The decoder
here runs those steps for all segments at once (a loop over the 512 steps,
vectorised over segments and lanes).

Example:
  >>> import ml_dtypes, numpy as np
  >>> x = np.linspace(-2, 2, 100_000).astype(ml_dtypes.bfloat16)
  >>> y = decode(encode(x), shape=x.shape, dtype=x.dtype)
  >>> np.array_equal(y.view(np.uint16), x.view(np.uint16))
  True
"""

from __future__ import annotations

import math
import struct
from typing import Sequence

import ml_dtypes
import numpy as np

from zipccl_jax import format as fmt
from zipccl_jax._xxh32 import xxh32

__all__ = [
    "encode", "decode", "frame_info", "split_symbols", "merge_symbols", "code_lengths",
    "canonical_codes", "pack_codes", "xxh32", "frame_checksum", "layout_stats", "max_encoded_bytes",
]

MAX_LEN = fmt.MAX_CODE_LEN            # 11
ZERO = fmt.ZERO_SYMBOL                # 256
NSYM = fmt.NUM_SYMBOLS                # 257
_HDR = struct.Struct("<IBBBBQQII")    # magic, version, dtype, flags, block_log2, n, frame_bytes, rsv, csum
_BLK = struct.Struct("<BBHI")         # mode, flags, reserved, value
SEGMENT_ELEMS, LANES, UNIT_BITS = fmt.SEGMENT_ELEMS, fmt.LANES, fmt.UNIT_BITS
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


# --------------------------------------------------------------------------- encode

def _as_elements(x) -> tuple[np.ndarray, int]:
  x = np.asarray(x)
  code = fmt.dtype_code(x.dtype, arg="x")
  u = np.ascontiguousarray(x).reshape(-1).view(_UINT[_width(code)])
  return u, code


def _segment_grid(m: int):
  """Per element of a block: (segment, step, lane); and each segment's element count."""
  e = np.arange(m, dtype=np.int64)
  seg = e >> fmt.SEGMENT_LOG2
  local = e & (SEGMENT_ELEMS - 1)
  n_segs = -(-m // SEGMENT_ELEMS)
  counts = np.minimum(SEGMENT_ELEMS, m - np.arange(n_segs) * SEGMENT_ELEMS)
  return seg, local // LANES, local % LANES, counts


def _lane_elems(counts: np.ndarray) -> np.ndarray:
  """[n_segs, 32]: how many elements each lane of each segment codes."""
  lane = np.arange(LANES)
  return np.maximum(0, -(-(counts[:, None] - lane[None, :]) // LANES))


# --------------------------------------------------------------------------- encode

def _units_of_block(codes: np.ndarray, lens: np.ndarray, m: int):
  """The units of one HUFF block in stored order, and each segment's unit count.

  codes/lens: each element's code (MSB first) and length, in element order.
  """
  seg, step, lane, counts = _segment_grid(m)
  n_segs, steps = counts.size, SEGMENT_ELEMS // LANES
  grid = np.zeros((n_segs, steps, LANES), np.int64)
  grid[seg, step, lane] = lens
  end = np.cumsum(grid, axis=1)                          # a lane's bits through step t
  start = end - grid
  first_unit = -(-start // UNIT_BITS)                    # the unit a code starts, if it starts one
  starts = ((-(-end // UNIT_BITS)) > first_unit)[seg, step, lane]
  lane_units = (-(-end[:, -1, :] // UNIT_BITS)).reshape(-1)
  lane_first = np.cumsum(lane_units) - lane_units        # a lane's first unit, lanes back to back
  # every lane's codes, then a zero code padding it to whole units, lanes back to back
  who = seg * LANES + lane
  key = np.concatenate([who * (steps + 1) + step, np.arange(n_segs * LANES) * (steps + 1) + steps])
  pos = np.argsort(key)
  seq_codes = np.concatenate([codes, np.zeros(n_segs * LANES, np.uint32)])[pos]
  seq_lens = np.concatenate([lens, (-end[:, -1, :] % UNIT_BITS).reshape(-1)])[pos]
  packed = pack_codes(seq_codes, seq_lens).view("<u2")
  f = np.flatnonzero(starts)                             # (step, lane) order is element order
  units = packed[lane_first[who[f]] + first_unit[seg[f], step[f], lane[f]]]
  return units, np.bincount(seg[f], minlength=n_segs)


def _huff_block(u: np.ndarray, code: int) -> bytes:
  """The version 2 HUFF coding of one block, whatever its size."""
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
  units, seg_units = _units_of_block(codes[sym], lengths[sym].astype(np.int64), m)
  seg, _, _, seg_counts = _segment_grid(m)
  seg_nnz = np.bincount(seg[sym != ZERO], minlength=seg_counts.size)
  sdir = np.empty((seg_counts.size, 2), "<u2")
  sdir[:, 0] = seg_units
  sdir[:, 1] = seg_nnz
  header = _BLK.pack(fmt.MODE_HUFF, fmt.BLOCK_FLAG_LOW16 if low16 else 0, 0, 0)
  return header + table + sdir.tobytes() + units.tobytes() + raw.tobytes()


def _encode_block(u: np.ndarray, code: int) -> bytes:
  """Rule 2: CONST, else HUFF if smaller than RAW, else RAW."""
  w = _width(code)
  if np.all(u == u[0]):
    return _BLK.pack(fmt.MODE_CONST, 0, 0, int(u[0]))
  huff = _huff_block(u, code)
  if len(huff) < fmt.BLOCK_HEADER_BYTES + u.size * w:
    return huff
  return _BLK.pack(fmt.MODE_RAW, 0, 0, 0) + u.astype(f"<u{w}").tobytes()


def frame_checksum(frame: bytes | bytearray, ranges) -> int:
  """XXH32 over the u32 hashes of the parts: header (field zeroed) + directory, then each block."""
  frame = bytes(frame)
  head_end = ranges[0][0] if ranges else len(frame)
  parts = [xxh32(frame[:head_end])] + [xxh32(frame[s:e]) for s, e in ranges]
  return xxh32(struct.pack(f"<{len(parts)}I", *parts))


def encode(x, *, checksum: bool = False) -> bytes:
  """One version 2 frame for the flat (row-major) elements of `x`."""
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
    ends = np.cumsum([len(b) for b in blocks]) + fmt.FRAME_HEADER_BYTES + len(directory)
    ranges = list(zip((ends - [len(b) for b in blocks]).tolist(), ends.tolist()))
    frame[28:32] = struct.pack("<I", frame_checksum(frame, ranges))
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


def _check_frame(buf: np.ndarray, code: int | None, n_expected: int | None):
  """Frame-level compliance; returns (header dict, list of block byte ranges)."""
  h = _parse_header(buf)
  if h["magic"] != fmt.MAGIC:
    _fail(f"bad magic 0x{h['magic']:08X} (expected 0x{fmt.MAGIC:08X}, 'ZCCL')")
  if h["version"] != fmt.VERSION:
    _fail(f"frame version {h['version']}, this decoder reads version {fmt.VERSION} "
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
    want = frame_checksum(frame, ranges)
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


def _parse_huff(blk: np.ndarray, m: int, code: int, flags: int, where: str) -> dict:
  """Validates one version 2 HUFF block's table, segment directory and sizes."""
  size = blk.size
  hb = fmt.BLOCK_HEADER_BYTES
  if size < hb + 2:
    _fail(f"{where}: HUFF block of {size} bytes has no code table")
  lo, hi = int(blk[hb]), int(blk[hb + 1])
  if hi < lo:
    _fail(f"{where}: malformed code table (hi {hi} < lo {lo})")
  n_nib = hi - lo + 2
  tbytes = 2 + (n_nib + 1) // 2
  counts = _segment_grid(m)[3]
  head = hb + tbytes + fmt.SEG_DIR_ENTRY_BYTES * counts.size
  if size < head:
    _fail(f"{where}: block size {size} too small for its code table and segment directory")
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
  sdir = blk[hb + tbytes:head].view("<u2").reshape(counts.size, 2).astype(np.int64)
  sunits, snnz = sdir[:, 0], sdir[:, 1]
  per_lane = _lane_elems(counts)
  if np.any(snnz > counts):
    _fail(f"{where}: seg_nnz exceeds the segment's element count")
  lo_u = np.sum(-(-per_lane // UNIT_BITS), axis=1)
  hi_u = np.sum(-(-(MAX_LEN * per_lane) // UNIT_BITS), axis=1)
  if np.any(sunits < lo_u) or np.any(sunits > hi_u):
    _fail(f"{where}: seg_units outside what its lanes' elements can take")
  r = _raw_width(code, bool(flags & fmt.BLOCK_FLAG_LOW16))
  n_units = int(sunits.sum())
  want = head + 2 * n_units + r * int(snnz.sum())
  if size != want:
    _fail(f"{where}: HUFF block size {size} inconsistent with its contents ({want} bytes)")
  units = blk[head:head + 2 * n_units].view("<u2").astype(np.uint64)
  raw = blk[head + 2 * n_units:].reshape(int(snnz.sum()), r)
  return dict(lengths=lengths, sunits=sunits, snnz=snnz, counts=counts, units=units, raw=raw,
              low16=bool(flags & fmt.BLOCK_FLAG_LOW16))


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


_REV11 = np.array([int(f"{i:011b}"[::-1], 2) for i in range(1 << MAX_LEN)], np.int64)


def _decode_huff_blocks(blocks: list[dict], where: list[str]) -> list[np.ndarray]:
  """The symbols of every HUFF block, decoded the way a warp does, all segments at once.

  Step t of every segment runs together: each active lane looks its next code
  up in the (zero-padded) bits it holds; a lane whose code is longer than those
  bits, or matches no code, takes the segment's next unit (lanes in order) and
  looks again. Vectorised over segments and lanes, a loop over the 512 steps.
  """
  if not blocks:
    return []
  seg_block, seg_m, seg_units, seg_unit0, seg_nnz, unit_parts = [], [], [], [], [], []
  sym_ts, len_ts = [], []
  off = 0
  for b, blk in enumerate(blocks):
    sym_t, len_t = _decode_tables(blk["lengths"])      # indexed MSB first
    sym_ts.append(sym_t[_REV11])                          # re-indexed by the LSB-first window
    len_ts.append(len_t[_REV11])
    k = blk["counts"].size
    seg_block += [b] * k
    seg_m.append(blk["counts"])
    seg_units.append(blk["sunits"])
    seg_unit0.append(off + np.cumsum(blk["sunits"]) - blk["sunits"])
    seg_nnz.append(blk["snnz"])
    unit_parts.append(blk["units"])
    off += blk["units"].size
  seg_block = np.array(seg_block, np.int64)
  seg_m, seg_units = np.concatenate(seg_m), np.concatenate(seg_units)
  seg_unit0, seg_nnz = np.concatenate(seg_unit0), np.concatenate(seg_nnz)
  units = np.concatenate(unit_parts + [np.zeros(1, np.uint64)])
  sym_tab, len_tab = np.concatenate(sym_ts), np.concatenate(len_ts)
  n_seg = seg_m.size
  buf = np.zeros((n_seg, LANES), np.uint64)
  nbits = np.zeros((n_seg, LANES), np.int64)
  cursor = np.zeros(n_seg, np.int64)
  steps = -(-SEGMENT_ELEMS // LANES)
  syms = np.full((n_seg, steps, LANES), -1, np.int64)
  lane = np.arange(LANES)
  tbase = (seg_block << MAX_LEN)[:, None]

  def look():
    idx = tbase + (buf & np.uint64((1 << MAX_LEN) - 1)).astype(np.int64)
    return sym_tab[idx], len_tab[idx]

  for t in range(steps):
    active = (t * LANES + lane)[None, :] < seg_m[:, None]
    if not active.any():
      break
    _, ln = look()
    need = active & ((ln == 0) | (ln > nbits))
    slot = cursor[:, None] + np.cumsum(need, axis=1) - need
    over = need & (slot >= seg_units[:, None])
    if over.any():
      s = int(np.flatnonzero(over.any(axis=1))[0])
      _fail(f"{where[seg_block[s]]}: a segment's lanes need more units than its seg_units")
    word = units[np.where(need, seg_unit0[:, None] + slot, units.size - 1)]
    buf = np.where(need, buf | (word << nbits.astype(np.uint64)), buf)
    nbits = nbits + UNIT_BITS * need
    cursor += need.sum(axis=1)
    sy, ln = look()
    bad = active & ((ln == 0) | (ln > nbits))
    if bad.any():
      s = int(np.flatnonzero(bad.any(axis=1))[0])
      _fail(f"{where[seg_block[s]]}: a bit prefix matches no code")
    buf = np.where(active, buf >> ln.astype(np.uint64), buf)
    nbits = np.where(active, nbits - ln, nbits)
    syms[:, t, :] = np.where(active, sy, -1)
  if np.any(cursor != seg_units):
    s = int(np.flatnonzero(cursor != seg_units)[0])
    _fail(f"{where[seg_block[s]]}: a segment decodes with {int(cursor[s])} units, "
          f"seg_units says {int(seg_units[s])}")
  if np.any(buf != 0):
    s = int(np.flatnonzero((buf != 0).any(axis=1))[0])
    _fail(f"{where[seg_block[s]]}: reserved padding bits after a lane's last code are non-zero")
  nnz = np.sum((syms != ZERO) & (syms >= 0), axis=(1, 2))
  if np.any(nnz != seg_nnz):
    s = int(np.flatnonzero(nnz != seg_nnz)[0])
    _fail(f"{where[seg_block[s]]}: non-ZERO symbols of a segment differ from its seg_nnz")
  flat = syms.reshape(n_seg, -1)                          # element order inside each segment
  out, row = [], 0
  for blk in blocks:
    k = blk["counts"].size
    s = flat[row:row + k]
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


# --------------------------------------------------------------------------- proxies

def layout_stats(frame, *, dtype) -> dict:
  """What decoding this frame asks of a GPU, from its bytes: work units, chain, loads.

  warps: independent decode work units (one warp per HUFF segment); chain_symbols:
  the longest serial chain of one lane (steps of its segment); units: 16-bit
  loads; symbols: elements of HUFF blocks.
  """
  buf = _as_buf(frame)
  h, ranges = _check_frame(buf, fmt.dtype_code(dtype), None)
  n = h["n_elems"]
  warps = chain = units = symbols = 0
  for b, (s, e) in enumerate(ranges):
    m = min(fmt.BLOCK_ELEMS, n - b * fmt.BLOCK_ELEMS)
    if buf[s] != fmt.MODE_HUFF:
      continue
    blk = _parse_huff(buf[s:e], m, h["dtype"], int(buf[s + 1]), f"block {b}")
    warps += blk["counts"].size
    chain = max(chain, int(-(-blk["counts"].max() // LANES)))
    units += int(blk["sunits"].sum())
    symbols += m
  return dict(warps=warps, chain_symbols=chain, units=units, symbols=symbols)
