"""The codec through its public JAX API (FFI path): zipccl_jax.encode / decode.

Every comparison is bit-exact on unsigned-integer views (np.array_equal, never
allclose). FORMAT.md is the spec; tests/data holds corpus slices and golden
frames (regenerate with tests/data/make_test_data.py).
"""

from __future__ import annotations

import functools
import json
import pathlib
import re
import struct

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import zipccl_jax as zj
from zipccl_jax import codec
from zipccl_jax import format as fmt

DATA = pathlib.Path(__file__).parent / "data"
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
DTYPES = [BF16, F16, F32]
# A failing FFI call surfaces as JaxRuntimeError (INVALID_ARGUMENT); depending on JAX's
# dispatch path (e.g. a numpy argument after a cached call with a jax.Array) the same
# error can arrive as ValueError. Both carry the codec's message.
DECODE_ERRORS = (jax.errors.JaxRuntimeError, ValueError)


def bits(a) -> np.ndarray:
  a = np.asarray(a)
  return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def same_bits(a, b) -> bool:
  a, b = np.asarray(a), np.asarray(b)
  return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(bits(a), bits(b))


@functools.cache
def _roundtrip_fn(checksum: bool):
  def f(x):
    payload, nbytes = zj.encode(x, checksum=checksum)
    return payload, nbytes, zj.decode(payload, shape=x.shape, dtype=x.dtype)
  return jax.jit(f)


def roundtrip(x, checksum=False):
  """(frame bytes, decoded numpy array) through one jitted encode+decode."""
  payload, nbytes, y = _roundtrip_fn(checksum)(jnp.asarray(x))
  payload, nbytes = np.asarray(payload), int(nbytes)
  assert payload.shape == (fmt.max_encoded_bytes(np.size(x), np.asarray(x).dtype),)
  assert 0 < nbytes <= payload.size
  return payload[:nbytes].tobytes(), np.asarray(y)


def check_roundtrip(x, checksum=False) -> bytes:
  x = np.asarray(x)
  frame, y = roundtrip(x, checksum)
  assert same_bits(y, x)
  h = header(frame)
  assert h["frame_bytes"] == len(frame) and h["n_elems"] == x.size
  return frame


def header(frame: bytes) -> dict:
  names = ["magic", "version", "dtype", "flags", "block_log2", "n_elems", "frame_bytes",
           "reserved", "checksum"]
  return dict(zip(names, struct.unpack("<IBBBBQQII", bytes(frame[:32]))))


def block_modes(frame: bytes) -> list[int]:
  """Mode byte of every block, walking the block directory."""
  n_blocks = fmt.num_blocks(header(frame)["n_elems"])
  sizes = struct.unpack(f"<{n_blocks}I", frame[32:32 + 4 * n_blocks])
  off, modes = 32 + 4 * n_blocks, []
  for s in sizes:
    modes.append(frame[off])
    off += s
  return modes


def ffi_decode(frame, shape, dtype):
  return np.asarray(zj.decode(np.frombuffer(bytes(frame), np.uint8), shape=shape, dtype=dtype))


def normal(n, dtype, seed=0, scale=1.0):
  return (np.random.default_rng(seed).normal(size=n) * scale).astype(dtype)


# --------------------------------------------------------------------------- bit patterns

@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_all_16bit_patterns(dtype):
  x = np.arange(1 << 16, dtype=np.uint16).view(dtype)
  check_roundtrip(x)
  # the same patterns in a scrambled order and a length spanning two blocks (HUFF + RAW mix)
  perm = np.random.default_rng(1).permutation(1 << 16).astype(np.uint16)
  y = np.concatenate([normal(70_000, dtype), perm.view(dtype)])
  check_roundtrip(y)


def test_random_fp32_bits():
  u = np.random.default_rng(2).integers(0, 1 << 32, size=100_003, dtype=np.uint32)
  frame = check_roundtrip(u.view(F32))
  assert set(block_modes(frame)) == {fmt.MODE_RAW}
  assert len(frame) == fmt.max_encoded_bytes(u.size, F32)


def _specials(dtype) -> np.ndarray:
  if dtype == F32:
    u = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
         0x7FBFFFFF, 0xFFFFFFFF, 0x7FC12345, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF,
         0x00800000, 0x7F7FFFFF, 0xFF7FFFFF]
    return np.array(u, np.uint32).view(F32)
  if dtype == BF16:
    u = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0x7FBF, 0xFFFF, 0x7FD5,
         0x0001, 0x8001, 0x007F, 0x807F, 0x0080, 0x7F7F, 0xFF7F]
  else:
    u = [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7DFF, 0xFFFF, 0x7E55,
         0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x7BFF, 0xFBFF]
  return np.array(u, np.uint16).view(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_special_values(dtype):
  s = _specials(dtype)
  check_roundtrip(s)                      # alone
  mixed = normal(5000, dtype, seed=3)     # scattered through ordinary values (HUFF blocks)
  idx = np.random.default_rng(4).choice(mixed.size, size=400, replace=False)
  mixed[idx] = np.resize(s, idx.size)
  frame = check_roundtrip(mixed)
  assert block_modes(frame) == [fmt.MODE_HUFF]
  for v in s:                             # each one as an all-equal (CONST) array
    frame = check_roundtrip(np.full(3, v, dtype))
    assert block_modes(frame) == [fmt.MODE_CONST]


# --------------------------------------------------------------------------- sizes and modes

@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 2047, 2048, 2049, 65535, 65536, 65537,
                               2 * 65536 + 4097])
def test_lengths_bf16(n):
  x = normal(n, BF16, seed=n)
  frame = check_roundtrip(x)
  assert len(block_modes(frame)) == fmt.num_blocks(n)
  if n == 0:
    assert len(frame) == 32


@pytest.mark.parametrize("dtype", [F16, F32], ids=lambda d: d.name)
@pytest.mark.parametrize("n", [1, 5, 4099, 65536 + 333])
def test_lengths_other_dtypes(dtype, n):
  check_roundtrip(normal(n, dtype, seed=n))


def test_upcast_bf16_float32_low16():
  x = normal(70_001, BF16, seed=5).astype(F32)
  frame = check_roundtrip(x)
  # HUFF + LOW16: ~1 raw byte per element plus the exponent code, far below 4 bytes
  assert len(frame) < 0.5 * x.nbytes


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_all_zeros_and_all_equal(dtype):
  n = 2 * 65536 + 5
  for v in (0.0, 1.0, -0.0, np.nan, -3.5):
    x = np.full(n, v, dtype)
    frame = check_roundtrip(x)
    assert block_modes(frame) == [fmt.MODE_CONST] * 3
    assert len(frame) == 32 + 3 * (4 + 8)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_random_bits_raw_fallback(dtype):
  w = dtype.itemsize
  n = 65536 + 1001
  u = np.random.default_rng(6).integers(0, 1 << (8 * w), size=n, dtype=f"u{w}")
  frame = check_roundtrip(u.view(dtype))
  assert block_modes(frame) == [fmt.MODE_RAW, fmt.MODE_RAW]
  assert len(frame) == zj.max_encoded_bytes(n, dtype)


def test_zero_heavy_sparse():
  x = normal(100_000, BF16, seed=7)
  x[np.random.default_rng(8).random(x.size) < 0.9] = 0
  frame = check_roundtrip(x)
  assert len(frame) < x.nbytes / 4


def test_multidimensional_shapes():
  x = normal(3 * 5 * 7, BF16, seed=9).reshape(3, 5, 7)
  check_roundtrip(x)
  p, n = zj.encode(x)
  p2, n2 = zj.encode(x.reshape(-1))
  assert int(n) == int(n2) and np.array_equal(np.asarray(p)[:int(n)], np.asarray(p2)[:int(n)])
  assert same_bits(zj.decode(p, shape=(7, 15), dtype=BF16), x.reshape(7, 15))


# --------------------------------------------------------------------------- corpus slices

def _slices():
  meta = json.loads((DATA / "golden.json").read_text())["corpus_slices"]
  return {m["name"]: m for m in meta}


def load_slice(name):
  m = _slices()[name]
  a = np.load(DATA / m["file"])
  return a.view(BF16) if m["dtype"] == "bfloat16" else a


# minimum ratio per slice (measured: 1.51, 1.52, 1.36, 4.75, 1.39, 7.15, 1.198, 8.03)
RATIO_FLOOR = {
    "param_mlp_dense": 1.45, "act_mlp_post_gelu": 1.45, "grad_lm_head": 1.30,
    "act_moe_dispatch": 4.0, "act_moe_expert_out": 1.30, "grad_embedding": 4.0,
    "grad_attn_fp32": 1.15, "grad_embedding_fp32": 4.0,
}


@pytest.mark.parametrize("name", sorted(RATIO_FLOOR))
def test_corpus_slice(name):
  x = load_slice(name)
  assert x.size == _slices()[name]["count"]
  frame = check_roundtrip(x)
  ratio = x.nbytes / len(frame)
  assert ratio >= RATIO_FLOOR[name], f"{name}: ratio {ratio:.3f} < {RATIO_FLOOR[name]}"


def test_corpus_slices_cover_expected_cases():
  meta = _slices()
  assert set(meta) == set(RATIO_FLOOR)
  assert sum((DATA / m["file"]).stat().st_size for m in meta.values()) < 5e6
  assert meta["grad_embedding"]["zero_fraction"] > 0.8
  frame, _ = roundtrip(load_slice("act_moe_dispatch"))
  assert block_modes(frame) == [fmt.MODE_HUFF, fmt.MODE_CONST]   # zero padding rows
  frame, _ = roundtrip(load_slice("param_mlp_dense"))
  assert block_modes(frame) == [fmt.MODE_HUFF] * 3


# --------------------------------------------------------------------------- exact size

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_decode_from_exactly_nbytes(dtype):
  x = normal(3000, dtype, seed=10)
  payload, nbytes = zj.encode(x)
  nbytes = int(nbytes)
  exact = np.asarray(payload)[:nbytes]
  assert same_bits(zj.decode(exact, shape=x.shape, dtype=dtype), x)
  with pytest.raises(DECODE_ERRORS, match="truncated"):
    jax.block_until_ready(zj.decode(exact[:-1], shape=x.shape, dtype=dtype))
  with pytest.raises(DECODE_ERRORS, match="truncated"):
    jax.block_until_ready(zj.decode(exact[:31], shape=x.shape, dtype=dtype))


# --------------------------------------------------------------------------- zero segments
# Frames whose HUFF segments (16,384 elements, one directory entry each) mix all-ZERO, mostly-ZERO and
# zero-free segments, so that the segments' lanes run out of units at very different steps; every decode
# reads exactly the frame.

SEGMENT = fmt.SEGMENT_ELEMS
# Per-segment layouts: Z all zero, M mostly zero (37 values), D zero-free, H zero head, S scattered zeros.
# Three blocks of 4, 4 and 3 segments; no block all zero (that would be CONST).
ZERO_LAYOUTS = {
    "moe_tails": "DDMZ" * 3,                          # capacity padding at the end of every block
    "zeros_first": "DZZM" + "DZDM" + "DZS",
    "alternating": "DZDZ" + "MHZS" + "DZH",
    "one_data_segment": "ZZZD" + "ZZZM" + "ZZD",      # a lone long segment among short ones
    "mostly_zero": "MMMZ" + "MMSZ" + "SZM",
    "random": None,                                   # drawn at random (seeded), no block all Z
}


def _zero_layout_array(layout, dtype, n, seed, every_exponent=False):
  """Gaussian elements with zeros laid out per segment; optionally every exponent byte in every block."""
  rng = np.random.default_rng(seed)
  ns = -(-n // SEGMENT)
  if layout is None:
    while True:
      layout = "".join(rng.choice(list("ZMDHS"), size=ns))
      if all(set(layout[i:i + 4]) != {"Z"} for i in range(0, ns, 4)) and "Z" in layout:
        break
  layout = (layout * ns)[:ns]
  x = normal(n, dtype, seed=seed)
  u = bits(x)
  if every_exponent:  # all 256 symbols used, and ZERO too
    w = 8 * dtype.itemsize
    e = np.arange(256, dtype=np.uint64)
    # rotl(v, 1) >> (w - 8) == e: exponent byte (bf16/f32) or exponent+3 mantissa bits (f16)
    v = ((e << np.uint64(w - 8)) | np.uint64(1 << 4)) >> np.uint64(1) | ((e & np.uint64(1)) << np.uint64(w - 1))
    for b0 in range(0, n, fmt.BLOCK_ELEMS):
      u[b0 + 7:b0 + 7 + 256 * 3:3][:min(256, (n - b0 - 7 + 2) // 3)] = v[:min(256, (n - b0 - 7 + 2) // 3)]
  for k, kind in enumerate(layout):
    lo, hi = k * SEGMENT, min(n, (k + 1) * SEGMENT)
    zero = np.zeros(hi - lo, bool)
    if kind == "Z":
      zero[:] = True
    elif kind == "M":
      zero[37:] = True
    elif kind == "H":
      zero[:(hi - lo) * 3 // 4] = True
    elif kind == "S":
      zero = rng.random(hi - lo) < 0.3
    if every_exponent:
      keep = np.zeros(hi - lo, bool)
      for b0 in range(0, n, fmt.BLOCK_ELEMS):
        j = np.arange(b0 + 7, min(n, b0 + 7 + 256 * 3), 3)
        j = j[(j >= lo) & (j < hi)] - lo
        keep[j] = True
      zero &= ~keep
    u[lo:hi][zero] = 0
  return x, layout


def _huff_segments(frame):
  """(block offset, code lengths per symbol, segment directory offset, units offset,
  [(seg_units, seg_nnz)]) of every HUFF block."""
  n = header(frame)["n_elems"]
  nb = fmt.num_blocks(n)
  sizes = struct.unpack(f"<{nb}I", frame[32:32 + 4 * nb])
  off, out = 32 + 4 * nb, []
  for b, size in enumerate(sizes):
    if frame[off] == fmt.MODE_HUFF:
      lo, hi = frame[off + 8], frame[off + 9]
      n_nib = hi - lo + 2
      nib = [(frame[off + 10 + i // 2] >> (4 * (i & 1))) & 0xF for i in range(n_nib)]
      lens = {256: nib[0], **{lo + i: nib[1 + i] for i in range(hi - lo + 1)}}
      d = off + 10 + (n_nib + 1) // 2
      m = min(fmt.BLOCK_ELEMS, n - b * fmt.BLOCK_ELEMS)
      ns = -(-m // SEGMENT)
      dirs = [struct.unpack("<HH", frame[d + 4 * k:d + 4 * k + 4]) for k in range(ns)]
      out.append((off, lens, d, d + 4 * ns, dirs))
    off += size
  return out


def _encode_exact(x):
  payload, nbytes = zj.encode(x)
  return np.asarray(payload)[:int(nbytes)].copy()


@pytest.mark.parametrize("every_exponent", [False, True], ids=["some_exponents", "every_exponent"])
@pytest.mark.parametrize("layout", sorted(ZERO_LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_zero_segment_layouts_roundtrip(dtype, layout, every_exponent):
  n = 2 * fmt.BLOCK_ELEMS + 2 * SEGMENT + 777     # three blocks, the last one short and ragged
  x, _ = _zero_layout_array(ZERO_LAYOUTS[layout], dtype, n, seed=len(layout), every_exponent=every_exponent)
  frame = _encode_exact(x)
  assert same_bits(zj.decode(frame, shape=x.shape, dtype=dtype), x)
  blocks = _huff_segments(frame.tobytes())
  assert len(blocks) == 3
  assert any(nnz == 0 for *_, dirs in blocks for _, nnz in dirs)  # they exercise what they are meant to
  for _, lens, _, _, dirs in blocks:
    assert any(nnz > 0 for _, nnz in dirs)
    assert all(lens.get(s, 0) > 0 for s in range(256)) == every_exponent


def _segment_mutations(frame):
  """Malformed variants of a frame, each targeting a segment the directory says is all ZERO. Every block
  size stays consistent, so only the segment checks can catch them."""
  blocks = _huff_segments(frame.tobytes())
  out = []
  for off, lens, d, us, dirs in blocks:
    zs = [k for k, (_, nnz) in enumerate(dirs) if nnz == 0]
    ds = [k for k, (_, nnz) in enumerate(dirs) if nnz > 0]
    if not zs:
      continue
    starts = np.concatenate([[0], np.cumsum([su for su, _ in dirs])])
    for z in (zs[0], zs[-1]):
      for bit in (0, 8 * dirs[z][0], 16 * dirs[z][0] - 1):  # first, middle and last bit of its units
        g = frame.copy()
        at = 16 * int(starts[z]) + bit
        g[us + at // 8] ^= 1 << (at % 8)
        out.append((f"flip bit {bit} of zero segment {z}", g))
      nb = z + 1 if z + 1 < len(dirs) else z - 1
      for delta in (1, 2, -1):                            # seg_units moved to/from a neighbour
        g = frame.copy()
        for k, dd in ((z, delta), (nb, -delta)):
          struct.pack_into("<H", g, d + 4 * k, dirs[k][0] + dd)
        out.append((f"seg_units {delta:+d} on zero segment {z}", g))
      k = ds[0]                                           # nnz moved between it and a data segment
      for nz, nk in ((1, dirs[k][1] - 1), (dirs[k][1], 0)):
        g = frame.copy()
        struct.pack_into("<H", g, d + 4 * z + 2, nz)
        struct.pack_into("<H", g, d + 4 * k + 2, nk)
        out.append((f"nnz {nz} on zero segment {z}, {nk} on data segment {k}", g))
    # a data segment's directory entry swapped with a zero segment's
    g = frame.copy()
    z, k = zs[len(zs) // 2], ds[len(ds) // 2]
    g[d + 4 * z:d + 4 * z + 4], g[d + 4 * k:d + 4 * k + 4] = frame[d + 4 * k:d + 4 * k + 4], frame[d + 4 * z:d + 4 * z + 4]
    out.append((f"directory entries {z}<->{k} swapped", g))
  return out


@pytest.mark.parametrize("every_exponent", [False, True], ids=["some_exponents", "every_exponent"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_zero_segment_corruption_rejected(dtype, every_exponent):
  from zipccl_jax import reference
  n = fmt.BLOCK_ELEMS + 3 * SEGMENT + 5
  x, _ = _zero_layout_array("DZZM" + "ZDZD" + "Z", dtype, n, seed=3, every_exponent=every_exponent)
  frame = _encode_exact(x)
  cases = _segment_mutations(frame)
  assert len(cases) > 20
  for what, g in cases:
    with pytest.raises(ValueError, match="zipccl reference decode"):
      reference.decode(g.tobytes(), shape=x.shape, dtype=dtype)      # the spec rejects it ...
    with pytest.raises(DECODE_ERRORS, match="malformed units or segment directory|reserved field or bit"):
      jax.block_until_ready(zj.decode(g, shape=x.shape, dtype=dtype))                         # ... and so does the codec
    assert not np.array_equal(g, frame), what


# --------------------------------------------------------------------------- golden vectors

def golden_vectors():
  return json.loads((DATA / "golden.json").read_text())["vectors"]


def golden_input(v) -> np.ndarray:
  raw = b"".join(bytes.fromhex(h) * n for h, n in v["input_segments"])
  dtype = np.dtype(ml_dtypes.bfloat16) if v["dtype"] == "bfloat16" else np.dtype(v["dtype"])
  return np.frombuffer(raw, dtype).reshape(v["shape"])


@pytest.mark.parametrize("v", golden_vectors(), ids=lambda v: v["name"])
def test_golden_vectors(v):
  x = golden_input(v)
  want = bytes.fromhex(v["frame_hex"])
  frame, y = roundtrip(x, checksum=v["checksum"])
  assert frame == want, f"{v['name']}: frame differs from golden.json (format change?)"
  assert same_bits(y, x)
  assert same_bits(ffi_decode(want, x.shape, x.dtype), x)


def test_golden_vectors_cover_format_md():
  names = {v["name"] for v in golden_vectors()}
  assert {"empty_bf16", "one_bf16", "small_bf16", "ramp_bf16_4096", "upcast_f32_1000"} <= names
  assert {"fp8_e4m3fn_all_patterns", "fp8_e5m2_all_patterns_huff", "fp8_e4m3fn_amax_3000",
          "fp8_e5m2_const_neg_inf"} <= names
  assert {v["dtype"] for v in golden_vectors()} == {dt.name for dt in fmt.SUPPORTED_DTYPES}
  assert json.loads((DATA / "golden.json").read_text())["format_version"] == fmt.VERSION
  for v in golden_vectors():          # the recorded block modes describe the frames
    frame = bytes.fromhex(v["frame_hex"])
    modes = [("RAW", "CONST", "HUFF")[m] for m in block_modes(frame)]
    assert [m.split("+")[0] for m in v["block_modes"]] == modes, v["name"]
  small = next(v for v in golden_vectors() if v["name"] == "small_bf16")
  frame = bytes.fromhex(small["frame_hex"])
  assert frame[:4] == b"ZCCL" and header(frame)["frame_bytes"] == len(frame)


# --------------------------------------------------------------------------- transformations

def test_jit_matches_eager():
  x = normal(5000, BF16, seed=11)
  p_e, n_e = zj.encode(x)
  p_j, n_j = jax.jit(zj.encode)(x)
  assert int(n_e) == int(n_j)
  assert np.array_equal(np.asarray(p_e)[:int(n_e)], np.asarray(p_j)[:int(n_j)])
  assert n_j.dtype == (jnp.int64 if jax.config.jax_enable_x64 else jnp.int32) and n_j.shape == ()
  dec = jax.jit(lambda p: zj.decode(p, shape=(5000,), dtype=BF16))
  assert same_bits(dec(p_j), x)


def test_x64_nbytes_int64_and_float64_rejected():
  x = normal(300, F32, seed=23)
  with jax.enable_x64(True):
    payload, nbytes = zj.encode(x)
    assert nbytes.dtype == jnp.int64 and int(nbytes) <= payload.shape[0]
    assert same_bits(zj.decode(payload, shape=x.shape, dtype=F32), x)
    with pytest.raises(TypeError, match="bfloat16, float16, float32"):
      zj.encode(np.zeros(3, np.float64))


def test_vmap_matches_per_row():
  rows = [normal(3000, BF16, seed=12), np.zeros(3000, BF16), normal(3000, BF16, seed=13) * 0,
          np.arange(1 << 16, dtype=np.uint16)[:3000].view(BF16), normal(3000, BF16, 14, 1e-30)]
  xs = np.stack(rows)
  P, N = jax.vmap(zj.encode)(xs)
  P, N = np.asarray(P), np.asarray(N)
  assert P.shape == (len(rows), zj.max_encoded_bytes(3000, BF16)) and N.shape == (len(rows),)
  for i, r in enumerate(rows):
    p, n = zj.encode(r)
    assert int(N[i]) == int(n)
    assert np.array_equal(P[i, :N[i]], np.asarray(p)[:int(n)])
  Y = jax.vmap(lambda p: zj.decode(p, shape=(3000,), dtype=BF16))(P)
  assert same_bits(Y, xs)
  # the batched forms: one call, one frame per leading row
  P2, N2 = codec.encode_frames(xs)
  assert np.array_equal(np.asarray(N2), N)
  for i in range(len(rows)):
    assert np.array_equal(np.asarray(P2)[i, :N[i]], P[i, :N[i]])
  assert same_bits(codec.decode_frames(P2, shape=(3000,), dtype=BF16), xs)


def test_vmap_nested_and_checksum():
  xs = normal(2 * 3 * 500, F16, seed=15).reshape(2, 3, 500)
  P, N = jax.vmap(jax.vmap(functools.partial(zj.encode, checksum=True)))(xs)
  assert P.shape[:2] == (2, 3) and N.shape == (2, 3)
  p, n = zj.encode(xs[1, 2], checksum=True)
  assert np.array_equal(np.asarray(P)[1, 2, :int(n)], np.asarray(p)[:int(n)])
  Y = jax.vmap(jax.vmap(lambda p: zj.decode(p, shape=(500,), dtype=F16)))(P)
  assert same_bits(Y, xs)


def _mesh8():
  if jax.device_count() < 8:
    pytest.skip(f"needs 8 CPU devices (tests/conftest.py sets XLA_FLAGS), have {jax.device_count()}")
  return jax.make_mesh((8,), ("d",))


def test_shard_map_8_devices():
  from jax.sharding import NamedSharding, PartitionSpec as P
  mesh = _mesh8()
  per = 1000
  host = normal(8 * per, BF16, seed=16)
  host[3 * per:4 * per] = 0                                # one shard all zeros (CONST)
  x = jax.device_put(host, NamedSharding(mesh, P("d")))

  def body(a):
    payload, nbytes = zj.encode(a, checksum=True)
    y = zj.decode(payload, shape=a.shape, dtype=a.dtype)
    return y, payload[None], nbytes[None]

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=(P("d"), P("d"), P("d"))))
  y, payloads, nbytes = f(x)
  assert same_bits(y, host)
  payloads, nbytes = np.asarray(payloads), np.asarray(nbytes)
  assert payloads.shape == (8, zj.max_encoded_bytes(per, BF16))
  for d in range(8):
    p, n = zj.encode(host[d * per:(d + 1) * per], checksum=True)
    assert int(nbytes[d]) == int(n)
    assert np.array_equal(payloads[d, :nbytes[d]], np.asarray(p)[:int(n)])
  assert int(nbytes[3]) == 32 + 4 + 8


def test_shard_map_custom_vjp_grad():
  """Codec outputs carry the per-device (varying) type, so a custom_vjp that round-trips
  values and cotangents through the codec works under grad inside shard_map."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  mesh = _mesh8()

  @jax.custom_vjp
  def through_codec(a):
    p, _ = zj.encode(a)
    return zj.decode(p, shape=a.shape, dtype=a.dtype)

  def fwd(a):
    return through_codec(a), None

  def bwd(_, g):
    p, _ = zj.encode(g)
    return (zj.decode(p, shape=g.shape, dtype=g.dtype),)

  through_codec.defvjp(fwd, bwd)

  def loss(a):
    y = through_codec(a)
    return jax.lax.psum(jnp.sum(y.astype(jnp.float32) ** 2), "d")

  host = normal(8 * 256, F32, seed=17)
  x = jax.device_put(host, NamedSharding(mesh, P("d")))
  g = jax.jit(jax.shard_map(jax.grad(loss), mesh=mesh, in_specs=P("d"), out_specs=P("d")))(x)
  assert np.array_equal(np.asarray(g), 2 * host)


def test_grad_free():
  x = normal(256, F32, seed=18)

  def through(a):
    p, _ = zj.encode(a)
    return jnp.sum(zj.decode(p, shape=a.shape, dtype=a.dtype))

  with pytest.raises(ValueError, match="cannot be differentiated"):
    jax.grad(through)(x)
  # with the codec behind stop_gradient, grad of the rest of the function works
  g = jax.grad(lambda a: jnp.sum(a * a) + through(jax.lax.stop_gradient(a)))(x)
  assert np.array_equal(np.asarray(g), 2 * x)


# --------------------------------------------------------------------------- checksum

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_checksum_roundtrip_and_corruption(dtype):
  x = normal(5000, dtype, seed=19)
  frame = check_roundtrip(x, checksum=True)
  h = header(frame)
  assert h["flags"] == fmt.FLAG_CHECKSUM and h["checksum"] != 0
  plain = check_roundtrip(x)
  assert plain[32:] == frame[32:] and len(plain) == len(frame)     # only the header differs
  for pos in (len(frame) - 1, len(frame) // 2, 40):  # a raw byte, the units, the block header
    bad = bytearray(frame)
    bad[pos] ^= 0x10
    with pytest.raises(DECODE_ERRORS, match="checksum"):
      jax.block_until_ready(ffi_decode(bad, x.shape, dtype))
  bad = bytearray(frame)
  bad[29] ^= 0x01                                     # the checksum field itself
  with pytest.raises(DECODE_ERRORS, match="checksum"):
    jax.block_until_ready(ffi_decode(bad, x.shape, dtype))


# --------------------------------------------------------------------------- capacity

def test_capacity_overflow():
  x = normal(4000, BF16, seed=20)
  full, n_full = zj.encode(x)
  need = int(n_full)
  for checksum in (False, True):
    payload, nbytes = zj.encode(x, capacity=need - 1, checksum=checksum)
    payload = np.asarray(payload)
    assert payload.shape == (need - 1,) and int(nbytes) == need
    assert int(codec.frame_bytes_of(payload)) == need
    h = header(payload)
    assert h["magic"] == fmt.MAGIC and h["frame_bytes"] == need
    assert h["flags"] == 0 and h["checksum"] == 0                  # FORMAT.md: overflowed header
    with pytest.raises(DECODE_ERRORS, match="truncated"):
      jax.block_until_ready(zj.decode(payload, shape=x.shape, dtype=BF16))
  payload, nbytes = zj.encode(x, capacity=need)                    # exactly enough
  assert int(nbytes) == need
  assert same_bits(zj.decode(payload, shape=x.shape, dtype=BF16), x)
  payload, nbytes = zj.encode(x, capacity=32)                      # header only
  assert int(nbytes) == need and int(codec.frame_bytes_of(payload)) == need
  with pytest.raises(ValueError, match="capacity"):
    zj.encode(x, capacity=31)
  # batched: rows that fit decode, the row that overflowed reports its size
  xs = np.stack([np.zeros(4000, BF16), x])
  P, N = codec.encode_frames(xs, capacity=200)
  assert int(N[0]) == 44 and int(N[1]) == need
  assert np.array_equal(np.asarray(codec.frame_bytes_of(P)), np.asarray(N))
  assert same_bits(zj.decode(P[0], shape=(4000,), dtype=BF16), xs[0])


def test_frame_bytes_of_saturates():
  hdr = np.zeros((3, 40), np.uint8)
  hdr[0, 16:24] = np.frombuffer(struct.pack("<Q", 4026), np.uint8)
  hdr[1, 16:24] = np.frombuffer(struct.pack("<Q", 1 << 31), np.uint8)
  hdr[2, 16:24] = np.frombuffer(struct.pack("<Q", 1 << 40), np.uint8)
  got = np.asarray(codec.frame_bytes_of(hdr))
  assert got.dtype == np.int32 and got.tolist() == [4026, 2**31 - 1, 2**31 - 1]


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("dtype", [
    np.int32, np.int8, np.uint16, np.bool_, np.complex64, np.float64,
])
def test_unsupported_dtype(dtype):
  with pytest.raises(TypeError, match="bfloat16, float16, float32"):
    zj.encode(np.zeros(4, dtype))
  with pytest.raises(TypeError, match="bfloat16, float16, float32"):
    codec.encode_frames(np.zeros((2, 4), dtype))
  payload, _ = zj.encode(np.zeros(4, BF16))
  with pytest.raises(TypeError, match="bfloat16, float16, float32"):
    zj.decode(payload, shape=(4,), dtype=dtype)
  with pytest.raises(TypeError, match="bfloat16, float16, float32"):
    zj.max_encoded_bytes(4, dtype)


@pytest.fixture(scope="module")
def frame_bf16():
  x = normal(3000, BF16, seed=21)
  p, n = zj.encode(x)
  return x, np.asarray(p)[:int(n)].copy()


def test_decode_wrong_shape_or_dtype(frame_bf16):
  x, frame = frame_bf16
  with pytest.raises(DECODE_ERRORS, match="element count"):
    jax.block_until_ready(zj.decode(frame, shape=(2999,), dtype=BF16))
  with pytest.raises(DECODE_ERRORS, match="element count"):
    jax.block_until_ready(zj.decode(frame, shape=(3001,), dtype=BF16))
  for dt in (F16, F32):
    with pytest.raises(DECODE_ERRORS, match="dtype"):
      jax.block_until_ready(zj.decode(frame, shape=x.shape, dtype=dt))
  assert same_bits(zj.decode(frame, shape=(1000, 3), dtype=BF16), x.reshape(1000, 3))
  with pytest.raises(TypeError, match="uint8"):
    zj.decode(frame.view(np.int8), shape=x.shape, dtype=BF16)
  with pytest.raises(ValueError, match="1-D"):
    zj.decode(frame[None], shape=x.shape, dtype=BF16)
  with pytest.raises(ValueError, match="non-negative"):
    zj.decode(frame, shape=(-1,), dtype=BF16)


def _mutated(frame, offset, value=None, xor=None):
  b = np.array(frame, np.uint8)
  if xor is not None:
    b[offset] ^= xor
  else:
    b[offset] = value
  return b


BAD_HEADERS = [
    ("magic", dict(offset=0, xor=0x01), "magic"),
    ("magic_last", dict(offset=3, value=0), "magic"),
    ("version_0", dict(offset=4, value=0), "version"),
    ("version_1", dict(offset=4, value=1), "another format version .this build reads version 2"),
    ("version_3", dict(offset=4, value=3), "version"),
    ("dtype_invalid", dict(offset=5, value=7), "dtype"),
    ("dtype_other", dict(offset=5, value=fmt.DTYPE_F16), "dtype"),
    ("frame_flag_bit1", dict(offset=6, value=0x02), "reserved"),
    ("frame_flag_bit7", dict(offset=6, value=0x80), "reserved"),
    ("block_log2", dict(offset=7, value=15), "block size"),
    ("reserved_field", dict(offset=25, value=1), "reserved"),
    ("checksum_without_flag", dict(offset=30, value=5), "reserved|checksum"),
    ("n_elems", dict(offset=8, xor=0x01), "element count"),
    ("frame_bytes_smaller", dict(offset=16, xor=0x01), "frame size|directory|truncated"),
]


@pytest.mark.parametrize("case", BAD_HEADERS, ids=[c[0] for c in BAD_HEADERS])
def test_bad_header(frame_bf16, case):
  x, frame = frame_bf16
  _, mut, msg = case
  with pytest.raises(DECODE_ERRORS, match=msg):
    jax.block_until_ready(zj.decode(_mutated(frame, **mut), shape=x.shape, dtype=BF16))


def test_bad_blocks_raise(frame_bf16):
  x, frame = frame_bf16
  blk = 32 + 4                                         # the one block's header
  cases = [
      (dict(offset=blk, value=3), "block mode"),        # unknown mode
      (dict(offset=blk + 1, value=0x01), "flag|reserved"),  # LOW16 on a bfloat16 block
      (dict(offset=blk + 1, value=0x80), "flag|reserved"),  # reserved block flag
      (dict(offset=blk + 2, value=1), "reserved"),      # reserved block field
      (dict(offset=blk + 4, value=1), "reserved"),      # HUFF value field
      (dict(offset=blk + 8, value=255), "table"),       # lo > hi
  ]
  for mut, msg in cases:
    with pytest.raises(DECODE_ERRORS, match=msg):
      jax.block_until_ready(zj.decode(_mutated(frame, **mut), shape=x.shape, dtype=BF16))


def test_corruption_never_crashes(frame_bf16):
  """Random byte damage either decodes (raw bytes carry no redundancy) or raises."""
  x, frame = frame_bf16
  rng = np.random.default_rng(22)
  payload = np.zeros(zj.max_encoded_bytes(x.size, BF16), np.uint8)
  dec = jax.jit(lambda p: zj.decode(p, shape=x.shape, dtype=BF16))
  raised = 0
  for _ in range(60):
    bad = frame.copy()
    pos = rng.integers(0, bad.size, size=rng.integers(1, 4))
    bad[pos] ^= rng.integers(1, 256, size=pos.size).astype(np.uint8)
    payload[:] = 0
    payload[:bad.size] = bad
    try:
      jax.block_until_ready(dec(payload))
    except DECODE_ERRORS as e:
      assert "zipccl decode" in str(e)
      raised += 1
  assert raised > 0


# --------------------------------------------------------------------------- skip

def _skip_rows(dtype, frames=5, n=3000, seed=40):
  """Rows of different kinds (Gaussian, zeros, random bits), so frames differ in size and mode."""
  rows = [normal(n, dtype, seed=seed + f) for f in range(frames)]
  rows[1 % frames] = np.zeros(n, dtype)
  if frames > 2:
    w = {2: np.uint16, 4: np.uint32}[np.dtype(dtype).itemsize]
    rows[2] = np.random.default_rng(seed).integers(0, np.iinfo(w).max, n, w).view(dtype)
  return np.stack(rows)


SKIP_PATTERNS = {
    "none": [False] * 5,
    "self": [False, False, True, False, False],
    "alternate": [True, False, True, False, True],
    "all": [True] * 5,
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("pattern", sorted(SKIP_PATTERNS))
@pytest.mark.parametrize("checksum", [False, True], ids=["plain", "checksum"])
def test_encode_frames_skip(dtype, pattern, checksum):
  xs = _skip_rows(dtype)
  skip = np.array(SKIP_PATTERNS[pattern])
  P0, N0 = (np.asarray(a) for a in codec.encode_frames(xs, checksum=checksum))
  P, N = (np.asarray(a) for a in codec.encode_frames(xs, checksum=checksum, skip=skip))
  assert P.shape == P0.shape and N.dtype == N0.dtype and N.shape == N0.shape
  assert np.array_equal(N, np.where(skip, 0, N0))
  assert not P[skip].any()                                   # skipped: all-zero rows
  assert np.array_equal(P[~skip], P0[~skip])                 # others: byte-identical rows
  # decode with the same mask: zeros where skipped, the original bits elsewhere
  Y = np.asarray(codec.decode_frames(P, shape=(3000,), dtype=dtype, skip=skip))
  assert not bits(Y[skip]).any()
  assert same_bits(Y[~skip], xs[~skip])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("garbage", ["zeros", "poison", "random", "other_frame"])
def test_decode_frames_skip_ignores_garbage(dtype, garbage):
  xs = _skip_rows(dtype, seed=50)
  P0 = np.asarray(codec.encode_frames(xs, checksum=True)[0])
  skip = np.array([True, False, False, True, False])
  P = P0.copy()
  if garbage == "zeros":
    P[skip] = 0
  elif garbage == "poison":                                   # the collectives' overflow marker
    P[skip] = 0xFF
  elif garbage == "random":
    P[skip] = np.random.default_rng(1).integers(0, 256, P[skip].shape, np.uint8)
  else:                                                       # a valid frame of another shape
    other = np.asarray(zj.encode(normal(77, F16, seed=2))[0])
    P[skip] = 0
    P[skip, :other.size] = other
  Y = np.asarray(codec.decode_frames(P, shape=(3000,), dtype=dtype, skip=skip))
  Y0 = np.asarray(codec.decode_frames(P0, shape=(3000,), dtype=dtype))
  assert Y.dtype == Y0.dtype and Y.shape == Y0.shape
  assert not bits(Y[skip]).any()
  assert np.array_equal(bits(Y[~skip]), bits(Y0[~skip]))
  assert same_bits(Y[~skip], xs[~skip])
  # without the mask the same payload is rejected (the skipped rows are not frames)
  if garbage != "other_frame":
    with pytest.raises(DECODE_ERRORS, match=r"zipccl decode \(frame 0"):
      jax.block_until_ready(codec.decode_frames(P, shape=(3000,), dtype=dtype))


def test_decode_frames_skip_still_checks_other_frames():
  xs = _skip_rows(BF16, seed=60)
  P = np.asarray(codec.encode_frames(xs)[0]).copy()
  P[0] = 0xFF                                                # skipped
  P[3, 0] ^= 1                                               # not skipped: bad magic
  skip = np.array([True, False, False, False, False])
  with pytest.raises(DECODE_ERRORS, match=r"zipccl decode \(frame 3\): bad magic"):
    jax.block_until_ready(codec.decode_frames(P, shape=(3000,), dtype=BF16, skip=skip))


def test_skip_overflow_and_capacity():
  # capacity too small for the random row (2): with it skipped nothing overflows
  xs = _skip_rows(BF16, seed=70)
  P0, N0 = (np.asarray(a) for a in codec.encode_frames(xs, capacity=5000))
  assert N0[2] > 5000 and (N0[[0, 1, 3, 4]] <= 5000).all()
  skip = np.array([False, False, True, False, False])
  P, N = (np.asarray(a) for a in codec.encode_frames(xs, capacity=5000, skip=skip))
  assert N[2] == 0 and not P[2].any() and (N <= 5000).all()
  assert np.array_equal(P[~skip], P0[~skip]) and np.array_equal(N[~skip], N0[~skip])
  # an overflowed, not skipped, row still gets its header-only frame
  skip = np.array([True, False, False, False, False])
  P, N = (np.asarray(a) for a in codec.encode_frames(xs, capacity=5000, skip=skip))
  assert N[2] == N0[2] and np.array_equal(P[2], P0[2]) and not P[0].any()


def test_skip_empty_and_zero_frames():
  x = np.zeros((3, 0), F32)
  P, N = (np.asarray(a) for a in codec.encode_frames(x, skip=np.array([True, False, True])))
  assert N.tolist() == [0, 32, 0] and not P[[0, 2]].any()
  Y = codec.decode_frames(P, shape=(0,), dtype=F32, skip=np.array([True, False, True]))
  assert Y.shape == (3, 0)
  P, N = codec.encode_frames(np.zeros((0, 10), BF16), skip=np.zeros((0,), bool))
  assert P.shape[0] == 0 and N.shape == (0,)
  Y = codec.decode_frames(np.zeros((0, 40), np.uint8), shape=(10,), dtype=BF16,
                          skip=np.zeros((0,), bool))
  assert Y.shape == (0, 10)


def test_skip_multidimensional_rows_and_x64():
  xs = _skip_rows(F16, frames=4, n=600, seed=80).reshape(4, 20, 30)
  skip = np.array([False, True, True, False])
  P0, N0 = (np.asarray(a) for a in codec.encode_frames(xs))
  with jax.enable_x64(True):
    P, N = codec.encode_frames(xs, skip=skip)
    assert N.dtype == jnp.int64
    P, N = np.asarray(P), np.asarray(N)
    Y = np.asarray(codec.decode_frames(P, shape=(20, 30), dtype=F16, skip=skip))
  assert N.tolist() == [int(N0[0]), 0, 0, int(N0[3])]
  assert np.array_equal(P[~skip], P0[~skip]) and not P[skip].any()
  assert same_bits(Y[~skip], xs[~skip]) and not bits(Y[skip]).any()


def test_skip_under_jit_is_traced():
  xs = _skip_rows(BF16, seed=90)
  P0, N0 = (np.asarray(a) for a in codec.encode_frames(xs))
  traces = []

  @jax.jit
  def roundtrip(x, skip):
    traces.append(1)
    p, n = codec.encode_frames(x, skip=skip)
    return p, n, codec.decode_frames(p, shape=(3000,), dtype=BF16, skip=skip)

  for pattern in SKIP_PATTERNS.values():
    skip = np.array(pattern)
    P, N, Y = (np.asarray(a) for a in roundtrip(xs, skip))
    assert np.array_equal(N, np.where(skip, 0, N0))
    assert np.array_equal(P[~skip], P0[~skip]) and not P[skip].any()
    assert same_bits(Y[~skip], xs[~skip]) and not bits(Y[skip]).any()
  assert len(traces) == 1                                   # one trace for every mask
  # the self-chunk mask the collectives build, computed inside jit
  me = 3
  P, N, Y = (np.asarray(a) for a in jax.jit(
      lambda x: roundtrip.__wrapped__(x, jnp.arange(5) == me))(xs))
  assert N[me] == 0 and np.array_equal(np.delete(N, me), np.delete(N0, me))


def test_skip_none_keeps_the_custom_call_unchanged():
  x = jnp.zeros((4, 700), jnp.bfloat16)
  plain = jax.jit(lambda x: codec.encode_frames(x)).lower(x).as_text()
  skipped = jax.jit(lambda x, s: codec.encode_frames(x, skip=s)).lower(
      x, jnp.zeros(4, bool)).as_text()
  call = [l for l in skipped.splitlines() if "@zipccl_encode" in l][0]
  assert "tensor<4xi1>" in call and "tensor<4x700xbf16>" in call
  call = [l for l in plain.splitlines() if "@zipccl_encode" in l][0]
  assert "i1>" not in call


@pytest.mark.parametrize("batched", ["x_and_skip", "x_only", "skip_only"])
def test_skip_vmap(batched):
  B, F, n = 3, 4, 1500
  xs = np.stack([_skip_rows(BF16, frames=F, n=n, seed=100 + 10 * b) for b in range(B)])
  masks = np.array([[True, False, False, False], [False, True, True, False],
                    [False, False, False, False]])
  if batched == "x_and_skip":
    enc = jax.vmap(lambda x, s: codec.encode_frames(x, skip=s))
    dec = jax.vmap(lambda p, s: codec.decode_frames(p, shape=(n,), dtype=BF16, skip=s))
    P, N = enc(xs, masks)
    Y = dec(P, masks)
    want_x, want_skip = xs, masks
  elif batched == "x_only":
    mask = masks[1]
    enc = jax.vmap(lambda x: codec.encode_frames(x, skip=mask))
    dec = jax.vmap(lambda p: codec.decode_frames(p, shape=(n,), dtype=BF16, skip=mask))
    P, N = enc(xs)
    Y = dec(P)
    want_x, want_skip = xs, np.broadcast_to(mask, (B, F))
  else:
    x = xs[0]
    enc = jax.vmap(lambda s: codec.encode_frames(x, skip=s))
    P, N = enc(masks)
    p_full = codec.encode_frames(x)[0]
    Y = jax.vmap(lambda s: codec.decode_frames(p_full, shape=(n,), dtype=BF16, skip=s))(masks)
    want_x, want_skip = np.broadcast_to(x, (B, F, n)), masks
  P, N, Y = np.asarray(P), np.asarray(N), np.asarray(Y)
  assert P.shape[:2] == (B, F) and N.shape == (B, F) and Y.shape == (B, F, n)
  for b in range(B):
    P0, N0 = (np.asarray(a) for a in codec.encode_frames(want_x[b]))
    s = want_skip[b]
    assert np.array_equal(N[b], np.where(s, 0, N0)), b
    assert np.array_equal(P[b][~s], P0[~s]) and not P[b][s].any()
    assert same_bits(Y[b][~s], want_x[b][~s]) and not bits(Y[b][s]).any()


def test_skip_nested_vmap():
  xs = _skip_rows(F32, frames=8, n=800, seed=120).reshape(2, 2, 2, 800)
  masks = np.array([[[True, False], [False, False]], [[False, True], [True, True]]])
  f = jax.vmap(jax.vmap(lambda x, s: codec.encode_frames(x, skip=s)))
  P, N = (np.asarray(a) for a in f(xs, masks))
  P0, N0 = (np.asarray(a) for a in codec.encode_frames(xs.reshape(8, 800)))
  P, N, m = P.reshape(8, -1), N.reshape(8), masks.reshape(8)
  assert np.array_equal(N, np.where(m, 0, N0))
  assert np.array_equal(P[~m], P0[~m]) and not P[m].any()


@pytest.mark.parametrize("spec", ["sharded", "replicated"])
def test_skip_shard_map_self_chunk(spec):
  """The collectives' use: skip = (arange(n) == axis_index); with replicated data the
  mask is what varies, so the results must be typed per-device too."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  mesh = _mesh8()
  F, n = 8, 500
  host = _skip_rows(BF16, frames=F, n=n, seed=130)
  in_spec = P("d") if spec == "sharded" else P()
  x = jax.device_put(np.concatenate([host] * 8) if spec == "sharded" else host,
                     NamedSharding(mesh, in_spec))

  def body(a):
    me = jax.lax.axis_index("d")
    skip = jnp.arange(F) == me
    p, nb = codec.encode_frames(a, skip=skip)
    y = codec.decode_frames(p, shape=(n,), dtype=BF16, skip=skip)
    return p[None], nb[None], y[None]

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_spec, out_specs=(P("d"),) * 3))
  Ps, Ns, Ys = (np.asarray(a) for a in f(x))
  P0, N0 = (np.asarray(a) for a in codec.encode_frames(host))
  for d in range(8):
    s = np.arange(F) == d
    assert np.array_equal(Ns[d], np.where(s, 0, N0)), d
    assert np.array_equal(Ps[d][~s], P0[~s]) and not Ps[d][s].any()
    assert same_bits(Ys[d][~s], host[~s]) and not bits(Ys[d][s]).any()
  if spec == "replicated":  # the results vary with the mask: a replicated output is refused
    g = jax.shard_map(lambda a: codec.encode_frames(a, skip=jnp.arange(F) == jax.lax.axis_index("d"))[1],
                      mesh=mesh, in_specs=in_spec, out_specs=P())
    with pytest.raises(ValueError, match="out_specs"):
      jax.jit(g)(x)


def test_skip_bad_arguments():
  x = np.zeros((4, 100), BF16)
  p = np.asarray(codec.encode_frames(x)[0])
  with pytest.raises(ValueError, match=r"encode_frames skip must have shape x.shape\[:1\] = \(4,\).*got \(3,\)"):
    codec.encode_frames(x, skip=np.zeros(3, bool))
  with pytest.raises(ValueError, match=r"encode_frames skip must have shape .*got \(4, 1\)"):
    codec.encode_frames(x, skip=np.zeros((4, 1), bool))
  with pytest.raises(ValueError, match=r"encode_frames skip must have shape .*got \(\)"):
    codec.encode_frames(x, skip=True)
  with pytest.raises(TypeError, match=r"encode_frames skip must be a bool array.*got dtype uint8"):
    codec.encode_frames(x, skip=np.zeros(4, np.uint8))
  with pytest.raises(TypeError, match=r"encode_frames skip must be a bool array.*got dtype int32"):
    codec.encode_frames(x, skip=jnp.arange(4, dtype=jnp.int32))
  codec.encode_frames(x, skip=[True, False, False, True])  # a list of bools is a bool array
  with pytest.raises(ValueError, match=r"decode_frames skip must have shape payload.shape\[:-1\] = \(4,\).*got \(5,\)"):
    codec.decode_frames(p, shape=(100,), dtype=BF16, skip=np.zeros(5, bool))
  with pytest.raises(TypeError, match=r"decode_frames skip must be a bool array.*got dtype float32"):
    codec.decode_frames(p, shape=(100,), dtype=BF16, skip=np.zeros(4, np.float32))
  # traced, under jit and vmap: the same trace-time errors
  with pytest.raises(ValueError, match="encode_frames skip must have shape"):
    jax.jit(lambda x, s: codec.encode_frames(x, skip=s))(x, np.zeros(2, bool))
  with pytest.raises(ValueError, match="decode_frames skip must have shape"):
    jax.vmap(lambda p, s: codec.decode_frames(p, shape=(100,), dtype=BF16, skip=s))(
        p[None], np.zeros((1, 3), bool))


def test_skip_ffi_operand_checks():
  """The handlers' own checks (the wrappers never produce these): shape, dtype, arity."""
  from zipccl_jax import _ffi
  _ffi.register()
  x = jnp.zeros((2, 3, 100), jnp.bfloat16)
  cap = zj.max_encoded_bytes(100, BF16)
  enc = jax.ffi.ffi_call(_ffi.ENCODE_TARGET, (jax.ShapeDtypeStruct((2, 3, cap), jnp.uint8),
                                              jax.ShapeDtypeStruct((2, 3), jnp.int32)))
  with pytest.raises(DECODE_ERRORS, match=r"zipccl encode: operand skip must have shape \[2,3\] "
                                          r"\(one flag per frame: the shape of nbytes\), got \[6\]"):
    jax.block_until_ready(enc(x, jnp.zeros(6, bool), checksum=False))
  with pytest.raises(DECODE_ERRORS, match=r"zipccl encode: operand skip must be bool \(PRED\) or uint8"):
    jax.block_until_ready(enc(x, jnp.zeros((2, 3), jnp.int32), checksum=False))
  p, n = enc(x, jnp.array([[1, 0, 0], [0, 0, 1]], jnp.uint8), checksum=False)  # uint8 flags work
  assert np.asarray(n).tolist() == [[0, 44, 44], [44, 44, 0]]
  dec = jax.ffi.ffi_call(_ffi.DECODE_TARGET, jax.ShapeDtypeStruct((2, 3, 100), jnp.bfloat16))
  with pytest.raises(DECODE_ERRORS, match=r"zipccl decode: operand skip must have shape \[2,3\] "
                                          r"\(one flag per frame: the leading dims of payload, "
                                          r"without the capacity dim\), got \[2,3,1\]"):
    jax.block_until_ready(dec(p, jnp.zeros((2, 3, 1), bool)))
  with pytest.raises(DECODE_ERRORS, match=r"at most one operand after the required ones \(skip\), got 2"):
    jax.block_until_ready(dec(p, jnp.zeros((2, 3), bool), jnp.zeros((2, 3), bool)))
  y = dec(p, jnp.array([[True, False, False], [False, False, True]]))
  assert not np.asarray(y).view(np.uint16).any()


# --------------------------------------------------------------------------- status result

def _fill_bits(dtype):
  return codec.REJECTED_FILL_BITS[np.dtype(dtype)]


def _raised_reason(row, shape, dtype):
  """The raising path's verdict on one payload row: None (decodes) or the error message."""
  try:
    jax.block_until_ready(zj.decode(row, shape=shape, dtype=dtype))
  except DECODE_ERRORS as e:
    return str(e)
  return None


def test_status_messages_cover_format_h():
  msgs = codec.status_messages()
  assert msgs[codec.STATUS_OK] == "ok" and sorted(msgs) == list(range(len(msgs)))
  assert msgs[1].startswith("payload is truncated") and msgs[2].startswith("bad magic")
  assert codec.status_message(9).startswith("checksum mismatch")
  assert codec.status_message(999) == "unknown error"
  host = getattr(_ffi_ext(), "cuda_host", None)
  if host is not None:
    assert all(host.status_message(c) == m for c, m in msgs.items())


def _ffi_ext():
  from zipccl_jax import _ffi
  return _ffi.extension()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_decode_frames_status_good_frames(dtype):
  xs = _skip_rows(dtype, seed=140)
  P = codec.encode_frames(xs, checksum=True)[0]
  Y, S = codec.decode_frames(P, shape=(3000,), dtype=dtype, return_status=True)
  Y, S = np.asarray(Y), np.asarray(S)
  assert S.dtype == np.int32 and S.shape == (5,) and not S.any()
  assert same_bits(Y, xs)
  assert same_bits(Y, codec.decode_frames(P, shape=(3000,), dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_decode_frames_status_bad_frames(dtype):
  """Rejected rows: their status code and an all-NaN row; the other rows stay exact."""
  xs = _skip_rows(dtype, frames=6, seed=150)
  P = np.asarray(codec.encode_frames(xs, checksum=True)[0]).copy()
  cap = P.shape[1]
  P[1, 0] ^= 1                                                 # bad magic
  P[2, 16:24] = np.frombuffer(np.uint64(cap + 1).tobytes(), np.uint8)  # longer than the row
  P[4, 200] ^= 0x10                                            # damage inside the frame
  P[5, 5] = 7                                                  # invalid dtype byte
  Y, S = codec.decode_frames(P, shape=(3000,), dtype=dtype, return_status=True)
  Y, S = np.asarray(Y), np.asarray(S)
  msgs = codec.status_messages()
  assert S[0] == 0 and S[3] == 0
  assert msgs[int(S[1])].startswith("bad magic")
  assert msgs[int(S[2])].startswith("payload is truncated")
  assert msgs[int(S[5])].startswith("frame dtype")
  bad = np.array([False, True, True, False, True, True])
  assert S[4] != 0
  for f in np.flatnonzero(bad):                                 # the codes the raising path names
    reason = _raised_reason(P[f], (3000,), dtype)
    assert reason is not None and reason.endswith(msgs[int(S[f])]), (f, reason, int(S[f]))
  assert np.array_equal(bits(Y[bad]), np.full((bad.sum(), 3000), _fill_bits(dtype), bits(Y).dtype))
  assert same_bits(Y[~bad], xs[~bad])
  # without return_status the same payload raises, naming the first bad frame
  with pytest.raises(DECODE_ERRORS, match=r"zipccl decode \(frame 1\): bad magic"):
    jax.block_until_ready(codec.decode_frames(P, shape=(3000,), dtype=dtype))


def test_decode_status_single_frame(frame_bf16):
  x, frame = frame_bf16
  y, s = zj.decode(frame, shape=x.shape, dtype=BF16, return_status=True)
  assert np.asarray(s).shape == () and int(s) == 0 and same_bits(y, x)
  for cut in (0, 31, 32, frame.size - 1):                      # truncated
    y, s = zj.decode(frame[:cut], shape=x.shape, dtype=BF16, return_status=True)
    assert codec.status_message(s).startswith("payload is truncated"), cut
    assert np.array_equal(bits(y), np.full(x.shape, 0x7FC0, np.uint16))
  y, s = zj.decode(frame, shape=(2999,), dtype=BF16, return_status=True)   # wrong shape
  assert codec.status_message(s).startswith("frame element count")
  assert y.shape == (2999,) and (bits(y) == 0x7FC0).all()
  for case in BAD_HEADERS:                                      # as the raising path
    _, mut, msg = case
    y, s = zj.decode(_mutated(frame, **mut), shape=x.shape, dtype=BF16, return_status=True)
    assert int(s) != 0 and re.search(msg, codec.status_message(s)), case[0]
    assert (bits(y) == 0x7FC0).all()


def test_decode_frames_status_with_skip():
  xs = _skip_rows(F16, seed=160)
  P = np.asarray(codec.encode_frames(xs)[0]).copy()
  P[0] = 0xFF                                                  # skipped: not read
  P[2, 0] ^= 1                                                 # not skipped: bad magic
  P[4] = 0                                                     # skipped
  skip = np.array([True, False, False, False, True])
  Y, S = codec.decode_frames(P, shape=(3000,), dtype=F16, skip=skip, return_status=True)
  Y, S = np.asarray(Y), np.asarray(S)
  assert S.tolist() == [0, 0, 2, 0, 0]
  assert not bits(Y[skip]).any()
  assert (bits(Y[2]) == 0x7E00).all()
  assert same_bits(Y[[1, 3]], xs[[1, 3]])
  with pytest.raises(DECODE_ERRORS, match=r"zipccl decode \(frame 2\): bad magic"):
    jax.block_until_ready(codec.decode_frames(P, shape=(3000,), dtype=F16, skip=skip))


def test_decode_frames_status_empty_and_zero_frames():
  P = np.asarray(codec.encode_frames(np.zeros((3, 0), F32))[0]).copy()
  P[1, 0] ^= 1
  Y, S = codec.decode_frames(P, shape=(0,), dtype=F32, return_status=True)
  assert Y.shape == (3, 0) and np.asarray(S).tolist() == [0, 2, 0]
  Y, S = codec.decode_frames(np.zeros((0, 40), np.uint8), shape=(10,), dtype=BF16,
                             return_status=True)
  assert Y.shape == (0, 10) and S.shape == (0,) and S.dtype == jnp.int32


def test_decode_frames_status_jit_and_vmap():
  B, F, n = 3, 4, 1500
  xs = np.stack([_skip_rows(BF16, frames=F, n=n, seed=170 + 10 * b) for b in range(B)])
  P = np.stack([np.asarray(codec.encode_frames(xs[b])[0]) for b in range(B)])
  P[0, 1, 0] ^= 1                                              # bad magic
  P[2, 3, 4] = 9                                               # bad version
  skips = np.zeros((B, F), bool)
  skips[1, 2] = True
  P[1, 2] = 0xFF
  bad = np.zeros((B, F), bool)
  bad[0, 1] = bad[2, 3] = True
  dec = jax.jit(lambda p, s: codec.decode_frames(p, shape=(n,), dtype=BF16, skip=s,
                                                  return_status=True))
  for b in range(B):                                           # jit, one trace
    Y, S = (np.asarray(a) for a in dec(P[b], skips[b]))
    assert np.array_equal(S != 0, bad[b]), b
    assert same_bits(Y[~bad[b] & ~skips[b]], xs[b][~bad[b] & ~skips[b]])
  vdec = jax.jit(jax.vmap(lambda p, s: codec.decode_frames(p, shape=(n,), dtype=BF16, skip=s,
                                                            return_status=True)))
  Y, S = (np.asarray(a) for a in vdec(P, skips))
  assert Y.shape == (B, F, n) and S.shape == (B, F) and S.dtype == np.int32
  msgs = codec.status_messages()
  assert msgs[int(S[0, 1])].startswith("bad magic")
  assert msgs[int(S[2, 3])].startswith("frame of another format version")
  assert np.array_equal(S != 0, bad)
  ok = ~bad & ~skips
  assert same_bits(Y[ok], xs[ok])
  assert (bits(Y[bad]) == 0x7FC0).all() and not bits(Y[skips]).any()
  # vmap without skip, over the single-frame API
  Y1, S1 = (np.asarray(a) for a in jax.vmap(
      lambda p: zj.decode(p, shape=(n,), dtype=BF16, return_status=True))(P[0]))
  assert np.array_equal(S1, S[0]) and same_bits(Y1[[0, 2, 3]], xs[0][[0, 2, 3]])


def test_decode_frames_status_shard_map():
  from jax.sharding import NamedSharding, PartitionSpec as P
  mesh = _mesh8()
  F, n = 8, 500
  host = _skip_rows(BF16, frames=F, n=n, seed=180)
  payload = np.asarray(codec.encode_frames(host)[0])
  payloads = np.stack([payload] * 8)
  for d in range(8):
    payloads[d, d, 0] ^= 1                                     # device d: its frame d is bad
  x = jax.device_put(payloads.reshape(8 * F, -1), NamedSharding(mesh, P("d")))

  def body(p):
    me = jax.lax.axis_index("d")
    skip = jnp.arange(F) == (me + 1) % F
    y, s = codec.decode_frames(p, shape=(n,), dtype=BF16, skip=skip, return_status=True)
    return y[None], s[None]

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=(P("d"),) * 2))
  Ys, Ss = (np.asarray(a) for a in f(x))
  for d in range(8):
    want = np.zeros(F, np.int32)
    want[d] = 2
    assert np.array_equal(Ss[d], want), d
    sk = np.arange(F) == (d + 1) % F
    ok = (np.arange(F) != d) & ~sk
    assert same_bits(Ys[d][ok], host[ok]) and not bits(Ys[d][sk]).any()
    assert (bits(Ys[d][d]) == 0x7FC0).all()


def test_status_agrees_with_raising_path_under_random_damage(frame_bf16):
  """Random damage: status 0 exactly where the raising decode succeeds, with the same output."""
  x, frame = frame_bf16
  rng = np.random.default_rng(23)
  cap = zj.max_encoded_bytes(x.size, BF16)
  rows = []
  for _ in range(24):
    bad = frame.copy()
    pos = rng.integers(0, bad.size, size=rng.integers(1, 4))
    bad[pos] ^= rng.integers(1, 256, size=pos.size).astype(np.uint8)
    row = np.zeros(cap, np.uint8)
    row[:bad.size] = bad
    rows.append(row)
  P = np.stack(rows)
  Y, S = (np.asarray(a) for a in codec.decode_frames(P, shape=x.shape, dtype=BF16,
                                                      return_status=True))
  msgs = codec.status_messages()
  for f, row in enumerate(rows):
    reason = _raised_reason(row, x.shape, BF16)
    if reason is None:
      assert S[f] == 0, f
      assert np.array_equal(bits(Y[f]), bits(zj.decode(row, shape=x.shape, dtype=BF16)))
    else:
      assert S[f] != 0 and reason.endswith(msgs[int(S[f])]), (f, reason, int(S[f]))
      assert (bits(Y[f]) == 0x7FC0).all()
  assert (S != 0).any()


def test_status_ffi_result_checks():
  """The handler's own checks on the status result (the wrapper never produces these)."""
  from zipccl_jax import _ffi
  _ffi.register()
  p = codec.encode_frames(jnp.zeros((2, 3, 100), jnp.bfloat16).reshape(6, 100))[0].reshape(2, 3, -1)
  out = jax.ShapeDtypeStruct((2, 3, 100), jnp.bfloat16)
  cases = [
      ((out, jax.ShapeDtypeStruct((6,), jnp.uint32)), "the status result must be int32"),
      ((out, jax.ShapeDtypeStruct((5,), jnp.int32)), "one int32 per frame"),
      ((out, jax.ShapeDtypeStruct((6,), jnp.int32), jax.ShapeDtypeStruct((6,), jnp.int32)),
       r"at most one extra result \(status\)"),
  ]
  for results, msg in cases:
    with pytest.raises(DECODE_ERRORS, match=msg):
      jax.block_until_ready(jax.ffi.ffi_call(_ffi.DECODE_TARGET, results)(p))
  y, s = jax.ffi.ffi_call(_ffi.DECODE_TARGET, (out, jax.ShapeDtypeStruct((2, 3), jnp.int32)))(p)
  assert not np.asarray(s).any() and not bits(y).any()
