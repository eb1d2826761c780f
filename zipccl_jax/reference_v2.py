"""Pure-NumPy reference codec for the zipccl wire format version 2 (FORMAT.md, "Version 2").

Version 2 keeps version 1's frame, directory, block modes, symbols and code
table, and lays a HUFF block out for a GPU warp: the block's elements are cut
into segments of 16,384, and in a segment lane `l` of 32 codes the elements
`32 t + l` (t = 0, 1, ...). Each lane's bits are cut into 16-bit units, and the
units of all 32 lanes are stored in the order a warp needs them: by the step
`t` whose code starts the unit, then by lane. A decoding warp therefore takes
its next units from one shared cursor (a ballot and a population count), its
loads and stores are contiguous, and no per-lane offset is stored. The block
checksum is per part, so that every block can be hashed in parallel.

Like `reference`, this module is written from FORMAT.md and is a test oracle:

- `encode(x, checksum=False) -> bytes` follows the version 2 encoder rules.
- `decode(frame, shape=, dtype=) -> np.ndarray` checks every version 2 decoder
  rule and raises `ValueError("zipccl reference decode: <reason>")`; a version 1
  frame is refused by name.
- `serial_chain(frame)` and `layout_stats(frame)` report what the format asks of
  a decoder (the proxies of benchmarks/codec_v2_proxies.py).

Example:
  >>> import ml_dtypes, numpy as np
  >>> x = np.linspace(-2, 2, 100_000).astype(ml_dtypes.bfloat16)
  >>> frame = encode(x)
  >>> np.array_equal(decode(frame, shape=x.shape, dtype=x.dtype).view(np.uint16), x.view(np.uint16))
  True
"""

from __future__ import annotations

import math
import struct

import numpy as np

from zipccl_jax import format as fmt
from zipccl_jax import reference as v1

__all__ = ["encode", "decode", "checksum_v2", "layout_stats", "VERSION", "SEGMENT_ELEMS", "LANES",
           "UNIT_BITS"]

# The version 2 constants (FORMAT.md "Version 2"); the rest are version 1's (format.py).
VERSION = 2
SEGMENT_LOG2 = 14
SEGMENT_ELEMS = 1 << SEGMENT_LOG2        # 16,384 elements: one warp's share of a block
LANES = 32                               # lanes of a warp; lane l codes elements 32 t + l
UNIT_BITS = 16                           # a lane's bits are read 16 at a time
SEG_DIR_ENTRY_BYTES = 4                  # u16 seg_units, u16 seg_nnz
SEGMENTS_PER_BLOCK = fmt.BLOCK_ELEMS // SEGMENT_ELEMS
MAX_LEN = v1.MAX_LEN
ZERO = v1.ZERO
_HDR, _BLK = v1._HDR, v1._BLK
_U16_MASK = (1 << UNIT_BITS) - 1


def _segment_grid(m: int):
  """Per element of a block: (segment, step, lane); and each segment's element count."""
  e = np.arange(m, dtype=np.int64)
  seg = e >> SEGMENT_LOG2
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
  """The unit stream of one HUFF block: (units u16 [U], seg_units [n_segs]).

  codes/lens: each element's code (MSB first) and length, in element order.
  """
  seg, step, lane, counts = _segment_grid(m)
  n_segs = counts.size
  steps = -(-SEGMENT_ELEMS // LANES)
  grid_len = np.zeros((n_segs, steps, LANES), np.int64)
  grid_len[seg, step, lane] = lens
  end = np.cumsum(grid_len, axis=1)                      # lane's bits through step t
  start = end - grid_len
  # a code starts a unit when it holds the unit's first bit: ceil(end/16) > ceil(start/16)
  starts_unit = (-(-end // UNIT_BITS)) > (-(-start // UNIT_BITS))
  # units in order: by step then lane inside a segment = element order
  flag = starts_unit[seg, step, lane]
  seg_units = np.bincount(seg[flag], minlength=n_segs).astype(np.int64)
  # each lane's bits packed LSB-first, padded to whole units with a zero code
  lane_bits = end[:, -1, :]                                # [n_segs, 32]
  pad = (-lane_bits) % UNIT_BITS
  order = np.lexsort((step, lane, seg))                   # (seg, lane, step)
  seq_codes = np.concatenate([codes[order], np.zeros(n_segs * LANES, np.uint32)])
  seq_lens = np.concatenate([lens[order], pad.reshape(-1)])
  key = np.concatenate([seg[order] * LANES + lane[order], np.arange(n_segs * LANES)])
  pos = np.argsort(key, kind="stable")                    # each lane's pad after its codes
  packed = v1.pack_codes(seq_codes[pos], seq_lens[pos])
  lane_units = packed.view("<u2") if packed.size else np.zeros(0, "<u2")
  # lane_units is in (seg, lane, j) order; unit j of a lane is started by its j-th flagged code
  fe = np.flatnonzero(flag)                               # element order = slot order per block
  fseg, flane = seg[fe], lane[fe]
  lane_first = np.cumsum(np.ceil(lane_bits / UNIT_BITS).astype(np.int64).reshape(-1))
  lane_first = lane_first - np.ceil(lane_bits / UNIT_BITS).astype(np.int64).reshape(-1)
  # j: rank of this flagged element among its lane's flagged elements
  lk = fseg * LANES + flane
  srt = np.argsort(lk, kind="stable")
  j = np.empty(fe.size, np.int64)
  j[srt] = np.arange(fe.size) - np.repeat(np.cumsum(np.bincount(lk, minlength=n_segs * LANES))
                                          - np.bincount(lk, minlength=n_segs * LANES),
                                          np.bincount(lk, minlength=n_segs * LANES))
  units = lane_units[lane_first[lk] + j]
  return units.astype("<u2"), seg_units


def _huff_block(u: np.ndarray, code: int) -> bytes:
  """The version 2 HUFF coding of one block, whatever its size."""
  m = u.size
  low16 = code == fmt.DTYPE_F32 and not np.any(u & 0xFFFF)
  sym, raw = v1.split_symbols(u, code, low16)
  counts = np.bincount(sym, minlength=v1.NSYM)
  lengths = v1.code_lengths(counts)
  codes = v1.canonical_codes(lengths)
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
  """Version 1's rule 2: CONST, else HUFF if smaller than RAW, else RAW."""
  w = v1._width(code)
  if np.all(u == u[0]):
    return _BLK.pack(fmt.MODE_CONST, 0, 0, int(u[0]))
  huff = _huff_block(u, code)
  if len(huff) < fmt.BLOCK_HEADER_BYTES + u.size * w:
    return huff
  return _BLK.pack(fmt.MODE_RAW, 0, 0, 0) + u.astype(f"<u{w}").tobytes()


def checksum_v2(frame: bytes | bytearray, ranges) -> int:
  """XXH32 over the u32 hashes of the parts: header (field zeroed) + directory, then each block."""
  frame = bytes(frame)
  head_end = ranges[0][0] if ranges else len(frame)
  parts = [v1.xxh32(frame[:head_end])] + [v1.xxh32(frame[s:e]) for s, e in ranges]
  return v1.xxh32(struct.pack(f"<{len(parts)}I", *parts))


def encode(x, *, checksum: bool = False) -> bytes:
  """One version 2 frame for the flat (row-major) elements of `x`."""
  u, code = v1._as_elements(x)
  n = u.size
  blocks = [_encode_block(u[s:s + fmt.BLOCK_ELEMS], code) for s in range(0, n, fmt.BLOCK_ELEMS)]
  directory = struct.pack(f"<{len(blocks)}I", *(len(b) for b in blocks))
  frame_bytes = fmt.FRAME_HEADER_BYTES + len(directory) + sum(len(b) for b in blocks)
  flags = fmt.FLAG_CHECKSUM if checksum else 0
  header = _HDR.pack(fmt.MAGIC, VERSION, code, flags, fmt.BLOCK_LOG2, n, frame_bytes, 0, 0)
  frame = bytearray(header + directory + b"".join(blocks))
  assert len(frame) == frame_bytes <= fmt.max_encoded_bytes(n, v1._DTYPE_OF_CODE[code])
  if checksum:
    ends = np.cumsum([len(b) for b in blocks]) + fmt.FRAME_HEADER_BYTES + len(directory)
    ranges = list(zip((ends - [len(b) for b in blocks]).tolist(), ends.tolist()))
    frame[28:32] = struct.pack("<I", checksum_v2(frame, ranges))
  return bytes(frame)


# --------------------------------------------------------------------------- decode

def _fail(reason: str):
  v1._fail(reason)


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
  head = hb + tbytes + SEG_DIR_ENTRY_BYTES * counts.size
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
  lengths = np.zeros(v1.NSYM, np.uint8)
  lengths[ZERO] = nib[0]
  lengths[lo:hi + 1] = nib[1:]
  if not np.any(lengths):
    _fail(f"{where}: malformed code table (no used symbol)")
  if not v1._kraft_ok(lengths):
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
  r = v1._raw_width(code, bool(flags & fmt.BLOCK_FLAG_LOW16))
  n_units = int(sunits.sum())
  want = head + 2 * n_units + r * int(snnz.sum())
  if size != want:
    _fail(f"{where}: HUFF block size {size} inconsistent with its contents ({want} bytes)")
  units = blk[head:head + 2 * n_units].view("<u2").astype(np.uint64)
  raw = blk[head + 2 * n_units:].reshape(int(snnz.sum()), r)
  return dict(lengths=lengths, sunits=sunits, snnz=snnz, counts=counts, units=units, raw=raw,
              low16=bool(flags & fmt.BLOCK_FLAG_LOW16))


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
    sym_t, len_t = v1._decode_tables(blk["lengths"])      # indexed MSB first
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


def decode(frame, *, shape, dtype) -> np.ndarray:
  """Decodes one version 2 frame (exactly the readable bytes given) into `shape`, `dtype`.

  Raises TypeError for an unsupported `dtype`, ValueError naming the reason for
  any frame that breaks the version 2 decoder rules (a version 1 frame included).
  """
  code = fmt.dtype_code(dtype)
  dt = v1._DTYPE_OF_CODE[code]
  shape = tuple(int(d) for d in shape) if np.ndim(shape) else (int(shape),)
  buf = v1._as_buf(frame)
  n = math.prod(shape)
  w = v1._width(code)
  _, ranges = v1._check_frame(buf, code, n, version=VERSION, checksum_of=checksum_v2)
  out = np.zeros(n, v1._UINT[w])
  huff, huff_where, huff_slices = [], [], []
  for b, (s, e) in enumerate(ranges):
    where = f"block {b}"
    blk = buf[s:e]
    m = min(fmt.BLOCK_ELEMS, n - b * fmt.BLOCK_ELEMS)
    sl = slice(b * fmt.BLOCK_ELEMS, b * fmt.BLOCK_ELEMS + m)
    mode, flags = v1._check_block_header(blk, m, w, code, where)
    if mode == fmt.MODE_HUFF:
      huff.append(_parse_huff(blk, m, code, flags, where))
      huff_where.append(where)
      huff_slices.append(sl)
    else:
      out[sl] = v1._plain_block(blk, m, w, mode)
  for blk, sl, syms in zip(huff, huff_slices, _decode_huff_blocks(huff, huff_where)):
    out[sl] = v1.merge_symbols(syms, blk["raw"], code, blk["low16"])
  return out.view(dt).reshape(shape)


# --------------------------------------------------------------------------- proxies

def layout_stats(frame, *, dtype) -> dict:
  """What decoding this frame asks of a GPU, from its bytes: work units, chain, loads.

  warps: independent decode work units (one warp per HUFF segment); chain_symbols:
  the longest serial chain of one lane (steps of its segment); units: 16-bit
  loads; symbols: elements of HUFF blocks.
  """
  buf = v1._as_buf(frame)
  h, ranges = v1._check_frame(buf, fmt.dtype_code(dtype), None, version=VERSION,
                              checksum_of=checksum_v2)
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
