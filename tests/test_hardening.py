"""Hardening of the codec against malformed payloads (FORMAT.md, "Decoder compliance").

Through both entry points, the host one (`zipccl_jax._zipccl.decode_host`, ValueError) and the FFI one
(`zipccl_jax.decode`, JaxRuntimeError INVALID_ARGUMENT):
  - truncation at many cut points, with the payload flush against an unmapped guard page (a read past the end
    would crash the checking subprocess), and overflowed frames from a too-small encode capacity;
  - every single-bit flip of the header, block directory, block headers and segment directories is rejected
    (no checksum needed); flips in code tables and units are rejected or decode, never crash; a flip in
    the raw bytes changes exactly one element by one bit (the documented limit without the checksum);
  - wrong dtype or shape, bad magic, version, dtype code, block size, each reserved field and bit;
  - sizes beyond the capacity or the format's bounds (frame_bytes, directory entries, 2^64 - 1 poison);
  - checksum on: XXH32 seed 0 as FORMAT.md says, and every single-bit flip at >= 200 byte positions spread over
    header, directory, block headers, code tables, segment directories, units, raw regions, RAW bodies and
    CONST values is detected;
  - the fuzzers' seeds and regression inputs (tests/fuzz/) replayed through the Python extension;
  - concurrency: 8 virtual devices encoding and decoding at once inside shard_map, Python threads calling
    encode_host/decode_host and the jitted decode at once; the codec object holds no writable globals.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import zipccl_jax
from zipccl_jax import _zipccl as ext
from zipccl_jax import codec
from zipccl_jax import format as fmt
from zipccl_jax import reference as ref

ROOT = Path(__file__).resolve().parents[1]
FUZZ = ROOT / "tests" / "fuzz"
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
CODE = dict(fmt.DTYPE_CODES)  # every coded dtype, the one-byte floats included
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}
JaxRuntimeError = jax.errors.JaxRuntimeError


# ------------------------------------------------------------------------------------------------- helpers

def bits_of(a):
  a = np.asarray(a)
  return a.view(UINT[a.dtype.itemsize])


def encode_host(x, checksum=False, capacity=None):
  """Frame of x as a uint8 array cut to its exact size (or the whole payload on overflow), and the size."""
  x = np.ascontiguousarray(x)
  code = CODE[x.dtype]
  cap = ext.max_encoded_bytes(x.size, code) if capacity is None else capacity
  out = np.zeros(cap, np.uint8)
  need = ext.encode_host(x.view(np.uint8).reshape(-1), x.size, code, checksum, out)
  return (out[:need] if need <= cap else out), need


def decode_host(frame, dtype, n):
  dtype = np.dtype(dtype)
  out = np.empty(n * dtype.itemsize, np.uint8)
  ext.decode_host(np.ascontiguousarray(frame, np.uint8), CODE[dtype], n, out)
  return out.view(dtype)


def reject_reason(frame, dtype, n):
  """None if the frame decodes, else the ValueError message."""
  try:
    decode_host(frame, dtype, n)
    return None
  except ValueError as e:
    return str(e)


def gaussian(n, dtype, seed, zeros=0.0, scale=1.0):
  rng = np.random.default_rng(seed)
  v = (rng.standard_normal(n) * scale).astype(np.float32)
  if zeros:
    v[rng.random(n) < zeros] = 0
  return v.astype(dtype)


def random_bits(n, dtype, seed):
  dtype = np.dtype(dtype)
  rng = np.random.default_rng(seed)
  return rng.integers(0, 1 << (8 * dtype.itemsize), n, dtype=np.uint64).astype(
      UINT[dtype.itemsize]).view(dtype)


def u32(f, off):
  return int.from_bytes(bytes(f[off:off + 4]), "little")


def u64(f, off):
  return int.from_bytes(bytes(f[off:off + 8]), "little")


def put(f, off, value, size):
  f = np.array(f, np.uint8, copy=True)
  f[off:off + size] = np.frombuffer(int(value).to_bytes(size, "little"), np.uint8)
  return f


def regions(frame, n):
  """[(start, end, kind)] of a valid frame: header, directory, and per block its parts."""
  out = [(0, 32, "header")]
  nb = fmt.num_blocks(n)
  out.append((32, 32 + 4 * nb, "directory"))
  off = 32 + 4 * nb
  for b in range(nb):
    bb = u32(frame, 32 + 4 * b)
    m = min(fmt.BLOCK_ELEMS, n - b * fmt.BLOCK_ELEMS)
    mode = int(frame[off])
    if mode == fmt.MODE_CONST:
      out += [(off, off + 4, "block_header"), (off + 4, off + 8, "const_value")]
    else:
      out.append((off, off + 8, "block_header"))
    if mode == fmt.MODE_RAW:
      out.append((off + 8, off + bb, "raw_block"))
    elif mode == fmt.MODE_HUFF:
      lo, hi = int(frame[off + 8]), int(frame[off + 9])
      tb = 2 + (hi - lo + 3) // 2
      ns = -(-m // fmt.SEGMENT_ELEMS)
      d = off + 8 + tb
      units = sum(int(frame[d + 4 * k]) | (int(frame[d + 4 * k + 1]) << 8) for k in range(ns))
      units_off = d + 4 * ns
      out += [(off + 8, d, "table"), (d, units_off, "seg_dir"),
              (units_off, units_off + 2 * units, "units"), (units_off + 2 * units, off + bb, "raw")]
    off += bb
  assert off == len(frame)
  return out


def block_ranges(frame, n):
  """(start, end, "block") of every block of a frame."""
  nb = fmt.num_blocks(n)
  off, out = 32 + 4 * nb, []
  for b in range(nb):
    bb = u32(frame, 32 + 4 * b)
    out.append((off, off + bb, "block"))
    off += bb
  return out


def block_offsets(frame, n):
  nb = fmt.num_blocks(n)
  off, offs = 32 + 4 * nb, []
  for b in range(nb):
    offs.append(off)
    off += u32(frame, 32 + 4 * b)
  return offs


def mixed_bf16(seed=0):
  """bfloat16, 4 blocks: HUFF (Gaussian, 20% zeros), RAW (random bits), CONST, partial HUFF (f32-like)."""
  n = 3 * 65536 + 5000
  x = np.empty(n, BF16)
  x[:65536] = gaussian(65536, BF16, seed, zeros=0.2)
  x[65536:131072] = random_bits(65536, BF16, seed + 1)
  x[131072:196608] = BF16.type(-3.5)
  x[196608:] = gaussian(5000, BF16, seed + 2, scale=1e-3)
  return x


@pytest.fixture(scope="module")
def frames():
  """(name, x, frame) with every block mode, per dtype, with and without the checksum."""
  out = {}
  xs = {
      "bf16": mixed_bf16(),
      "f16": np.concatenate([gaussian(65536, F16, 3, zeros=0.1), np.full(70000 - 65536, 2.0, F16)]),
      "f32": np.concatenate([gaussian(65536, F32, 4), gaussian(9000, BF16, 5).astype(F32)]),  # 2nd: LOW16
  }
  for name, x in xs.items():
    for cs in (False, True):
      f, need = encode_host(x, checksum=cs)
      assert need == len(f)
      out[(name, cs)] = (x, f)
  modes = [int(out[("bf16", False)][1][o]) for o in block_offsets(out[("bf16", False)][1], xs["bf16"].size)]
  assert modes == [fmt.MODE_HUFF, fmt.MODE_RAW, fmt.MODE_CONST, fmt.MODE_HUFF]
  f32 = out[("f32", False)][1]
  assert [int(f32[o + 1]) for o in block_offsets(f32, xs["f32"].size)] == [0, fmt.BLOCK_FLAG_LOW16]
  return out


# ------------------------------------------------------------------------------------------------- truncation

_GUARD_SCRIPT = textwrap.dedent(r"""
    import ctypes, importlib.machinery, importlib.util, mmap, sys
    import numpy as np
    # The extension alone, loaded from its file (no JAX import: the subprocess starts fast).
    loader = importlib.machinery.ExtensionFileLoader("zipccl_jax._zipccl", sys.argv[1])
    ext = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(ext)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    PAGE = mmap.PAGESIZE

    class Guarded:
        # nbytes of writable memory that end exactly where an inaccessible page begins.
        def __init__(self, nbytes):
            self.pages = (nbytes + PAGE - 1) // PAGE + 1
            self.base = libc.mmap(None, self.pages * PAGE, 3, 0x22, -1, 0)  # RW, MAP_PRIVATE|ANONYMOUS
            assert self.base not in (None, ctypes.c_void_p(-1).value)
            end = self.base + (self.pages - 1) * PAGE
            assert libc.mprotect(end, PAGE, 0) == 0
            self.a = np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(end - nbytes))
            self.a = self.a[:nbytes]
        def free(self):
            del self.a
            libc.munmap(self.base, self.pages * PAGE)

    for path in sys.argv[2:]:
        data = np.load(path)
        frame, code, n, cuts = data["frame"], int(data["code"]), int(data["n"]), data["cuts"]
        out = Guarded(n * (4 if code == 3 else 2))
        rejected = 0
        for cut in cuts:
            buf = Guarded(int(cut))
            buf.a[:] = frame[:cut]
            try:
                ext.decode_host(buf.a, code, n, out.a)
            except ValueError as e:
                assert "truncated" in str(e), (int(cut), str(e))
                rejected += 1
            buf.free()
        buf = Guarded(len(frame))
        buf.a[:] = frame
        ext.decode_host(buf.a, code, n, out.a)  # the whole frame, flush against the guard page, decodes
        print(path, "rejected", rejected, "of", len(cuts))
""")


def test_truncation_at_many_cut_points_never_reads_past_the_payload(frames, tmp_path):
  paths, expect = [], []
  for name in ("bf16", "f16", "f32"):
    x, frame = frames[(name, True)]
    L = len(frame)
    rng = np.random.default_rng(1)
    cuts = set(range(0, 80)) | set(range(L - 40, L)) | set(rng.integers(0, L, 250).tolist())
    for start, end, _ in regions(frame, x.size):  # both sides of every region boundary
      cuts |= {c for c in range(start - 2, start + 3) if 0 <= c < L}
    cuts = np.array(sorted(cuts), np.int64)
    assert len(cuts) >= 300
    # In-process first: every cut is a clear "truncated" error.
    for cut in cuts:
      msg = reject_reason(frame[:cut], x.dtype, x.size)
      assert msg is not None and "truncated" in msg, (name, cut, msg)
    paths.append(str(tmp_path / f"{name}.npz"))
    np.savez(paths[-1], frame=frame, code=CODE[x.dtype], n=x.size, cuts=cuts)
    expect.append(f"{paths[-1]} rejected {len(cuts)} of {len(cuts)}")
  # Then in a subprocess, with every payload and the output flush against an unmapped page: a read or a
  # write past either one is a segmentation fault.
  r = subprocess.run([sys.executable, "-c", _GUARD_SCRIPT, ext.__file__, *paths],
                     capture_output=True, text=True, timeout=300, cwd=tmp_path)
  assert r.returncode == 0, f"guard-page decode crashed or failed (rc {r.returncode}):\n{r.stderr[-3000:]}"
  for line in expect:
    assert line in r.stdout, r.stdout


def test_truncation_through_jax_decode(frames):
  x, frame = frames[("bf16", False)]
  for cut in (0, 1, 31, 32, 33, 4096, len(frame) - 1):
    with pytest.raises(JaxRuntimeError, match=r"INVALID_ARGUMENT.*truncated"):
      np.asarray(zipccl_jax.decode(jnp.asarray(frame[:cut]), shape=x.shape, dtype=x.dtype))
  y = zipccl_jax.decode(jnp.asarray(frame), shape=x.shape, dtype=x.dtype)
  assert np.array_equal(bits_of(y), bits_of(x))


def test_payload_bytes_past_the_frame_are_zero():
  """The padded transport sends the whole payload, so nothing but the frame may be in it.

  XLA hands the encode handler a recycled buffer; bytes the codec does not write would carry stale memory of
  this process (other tensors, heap pointers) to every peer, and make the wire bytes nondeterministic.
  """
  x = jnp.asarray(np.stack([gaussian(70000, BF16, 30 + k) for k in range(3)]))
  enc = jax.jit(lambda x: codec.encode_frames(x))
  enc_over = jax.jit(lambda x: codec.encode_frames(x, capacity=40000))  # every frame overflows
  for i in range(4):
    p, n = (np.asarray(a) for a in enc(x))
    for f in range(3):
      assert not p[f, n[f]:].any(), f"iteration {i}: stale bytes after frame {f}"
    p, n = (np.asarray(a) for a in enc_over(x))
    assert (n > 40000).all()
    assert not p[:, 32:].any(), f"iteration {i}: stale bytes after an overflowed header"
    stale = jnp.full(400000, 0x5EC12E7 + i, jnp.int32) * (i + 1)  # recycled by the next encode
    stale.block_until_ready()
    del stale


@pytest.mark.parametrize("dtype", [BF16, F16, F32])
def test_overflowed_encode_is_rejected_by_every_decoder(dtype):
  x = random_bits(3000, dtype, 9)  # incompressible: the frame is RAW, larger than the raw data
  _, need = encode_host(x)
  for cap in (32, 33, 100, need - 1):
    payload, got = encode_host(x, capacity=cap)
    assert got == need
    assert u64(payload, 16) == need and payload[6] == 0 and u32(payload, 28) == 0  # header only, no flags
    assert "truncated" in reject_reason(payload, dtype, x.size)
  # A capacity below the header: nothing is written at all.
  for cap in (0, 1, 31):
    out = np.full(cap, 0xCD, np.uint8)
    assert ext.encode_host(x.view(np.uint8), x.size, CODE[dtype], False, out) == need
    assert (out == 0xCD).all()
  # The FFI path: nbytes > capacity, frame_bytes_of sees it, decode raises.
  payload, nbytes = zipccl_jax.encode(jnp.asarray(x), capacity=need - 1)
  assert int(nbytes) == need and int(codec.frame_bytes_of(payload)) == need
  with pytest.raises(JaxRuntimeError, match="truncated"):
    np.asarray(zipccl_jax.decode(payload, shape=x.shape, dtype=dtype))
  with pytest.raises(ValueError, match="capacity"):
    zipccl_jax.encode(jnp.asarray(x), capacity=31)


# ------------------------------------------------------------------------------------------------- bit flips

ALWAYS_REJECTED = ("header", "directory", "block_header", "seg_dir")


@pytest.mark.parametrize("name", ["bf16", "f16", "f32"])
def test_bit_flips_without_checksum(frames, name):
  """Structure bits are always checked; code tables/units are rejected or decode; raw flips are local."""
  x, frame = frames[(name, False)]
  n, w = x.size, x.dtype.itemsize
  xb = bits_of(x)
  rng = np.random.default_rng(2)
  tally = {}
  for start, end, kind in regions(frame, n):
    if end <= start:
      continue
    if kind in ALWAYS_REJECTED:
      positions = range(start * 8, end * 8)  # every bit
    else:
      positions = rng.integers(start * 8, end * 8, min(200, (end - start) * 8)).tolist()
    for bit in positions:
      bad = frame.copy()
      bad[bit // 8] ^= 1 << (bit % 8)
      try:
        y = decode_host(bad, x.dtype, n)
        msg = None
      except ValueError as e:
        msg = str(e)
        assert msg.startswith("zipccl decode: ") and len(msg) > 20
      t = tally.setdefault(kind, [0, 0])
      t[msg is None] += 1
      if kind in ALWAYS_REJECTED:
        assert msg is not None, f"{kind} bit {bit} flipped and the frame was accepted"
      elif msg is None and kind in ("raw", "raw_block", "const_value"):
        diff = np.flatnonzero(bits_of(y) != xb)
        if kind == "const_value":
          assert len(diff) == min(65536, n - (diff[0] // 65536) * 65536)
        else:
          assert len(diff) == 1, (kind, bit, diff[:10])
          assert bin(int(bits_of(y)[diff[0]]) ^ int(xb[diff[0]])).count("1") == 1
  for kind in ("raw", "raw_block"):
    if kind in tally:  # raw bytes carry no redundancy: flips go undetected without the checksum
      assert tally[kind][1] == sum(tally[kind])
  assert {"header", "directory", "block_header", "table", "seg_dir", "units", "raw"} <= set(tally)


def test_bit_flips_through_jax_decode(frames):
  x, frame = frames[("bf16", False)]
  rng = np.random.default_rng(3)
  dec = jax.jit(lambda p: zipccl_jax.decode(p, shape=x.shape, dtype=x.dtype))
  header_bits = rng.choice(256, 12, replace=False).tolist()
  dir_bits = (rng.integers(32 * 8, 48 * 8, 4)).tolist()
  for bit in header_bits + dir_bits:
    bad = frame.copy()
    bad[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(JaxRuntimeError, match=r"INVALID_ARGUMENT: zipccl decode \(frame 0"):
      np.asarray(dec(jnp.asarray(bad)))
  assert np.array_equal(bits_of(dec(jnp.asarray(frame))), bits_of(x))


def test_batched_decode_names_the_bad_frame_and_block():
  x = jnp.asarray(np.stack([gaussian(70000, BF16, 40 + k) for k in range(3)]))
  p, nb = codec.encode_frames(x)
  p = np.asarray(p).copy()
  second_block = 32 + 8 + int(np.asarray(p[2, 32:36]).view("<u4")[0])  # frame 2, block 1's header
  p[2, second_block + 2] = 1  # a reserved byte
  with pytest.raises(JaxRuntimeError, match=r"zipccl decode \(frame 2, block 1\): a reserved field"):
    np.asarray(codec.decode_frames(jnp.asarray(p), shape=(70000,), dtype=BF16))
  p[2, second_block + 2] = 0
  assert np.array_equal(bits_of(codec.decode_frames(jnp.asarray(p), shape=(70000,), dtype=BF16)),
                        bits_of(x))


# ------------------------------------------------------------------------------------------------- fields

def test_header_fields_are_each_checked(frames):
  x, frame = frames[("bf16", False)]
  n = x.size
  nb = fmt.num_blocks(n)
  cases = {
      "bad magic": put(frame, 0, 0x4C43435B, 4),
      "version": put(frame, 4, 1, 1),
      "version 0": put(frame, 4, 0, 1),
      "dtype code 0": put(frame, 5, 0, 1),
      "dtype code 4": put(frame, 5, 4, 1),
      "dtype f16": put(frame, 5, 2, 1),
      "block size": put(frame, 7, 15, 1),
      "element count": put(frame, 8, n + 1, 8),
      "element count 2^63": put(frame, 8, 1 << 63, 8),
      "truncated": put(frame, 16, len(frame) + 1, 8),
      "poisoned": put(frame, 16, (1 << 64) - 1, 8),
      "frame size": put(frame, 16, len(frame) - 1, 8),
      "frame size small": put(frame, 16, 32 + 4 * nb - 1, 8),
      "checksum without flag": put(frame, 28, 1, 4),
      "checksum flag, no checksum": put(frame, 6, 1, 1),
      "directory": put(frame, 32, u32(frame, 32) + 1, 4),
      "directory huge": put(frame, 32, 0xFFFFFFFF, 4),
  }
  for bit in range(1, 8):
    cases[f"reserved flag bit {bit}"] = put(frame, 6, 1 << bit, 1)
  for byte in range(24, 28):
    cases[f"reserved byte {byte}"] = put(frame, byte, 0x80, 1)
  want = {
      "bad magic": "magic", "version": "version", "version 0": "version", "dtype code 0": "dtype",
      "dtype code 4": "dtype", "dtype f16": "dtype", "block size": "block size",
      "element count": "element count", "element count 2^63": "element count", "truncated": "truncated",
      "poisoned": "truncated", "frame size": "frame size", "frame size small": "frame size",
      "checksum without flag": "reserved", "checksum flag, no checksum": "checksum",
      "directory": "frame size", "directory huge": "frame size",
  }
  for name, bad in cases.items():
    msg = reject_reason(bad, x.dtype, n)
    assert msg is not None, name
    assert want.get(name, "reserved") in msg, (name, msg)


def test_frame_bytes_beyond_the_format_bound_is_rejected_even_if_readable(frames):
  x, frame = frames[("bf16", False)]
  bound = fmt.max_encoded_bytes(x.size, x.dtype)
  padded = np.concatenate([frame, np.zeros(bound + 64 - len(frame), np.uint8)])
  for fb in (bound + 1, bound + 64):
    bad = put(padded, 16, fb, 8)
    bad = put(bad, 32 + 4 * 3, u32(bad, 32 + 12) + fb - len(frame), 4)  # directory adds up to fb
    assert "frame size" in reject_reason(bad, x.dtype, x.size)
  # Trailing bytes beyond frame_bytes are ignored.
  assert np.array_equal(bits_of(decode_host(padded, x.dtype, x.size)), bits_of(x))


def test_block_fields_are_each_checked(frames):
  x, frame = frames[("bf16", False)]
  n = x.size
  huff, raw, const, _ = block_offsets(frame, n)
  lo, hi = int(frame[huff + 8]), int(frame[huff + 9])
  n_nib = hi - lo + 2
  cases = {
      "huff mode 3": (put(frame, huff, 3, 1), "block mode"),
      "huff mode 255": (put(frame, huff, 255, 1), "block mode"),
      "huff as raw": (put(frame, huff, 0, 1), "block size"),
      "huff as const": (put(frame, huff, 1, 1), "block size"),
      "raw as huff": (put(frame, raw, 2, 1), None),
      "low16 on bf16": (put(frame, huff + 1, 1, 1), "block mode"),
      "raw flags": (put(frame, raw + 1, 1, 1), "block mode"),
      "const flags": (put(frame, const + 1, 1, 1), "block mode"),
      "raw value": (put(frame, raw + 4, 1, 4), "reserved"),
      "huff value": (put(frame, huff + 4, 1, 4), "reserved"),
      "const upper 16 bits (bf16)": (put(frame, const + 6, 1, 2), "reserved"),
      "table length 12": (put(frame, huff + 10, (int(frame[huff + 10]) & 0xF0) | 12, 1), "table"),
      "table length 15": (put(frame, huff + 10, (int(frame[huff + 10]) & 0x0F) | 0xF0, 1), None),
      "table all zero": (put(frame, huff + 10, 0, (n_nib + 1) // 2), None),
  }
  if lo > 0:
    cases["table hi < lo"] = (put(frame, huff + 9, lo - 1, 1), "table")
  for bit in range(1, 8):
    cases[f"huff flag bit {bit}"] = (put(frame, huff + 1, 1 << bit, 1), "reserved")
  for byte in (2, 3):
    for off in (huff, raw, const):
      cases[f"reserved byte {byte} at {off}"] = (put(frame, off + byte, 1, 1), "reserved")
  if n_nib % 2:
    last = huff + 10 + n_nib // 2
    cases["table reserved nibble"] = (put(frame, last, int(frame[last]) | 0x10, 1), None)
  for name, (bad, reason) in cases.items():
    msg = reject_reason(bad, x.dtype, n)
    assert msg is not None, name
    if reason:
      assert reason in msg, (name, msg)
  # A CONST bfloat16 value in the low 16 bits decodes to that value (not an error).
  y = decode_host(put(frame, const + 4, 0x3F80, 4), x.dtype, n)
  assert (bits_of(y)[131072:196608] == 0x3F80).all()


def _padded_lane_unit(x_block, dtype):
  """(stored index, spare bits) of the last unit of a lane of segment 0 of a HUFF block whose codes
  leave padding, from FORMAT.md's unit order: by the step of the code holding a unit's first bit,
  then by lane."""
  code = fmt.dtype_code(dtype)
  u = bits_of(x_block)
  sym, _ = ref.split_symbols(u, code, code == fmt.DTYPE_F32 and not np.any(u & 0xFFFF))
  lens = ref.code_lengths(np.bincount(sym, minlength=fmt.NUM_SYMBOLS)).astype(np.int64)[sym]
  m = min(fmt.SEGMENT_ELEMS, sym.size)
  grid = np.zeros((fmt.SEGMENT_ELEMS // fmt.LANES, fmt.LANES), np.int64)
  grid.reshape(-1)[:m] = lens[:m]
  end = np.cumsum(grid, axis=0)
  starts = -(-end // fmt.UNIT_BITS) > -(-(end - grid) // fmt.UNIT_BITS)
  order = np.cumsum(starts.reshape(-1)).reshape(starts.shape) - 1     # stored index of each start
  for lane in range(fmt.LANES):
    spare = -int(end[-1, lane]) % fmt.UNIT_BITS
    if spare:
      return int(order[np.flatnonzero(starts[:, lane])[-1], lane]), spare
  return None


def test_segment_directory_and_unit_padding_are_checked(frames):
  x, frame = frames[("bf16", False)]
  n = x.size
  regs = regions(frame, n)
  sd = next(r for r in regs if r[2] == "seg_dir")
  us = next(r for r in regs if r[2] == "units")
  d = sd[0]
  su, nnz = int.from_bytes(bytes(frame[d:d + 2]), "little"), int.from_bytes(bytes(frame[d + 2:d + 4]), "little")
  m = min(fmt.SEGMENT_ELEMS, n)
  for name, bad in {
      "seg_units + 1": put(frame, d, su + 1, 2),
      "seg_units - 1": put(frame, d, su - 1, 2),
      "seg_units < count / 16": put(frame, d, m // 16 - 1, 2),
      "seg_units > 11 count / 16": put(frame, d, 11 * m // 16 + 33, 2),
      "nnz > count": put(frame, d + 2, m + 1, 2),
      "nnz - 1": put(frame, d + 2, nnz - 1, 2),
      "nnz 0xFFFF": put(frame, d + 2, 0xFFFF, 2),
  }.items():
    assert reject_reason(bad, x.dtype, n) is not None, name
  # Bits after a lane's last code (reserved) must be zero.
  found = _padded_lane_unit(x.reshape(-1)[:fmt.BLOCK_ELEMS], x.dtype)
  assert found is not None
  k, spare = found
  at = us[0] + 2 * k + 1                                  # the unit's high byte: its top bit is padding
  bad = put(frame, at, int(frame[at]) | 0x80, 1)
  assert "reserved" in reject_reason(bad, x.dtype, n)


@pytest.mark.parametrize("name", ["bf16", "f16", "f32"])
def test_wrong_dtype_and_shape(frames, name):
  x, frame = frames[(name, False)]
  n = x.size
  for other in (BF16, F16, F32):
    if other != x.dtype:
      assert "dtype" in reject_reason(frame, other, n)
  for m in (0, 1, n - 1, n + 1, 2 * n):
    assert "element count" in reject_reason(frame, x.dtype, m)
  p = jnp.asarray(frame)
  other = F16 if x.dtype != F16 else BF16
  with pytest.raises(JaxRuntimeError, match="dtype"):
    np.asarray(zipccl_jax.decode(p, shape=x.shape, dtype=other))
  with pytest.raises(JaxRuntimeError, match="element count"):
    np.asarray(zipccl_jax.decode(p, shape=(n + 1,), dtype=x.dtype))
  with pytest.raises(JaxRuntimeError, match="element count"):
    np.asarray(zipccl_jax.decode(p, shape=(2, n // 2 - 1), dtype=x.dtype))


def test_unsupported_dtypes_and_bad_arguments(frames):
  x, frame = frames[("bf16", False)]
  for dt in (np.int32, np.int8, np.uint16, np.bool_):
    with pytest.raises(TypeError, match="bfloat16, float16, float32"):
      zipccl_jax.encode(jnp.zeros(8, dt))
    with pytest.raises(TypeError, match="bfloat16, float16, float32"):
      zipccl_jax.decode(jnp.asarray(frame), shape=x.shape, dtype=dt)
  with pytest.raises(TypeError):
    zipccl_jax.decode(jnp.asarray(frame).astype(jnp.int8), shape=x.shape, dtype=x.dtype)
  with pytest.raises(ValueError):
    zipccl_jax.decode(jnp.asarray(frame).reshape(1, -1), shape=x.shape, dtype=x.dtype)
  with pytest.raises(ValueError):
    zipccl_jax.decode(jnp.asarray(frame), shape=(-1,), dtype=x.dtype)
  # Host entry points check their buffer sizes and dtype codes.
  out = np.empty(x.size * 2, np.uint8)
  for code in (0, 4, 255):
    with pytest.raises(ValueError, match="dtype"):
      ext.decode_host(frame, code, x.size, out)
  with pytest.raises(ValueError, match="out must hold"):
    ext.decode_host(frame, 1, x.size + 1, out)
  with pytest.raises(ValueError, match="x must hold"):
    ext.encode_host(x.view(np.uint8), x.size + 1, 1, False, np.empty(10, np.uint8))

def test_host_entry_points_reject_element_counts_whose_byte_size_wraps(tmp_path):
  """n_elems * width wrapping around 2^64 must not pass the buffer-size checks (it crashed encode_host).

  Run in a subprocess: the failure mode is a segmentation fault.
  """
  script = textwrap.dedent("""
      import importlib.machinery, importlib.util, sys
      import numpy as np
      loader = importlib.machinery.ExtensionFileLoader("zipccl_jax._zipccl", sys.argv[1])
      ext = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
      loader.exec_module(ext)
      for n, code in ((1 << 63, 1), (1 << 62, 3), (1 << 63, 2), ((1 << 64) - 1, 1)):
          for call in (lambda: ext.encode_host(np.empty(0, np.uint8), n, code, False, np.empty(64, np.uint8)),
                       lambda: ext.decode_host(np.zeros(64, np.uint8), code, n, np.empty(0, np.uint8))):
              try:
                  call()
                  raise SystemExit(f"accepted n={n} code={code}")
              except ValueError:
                  pass
      print("ok")
  """)
  r = subprocess.run([sys.executable, "-c", script, ext.__file__], capture_output=True, text=True,
                     timeout=120, cwd=tmp_path)
  assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr[-2000:])


# ------------------------------------------------------------------------------------------------- checksum

def xxh32(data: bytes, seed: int = 0) -> int:
  """XXH32 from its specification (independent of the C++ and reference implementations)."""
  P1, P2, P3, P4, P5 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1
  M = 0xFFFFFFFF
  rotl = lambda x, r: ((x << r) | (x >> (32 - r))) & M
  rnd = lambda acc, lane: (rotl((acc + lane * P2) & M, 13) * P1) & M
  n, i = len(data), 0
  words = np.frombuffer(data[: n - n % 4], "<u4").astype(np.int64).tolist()
  if n >= 16:
    v = [(seed + P1 + P2) & M, (seed + P2) & M, seed & M, (seed - P1) & M]
    while i + 16 <= n:
      for k in range(4):
        v[k] = rnd(v[k], words[i // 4 + k])
      i += 16
    h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
  else:
    h = (seed + P5) & M
  h = (h + n) & M
  while i + 4 <= n:
    h = (rotl((h + words[i // 4] * P3) & M, 17) * P4) & M
    i += 4
  while i < n:
    h = (rotl((h + data[i] * P5) & M, 11) * P1) & M
    i += 1
  h ^= h >> 15
  h = (h * P2) & M
  h ^= h >> 13
  h = (h * P3) & M
  h ^= h >> 16
  return h


def test_checksum_is_xxh32_seed0_over_the_frame(frames):
  assert xxh32(b"") == 0x02CC5D05 and xxh32(b"abc") == 0x32D153FF  # published test vectors
  for name in ("bf16", "f16", "f32"):
    x, frame = frames[(name, True)]
    assert frame[6] & fmt.FLAG_CHECKSUM
    zeroed = frame.copy()
    zeroed[28:32] = 0
    ranges = [(s, e) for s, e, kind in block_ranges(frame, x.size)]
    # version 2: XXH32 of the parts' XXH32s (header + directory, then each block)
    parts = [xxh32(zeroed[:ranges[0][0]].tobytes())] + [xxh32(zeroed[s:e].tobytes()) for s, e in ranges]
    assert xxh32(np.array(parts, "<u4").tobytes()) == u32(frame, 28)
    assert ref.frame_checksum(zeroed.tobytes(), ranges) == u32(frame, 28)
    plain = frames[(name, False)][1]
    assert np.array_equal(plain[32:], frame[32:]) and u32(plain, 28) == 0 and plain[6] == 0
  # Selectable per call in the FFI path too.
  x = gaussian(5000, BF16, 8)
  p0, n0 = zipccl_jax.encode(jnp.asarray(x))
  p1, n1 = zipccl_jax.encode(jnp.asarray(x), checksum=True)
  f1 = np.asarray(p1)[: int(n1)]
  assert int(n0) == int(n1) and np.asarray(p0)[6] == 0 and f1[6] == 1
  assert np.array_equal(f1, encode_host(x, checksum=True)[0])


@pytest.mark.parametrize("name", ["bf16", "f16", "f32"])
def test_checksum_detects_every_single_bit_flip(frames, name):
  """Every bit of >= 200 byte positions (bf16: 300), spread over every region kind, flipped one at a time."""
  x, frame = frames[(name, True)]
  assert u32(frame, 28) != 0
  rng = np.random.default_rng(4)
  regs = [r for r in regions(frame, x.size) if r[1] > r[0]]
  kinds = sorted({k for _, _, k in regs})
  target = 320 if name == "bf16" else 220
  pools = {k: rng.permutation(np.concatenate([np.arange(s, e) for s, e, kk in regs if kk == k])).tolist()
           for k in kinds}
  positions = set(range(32))  # the whole header
  while len(positions) < target and any(pools.values()):
    for k in kinds:  # round robin over the region kinds, so small kinds are covered exhaustively
      if pools[k]:
        positions.add(int(pools[k].pop()))
  assert len(positions) >= 200
  covered = {k for s, e, k in regs for p in positions if s <= p < e}
  assert covered == set(kinds)
  missed = []
  for pos in sorted(positions):
    for b in range(8):
      bad = frame.copy()
      bad[pos] ^= 1 << b
      msg = reject_reason(bad, x.dtype, x.size)
      if msg is None:
        missed.append((pos, b))
  assert not missed, f"{len(missed)} undetected flips, e.g. {missed[:10]}"


def test_checksum_detects_flips_through_jax_decode(frames):
  x, frame = frames[("bf16", True)]
  dec = jax.jit(lambda p: zipccl_jax.decode(p, shape=x.shape, dtype=x.dtype))
  rng = np.random.default_rng(5)
  body = [r for r in regions(frame, x.size) if r[2] in ("raw", "raw_block", "units", "const_value")]
  for s, e, kind in body:
    for pos in rng.integers(s, e, 3):
      bad = frame.copy()
      bad[pos] ^= 1 << int(rng.integers(8))
      with pytest.raises(JaxRuntimeError, match="checksum mismatch"):
        np.asarray(dec(jnp.asarray(bad)))
  assert np.array_equal(bits_of(dec(jnp.asarray(frame))), bits_of(x))


# ------------------------------------------------------------------------------------------------- fuzz replay

def _fuzz_files(kind):
  files = []
  for sub in ("corpus", "regressions"):
    d = FUZZ / sub / kind
    if d.is_dir():
      files += sorted(p for p in d.iterdir() if p.is_file() and p.suffix != ".md")
  return files


def _replay_decode(blob: bytes):
  """Python mirror of tests/fuzz/decode_fuzzer.cc. Returns True if the frame was accepted."""
  if not blob:
    return False
  ctl, frame = blob[0], np.frombuffer(blob[1:], np.uint8)
  dt = ctl & 3
  hdr_n = hdr_fb = 0
  if len(frame) >= 32:
    hdr_n, hdr_fb = u64(frame, 8), u64(frame, 16)
    if dt == 0:
      dt = int(frame[5])
  if dt not in CODE.values():
    dt = 1
  kmax = 1 << 18
  n = hdr_n if hdr_n <= kmax else hdr_n % (kmax + 1)
  n += (ctl >> 2) & 1
  dtype = {code: d for d, code in CODE.items()}[dt]
  msg = None
  try:
    y = decode_host(frame, dtype, n)
  except ValueError as e:
    msg = str(e)
  if msg is not None:
    assert msg.startswith("zipccl decode: ") and "unknown" not in msg and "capacity" not in msg
    return False
  assert 32 <= hdr_fb <= len(frame) and hdr_fb <= fmt.max_encoded_bytes(n, dtype)
  assert np.array_equal(bits_of(decode_host(frame[:hdr_fb], dtype, n)), bits_of(y))
  assert "truncated" in reject_reason(frame[: hdr_fb - 1], dtype, n)
  again, _ = encode_host(y, checksum=bool((ctl >> 4) & 1))
  assert np.array_equal(bits_of(decode_host(again, dtype, n)), bits_of(y))
  return True


def _shape_elements(v, dtype, mode, tag):
  """Mirror of Shape() in tests/fuzz/roundtrip_fuzzer.cc, vectorised (v: uint32 array)."""
  v = v.astype(np.uint32)
  if mode == 0:
    return v
  if dtype.itemsize == 1:
    v = (v & 0x87) | ((8 + ((v >> 3) & 7)) << 3)
    if mode == 3:
      v = np.where(tag == 0xFF, np.where((v >> 2) & 1, v | 0x78, v & 0x87), v)
  elif dtype == F16:
    v = (v & 0x83FF) | ((8 + ((v >> 10) & 15)) << 10)
    if mode == 3:
      esc = tag == 0xFF
      v = np.where(esc, np.where((v >> 3) & 1, v | 0x7C00, v & 0x83FF), v)
  else:
    mbits = 23 if dtype == F32 else 7
    emask = np.uint32(0xFF << mbits)
    v = (v & ~emask) | ((124 + ((v >> mbits) & 7)) << mbits).astype(np.uint32)
    if mode == 3:
      if dtype == F32:
        v = v & np.uint32(0xFFFF0000)
      esc = tag == 0xFF
      v = np.where(esc, np.where((v >> (mbits - 4)) & 1, v | emask, v & ~emask), v)
  if mode == 2:
    v = np.where(tag < 64, 0, v)
  return v.astype(np.uint32)


def _roundtrip_input(blob: bytes):
  """(x, dtype, checksum, cap_mode, ctl1) as tests/fuzz/roundtrip_fuzzer.cc builds them from an input."""
  ctl0, ctl1 = blob[0], blob[1]
  dtype = [BF16, F16, F32, np.dtype(ml_dtypes.float8_e4m3fn)][ctl0 & 3]
  checksum, mode, cap_mode = bool(ctl0 & 4), (ctl0 >> 3) & 3, (ctl0 >> 5) & 3
  w = dtype.itemsize
  src_n = (len(blob) - 2) // w
  src = np.frombuffer(blob[2:2 + src_n * w], UINT[w]).astype(np.uint32)
  tags = np.frombuffer(blob[2:2 + src_n * w], np.uint8)[::w]
  n = 65536 + 131 * (ctl1 & 127) + src_n if (ctl0 & 0x80) and src_n else src_n
  i = np.arange(n, dtype=np.uint64)
  j = (i % src_n) if src_n else i
  rep = (i // src_n) if src_n else i
  v = src[j] if src_n else np.zeros(0, np.uint32)
  pert = ((rep * np.uint64(0x9E3779B1)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
  v = v ^ (pert & np.uint32(0xFFFF if w == 4 else 0x0007))
  x = _shape_elements(v, dtype, mode, tags[j] if src_n else np.zeros(0, np.uint8))
  return x.astype(UINT[w]).view(dtype), dtype, checksum, cap_mode, ctl1


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_python_mirror_of_the_roundtrip_harness_builds_the_same_elements(tmp_path):
  """The harness, built with its dump hook and a plain main(), writes the elements it would code."""
  main = tmp_path / "main.cc"
  main.write_text(textwrap.dedent("""
      #include <cstdint>
      #include <cstdio>
      #include <cstdlib>
      #include <string>
      #include <vector>
      extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
      int main(int argc, char** argv) {  // main IN... : dumps the elements of IN to IN.out
        for (int k = 1; k < argc; ++k) {
          std::FILE* f = std::fopen(argv[k], "rb");
          std::vector<uint8_t> buf(1 << 20);
          size_t n = std::fread(buf.data(), 1, buf.size(), f);
          std::fclose(f);
          setenv("ROUNDTRIP_FUZZER_DUMP", (std::string(argv[k]) + ".out").c_str(), 1);
          LLVMFuzzerTestOneInput(buf.data(), n);
        }
        return 0;
      }
  """))
  exe = tmp_path / "rt"
  codec_dir = ROOT / "xla_ffi" / "codec"
  subprocess.run(["g++", "-std=c++17", "-O0", "-DROUNDTRIP_FUZZER_DUMP", "-I", str(codec_dir),
                  str(FUZZ / "roundtrip_fuzzer.cc"), str(codec_dir / "cpu_driver.cc"), str(main), "-o", str(exe)],
                 check=True, timeout=300)
  rng = np.random.default_rng(6)
  blobs = [p.read_bytes() for p in _fuzz_files("roundtrip")]
  blobs += [bytes([c0, int(rng.integers(256))]) + rng.integers(0, 256, int(rng.integers(0, 300)),
                                                                 dtype=np.uint8).tobytes()
            for c0 in range(256)]  # every control byte
  blobs = [b for b in blobs if len(b) >= 2]
  inputs = []
  for k, blob in enumerate(blobs):
    inputs.append(tmp_path / f"in{k}")
    inputs[-1].write_bytes(blob)
  subprocess.run([str(exe), *map(str, inputs)], check=True, timeout=300)
  for k, blob in enumerate(blobs):
    x = _roundtrip_input(blob)[0]
    got = (tmp_path / f"in{k}.out").read_bytes()
    assert got == x.tobytes(), f"input {k} (ctl0 {blob[0]:#04x}): mirror differs"


def _replay_roundtrip(blob: bytes):
  """Python mirror of tests/fuzz/roundtrip_fuzzer.cc."""
  if len(blob) < 2:
    return
  x, dtype, checksum, cap_mode, ctl1 = _roundtrip_input(blob)
  n = x.size
  frame, need = encode_host(x, checksum=checksum)
  assert need >= 32 + 4 * fmt.num_blocks(n) and u64(frame, 16) == need
  assert np.array_equal(bits_of(decode_host(frame, dtype, n)), bits_of(x))
  cap = {0: fmt.max_encoded_bytes(n, dtype), 1: need, 2: need - 1, 3: ctl1 % 40}[cap_mode]
  payload, got = encode_host(x, checksum=checksum, capacity=cap)
  assert got == need
  if need <= cap:
    assert np.array_equal(payload, frame)
  elif cap >= 32:
    assert u64(payload, 16) == need and "truncated" in reject_reason(payload, dtype, n)
  if checksum:
    bit = (ctl1 * 2654435761 + len(blob) * 40503) % (need * 8)
    bad = frame.copy()
    bad[bit // 8] ^= 1 << (bit % 8)
    msg = reject_reason(bad, dtype, n)
    assert msg is not None or np.array_equal(bits_of(decode_host(bad, dtype, n)), bits_of(x))


def test_fuzz_corpus_and_regressions_replay():
  """Every seed and every kept crasher, through the release-built Python extension."""
  dec = _fuzz_files("decode")
  rt = _fuzz_files("roundtrip")
  assert len(dec) >= 20 and len(rt) >= 20, "run tests/fuzz/make_corpus.py"
  accepted = sum(_replay_decode(p.read_bytes()) for p in dec)
  seeds = [p for p in dec if p.parent.parent.name == "corpus"]
  assert accepted >= len(seeds)  # every seed is a valid frame
  for p in rt:
    _replay_roundtrip(p.read_bytes())


# ------------------------------------------------------------------------------------------------- concurrency

def _device_data(m):
  """One distinct array per device: every block mode and several dtypes' worth of patterns (bfloat16)."""
  rows = [
      gaussian(m, BF16, 10),
      random_bits(m, BF16, 11),
      np.zeros(m, BF16),
      gaussian(m, BF16, 12, zeros=0.5),
      (0x7F80 | (np.arange(m) % 127 + 1)).astype(np.uint16).view(BF16),  # NaNs with payloads
      gaussian(m, BF16, 13, scale=1e-30),
      np.concatenate([np.full(m // 2, 7.0, BF16), gaussian(m - m // 2, BF16, 14)]),
      gaussian(m, BF16, 15, scale=1e4),
  ]
  return np.stack(rows)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
def test_eight_devices_encode_and_decode_at_once_in_shard_map():
  m = 2 * 65536 + 999  # three blocks per device, so the handlers overlap
  x = _device_data(m)
  mesh = jax.make_mesh((8,), ("d",))

  @jax.jit
  @jax.shard_map(mesh=mesh, in_specs=P("d"), out_specs=(P("d"), P("d"), P("d")))
  def roundtrip(x):
    p, nb = codec.encode_frames(x, checksum=True)
    y = codec.decode_frames(p, shape=(m,), dtype=x.dtype)
    p2, nb2 = codec.encode_frames(y)
    return codec.decode_frames(p2, shape=(m,), dtype=x.dtype), nb, nb2

  want_nb = [encode_host(r, checksum=True)[1] for r in x]
  want_nb2 = [encode_host(r)[1] for r in x]
  xd = jax.device_put(x, jax.sharding.NamedSharding(mesh, P("d")))
  for _ in range(3):
    y, nb, nb2 = roundtrip(xd)
    assert np.array_equal(bits_of(y), bits_of(x))
    assert np.asarray(nb).tolist() == want_nb and np.asarray(nb2).tolist() == want_nb2


def test_python_threads_call_the_host_codec_concurrently():
  m = 2 * 65536 + 4321
  xs = [r for r in _device_data(m)] + [gaussian(m, F32, 20).view(BF16)[:m]]
  frames_ = [encode_host(x, checksum=(i % 2 == 0))[0] for i, x in enumerate(xs)]
  errors = []
  barrier = threading.Barrier(8)

  def worker(t):
    try:
      barrier.wait()
      for it in range(12):
        k = (t + it) % len(xs)
        y = decode_host(frames_[k], BF16, m)
        if not np.array_equal(bits_of(y), bits_of(xs[k])):
          errors.append(f"thread {t} iteration {it}: decode of {k} differs")
        f, _ = encode_host(xs[k], checksum=(k % 2 == 0))
        if not np.array_equal(f, frames_[k]):
          errors.append(f"thread {t} iteration {it}: encode of {k} differs")
        bad = frames_[k].copy()
        bad[len(bad) // 2] ^= 0x10
        reject_reason(bad, BF16, m)  # errors are per call, not shared state
    except Exception as e:  # pragma: no cover - reported below
      errors.append(repr(e))

  threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=300)
  assert not any(t.is_alive() for t in threads)
  assert not errors, errors[:5]


def test_python_threads_run_the_jitted_codec_concurrently():
  m = 70000
  xs = _device_data(m)
  dec = jax.jit(lambda p: zipccl_jax.decode(p, shape=(m,), dtype=BF16))
  enc = jax.jit(lambda x: zipccl_jax.encode(x, checksum=True))
  payloads = [enc(jnp.asarray(x))[0] for x in xs]
  dec(payloads[0]).block_until_ready()
  errors = []

  def worker(t):
    try:
      for it in range(4):
        k = (t + it) % len(xs)
        y = np.asarray(dec(payloads[k]))
        if not np.array_equal(bits_of(y), bits_of(xs[k])):
          errors.append(f"thread {t}: decode of {k} differs")
        p, _ = enc(jnp.asarray(xs[k]))
        if not np.array_equal(np.asarray(p), np.asarray(payloads[k])):
          errors.append(f"thread {t}: encode of {k} differs")
    except Exception as e:  # pragma: no cover
      errors.append(repr(e))

  threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=300)
  assert not errors, errors[:5]


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("nm") is None, reason="needs g++ and nm")
def test_codec_and_handlers_hold_no_writable_globals(tmp_path):
  """The codec driver and the FFI handlers compile to objects with no writable data (no shared state)."""
  sources = [ROOT / "xla_ffi" / "codec" / "cpu_driver.cc", ROOT / "xla_ffi" / "handlers_cpu.cc"]
  inc = ["-I", str(ROOT / "xla_ffi"), "-isystem", jax.ffi.include_dir()]
  for src in sources:
    obj = tmp_path / (src.parent.name + "_" + src.stem + ".o")
    subprocess.run(["g++", "-std=c++17", "-O0", "-c", str(src), "-o", str(obj), *inc], check=True,
                   timeout=300)
    syms = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True, check=True).stdout
    writable = [ln for ln in syms.splitlines() if re.match(r"^\S*\s+[BbDdCSsuVv]\s", ln)]
    # XLA_FFI_DEFINE_HANDLER_SYMBOL keeps the bound handler in a function-local static (initialised once,
    # thread-safely, then read-only); XLA's header-only API has type ids of its own. Anything else is ours.
    ours = [ln for ln in writable if "zipccl" in ln.lower()
            and not re.search(r"\s(guard variable for )?Zipccl(Encode|Decode|DecodeInto)Cpu::.*\bhandler$", ln)]
    assert not ours, f"{src.name} has writable globals: {ours}"
