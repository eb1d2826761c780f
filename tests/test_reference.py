"""The NumPy reference codec (zipccl_jax.reference) against FORMAT.md and the C++ codec.

- helpers: XXH32 vectors, RFC 1951 canonical codes, encoder rule 3 code lengths,
  symbol split/merge, bit packing;
- the reference and the C++ encoder produce byte-identical frames, and each decodes
  the other's frames;
- every decoder-compliance rule: a frame breaking it is rejected by the reference
  (ValueError naming the reason) and by the C++ decoder; randomly damaged frames are
  accepted or rejected by both alike.

The C++ side is called through `zipccl_jax._zipccl.encode_host/decode_host` (the
driver the CPU FFI handler runs, without XLA dispatch) and, for a few inputs,
through `zipccl_jax.encode`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import struct

import ml_dtypes
import numpy as np
import pytest

import zipccl_jax as zj
from zipccl_jax import format as fmt
from zipccl_jax import reference as ref

from zipccl_jax import _zipccl as ext  # noqa: E402  (a missing build must fail, not skip)

DATA = pathlib.Path(__file__).parent / "data"
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)


def bits(a) -> np.ndarray:
  a = np.asarray(a)
  return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def same_bits(a, b) -> bool:
  return np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(bits(a), bits(b))


def c_encode(x, checksum=False) -> bytes:
  x = np.ascontiguousarray(x)
  out = np.zeros(fmt.max_encoded_bytes(x.size, x.dtype), np.uint8)
  n = ext.encode_host(x.reshape(-1).view(np.uint8), x.size, fmt.dtype_code(x.dtype), checksum, out)
  assert n <= out.size
  return out[:n].tobytes()


def c_decode(frame, n, dtype) -> np.ndarray:
  out = np.zeros(n * np.dtype(dtype).itemsize, np.uint8)
  ext.decode_host(np.frombuffer(bytes(frame), np.uint8), fmt.dtype_code(dtype), n, out)
  return out.view(dtype)


def normal(n, dtype, seed=0, scale=1.0):
  return (np.random.default_rng(seed).normal(size=n) * scale).astype(dtype)


# --------------------------------------------------------------------------- helpers

def test_xxh32_known_vectors():
  assert ref.xxh32(b"") == 0x02CC5D05
  assert ref.xxh32(b"a") == 0x550D7456
  assert ref.xxh32(b"abc") == 0x32D153FF
  assert ref.xxh32(b"Nobody inspects the spammish repetition") == 0xE2293B2F
  assert ref.xxh32(b"", seed=1) != ref.xxh32(b"")


def test_xxh32_matches_lz4_frame_checksum():
  """LZ4 frames end with the XXH32 (seed 0) of their content: an independent implementation."""
  lz4frame = pytest.importorskip("lz4.frame")
  rng = np.random.default_rng(0)
  for n in list(range(0, 40)) + [63, 64, 65, 1000, 65_537]:
    data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    frame = lz4frame.compress(data, content_checksum=True)
    assert ref.xxh32(data) == int.from_bytes(frame[-4:], "little"), n


def test_canonical_codes_rfc1951_example():
  # RFC 1951 3.2.2: lengths (3,3,3,3,3,2,4,4) for A..H give 010 011 100 101 110 00 1110 1111
  lengths = np.zeros(fmt.NUM_SYMBOLS, np.uint8)
  lengths[65:73] = [3, 3, 3, 3, 3, 2, 4, 4]
  codes = ref.canonical_codes(lengths)
  assert codes[65:73].tolist() == [0b010, 0b011, 0b100, 0b101, 0b110, 0b00, 0b1110, 0b1111]
  # ZERO (256) comes last among symbols of its length
  lengths[fmt.ZERO_SYMBOL] = 4
  lengths[72] = 0
  lengths[66] = 4
  codes = ref.canonical_codes(lengths)
  assert codes[fmt.ZERO_SYMBOL] > codes[71] > codes[66]


def _hist(pairs):
  c = np.zeros(fmt.NUM_SYMBOLS, np.int64)
  for s, n in pairs:
    c[s] = n
  return c


def test_code_lengths_rules():
  one = ref.code_lengths(_hist([(7, 100)]))
  assert one[7] == 1 and one.sum() == 1                              # rule 3.2
  assert ref.code_lengths(_hist([(3, 5), (256, 9)]))[[3, 256]].tolist() == [1, 1]
  # equal weights: the two-queue method prefers leaves on ties -> balanced
  eq = ref.code_lengths(_hist([(s, 10) for s in range(8)]))
  assert eq[:8].tolist() == [3] * 8
  # ties between a leaf and an internal node: counts 1,1,2 -> leaf '2' taken first
  t = ref.code_lengths(_hist([(1, 1), (2, 1), (3, 2)]))
  assert t[[1, 2, 3]].tolist() == [2, 2, 1]
  # Fibonacci weights build a 24-deep tree: folded to 11 bits and Kraft-complete
  fib = [1, 1]
  while len(fib) < 25:
    fib.append(fib[-1] + fib[-2])
  ln = ref.code_lengths(_hist(list(zip(range(100, 125), fib))))
  used = ln[ln > 0].astype(int)
  assert used.max() == fmt.MAX_CODE_LEN and used.size == 25
  assert sum(2.0 ** -used) == 1.0
  # rarer symbols never get shorter codes (rule 3.5 hands lengths out by rank)
  assert all(ln[100 + i] >= ln[101 + i] for i in range(24))
  with pytest.raises(ValueError):
    ref.code_lengths(np.zeros(fmt.NUM_SYMBOLS))


def test_code_lengths_random_histograms_are_valid():
  rng = np.random.default_rng(1)
  for _ in range(50):
    k = int(rng.integers(2, 258))
    c = np.zeros(fmt.NUM_SYMBOLS, np.int64)
    c[rng.choice(fmt.NUM_SYMBOLS, k, replace=False)] = rng.geometric(0.05, k) ** 2
    ln = ref.code_lengths(c).astype(int)
    assert np.array_equal(ln > 0, c > 0)
    assert ln.max() <= fmt.MAX_CODE_LEN
    assert sum(2.0 ** -ln[ln > 0]) == 1.0                              # complete code


def test_pack_codes_lsb_first_msb_code():
  # codes 1 (len 1), 01 (len 2), 110 (len 3): bit stream 1,0,1,1,1,0 -> 0b011101
  out = ref.pack_codes(np.array([1, 1, 6]), np.array([1, 2, 3]))
  assert out.tolist() == [0b011101]
  out = ref.pack_codes(np.array([0x7FF, 0]), np.array([11, 1]))
  assert out.tolist() == [0xFF, 0x07]
  assert ref.pack_codes(np.zeros(0), np.zeros(0)).size == 0


def test_symbol_split_merge():
  u16 = np.arange(1 << 16, dtype=np.uint16)
  for code in (fmt.DTYPE_BF16, fmt.DTYPE_F16):
    sym, raw = ref.split_symbols(u16, code)
    assert sym[0] == fmt.ZERO_SYMBOL and sym[1:].max() <= 255 and raw.shape == (65535, 1)
    assert np.array_equal(ref.merge_symbols(sym, raw, code), u16)
  # bfloat16: the symbol is the biased exponent; the raw byte the mantissa with the sign below
  sym, raw = ref.split_symbols(np.array([0x3F80, 0xBFC0], np.uint16), fmt.DTYPE_BF16)
  assert sym.tolist() == [127, 127] and raw[:, 0].tolist() == [0x00, 0x81]
  u32 = np.random.default_rng(2).integers(0, 1 << 32, 10_000, dtype=np.uint32)
  u32[:3] = [0, 0x80000000, 0x3F800000]
  sym, raw = ref.split_symbols(u32, fmt.DTYPE_F32)
  assert sym[0] == fmt.ZERO_SYMBOL and sym[2] == 127 and raw.shape == (9999, 3)
  assert np.array_equal(ref.merge_symbols(sym, raw, fmt.DTYPE_F32), u32)
  up = u32 & 0xFFFF0000
  sym16, raw16 = ref.split_symbols(up, fmt.DTYPE_F32, low16=True)
  sym32, _ = ref.split_symbols(up, fmt.DTYPE_F32)
  assert np.array_equal(sym16, sym32)                                 # LOW16 keeps the symbol
  assert np.array_equal(ref.merge_symbols(sym16, raw16, fmt.DTYPE_F32, low16=True), up)
  with pytest.raises(ValueError):
    ref.split_symbols(np.array([1], np.uint32), fmt.DTYPE_F32, low16=True)


# --------------------------------------------------------------------------- identical frames

def _golden_tie_inputs():
  vec = json.loads((DATA / "golden.json").read_text())["vectors"]
  out = {}
  for v in vec:
    if v["name"].startswith("huff_"):
      raw = b"".join(bytes.fromhex(h) * n for h, n in v["input_segments"])
      out[v["name"]] = np.frombuffer(raw, BF16)
  return out


def _from_hist(counts, dtype, seed):
  rng = np.random.default_rng(seed)
  sym = np.repeat(np.arange(fmt.NUM_SYMBOLS), counts).astype(np.uint16)
  rng.shuffle(sym)
  nz = int((sym != fmt.ZERO_SYMBOL).sum())
  code = fmt.dtype_code(dtype)
  r = 3 if code == fmt.DTYPE_F32 else 1
  raw = rng.integers(0, 256, (nz, r), dtype=np.uint8)
  return ref.merge_symbols(sym, raw, code).view(dtype)


def _inputs():
  rng = np.random.default_rng(3)
  cases = {}
  for dt in (BF16, F16, F32):
    cases[f"normal_{dt.name}"] = normal(70_001, dt, seed=4)
    cases[f"zeros_{dt.name}"] = np.zeros(5000, dt)
    cases[f"sparse_{dt.name}"] = np.where(rng.random(9000) < 0.7, 0, normal(9000, dt, 5))
    cases[f"random_bits_{dt.name}"] = rng.integers(
        0, 1 << (8 * dt.itemsize), 3001, dtype=f"u{dt.itemsize}").view(dt)
    cases[f"tiny_{dt.name}"] = np.array([0, 1], dt)
    cases[f"empty_{dt.name}"] = np.zeros(0, dt)
    cases[f"one_{dt.name}"] = np.array([-7], dt)
    cases[f"scaled_{dt.name}"] = normal(5000, dt, seed=6, scale=1e-3)
  cases["low16_f32"] = normal(140_000, BF16, seed=7).astype(F32)
  cases["low16_mixed_blocks_f32"] = np.concatenate(
      [normal(65536, BF16, 8).astype(F32), normal(1000, F32, 9)])
  cases["multi_block_bf16"] = normal(3 * 65536 + 17, BF16, seed=10, scale=3e4)
  cases["const_huff_raw_bf16"] = np.concatenate([
      np.full(65536, 2.5, BF16), normal(65536, BF16, 11),
      rng.integers(0, 1 << 16, 65536, dtype=np.uint16).view(BF16), np.zeros(3, BF16)])
  cases["all_bf16_patterns"] = np.arange(1 << 16, dtype=np.uint16).view(BF16)
  cases["heavy_tail_bf16"] = (rng.standard_cauchy(70_000) ** 3).astype(BF16)
  cases["one_symbol_bf16"] = (1 + np.arange(3000) % 64 / 128).astype(BF16)  # exponents all 127
  fib = [1, 1]
  while len(fib) < 22:
    fib.append(fib[-1] + fib[-2])
  deep = np.zeros(fmt.NUM_SYMBOLS, np.int64)
  deep[[fmt.ZERO_SYMBOL] + list(range(60, 81))] = fib          # depth > 11: length limiting
  cases["deep_tree_bf16"] = _from_hist(deep, BF16, 12)
  cases["deep_tree_f32"] = _from_hist(deep, F32, 13)
  ties = np.zeros(fmt.NUM_SYMBOLS, np.int64)
  ties[rng.choice(256, 77, replace=False)] = rng.integers(1, 4, 77)
  cases["many_ties_f16"] = _from_hist(ties, F16, 14)
  cases.update(_golden_tie_inputs())
  for p in sorted(DATA.glob("*.npy")):
    a = np.load(p)
    cases[f"corpus_{p.name}"] = a.view(BF16) if p.name.endswith(".bf16.npy") else a
  return cases


INPUTS = _inputs()


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_reference_matches_cpp(name):
  x = INPUTS[name]
  for checksum in (False, True) if x.size <= 70_001 else (False,):
    r = ref.encode(x, checksum=checksum)
    c = c_encode(x, checksum=checksum)
    assert r == c, f"{name}: frames differ at byte {next(i for i in range(len(r)) if r[i] != c[i])}"
  assert same_bits(ref.decode(c, shape=x.shape, dtype=x.dtype), x)   # reference decodes C++
  assert same_bits(c_decode(r, x.size, x.dtype), x)                    # C++ decodes reference


def test_tie_goes_raw_one_byte_under_goes_huff():
  ties = _golden_tie_inputs()
  tie = ref.frame_info(ref.encode(ties["huff_raw_tie_bf16"]))["blocks"]
  under = ref.frame_info(ref.encode(ties["huff_one_byte_under_raw_bf16"]))["blocks"]
  raw_size = fmt.BLOCK_HEADER_BYTES + 2 * 2048
  assert tie[0]["mode"] == fmt.MODE_RAW and tie[0]["bytes"] == raw_size
  assert under[0]["mode"] == fmt.MODE_HUFF and under[0]["bytes"] == raw_size - 1


@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=lambda d: d.name)
def test_reference_matches_jax_api(dtype):
  x = normal(66_000, dtype, seed=15)
  x[100:3000] = 0
  payload, nbytes = zj.encode(x, checksum=True)
  frame = np.asarray(payload)[:int(nbytes)].tobytes()
  assert frame == ref.encode(x, checksum=True)
  y = zj.decode(np.frombuffer(ref.encode(x), np.uint8), shape=x.shape, dtype=dtype)
  assert same_bits(np.asarray(y), x)


def test_small_capacity_writes_header_only():
  """FORMAT.md: an encoder short of capacity writes only the header (if it fits) with the
  needed frame_bytes, flags 0 and checksum 0, and reports the size it needed."""
  x = normal(1000, BF16, seed=24)
  want = ref.encode(x)
  for checksum in (False, True):
    for cap in (0, 10, 31, 32, 33, len(want) - 1):
      out = np.full(cap, 0xAB, np.uint8)
      n = ext.encode_host(x.view(np.uint8), x.size, fmt.DTYPE_BF16, checksum, out)
      assert n == len(want)
      if cap < 32:
        assert np.all(out == 0xAB), "wrote past a buffer that cannot hold the header"
      else:
        h = struct.unpack("<IBBBBQQII", out[:32].tobytes())
        assert h == (fmt.MAGIC, fmt.VERSION, fmt.DTYPE_BF16, 0, 16, x.size, len(want), 0, 0)
        with pytest.raises(ValueError, match="truncated|exceeds"):
          ref.decode(out, shape=x.shape, dtype=BF16)
        with pytest.raises(ValueError, match="truncated"):
          c_decode(out, x.size, BF16)


def test_frame_info():
  info = ref.frame_info(ref.encode(INPUTS["const_huff_raw_bf16"], checksum=True))
  assert [b["mode"] for b in info["blocks"]] == [1, 2, 0, 1]
  assert info["flags"] == fmt.FLAG_CHECKSUM and info["n_elems"] == 3 * 65536 + 3
  info = ref.frame_info(ref.encode(INPUTS["low16_mixed_blocks_f32"]))
  assert [(b["mode"], b["flags"]) for b in info["blocks"]] == [(2, 1), (2, 0)]


def test_reference_api_errors():
  with pytest.raises(TypeError, match="bfloat16, float16, float32"):
    ref.encode(np.zeros(3, np.int32))
  with pytest.raises(TypeError, match="bfloat16, float16, float32"):
    ref.decode(ref.encode(np.zeros(3, BF16)), shape=(3,), dtype=np.float64)
  with pytest.raises(TypeError, match="uint8"):
    ref.decode(np.zeros(40, np.int8), shape=(3,), dtype=BF16)
  frame = ref.encode(np.arange(6, dtype=BF16).reshape(2, 3))
  assert ref.decode(frame, shape=(3, 2), dtype=BF16).shape == (3, 2)
  assert ref.decode(np.frombuffer(frame + b"junk", np.uint8), shape=6, dtype=BF16).shape == (6,)


# --------------------------------------------------------------------------- compliance

def _block_parts(frame: bytes, dtype) -> dict:
  """A one-block frame split into editable fields (HUFF: table, segment directory, units, raw)."""
  frame = bytes(frame)
  hdr = list(struct.unpack("<IBBBBQQII", frame[:32]))
  blk = frame[36:]
  mode, flags, rsv, value = struct.unpack("<BBHI", blk[:8])
  parts = dict(hdr=hdr, mode=mode, flags=flags, rsv=rsv, value=value, body=blk[8:])
  if mode == fmt.MODE_HUFF:
    n = hdr[5]
    lo, hi = blk[8], blk[9]
    tb = 2 + (hi - lo + 3) // 2
    ns = -(-n // fmt.SEGMENT_ELEMS)
    sdir = np.frombuffer(blk[8 + tb:8 + tb + 4 * ns], "<u2").reshape(ns, 2).astype(np.int64)
    nu = 2 * int(sdir[:, 0].sum())
    rest = blk[8 + tb + 4 * ns:]
    parts.update(lo=lo, hi=hi, table=bytearray(blk[10:8 + tb]), sdir=sdir,
                 units=bytearray(rest[:nu]), raw=bytes(rest[nu:]))
  return parts


def _build(p: dict, *, dir_delta=0, frame_bytes=None, extra=b"", fix_checksum=False) -> bytes:
  if "table" in p:
    body = (bytes([p["lo"], p["hi"]]) + bytes(p["table"]) + p["sdir"].astype("<u2").tobytes()
            + bytes(p["units"]) + p["raw"])
  else:
    body = p["body"]
  blk = struct.pack("<BBHI", p["mode"], p["flags"], p["rsv"], p["value"]) + body
  hdr = list(p["hdr"])
  hdr[6] = 36 + len(blk) if frame_bytes is None else frame_bytes
  frame = bytearray(struct.pack("<IBBBBQQII", *hdr) + struct.pack("<I", len(blk) + dir_delta)
                    + blk + extra)
  if fix_checksum:
    frame[28:32] = b"\0\0\0\0"
    frame[28:32] = struct.pack("<I", ref.frame_checksum(frame[:hdr[6]], [(36, hdr[6])]))
  return bytes(frame)


def _x_huff():
  x = normal(5003, BF16, seed=16)   # 13 nibbles (odd); one segment of ~157 elements per lane
  x[::7] = 0
  return x


X_HUFF = _x_huff()
F_HUFF = ref.encode(X_HUFF)
X_F32 = normal(3000, F32, seed=17)
F_F32 = ref.encode(X_F32)
X_CONST = np.full(100, 1.25, BF16)
F_CONST = ref.encode(X_CONST)
X_RAW = np.random.default_rng(18).integers(0, 1 << 16, 300, dtype=np.uint16).view(F16)
F_RAW = ref.encode(X_RAW)


def _hdr_edit(frame, field, value):
  p = _block_parts(frame, BF16)
  names = ["magic", "version", "dtype", "flags", "block_log2", "n_elems", "frame_bytes",
           "reserved", "checksum"]
  p["hdr"][names.index(field)] = value
  return _build(p, frame_bytes=p["hdr"][6] if field == "frame_bytes" else None)


def _edit(frame, dtype=BF16, **kw):
  p = _block_parts(frame, dtype)
  for k, v in kw.items():
    if callable(v):
      v(p)
    else:
      p[k] = v
  return _build(p)


def _set_nibble(i, v):
  def f(p):
    b = p["table"]
    b[i // 2] = (b[i // 2] & (0xF0 if i % 2 == 0 else 0x0F)) | (v << (4 * (i % 2)))
  return f


def _sdir(row, col, delta):
  def f(p):
    p["sdir"] = p["sdir"].copy()
    p["sdir"][row, col] += delta
  return f


def _n_nibbles(frame):
  p = _block_parts(frame, BF16)
  return p["hi"] - p["lo"] + 2


def _violations():
  """(name, frame, n_elems, dtype, reference message regex)."""
  n, bf = X_HUFF.size, BF16
  fb = len(F_HUFF)
  nb = _n_nibbles(F_HUFF)
  odd_frame = F_HUFF if nb % 2 else F_F32
  odd_dtype = bf if nb % 2 else F32
  assert _n_nibbles(odd_frame) % 2 == 1, "need a table with an odd nibble count"
  p = _block_parts(F_HUFF, bf)
  lo_u, hi_u = _unit_bounds(n)
  v = [
      ("short_header", F_HUFF[:31], n, bf, "truncated"),
      ("truncated", F_HUFF[:-1], n, bf, "truncated|exceeds"),
      ("bad_magic", _hdr_edit(F_HUFF, "magic", 0x4C43435B), n, bf, "magic"),
      ("bad_version", _hdr_edit(F_HUFF, "version", 3), n, bf, "version"),
      ("invalid_dtype", _hdr_edit(F_HUFF, "dtype", 4), n, bf, "dtype"),
      ("dtype_mismatch", F_HUFF, n, F16, "dtype"),
      ("bad_block_log2", _hdr_edit(F_HUFF, "block_log2", 15), n, bf, "block_log2"),
      ("count_mismatch", F_HUFF, n + 1, bf, "element count"),
      ("reserved_frame_flag", _hdr_edit(F_HUFF, "flags", 0x04), n, bf, "reserved"),
      ("reserved_header_field", _hdr_edit(F_HUFF, "reserved", 1 << 24), n, bf, "reserved"),
      ("checksum_without_flag", _hdr_edit(F_HUFF, "checksum", 1), n, bf, "checksum"),
      ("frame_bytes_below_directory", _hdr_edit(F_HUFF, "frame_bytes", 35), n, bf, "outside"),
      ("frame_bytes_above_bound",
       _build(_block_parts(F_HUFF, bf), frame_bytes=32 + 12 + 2 * n + 1,
              extra=bytes(2 * n + 12 - fb + 33)), n, bf, "outside"),
      ("directory_mismatch", _build(_block_parts(F_HUFF, bf), dir_delta=-1), n, bf, "directory"),
      ("checksum_mismatch", ref.encode(X_HUFF, checksum=True)[:-1] + b"\x55", n, bf, "checksum"),
      ("unknown_mode", _edit(F_CONST, mode=3), 100, bf, "unknown block mode"),
      ("low16_on_bf16", _edit(F_HUFF, flags=1), n, bf, "not allowed"),
      ("reserved_block_flag", _edit(F_F32, F32, flags=2), 3000, F32, "not allowed"),
      ("low16_on_raw", _edit(F_RAW, F16, flags=1), 300, F16, "not allowed"),
      ("low16_on_const", _edit(ref.encode(np.ones(9, F32)), F32, flags=1), 9, F32, "not allowed"),
      ("reserved_block_field", _edit(F_HUFF, rsv=1), n, bf, "reserved"),
      ("huff_value_field", _edit(F_HUFF, value=1), n, bf, "reserved"),
      ("raw_value_field", _edit(F_RAW, F16, value=1), 300, F16, "reserved"),
      ("const_upper_bits", _edit(F_CONST, value=0x13FA0), 100, bf, "reserved"),
      ("const_with_body", _edit(F_CONST, body=b"\0\0"), 100, bf, "CONST block size"),
      ("raw_short", _edit(F_RAW, F16, body=_block_parts(F_RAW, F16)["body"][:-2]), 300, F16,
       "RAW block size"),
      ("huff_size_mismatch", _edit(F_HUFF, raw=p["raw"] + b"\0"), n, bf, "inconsistent"),
      ("hi_below_lo", _edit(F_HUFF, hi=p["lo"] - 1), n, bf, "hi .* < lo"),
      ("length_above_11", _edit(F_HUFF, table=_set_nibble(1, 12)), n, bf, "code length"),
      ("no_used_symbol", _edit(F_HUFF, table=lambda q: q.__setitem__(
          "table", bytearray(len(q["table"])))), n, bf, "no used symbol"),
      ("kraft_violated", _edit(F_HUFF, table=_set_nibble(0, 1)), n, bf, "Kraft"),
      ("reserved_final_nibble", _edit(odd_frame, odd_dtype, table=_set_nibble(
          _n_nibbles(odd_frame), 1)), X_HUFF.size if odd_dtype == bf else 3000, odd_dtype,
       "nibble"),
      ("seg_nnz_above_count", _edit(F_HUFF, sdir=_sdir(0, 1, n + 1 - int(p["sdir"][0, 1]))),
       n, bf, "seg_nnz exceeds"),
      ("seg_units_below_bound", _edit(F_HUFF, sdir=_sdir(0, 0, lo_u - 1 - int(p["sdir"][0, 0]))),
       n, bf, "seg_units outside"),
      ("seg_units_above_bound", _edit(F_HUFF, sdir=_sdir(0, 0, hi_u + 1 - int(p["sdir"][0, 0]))),
       n, bf, "seg_units outside"),
      ("v1_frame", _hdr_edit(F_HUFF, "version", 1), n, bf, "version 1, this decoder reads version 2"),
  ]
  return v


def _unit_bounds(m):
  """FORMAT.md's bounds on a segment's seg_units: every code of 1 bit, of 11 bits."""
  e = np.maximum(0, -(-(m - np.arange(fmt.LANES)) // fmt.LANES))
  return int(np.sum(-(-e // fmt.UNIT_BITS))), int(np.sum(-(-(11 * e) // fmt.UNIT_BITS)))


X_TINY = np.tile(np.array([0, 0, 1.5, -2, 0, 1.5], BF16), 32)    # HUFF: ZERO, 127, 128


def _craft_tiny(lengths: dict, damage=None) -> bytes:
  """X_TINY as a HUFF block with the given code lengths {symbol: length}; `damage(codes,
  lens)` may edit the per-element (code, length) arrays before they are laid out in units."""
  q = _block_parts(ref.encode(X_TINY), BF16)
  assert q["mode"] == fmt.MODE_HUFF and (q["lo"], q["hi"]) == (127, 128)
  ln = np.zeros(fmt.NUM_SYMBOLS, np.uint8)
  for sym, length in lengths.items():
    ln[sym] = length
  nib = [ln[fmt.ZERO_SYMBOL], ln[127], ln[128], 0]
  q["table"] = bytearray([nib[0] | (nib[1] << 4), nib[2] | (nib[3] << 4)])
  sym, _ = ref.split_symbols(bits(X_TINY), fmt.DTYPE_BF16)
  codes = ref.canonical_codes(ln)[sym].astype(np.uint32)
  lens = ln[sym].astype(np.int64)
  if damage:
    damage(codes, lens)
  units, seg_units = ref._units_of_block(codes, lens, X_TINY.size)   # the spec's unit layout
  q["sdir"] = np.array([[int(seg_units[0]), int((sym != fmt.ZERO_SYMBOL).sum())]])
  q["units"] = bytearray(units.astype("<u2").tobytes())
  return _build(q)


def _unit_violations():
  """Segments whose units do not decode as their directory says."""
  n = X_HUFF.size
  out = []
  # seg_nnz differs from the non-ZERO symbols in the segment (block size kept consistent)
  q = _block_parts(F_HUFF, BF16)
  q["sdir"] = q["sdir"].copy()
  q["sdir"][0, 1] -= 1
  q["raw"] = q["raw"][:-1]
  out.append(("nnz_mismatch", _build(q), n, BF16, "differ from its seg_nnz"))
  # one unit more than the lanes take (a zero unit appended)
  q = _block_parts(F_HUFF, BF16)
  q["sdir"] = q["sdir"].copy()
  q["sdir"][0, 0] += 1
  q["units"] = q["units"] + b"\0\0"
  out.append(("extra_unit", _build(q), n, BF16, "decodes with"))
  # the last unit cut off: a lane needs a unit that is not there
  q = _block_parts(F_HUFF, BF16)
  q["sdir"] = q["sdir"].copy()
  q["sdir"][0, 0] -= 1
  q["units"] = q["units"][:-2]
  out.append(("truncated_units", _build(q), n, BF16, "more units than its seg_units"))
  # non-zero padding above lane 0's last code: its codes (elements 0, 32, ...) fill less than
  # its one unit, which is stored first (step 0, lane 0)
  q = _block_parts(ref.encode(X_TINY), BF16)
  sym, _ = ref.split_symbols(bits(X_TINY), fmt.DTYPE_BF16)
  lens = ref.code_lengths(np.bincount(sym, minlength=fmt.NUM_SYMBOLS))
  assert int(lens[sym[0::fmt.LANES]].sum()) < fmt.UNIT_BITS
  q["units"][1] |= 0x80
  out.append(("units_padding_bits", _build(q), X_TINY.size, BF16, "padding"))
  # an incomplete code (Kraft 7/8, legal) and a prefix '111' that matches no code
  def no_code(codes, lens):
    assert lens[3] == 3 and codes[3] == 0b110
    codes[3] = 0b111
  frame = _craft_tiny({fmt.ZERO_SYMBOL: 1, 127: 2, 128: 3}, no_code)
  out.append(("prefix_matches_no_code", frame, X_TINY.size, BF16, "matches no code"))
  return out


VIOLATIONS = _violations() + _unit_violations()


@pytest.mark.parametrize("case", VIOLATIONS, ids=[c[0] for c in VIOLATIONS])
def test_compliance_violation_rejected(case):
  name, frame, n, dtype, msg = case
  with pytest.raises(ValueError, match=msg):
    ref.decode(frame, shape=(n,), dtype=dtype)
  with pytest.raises(ValueError, match="zipccl decode"):
    c_decode(frame, n, dtype)


def test_crafted_frames_valid_controls():
  """The editing helpers rebuild valid frames, and an incomplete (Kraft < 1) code is legal."""
  for frame, x in ((F_HUFF, X_HUFF), (F_F32, X_F32), (F_CONST, X_CONST), (F_RAW, X_RAW)):
    p = _block_parts(frame, x.dtype)
    assert _build(p) == frame
    same = _build(p, extra=b"trailing bytes are ignored")
    assert same_bits(ref.decode(same, shape=x.shape, dtype=x.dtype), x)
    assert same_bits(c_decode(same, x.size, x.dtype), x)
  # a hand-made HUFF block with an incomplete code: ZERO 1, 1.5's exponent 2, -2's 3 (Kraft 7/8)
  frame = _craft_tiny({fmt.ZERO_SYMBOL: 1, 127: 2, 128: 3})
  assert frame != ref.encode(X_TINY)
  assert same_bits(ref.decode(frame, shape=X_TINY.shape, dtype=BF16), X_TINY)
  assert same_bits(c_decode(frame, X_TINY.size, BF16), X_TINY)
  # a HUFF block whose only used symbol is ZERO (lo = hi = 0): encoders write CONST, but the
  # block is compliant and decoders accept it
  z = np.zeros(64, BF16)
  hdr = struct.pack("<IBBBBQQII", fmt.MAGIC, fmt.VERSION, fmt.DTYPE_BF16, 0, 16, 64,
                    36 + 8 + 3 + 4 + 64, 0, 0)
  blk = struct.pack("<BBHI", fmt.MODE_HUFF, 0, 0, 0) + bytes([0, 0, 0x01]) \
      + struct.pack("<HH", 32, 0) + bytes(64)       # 32 lanes of two 1-bit codes 0, a unit each
  zframe = hdr + struct.pack("<I", len(blk)) + blk
  assert same_bits(ref.decode(zframe, shape=(64,), dtype=BF16), z)
  assert same_bits(c_decode(zframe, 64, BF16), z)
  # the same with the CHECKSUM flag and a checksum recomputed over the edited frame
  q = _block_parts(frame, BF16)
  q["hdr"][3] = fmt.FLAG_CHECKSUM
  frame = _build(q, fix_checksum=True)
  assert same_bits(ref.decode(frame, shape=X_TINY.shape, dtype=BF16), X_TINY)
  assert same_bits(c_decode(frame, X_TINY.size, BF16), X_TINY)


@pytest.mark.parametrize("which", ["bf16_huff", "f32", "f32_low16", "f16_multi"])
def test_damaged_frames_same_verdict(which):
  """Random byte damage: the reference and the C++ decoder accept or reject alike, and
  decode accepted frames to the same bits."""
  x = {"bf16_huff": X_HUFF, "f32": X_F32,
       "f32_low16": normal(2500, BF16, 19).astype(F32),
       "f16_multi": np.concatenate([normal(65536 + 2100, F16, 20), np.zeros(900, F16)])}[which]
  frame = np.frombuffer(ref.encode(x), np.uint8)
  rng = np.random.default_rng(abs(hash(which)) % 2**32)
  accepted = rejected = 0
  for i in range(24 if x.size > 65536 else 80):
    bad = frame.copy()
    if i % 2:   # damage the structural part (headers, table, directories) more often
      pos = rng.integers(0, min(bad.size, 32 + 4 + 8 + 140), size=1)
    else:
      pos = rng.integers(0, bad.size, size=rng.integers(1, 3))
    bad[pos] ^= rng.integers(1, 256, size=pos.size).astype(np.uint8)
    try:
      r = ref.decode(bad, shape=x.shape, dtype=x.dtype)
    except ValueError as e:
      r = e
    try:
      c = c_decode(bad, x.size, x.dtype)
    except ValueError as e:
      c = e
    assert isinstance(r, Exception) == isinstance(c, Exception), (
        f"damage at {pos.tolist()}: reference {'rejects: ' + str(r) if isinstance(r, Exception) else 'accepts'}"
        f", C++ {'rejects: ' + str(c) if isinstance(c, Exception) else 'accepts'}")
    if isinstance(r, Exception):
      rejected += 1
    else:
      accepted += 1
      assert same_bits(r, c)
  assert rejected > 0


# --------------------------------------------------------------------------- CPU code paths

BOUNDARY_SIZES = [0, 1, 31, 32, 33, 16383, 16384, 16385, 65535, 65536, 65537, 2 * 65536 + 777]


def _path_inputs():
  rng = np.random.default_rng(40)
  out = []
  for dt in fmt.SUPPORTED_DTYPES:
    dt = np.dtype(dt)
    w = dt.itemsize
    special = {2: [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x0001, 0x807F, 0x7C00, 0xFE01],
               4: [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFC12345, 0x00000001, 0x807FFFFF],
               1: list(range(256))}[w]
    for n in BOUNDARY_SIZES:
      g = (rng.standard_normal(n) * 0.05).astype(np.float32)
      x = g.astype(dt) if w > 1 else np.clip(g * 100, -200, 200).astype(dt)
      u = x.view(f"u{w}")
      u[rng.random(n) < 0.25] = 0                                   # zeros, some segments all zero
      if n > 40000:
        u[16384:32768] = 0
      k = min(n, len(special))
      u[:k] = np.array(special[:k], f"u{w}")                        # NaN payloads, +-0, Inf, subnormals
      out.append((f"{dt.name}_{n}", x))
    if w == 4:
      out.append(("float32_low16_70000", normal(70_000, BF16, 41).astype(F32)))
    out.append((f"{dt.name}_random_bits", rng.integers(0, 256, 5000 * w, dtype=np.uint8).view(dt)))
  return out


PATH_INPUTS = _path_inputs()


@contextlib.contextmanager
def cpu_path(vector: bool):
  """The CPU driver's AVX-512 paths (where compiled in) or its portable loops (ZIPCCL_CPU_PORTABLE)."""
  prev = os.environ.pop("ZIPCCL_CPU_PORTABLE", None)
  if not vector:
    os.environ["ZIPCCL_CPU_PORTABLE"] = "1"
  try:
    yield
  finally:
    os.environ.pop("ZIPCCL_CPU_PORTABLE", None)
    if prev is not None:
      os.environ["ZIPCCL_CPU_PORTABLE"] = prev


@pytest.fixture
def portable_paths():
  with cpu_path(False):
    yield


@pytest.mark.parametrize("name,x", PATH_INPUTS, ids=[n for n, _ in PATH_INPUTS])
def test_cpu_code_paths_match_reference(name, x):
  """The AVX-512 paths (where compiled in) and the portable loops write the reference's frames and
  decode them alike, on every dtype, around segment, lane and block boundaries."""
  frames = []
  for vec in (True, False):
    with cpu_path(vec):
      for checksum in (False, True):
        c = c_encode(x, checksum=checksum)
        assert c == ref.encode(x, checksum=checksum), (name, vec, checksum)
        assert same_bits(c_decode(c, x.size, x.dtype), x)
        frames.append(c)
  assert frames[:2] == frames[2:]


@pytest.mark.parametrize("which", ["bf16", "f32", "e4m3fn"])
def test_cpu_code_paths_same_verdicts(which):
  """Damaged frames: both CPU code paths accept or reject alike, with the same message, and agree
  with the reference; accepted frames decode to the same bits."""
  x = {"bf16": normal(40_000, BF16, 42), "f32": normal(20_000, F32, 43),
       "e4m3fn": normal(30_000, F32, 44).astype(ml_dtypes.float8_e4m3fn)}[which]
  x.view(f"u{x.dtype.itemsize}")[::5] = 0
  frame = np.frombuffer(ref.encode(x), np.uint8)
  rng = np.random.default_rng(45)
  rejected = 0
  for i in range(60):
    bad = frame.copy()
    pos = rng.integers(36, bad.size, size=1 + i % 3)
    bad[pos] ^= rng.integers(1, 256, size=pos.size).astype(np.uint8)
    verdicts = []
    for vec in (True, False):
      with cpu_path(vec):
        try:
          verdicts.append(c_decode(bad, x.size, x.dtype))
        except ValueError as e:
          verdicts.append(str(e))
    try:
      r = ref.decode(bad, shape=x.shape, dtype=x.dtype)
    except ValueError:
      r = None
    a, b = verdicts
    if isinstance(a, str):
      rejected += 1
      assert a == b and r is None, (pos, a, b)
    else:
      assert not isinstance(b, str) and r is not None and same_bits(a, b) and same_bits(a, r), pos
  assert rejected > 0


@pytest.mark.parametrize("case", VIOLATIONS, ids=[c[0] for c in VIOLATIONS])
def test_compliance_violation_rejected_portable(case, portable_paths):
  name, frame, n, dtype, msg = case
  with pytest.raises(ValueError, match="zipccl decode"):
    c_decode(frame, n, dtype)
