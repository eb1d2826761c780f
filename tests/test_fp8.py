"""One-byte float dtypes (float8_e4m3fn, float8_e5m2 and the other float8 variants) at every layer.

FORMAT.md codes a one-byte float as a single symbol, `rotl8(v)` (ZERO for +0), with no raw bytes.
Checked here, always on bit patterns (uint8 views, `np.array_equal`):
- the NumPy reference (the oracle written from FORMAT.md): the symbol table, every bit pattern,
  every block mode, the FP8-specific compliance rules (CONST reserved bits, no LOW16);
- the C++ CPU driver (`encode_host`/`decode_host`) writes the reference's bytes and decodes them;
- the JAX API (`encode`/`decode`/`encode_frames`/`decode_frames`, skip, status, fill NaN);
- the CUDA kernels in the SIMT emulator write the CPU driver's bytes and give its verdicts;
- corrupted and truncated frames are rejected alike by all of them;
- the compression bar on held-out tensors cast to FP8 with per-tensor amax scaling.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import zipccl_jax as zj
from zipccl_jax import codec
from zipccl_jax import format as fmt
from zipccl_jax import reference as ref

from zipccl_jax import _zipccl as ext  # noqa: E402  (a missing build must fail, not skip)

HOST = getattr(ext, "cuda_host", None)
DATA = pathlib.Path(__file__).parent / "data"
FP8 = fmt.FP8_DTYPES
E4M3FN, E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)
ALL_BYTES = np.arange(256, dtype=np.uint8)
BLOCK0 = fmt.FRAME_HEADER_BYTES + fmt.DIR_ENTRY_BYTES  # first block of a one-block frame
ids = lambda d: np.dtype(d).name  # noqa: E731

needs_host = pytest.mark.skipif(HOST is None, reason="extension built without the CUDA host bindings")


def u8(a) -> np.ndarray:
  return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def amax_cast(x: np.ndarray, dtype) -> np.ndarray:
  """Per-tensor amax scaling into `dtype`: the largest |x| maps to the dtype's largest finite value."""
  x = np.asarray(x, np.float32)
  scale = float(ml_dtypes.finfo(dtype).max) / float(np.max(np.abs(x)))
  return (x * scale).astype(dtype)


def c_encode(x, checksum=False) -> bytes:
  out = np.zeros(fmt.max_encoded_bytes(x.size, x.dtype), np.uint8)
  n = ext.encode_host(u8(x), x.size, fmt.dtype_code(x.dtype), checksum, out)
  return out[:n].tobytes()


def c_decode(frame, n, dtype) -> np.ndarray:
  out = np.zeros(n, np.uint8)
  ext.decode_host(np.frombuffer(bytes(frame), np.uint8), fmt.dtype_code(dtype), n, out)
  return out


def inputs(dtype) -> dict[str, np.ndarray]:
  """Bit patterns that exercise every mode: uint8 arrays, viewed as `dtype` by the tests."""
  rng = np.random.default_rng(8)
  gauss = u8(amax_cast(rng.normal(size=70_000), dtype))
  skewed = np.concatenate([gauss[:6000], ALL_BYTES, rng.permutation(ALL_BYTES)])
  padded = gauss[:9000].copy()
  padded[3000:7000] = 0                      # capacity padding: ZERO codes, all-ZERO lanes
  return {
      "all_patterns": ALL_BYTES,                       # RAW (every byte once)
      "all_patterns_in_huff": skewed,                  # HUFF holding every byte
      "gauss_two_blocks": gauss,                       # HUFF + HUFF, partial last segment
      "zero_padded": padded,
      "const_nan": np.full(70_000, ALL_BYTES[-1]),     # CONST + CONST (0xFF: a NaN or -max)
      "const_neg_zero": np.full(5, 0x80, np.uint8),
      "zeros": np.zeros(3000, np.uint8),
      "random": rng.integers(0, 256, 5000, dtype=np.uint8),
      "one": np.array([0x38], np.uint8),
      "empty": np.zeros(0, np.uint8),
  }


CASES = [(d, name) for d in FP8 for name in inputs(d)]


# --------------------------------------------------------------------------- reference


@pytest.mark.parametrize("dtype", FP8, ids=ids)
def test_symbol_is_the_rotated_byte(dtype):
  code = fmt.dtype_code(dtype)
  sym, raw = ref.split_symbols(ALL_BYTES, code)
  assert raw.shape == (255, 0)                       # no raw bytes at all
  assert sym[0] == fmt.ZERO_SYMBOL                   # +0 is ZERO
  want = ((ALL_BYTES.astype(np.int64) << 1) | (ALL_BYTES >> 7)) & 0xFF
  np.testing.assert_array_equal(sym[1:], want[1:])
  assert sym[0x80] == 1 and 0 not in sym             # -0 is symbol 1; symbol 0 is never produced
  assert np.array_equal(ref.merge_symbols(sym, raw, code), ALL_BYTES)


@pytest.mark.parametrize("dtype,name", CASES, ids=lambda c: ids(c) if not isinstance(c, str) else c)
def test_reference_round_trip_and_modes(dtype, name):
  x = inputs(dtype)[name].view(dtype)
  for checksum in (False, True):
    frame = ref.encode(x, checksum=checksum)
    assert len(frame) <= fmt.max_encoded_bytes(x.size, dtype)
    assert frame[5] == fmt.dtype_code(dtype) and frame[4] == fmt.VERSION
    assert np.array_equal(u8(ref.decode(frame, shape=x.shape, dtype=dtype)), u8(x))
  modes = [b["mode"] for b in ref.frame_info(frame)["blocks"]]
  expect = {"all_patterns": [0], "const_nan": [1, 1], "const_neg_zero": [1], "zeros": [1],
            "one": [1], "empty": [], "random": [0], "gauss_two_blocks": [2, 2]}
  if name in expect:
    assert modes == expect[name]
  else:
    assert modes == [2]


def _huff_frame(dtype):
  x = inputs(dtype)["all_patterns_in_huff"].view(dtype)
  frame = bytearray(ref.encode(x))
  assert frame[BLOCK0] == fmt.MODE_HUFF
  return x, frame


@pytest.mark.parametrize("dtype", [E4M3FN, E5M2], ids=ids)
def test_huff_block_has_no_raw_region(dtype):
  x, frame = _huff_frame(dtype)
  at = BLOCK0 + fmt.BLOCK_HEADER_BYTES
  lo, hi = frame[at], frame[at + 1]
  table = 2 + (hi - lo + 2 + 1) // 2
  n_segs = -(-x.size // fmt.SEGMENT_ELEMS)
  sdir = np.frombuffer(bytes(frame[at + table:at + table + 4 * n_segs]), "<u2").reshape(-1, 2)
  units = int(sdir[:, 0].sum())
  assert int(sdir[:, 1].sum()) == np.count_nonzero(u8(x))
  assert len(frame) == at + table + 4 * n_segs + 2 * units   # r = 0: nothing after the units


def _rejections(dtype):
  """(name, frame, reason regex): FP8 frames that break FORMAT.md's rules."""
  x, huff = _huff_frame(dtype)
  low16 = bytearray(huff)
  low16[BLOCK0 + 1] = fmt.BLOCK_FLAG_LOW16
  const = bytearray(ref.encode(np.full(10, 0x3C, np.uint8).view(dtype)))
  const[BLOCK0 + 5] = 1                            # bit 8 of the CONST value: reserved for w = 1
  as_bf16 = bytearray(huff)
  as_bf16[5] = fmt.DTYPE_BF16
  unknown = bytearray(huff)
  unknown[5] = 12                                  # a code no decoder knows
  return x, [("low16_flag", low16, "not allowed for a HUFF block"),
             ("const_upper_bits", const, "reserved upper 24 bits"),
             ("dtype_mismatch", as_bf16, "dtype mismatch"),
             ("unknown_dtype", unknown, "invalid dtype code"),
             ("truncated", huff[:-1], "truncated"),
             ("short", huff[:20], "truncated")]


@pytest.mark.parametrize("dtype", [E4M3FN, E5M2], ids=ids)
def test_reference_and_cpu_reject_bad_fp8_frames(dtype):
  x, cases = _rejections(dtype)
  for name, frame, reason in cases:
    n = 10 if name == "const_upper_bits" else x.size
    with pytest.raises(ValueError, match=reason):
      ref.decode(bytes(frame), shape=(n,), dtype=dtype)
    with pytest.raises(Exception):
      c_decode(frame, n, dtype)


def test_fp8_frame_is_rejected_by_a_16_bit_decoder():
  """FORMAT.md "Versioning": a decoder asked for a v1-original dtype rejects codes 4-11 at the header."""
  for dtype in FP8:
    x = inputs(dtype)["gauss_two_blocks"][:4096]
    frame = ref.encode(x.view(dtype))
    for other in (ml_dtypes.bfloat16, np.float16):
      with pytest.raises(ValueError, match="dtype mismatch"):
        ref.decode(frame, shape=(2048,), dtype=other)
      out = np.zeros(4096, np.uint8)
      with pytest.raises(Exception, match="dtype"):
        ext.decode_host(np.frombuffer(frame, np.uint8), fmt.dtype_code(other), 2048, out)


def test_unsupported_dtypes_raise_type_error_naming_the_set():
  x = jnp.zeros(8, jnp.float4_e2m1fn)
  for bad in (x, jnp.zeros(8, jnp.int8), jnp.zeros(8, jnp.uint8)):
    with pytest.raises(TypeError, match="float8_e4m3fn, float8_e5m2"):
      zj.encode(bad)
  with pytest.raises(TypeError, match="float8_e5m2"):
    zj.max_encoded_bytes(8, ml_dtypes.float4_e2m1fn)
  with pytest.raises(TypeError, match="bfloat16, float16, float32, float8_e4m3fn"):
    zj.decode(jnp.zeros(64, jnp.uint8), shape=(8,), dtype=jnp.int8)


# --------------------------------------------------------------------------- CPU driver


@pytest.mark.parametrize("dtype,name", CASES, ids=lambda c: ids(c) if not isinstance(c, str) else c)
def test_cpu_driver_writes_the_reference_bytes(dtype, name):
  x = inputs(dtype)[name].view(dtype)
  for checksum in (False, True):
    frame = ref.encode(x, checksum=checksum)
    assert c_encode(x, checksum) == frame
    assert np.array_equal(c_decode(frame, x.size, dtype), u8(x))


@pytest.mark.parametrize("dtype", FP8, ids=ids)
def test_max_encoded_bytes(dtype):
  for n in (0, 1, 65536, 65537, 10**6):
    nb = -(-n // 65536)
    assert zj.max_encoded_bytes(n, dtype) == 32 + 12 * nb + n
    assert zj.max_encoded_bytes(n, dtype) == ext.max_encoded_bytes(n, fmt.dtype_code(dtype))


# --------------------------------------------------------------------------- JAX API


@pytest.mark.parametrize("dtype", FP8, ids=ids)
def test_jax_encode_decode_every_bit_pattern(dtype):
  for name in ("all_patterns", "all_patterns_in_huff", "const_nan", "zero_padded"):
    x = inputs(dtype)[name].view(dtype).reshape(-1, 1)
    payload, nbytes = zj.encode(jnp.asarray(x), checksum=True)
    frame = np.asarray(payload)[:int(nbytes)].tobytes()
    assert frame == ref.encode(x, checksum=True), name
    y = jax.jit(lambda p: zj.decode(p, shape=x.shape, dtype=dtype))(payload)
    assert y.dtype == dtype and y.shape == x.shape
    assert np.array_equal(u8(np.asarray(y)), u8(x)), name


@pytest.mark.parametrize("dtype", [E4M3FN, E5M2], ids=ids)
def test_vmap_and_jit_code_each_row(dtype):
  rows = np.stack([inputs(dtype)["all_patterns_in_huff"][:3000], inputs(dtype)["zero_padded"][:3000],
                   inputs(dtype)["const_nan"][:3000]]).view(dtype)
  payload, nbytes = jax.jit(jax.vmap(zj.encode))(jnp.asarray(rows))
  for f in range(rows.shape[0]):
    assert np.asarray(payload[f])[:int(nbytes[f])].tobytes() == ref.encode(rows[f]), f
  y = jax.vmap(lambda p: zj.decode(p, shape=(3000,), dtype=dtype))(payload)
  assert np.array_equal(u8(np.asarray(y)), u8(rows))


@pytest.mark.parametrize("dtype", [E4M3FN, E5M2], ids=ids)
def test_jax_frames_skip_and_status(dtype):
  rows = np.stack([inputs(dtype)["all_patterns_in_huff"][:4800], inputs(dtype)["random"][:4800],
                   inputs(dtype)["zero_padded"][:4800]]).view(dtype)
  skip = jnp.array([False, True, False])
  payload, nbytes = codec.encode_frames(jnp.asarray(rows), skip=skip)
  assert int(nbytes[1]) == 0 and not np.asarray(payload[1]).any()
  for f in (0, 2):
    assert np.asarray(payload[f])[:int(nbytes[f])].tobytes() == ref.encode(rows[f])
  # The frames are read on the host (np.asarray first, then the row): XLA:CPU of jax 0.11+ rewrites a
  # float8_e5m2 NaN's payload when it slices a device array (0x7E comes out 0x7F), which would hide the bits
  # the decoder wrote.
  out = np.asarray(codec.decode_frames(payload, shape=(4800,), dtype=dtype, skip=skip))
  assert np.array_equal(u8(out[0]), u8(rows[0]))
  assert not u8(out[1]).any()
  # A corrupted frame: status, and its whole row is the dtype's fill NaN; the others are untouched.
  bad = np.asarray(payload).copy()
  bad[2, BLOCK0] = 7                               # an unknown block mode
  out, status = codec.decode_frames(jnp.asarray(bad), shape=(4800,), dtype=dtype, skip=skip,
                                    return_status=True)
  out, status = np.asarray(out), np.asarray(status)
  assert status[0] == 0 and status[1] == 0 and status[2] != 0
  assert codec.status_message(status[2]) == "unknown block mode or invalid block flags"
  fill = codec.REJECTED_FILL_BITS[np.dtype(dtype)]
  assert np.isnan(np.array([fill], np.uint8).view(dtype).astype(np.float32))[0]
  assert np.all(u8(out[2]) == fill)
  assert np.array_equal(u8(out[0]), u8(rows[0]))
  with pytest.raises(Exception, match="unknown block mode"):
    jax.block_until_ready(codec.decode_frames(jnp.asarray(bad), shape=(4800,), dtype=dtype,
                                              skip=skip))


@pytest.mark.parametrize("dtype", FP8, ids=ids)
def test_fill_bits_are_a_nan_and_match_the_extension(dtype):
  fill = codec.REJECTED_FILL_BITS[np.dtype(dtype)]
  assert np.isnan(np.array([fill], np.uint8).view(dtype).astype(np.float32))[0]
  assert ext.rejected_fill_bits(fmt.dtype_code(dtype)) == fill
  x = inputs(dtype)["gauss_two_blocks"][:3000].view(dtype)
  payload, _ = zj.encode(jnp.asarray(x))
  out, status = zj.decode(payload[:100], shape=x.shape, dtype=dtype, return_status=True)
  assert int(status) != 0 and np.all(u8(np.asarray(out)) == fill)   # truncated


@pytest.mark.parametrize("dtype", [E4M3FN, E5M2], ids=ids)
def test_truncated_payload_raises(dtype):
  x = inputs(dtype)["gauss_two_blocks"][:5000].view(dtype)
  payload, nbytes = zj.encode(jnp.asarray(x))
  with pytest.raises(Exception, match="truncated"):
    jax.block_until_ready(zj.decode(payload[:int(nbytes) - 1], shape=x.shape, dtype=dtype))
  small, need = zj.encode(jnp.asarray(x), capacity=64)          # overflow: header only
  assert int(need) > 64
  with pytest.raises(Exception, match="truncated"):
    jax.block_until_ready(zj.decode(small, shape=x.shape, dtype=dtype))


# --------------------------------------------------------------------------- corruption


@pytest.mark.parametrize("dtype", [E4M3FN, E5M2], ids=ids)
def test_damaged_frames_same_verdict_everywhere(dtype):
  """Random bit flips: the reference and the CPU driver accept or reject alike, with the same bits;
  with CHECKSUM every flip is rejected."""
  rng = np.random.default_rng(17)
  x = inputs(dtype)["zero_padded"][:5000].view(dtype)
  for checksum in (False, True):
    frame = np.frombuffer(ref.encode(x, checksum=checksum), np.uint8)
    for _ in range(60):
      bad = frame.copy()
      pos = int(rng.integers(0, bad.size))
      bad[pos] ^= np.uint8(1 << int(rng.integers(0, 8)))
      try:
        want = u8(ref.decode(bad, shape=x.shape, dtype=dtype))
      except ValueError:
        want = None
      if checksum:
        assert want is None, pos
      try:
        got = c_decode(bad, x.size, dtype)
      except Exception:
        got = None
      assert (want is None) == (got is None), pos
      if want is not None:
        assert np.array_equal(want, got), pos


# --------------------------------------------------------------------------- emulated CUDA


def _emu_encode(rows: np.ndarray, dtype, checksum: bool, cap: int, seed=0):
  frames, n = rows.shape
  out = np.random.default_rng(seed).integers(0, 256, frames * cap, dtype=np.uint8)
  nbytes = np.full(frames, -1, np.int64)
  HOST.emulate_encode(u8(rows), frames, n, fmt.dtype_code(dtype), checksum, out, nbytes, seed)
  return out.reshape(frames, cap), nbytes


def _emu_decode(payload: np.ndarray, dtype, n: int, seed=0):
  frames = payload.shape[0]
  out = np.random.default_rng(seed).integers(0, 256, frames * n, dtype=np.uint8)
  status = np.full(frames, -1, np.int32)
  HOST.emulate_decode(u8(payload), frames, fmt.dtype_code(dtype), n, out, status, seed)
  return out.reshape(frames, n), status


@needs_host
@pytest.mark.parametrize("dtype", FP8, ids=ids)
def test_emulated_kernels_every_bit_pattern(dtype):
  """Odd capacity: frames start at every alignment; garbage-filled device memory."""
  d = inputs(dtype)
  n = 4801
  rows = np.stack([d["all_patterns_in_huff"][:n], d["random"][:n], d["zero_padded"][:n],
                   np.resize(ALL_BYTES, n), d["const_nan"][:n]])
  cap = fmt.max_encoded_bytes(n, dtype) + 3
  for checksum in (False, True):
    payload, nbytes = _emu_encode(rows, dtype, checksum, cap, seed=int(checksum) + 1)
    for f in range(rows.shape[0]):
      frame = ref.encode(rows[f].view(dtype), checksum=checksum)
      assert nbytes[f] == len(frame) and payload[f, :len(frame)].tobytes() == frame, f
      assert not payload[f, len(frame):].any()
    out, status = _emu_decode(payload, dtype, n, seed=3)
    assert not status.any()
    assert np.array_equal(out, rows)


@needs_host
@pytest.mark.parametrize("dtype", [E4M3FN, E5M2], ids=ids)
def test_emulated_kernels_two_blocks(dtype):
  rows = inputs(dtype)["gauss_two_blocks"][None]
  cap = fmt.max_encoded_bytes(rows.shape[1], dtype)
  payload, nbytes = _emu_encode(rows, dtype, False, cap)
  assert payload[0, :nbytes[0]].tobytes() == c_encode(rows[0].view(dtype))
  out, status = _emu_decode(payload, dtype, rows.shape[1])
  assert status[0] == 0 and np.array_equal(out[0], rows[0])


@needs_host
@pytest.mark.parametrize("dtype", [E4M3FN, E5M2], ids=ids)
def test_emulated_decoder_rejects_like_the_cpu(dtype):
  """Damaged frames: the emulated kernels give the CPU handler's status and bits (fill NaN)."""
  rng = np.random.default_rng(5)
  x = inputs(dtype)["zero_padded"][:4500].view(dtype)
  frame = np.frombuffer(ref.encode(x), np.uint8)
  cap = frame.size + 5
  rows = []
  for _ in range(24):
    bad = np.zeros(cap, np.uint8)
    bad[:frame.size] = frame
    pos = int(rng.integers(0, frame.size))
    bad[pos] ^= np.uint8(1 << int(rng.integers(0, 8)))
    rows.append(bad)
  trunc = np.zeros(cap, np.uint8)
  trunc[:frame.size - 9] = frame[:frame.size - 9]
  trunc[16:24] = np.frombuffer(np.uint64(cap + 1).tobytes(), np.uint8)   # frame_bytes > readable
  rows.append(trunc)
  payload = np.stack(rows)
  out, status = _emu_decode(payload, dtype, x.size)
  cpu_out, cpu_status = codec.decode_frames(jnp.asarray(payload), shape=x.shape, dtype=dtype,
                                            return_status=True)
  np.testing.assert_array_equal(status, np.asarray(cpu_status))
  np.testing.assert_array_equal(out, u8(np.asarray(cpu_out)).reshape(out.shape))
  assert status[-1] == 1 and status.any()


# --------------------------------------------------------------------------- ratio bar


def _held_out() -> dict[str, np.ndarray]:
  """float32 tensors the codec was not tuned on: the tests/data slices and fresh random tensors."""
  out = {}
  for p in sorted(DATA.glob("*.npy")):
    a = np.load(p)
    out[p.name] = (a.view(ml_dtypes.bfloat16) if a.dtype == np.uint16 else a).astype(np.float32)
  rng = np.random.default_rng(20261123)
  out["gauss"] = rng.normal(size=1 << 18).astype(np.float32)
  out["student_t4"] = rng.standard_t(4, size=1 << 18).astype(np.float32)
  rows = rng.normal(size=(512, 256)).astype(np.float32)
  rows[rng.random(512) < 0.4] = 0                  # capacity-padded dispatch buffer
  out["dispatch_padded"] = rows.ravel()
  return out


@pytest.mark.parametrize("dtype,bar", [(E4M3FN, 1.22), (E5M2, 1.42)], ids=["e4m3fn", "e5m2"])
def test_ratio_bar_on_held_out_tensors(dtype, bar):
  raw = coded = 0
  for name, x in _held_out().items():
    q = amax_cast(x, dtype)
    frame = c_encode(q)
    assert np.array_equal(c_decode(frame, q.size, dtype), u8(q)), name
    raw += q.size
    coded += len(frame)
  assert raw / coded >= bar, f"{dtype.name}: byte-weighted ratio {raw / coded:.3f} < {bar}"


# --------------------------------------------------------------------------- CUDA lowering and real GPU


@pytest.mark.parametrize("dtype", [E4M3FN, E5M2], ids=ids)
def test_lowering_for_cuda_has_custom_calls(dtype):
  x = jnp.zeros((3000,), dtype)
  text = jax.jit(zj.encode).trace(x).lower(lowering_platforms=("cuda",)).as_text()
  assert "stablehlo.custom_call @zipccl_encode" in text and "f8E" in text
  payload, _ = zj.encode(x)
  text = jax.jit(lambda p: zj.decode(p, shape=x.shape, dtype=dtype)).trace(payload).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "stablehlo.custom_call @zipccl_decode" in text


def _gpu_devices():
  try:
    return jax.devices("gpu")
  except RuntimeError:
    return []


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_devices(), reason="no CUDA device visible to JAX; the emulator covers the kernels")
@pytest.mark.parametrize("dtype", FP8, ids=ids)
def test_gpu_every_bit_pattern_equals_cpu_bytes(dtype):
  x = inputs(dtype)["all_patterns_in_huff"].view(dtype)
  payload, nbytes = jax.jit(zj.encode)(jax.device_put(jnp.asarray(x), _gpu_devices()[0]))
  assert np.asarray(payload)[:int(nbytes)].tobytes() == ref.encode(x)
  y = zj.decode(payload, shape=x.shape, dtype=dtype)
  assert np.array_equal(u8(np.asarray(y)), u8(x))
  out, status = zj.decode(payload[:50], shape=x.shape, dtype=dtype, return_status=True)
  assert int(status) != 0 and np.all(u8(np.asarray(out)) == codec.REJECTED_FILL_BITS[dtype])
