"""Inputs and frames larger than 2^31 bytes: no size or offset may overflow 32 bits anywhere.

N = 2^30 + 2^25 + 12345 bfloat16 elements (2.21 GB; 16897 blocks, the last one partial). The data is mostly
incompressible (random bits: RAW blocks), so the *frame* is larger than 2^31 bytes too. HUFF blocks (Gaussian,
dense and sparse), CONST blocks and RAW blocks sit on both sides of byte offset 2^31 of the input and of the
frame, with unique data around those offsets (the random background repeats with a period that does not divide
2^30), so that an offset or size truncated to 32 bits reads or writes the wrong place and breaks bit-exactness.

  - host path: `_zipccl.encode_host` / `decode_host` with the checksum on (XXH32 over > 2^31 bytes), a flipped
    bit near the end detected, truncation past 2^31 reported;
  - FFI path with `jax_enable_x64`: `encode_frames` -> int64 nbytes > 2^31 -> `decode_frames`, bit-exact, and
    byte-identical to the host frame at its start and end; without x64 the encode reports that it needs int64
    sizes instead of wrapping.

Peak memory is about 9 GB (input, its JAX copy, payload, output); buffers are freed between the steps. Run it
alone: `pytest tests/test_huge.py`.
"""
from __future__ import annotations

import gc
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from zipccl_jax import _zipccl as ext
from zipccl_jax import codec
from zipccl_jax import format as fmt

BF16 = np.dtype(ml_dtypes.bfloat16)
B = fmt.BLOCK_ELEMS
N = (1 << 30) + (1 << 25) + 12345
NB = fmt.num_blocks(N)          # 16897
HALF = (1 << 30) // B           # block 16384 starts at input byte offset 2^31
CHUNK = 1 << 26                 # elements per comparison step (128 MB of bfloat16)


def _available_bytes() -> int:
  try:
    with open("/proc/meminfo") as f:
      info = dict(line.split(":", 1) for line in f)
    return int(info["MemAvailable"].split()[0]) * 1024
  except (OSError, KeyError, ValueError):  # pragma: no cover
    return 1 << 40


def _gauss_bf16(n, seed, scale=1.0):
  rng = np.random.default_rng(seed)
  return (rng.standard_normal(n, dtype=np.float32) * scale).astype(BF16).view(np.uint16)


def _make_input() -> np.ndarray:
  """uint16 bit patterns of N bfloat16 elements (layout in the module docstring)."""
  rng = np.random.default_rng(2026)
  period = (1 << 24) + 12347  # not a divisor of 2^30: a wrapped offset sees different data
  x = np.resize(rng.integers(0, 1 << 16, period, dtype=np.uint16), N)
  blk = lambda b0, b1: slice(b0 * B, min(b1 * B, N))
  x[blk(0, 1)] = _gauss_bf16(B, 6)                        # HUFF
  x[blk(1, 2)] = 0x8000                                   # CONST -0.0
  # Around input offset 2^31: HUFF, HUFF | RAW (unique), RAW (unique), HUFF (sparse, tiny scale).
  x[blk(HALF - 2, HALF)] = _gauss_bf16(2 * B, 1)
  x[blk(HALF, HALF + 2)] = rng.integers(0, 1 << 16, 2 * B, dtype=np.uint16)
  x[blk(HALF + 2, HALF + 3)] = _gauss_bf16(B, 2, scale=3e-3)
  # Past frame offset 2^31: CONST, RAW background, sparse HUFF blocks, the partial last block (HUFF).
  x[blk(NB - 47, NB - 45)] = 0x3F80
  s = _gauss_bf16(36 * B, 3)
  s[np.random.default_rng(4).random(s.size) < 0.3] = 0
  x[blk(NB - 37, NB - 1)] = s
  x[blk(NB - 1, NB)] = _gauss_bf16(N - (NB - 1) * B, 5)
  return x


def _assert_equal_chunked(a: np.ndarray, b: np.ndarray, what: str) -> None:
  assert a.shape == b.shape, what
  for lo in range(0, a.size, CHUNK):
    if not np.array_equal(a[lo: lo + CHUNK], b[lo: lo + CHUNK]):
      bad = np.flatnonzero(a[lo: lo + CHUNK] != b[lo: lo + CHUNK])
      raise AssertionError(f"{what}: {bad.size} elements differ, first at {lo + int(bad[0])}")


def _check_frame(frame: np.ndarray, nbytes: int) -> None:
  u64 = lambda off: int(frame[off: off + 8].view("<u8")[0])
  assert u64(8) == N and u64(16) == nbytes > (1 << 31)
  nb = fmt.num_blocks(N)
  sizes = frame[32: 32 + 4 * nb].view("<u4").astype(np.int64)
  offs = 32 + 4 * nb + np.concatenate([[0], np.cumsum(sizes)[:-1]])
  assert 32 + 4 * nb + int(sizes.sum()) == nbytes
  modes = frame[offs]
  H, C, R = fmt.MODE_HUFF, fmt.MODE_CONST, fmt.MODE_RAW
  assert list(modes[:3]) == [H, C, R]
  assert list(modes[HALF - 2: HALF + 4]) == [H, H, R, R, H, R]
  assert list(modes[NB - 48: NB - 44]) == [R, C, C, R] and (modes[NB - 37:] == H).all()
  # Frame offset 2^31 falls among the RAW blocks after the input's 2^31; every block type lies beyond it.
  beyond = offs > (1 << 31)
  assert 0 < beyond.sum() < NB - HALF
  assert {H, C, R} <= set(modes[beyond].tolist()) and {H, C, R} <= set(modes[~beyond].tolist())


@pytest.fixture(scope="module")
def x():
  if _available_bytes() < (12 << 30):
    pytest.skip("needs ~12 GB of free memory (peak ~9 GB)")
  t = time.perf_counter()
  a = _make_input()
  print(f"\ninput: {a.nbytes / 1e9:.3f} GB in {time.perf_counter() - t:.1f} s")
  yield a
  del a
  gc.collect()


_HOST: dict = {}  # nbytes and the first/last 4096 bytes of the host frame, for the FFI comparison


def _host_frame_ends(x) -> dict:
  if not _HOST:
    payload = np.empty(ext.max_encoded_bytes(N, fmt.DTYPE_BF16), np.uint8)
    nbytes = ext.encode_host(x.view(np.uint8), N, fmt.DTYPE_BF16, True, payload)
    _HOST.update(nbytes=nbytes, head=payload[:4096].copy(), tail=payload[nbytes - 4096: nbytes].copy())
    del payload
    gc.collect()
  return _HOST


@pytest.mark.slow
def test_huge_host_roundtrip_with_checksum(x):
  cap = ext.max_encoded_bytes(N, fmt.DTYPE_BF16)
  assert cap > (1 << 31)
  payload = np.empty(cap, np.uint8)
  t = time.perf_counter()
  nbytes = ext.encode_host(x.view(np.uint8), N, fmt.DTYPE_BF16, True, payload)
  t_enc = time.perf_counter() - t
  assert (1 << 31) < nbytes <= cap
  frame = payload[:nbytes]
  _check_frame(frame, nbytes)
  _HOST.update(nbytes=nbytes, head=frame[:4096].copy(), tail=frame[nbytes - 4096:].copy())
  out = np.empty(N, np.uint16)
  t = time.perf_counter()
  ext.decode_host(frame, fmt.DTYPE_BF16, N, out.view(np.uint8))
  t_dec = time.perf_counter() - t
  _assert_equal_chunked(out, x, "host round trip")
  # The checksum covers bytes past 2^31: a flip near the end is detected.
  frame[nbytes - 5] ^= 0x20
  with pytest.raises(ValueError, match="checksum"):
    ext.decode_host(frame, fmt.DTYPE_BF16, N, out.view(np.uint8))
  frame[nbytes - 5] ^= 0x20
  # Cut past 2^31: still "truncated".
  with pytest.raises(ValueError, match="truncated"):
    ext.decode_host(frame[: nbytes - 1], fmt.DTYPE_BF16, N, out.view(np.uint8))
  print(f"host: frame {nbytes / 1e9:.3f} GB, encode {t_enc:.1f} s, decode {t_dec:.1f} s")
  del payload, frame, out
  gc.collect()


@pytest.mark.slow
def test_huge_ffi_roundtrip_with_x64(x):
  host = _host_frame_ends(x)
  xj = jnp.asarray(x.view(BF16))
  with jax.enable_x64(True):
    @jax.jit
    def roundtrip(v):
      p, nb = codec.encode_frames(v[None], checksum=True)
      y = codec.decode_frames(p, shape=(N,), dtype=jnp.bfloat16)[0]
      return y, nb[0], p[0, :4096], jax.lax.dynamic_slice(p[0], (nb[0] - 4096,), (4096,))

    t = time.perf_counter()
    y, nbytes, head, tail = roundtrip(xj)
    y.block_until_ready()
    t_rt = time.perf_counter() - t
    assert nbytes.dtype == jnp.int64 and int(nbytes) == host["nbytes"] > (1 << 31)
    # The FFI frame is the host frame, byte for byte, at both ends.
    assert np.array_equal(np.asarray(head), host["head"])
    assert np.array_equal(np.asarray(tail), host["tail"])
    _assert_equal_chunked(np.asarray(y).view(np.uint16), x, "FFI round trip (x64)")
    del y
    gc.collect()
    print(f"ffi x64: frame {int(nbytes) / 1e9:.3f} GB, encode+decode {t_rt:.1f} s")
    # Overflow at 64-bit sizes: a 64-byte capacity reports the whole size and holds only the header.
    p, nb = codec.encode_frames(xj[None], capacity=64)
    assert int(nb[0]) == host["nbytes"] and int(np.asarray(p)[0, 16:24].view("<u8")[0]) == host["nbytes"]
    assert not np.asarray(p)[0, 32:].any()

  # Without x64 the size does not fit int32: the encode says so instead of wrapping.
  with jax.enable_x64(False):
    with pytest.raises(jax.errors.JaxRuntimeError, match="jax_enable_x64"):
      _, nb = codec.encode_frames(xj[None], capacity=64)
      nb.block_until_ready()
  del xj
  gc.collect()
