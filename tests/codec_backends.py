"""The codec's three executions of the CUDA path's contract, behind one interface, and the data that tests them.

tests/test_gpu.py checks every backend against the CPU driver's bytes (`encode_host`/`decode_host` of the
extension, the reference of FORMAT.md):
- "cuda": the real kernels, through JAX on a CUDA device (`codec.encode_frames`/`decode_frames`);
- "cpu": the XLA:CPU FFI handlers, through JAX on a CPU device (the same Python path as "cuda");
- "emulator": the CUDA kernel bodies and launch sequence on the SIMT emulator (`_zipccl.cuda_host`).
So the bodies of the GPU tests run on every machine ("cpu", "emulator"); only "cuda" needs a GPU.

Rows are bit patterns: `bits` is `(F, n)` of the unsigned integer of the dtype's width.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import zipccl_jax
from zipccl_jax import _ffi, codec
from zipccl_jax import format as fmt

EXT = _ffi.extension()
HOST = getattr(EXT, "cuda_host", None)
BLOCK = 65536  # elements per block (FORMAT.md)
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}
NO_CUDA = "no CUDA device visible to JAX (jax.devices('cuda') is empty)"


def cuda_devices() -> list:
  try:
    return jax.devices("cuda")
  except RuntimeError:
    return []


def device_of(backend: str):
  return cuda_devices()[0] if backend == "cuda" else jax.devices("cpu")[0]


# ---- data ------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _classes(dtype: np.dtype) -> dict[str, np.ndarray]:
  """Bit patterns of `dtype` by class: nan (every payload and sign), zero (+0, -0), subnormal, inf."""
  w = dtype.itemsize
  if w <= 2:
    pats = np.arange(1 << (8 * w), dtype=UINT[w])
  else:  # float32: every class built from the bit layout, with random mantissas
    rng = np.random.default_rng(0)
    mant = rng.integers(1, 1 << 23, 4096, dtype=np.uint32)
    sign = rng.integers(0, 2, 4096, dtype=np.uint32) << 31
    pats = np.concatenate([sign | 0x7F800000 | mant, sign | mant, np.uint32([0, 0x80000000]),
                           np.uint32([0x7F800000, 0xFF800000]), sign | 0x3F800000 | mant])
  vals = pats.view(dtype).astype(np.float32)
  tiny = float(jnp.finfo(dtype).smallest_normal)
  out = {"nan": pats[np.isnan(vals)], "zero": pats[vals == 0], "inf": pats[np.isinf(vals)],
         "subnormal": pats[(vals != 0) & (np.abs(vals) < tiny) & np.isfinite(vals)]}
  return {k: v for k, v in out.items() if v.size}  # e.g. float8_e4m3fn has no Inf, e8m0 no zero


def adversarial_bits(dtype, n: int, seed: int) -> np.ndarray:
  """n elements of `dtype` as bits: Gaussian runs (coded blocks) interleaved with runs of NaN payloads,
  +0/-0, subnormals, +-Inf and random bits (RAW-like stretches), in 257-element runs so they land inside
  streams, across stream and block borders."""
  dtype = np.dtype(dtype)
  rng = np.random.default_rng(seed)
  u = UINT[dtype.itemsize]
  out = (rng.standard_normal(n) * 0.05).astype(np.float32).astype(dtype).view(u)
  kinds = [*_classes(dtype).values(), None]  # None: random bits
  for i, at in enumerate(range(0, n, 257 * 3)):
    run = slice(at, min(at + 257, n))
    pats = kinds[i % len(kinds)]
    size = run.stop - run.start
    out[run] = (rng.integers(0, 1 << (8 * dtype.itemsize), size, dtype=np.uint64).astype(u)
                if pats is None else rng.choice(pats, size))
  return out


def sprinkled_bits(dtype, n: int, seed: int, fraction: float = 0.02) -> np.ndarray:
  """n Gaussian elements of `dtype` (std 0.02) as bits with a `fraction` of them NaN payloads, +-0,
  subnormals or +-Inf, one at a time: data that still codes (frames fit the default capacity)."""
  dtype = np.dtype(dtype)
  rng = np.random.default_rng(seed)
  out = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(dtype).view(UINT[dtype.itemsize])
  at = rng.random(n) < fraction
  out[at] = rng.choice(np.concatenate(list(_classes(dtype).values())), int(at.sum()))
  return out


# ---- the CPU driver (the reference) -----------------------------------------------------------------------


def reference_encode(row: np.ndarray, dtype, checksum: bool, cap: int) -> tuple[np.ndarray, int]:
  """The CPU driver's payload row (cap bytes; the frame, zeros after it; the header alone on overflow)
  and the frame size it needs."""
  out = np.zeros(cap, np.uint8)
  need = EXT.encode_host(np.ascontiguousarray(row).view(np.uint8), row.size,
                         fmt.dtype_code(np.dtype(dtype)), checksum, out)
  if need > cap:
    out[min(cap, 32):] = 0
  return out, need


def reference_decode(row: np.ndarray, dtype, n: int) -> tuple[np.ndarray | None, str | None]:
  """(bits, None) for a frame the CPU driver accepts, (None, its message) for one it rejects."""
  dtype = np.dtype(dtype)
  out = np.zeros(n * dtype.itemsize, np.uint8)
  try:
    EXT.decode_host(np.ascontiguousarray(row), fmt.dtype_code(dtype), n, out)
  except ValueError as e:
    return None, str(e)
  return out.view(UINT[dtype.itemsize]), None


# ---- the backends -----------------------------------------------------------------------------------------


def encode_rows(backend: str, bits: np.ndarray, dtype, *, checksum: bool, cap: int, skip=None,
                seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """(payload uint8 (F, cap), nbytes int64 (F,)) of the rows `bits` (F, n) coded by `backend`."""
  dtype = np.dtype(dtype)
  frames, n = bits.shape
  if backend == "emulator":
    rng = np.random.default_rng(seed)
    out = rng.integers(0, 256, frames * cap, dtype=np.uint8)  # device memory is not zeroed
    nbytes = np.full(frames, -1, np.int64)
    kw = {} if skip is None else {"skip": np.asarray(skip, np.uint8)}
    HOST.emulate_encode(np.ascontiguousarray(bits).view(np.uint8).ravel(), frames, n,
                        fmt.dtype_code(dtype), checksum, out, nbytes, seed, **kw)
    return out.reshape(frames, cap), nbytes
  dev = device_of(backend)
  x = jax.device_put(np.ascontiguousarray(bits).view(dtype), dev)
  s = None if skip is None else jax.device_put(np.asarray(skip, bool), dev)
  fn = jax.jit(lambda x, s: codec.encode_frames(x, capacity=cap, checksum=checksum, skip=s))
  payload, nbytes = fn(x, s)
  return np.asarray(payload), np.asarray(nbytes).astype(np.int64)


def decode_rows(backend: str, payload: np.ndarray, dtype, n: int, *, skip=None,
                seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """(bits (F, n), status int32 (F,)) of decoding the payload rows with `backend` (status: 0 or the
  code of the first error, `codec.status_message(code)`)."""
  dtype = np.dtype(dtype)
  frames = payload.shape[0]
  u = UINT[dtype.itemsize]
  if backend == "emulator":
    rng = np.random.default_rng(seed)
    out = rng.integers(0, 256, frames * n * dtype.itemsize, dtype=np.uint8)
    status = np.full(frames, -1, np.int32)
    kw = {} if skip is None else {"skip": np.asarray(skip, np.uint8)}
    HOST.emulate_decode(np.ascontiguousarray(payload).ravel(), frames, fmt.dtype_code(dtype), n, out,
                        status, seed, **kw)
    return out.view(u).reshape(frames, n), status
  dev = device_of(backend)
  p = jax.device_put(payload, dev)
  s = None if skip is None else jax.device_put(np.asarray(skip, bool), dev)
  fn = jax.jit(lambda p, s: codec.decode_frames(p, shape=(n,), dtype=dtype, skip=s, return_status=True))
  out, status = fn(p, s)
  return np.asarray(out).view(u).reshape(frames, n), np.asarray(status)


def rejected_fill(dtype) -> int:
  return EXT.rejected_fill_bits(fmt.dtype_code(np.dtype(dtype)))


def max_encoded_bytes(n: int, dtype) -> int:
  return zipccl_jax.max_encoded_bytes(n, np.dtype(dtype))
