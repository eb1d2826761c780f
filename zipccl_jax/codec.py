"""Jittable encode/decode: `jax.ffi.ffi_call` wrappers with static output shapes.

The payload of one frame is a uint8 vector of static length (by default
`max_encoded_bytes(x.size, x.dtype)`); the frame itself occupies the prefix of
`nbytes` bytes. FORMAT.md describes the bytes.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from zipccl_jax import _ffi
from zipccl_jax import format as fmt

__all__ = ["encode", "decode", "encode_frames", "decode_frames", "decode_frames_into",
           "max_encoded_bytes", "frame_bytes_of", "poison_overflow", "any_overflow",
           "status_messages", "status_message", "STATUS_OK", "REJECTED_FILL_BITS"]

max_encoded_bytes = fmt.max_encoded_bytes
# The bits of the quiet NaN that fills a rejected frame's output row (format.py holds them).
REJECTED_FILL_BITS = fmt.REJECTED_FILL_BITS


def _nbytes_dtype():
  return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32


def _result(like, shape, dtype):
  """A result type for `shape`/`dtype` that carries `like`'s manual-axis type.

  Inside `jax.shard_map` every value is per-device ("varying"); an ffi_call
  result must say so too, or custom_vjp/grad reject it.
  """
  aval = jax.typeof(like)
  manual = getattr(aval, "manual_axis_type", None)
  sharding = getattr(aval, "sharding", None)
  mesh = getattr(sharding, "mesh", None)
  if manual is not None and mesh is not None and getattr(mesh, "axis_names", ()):
    try:
      return jax.ShapeDtypeStruct(
          shape, dtype, manual_axis_type=manual,
          sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    except (TypeError, ValueError):
      pass
  return jax.ShapeDtypeStruct(shape, dtype)


def _vary_together(*arrays):
  """`arrays`, each pcast to the union of their varying manual axes (inside `shard_map`).

  An ffi_call result takes its varying axes from one operand (`_result`); when
  `skip` varies over an axis the data does not (e.g. `arange(n) == axis_index`
  with a replicated `x`), the results must vary over it too. A no-op outside
  shard_map and with check_vma off (no varying axes).
  """
  try:
    varying = [frozenset(jax.typeof(a).mat.varying) for a in arrays]
  except AttributeError:  # pragma: no cover - JAX without manual axis types
    return arrays
  union = frozenset().union(*varying)
  return tuple(
      jax.lax.pcast(a, tuple(sorted(union - v, key=str)), to="varying") if union - v else a
      for a, v in zip(arrays, varying))


def _codec_call(target: str, results: tuple, scratch, operands: tuple, aliases=None,
                **attrs) -> tuple:
  """`jax.ffi.ffi_call(target, results)(*operands, **attrs)`, with on CUDA one more result, `scratch`.

  The CUDA handlers take their working memory as a last result, `uint8[scratch bytes]`, that XLA
  allocates like any buffer (so they allocate nothing at run time and XLA may capture them into a
  command buffer); the CPU handlers need none. `lax.platform_dependent` stages both calls and lowering
  keeps the one of the platform it lowers for (a single-platform lowering holds one custom call, in a
  conditional on a constant that XLA removes). The scratch is dropped: the results are `results`'.
  Both calls batch the same way under `jax.vmap` (`broadcast_all`: a batched call's scratch is the
  batch size times the unbatched one, never less than the batched call needs: each section of the
  layout grows linearly with the frames and is rounded up per call). `aliases`: ffi_call's
  ``input_output_aliases`` (the scratch comes after every aliased result).
  """
  def branch(result_types):
    def run(*ops):
      out = jax.ffi.ffi_call(target, result_types, vmap_method="broadcast_all",
                             input_output_aliases=aliases)(*ops, **attrs)
      return tuple(out)[:len(results)]
    return run

  return tuple(jax.lax.platform_dependent(
      *operands, cuda=branch((*results, scratch)), default=branch(results)))


def _scratch(like, op: str, frames: int, n: int):
  """The CUDA handler's scratch result for `frames` frames of `n` elements: its size is the extension's
  (`cuda_scratch_bytes`, from the same C++ layout the handler checks it against)."""
  nbytes = int(_ffi.extension().cuda_scratch_bytes(op, frames, n))
  return _result(like, (nbytes,), jnp.uint8)


def _check_capacity(capacity, default: int) -> int:
  if capacity is None:
    return default
  if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
    raise TypeError(f"zipccl_jax: capacity must be an int number of bytes, got {capacity!r}")
  capacity = int(capacity)
  if capacity < fmt.FRAME_HEADER_BYTES:
    raise ValueError(
        f"zipccl_jax: capacity must be >= {fmt.FRAME_HEADER_BYTES} bytes (one frame header), "
        f"got {capacity}")
  return capacity


def _as_coded_array(x, arg: str):
  """`x` as a jax array, after checking its own dtype (before any x64 narrowing)."""
  dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
  fmt.dtype_code(dtype, arg=arg)
  return jnp.asarray(x)


def _check_skip(skip, frames: int, fn: str, expected: str):
  """`skip` as a bool jax array of shape `(frames,)`, or None; raises naming the argument."""
  if skip is None:
    return None
  dtype = skip.dtype if hasattr(skip, "dtype") else np.asarray(skip).dtype
  if dtype != np.bool_:
    raise TypeError(
        f"zipccl_jax: {fn} skip must be a bool array of shape {expected} = ({frames},) "
        f"(one flag per frame), got dtype {dtype}")
  skip = jnp.asarray(skip)
  if skip.shape != (frames,):
    raise ValueError(
        f"zipccl_jax: {fn} skip must have shape {expected} = ({frames},) (one flag per frame), "
        f"got {skip.shape}")
  return skip


def encode_frames(x, *, capacity: int | None = None, checksum: bool = False, skip=None):
  """Codes each row `x[f]` as its own frame, in one FFI call.

  Args:
    x: array of shape `(F, *s)` and a coded dtype (`format.SUPPORTED_NAMES`:
      bfloat16, float16, float32 and the one-byte float8 dtypes).
    capacity: bytes reserved per frame; default `max_encoded_bytes(prod(s), dtype)`,
      which always fits. A smaller capacity may overflow: see `encode`.
    checksum: append an XXH32 checksum to every frame (verified on decode).
    skip: optional bool array of shape `(F,)` (`x.shape[:1]`; for the `(F, n)` rows
      of the collectives that is `x.shape[:-1]`), may be traced. Where `skip[f]`
      is True, row `f` is not coded at all: `payload[f]` is all zeros and
      `nbytes[f] == 0` (a skipped frame is not a frame; decoding it needs
      `decode_frames(..., skip=...)`). Other rows are byte-identical to coding
      without `skip`. The collectives skip the chunk a device sends to itself.

  Returns:
    `(payload, nbytes)`: uint8 `(F, capacity)` and int32 `(F,)` (int64 with x64).
  """
  x = _as_coded_array(x, "x")
  if x.ndim < 1:
    raise ValueError("zipccl_jax: encode_frames needs x with a leading frame axis, got a scalar")
  frames = x.shape[0]
  n = math.prod(x.shape[1:])
  cap = _check_capacity(capacity, fmt.max_encoded_bytes(n, x.dtype))
  skip = _check_skip(skip, frames, "encode_frames", "x.shape[:1]")
  _ffi.register()
  operands = (x,) if skip is None else _vary_together(x, skip)
  x = operands[0]
  payload, nbytes = _codec_call(
      _ffi.ENCODE_TARGET,
      (_result(x, (frames, cap), jnp.uint8), _result(x, (frames,), _nbytes_dtype())),
      _scratch(x, "encode", frames, n), operands, checksum=bool(checksum))
  return payload, nbytes


STATUS_OK = 0


def status_messages() -> dict[int, str]:
  """`{code: message}` for every status code of the decoders' status result.

  0 is `"ok"`; the others are the `Status` codes of xla_ffi/codec/format.h, with
  the messages a raising decode uses (e.g. 1 truncated, 2 bad magic, 9 checksum
  mismatch). Read from the compiled extension.
  """
  return dict(_ffi.extension().status_messages())


def status_message(code) -> str:
  """The message of one status code (`"ok"` for 0, `"unknown error"` for an unknown code)."""
  return status_messages().get(int(code), "unknown error")


def decode_frames(payload, *, shape: Sequence[int], dtype, skip=None, return_status: bool = False):
  """Inverse of `encode_frames`: `(F, C)` uint8 payload -> `(F, *shape)` array.

  Args:
    payload: uint8 `(F, C)`, frame `f` in the prefix of row `f`.
    shape, dtype: what each frame holds; they must match every decoded frame's header.
    skip: optional bool array of shape `(F,)` (`payload.shape[:-1]`), may be traced.
      Where `skip[f]` is True, row `f` of the payload is neither read nor
      validated (it may hold anything, e.g. zeros or the 0xFF overflow poison of
      the collectives) and the output row `f` is all zeros. Other rows are
      bit-identical to decoding without `skip`.
    return_status: also return a per-frame status instead of raising on a bad frame.

  Returns:
    `(F, *shape)` array of `dtype`; with `return_status=True`, `(out, status)`
    where `status` is int32 `(F,)`: 0 (`STATUS_OK`) where frame `f` decoded (its
    row is bit-exact) or was skipped (its row is zeros), else the code of the
    first error found, as the raising path would report it (frame-level errors
    first, then the lowest bad block); `status_message(code)` gives its text and
    `status_messages()` lists all codes. A rejected frame's whole output row is
    a quiet NaN (bits `REJECTED_FILL_BITS[dtype]`: 0x7FC0 bfloat16, 0x7E00
    float16, 0x7FC00000 float32, 0x7F float8_e4m3fn, 0x7E float8_e5m2), never
    partially decoded data; the other rows
    are unaffected. This is what the CUDA decoder does (a GPU cannot raise
    without a host sync), and the CPU decoder gives the same bits and codes.

  Without `return_status`, raises at run time if any frame that is not skipped
  is malformed, truncated, overflowed, or disagrees with `shape`/`dtype`: a
  `JaxRuntimeError` (or, on some of JAX's eager dispatch paths, a `ValueError`)
  whose message starts with `INVALID_ARGUMENT: zipccl decode (frame F, ...)`.
  (On CUDA, which cannot raise, such a frame decodes to NaNs.)
  """
  payload = jnp.asarray(payload)
  if payload.dtype != jnp.uint8:
    raise TypeError(f"zipccl_jax: payload must be uint8, got {payload.dtype}")
  if payload.ndim != 2:
    raise ValueError(f"zipccl_jax: payload must have shape (frames, capacity), got {payload.shape}")
  shape = _check_shape(shape)
  fmt.dtype_code(dtype)
  skip = _check_skip(skip, payload.shape[0], "decode_frames", "payload.shape[:-1]")
  _ffi.register()
  operands = (payload,) if skip is None else _vary_together(payload, skip)
  payload = operands[0]
  frames = payload.shape[0]
  out_type = _result(payload, (frames, *shape), jnp.dtype(dtype))
  scratch = _scratch(payload, "decode", frames, math.prod(shape))
  if not return_status:
    return _codec_call(_ffi.DECODE_TARGET, (out_type,), scratch, operands)[0]
  out, status = _codec_call(
      _ffi.DECODE_TARGET, (out_type, _result(payload, (frames,), jnp.int32)), scratch, operands)
  return out, status


def decode_frames_into(into, payload, *, col: int, elems: int, skip=None,
                       return_status: bool = False):
  """`decode_frames` into columns of an array: `(F, R)` `into` and `(F, C)` frames -> `(F, R)`.

  Row f of the result is row f of `into` with its columns ``[col, col + elems)`` replaced by
  frame f's `elems` elements of `into.dtype` (zeros where `skip[f]`; NaNs for a rejected frame
  with `return_status`, as `decode_frames`). The result takes `into`'s buffer (the custom call
  aliases it): XLA writes the columns in place when `into` is not used afterwards, and copies it
  first otherwise. A collective in K pieces decodes each piece into its columns of one result
  this way, where K decoded pieces and their concatenation would each hold a result's bytes.

  Args:
    into: `(F, R)` array of a supported dtype (`format.SUPPORTED_NAMES`).
    payload: uint8 `(F, C)`, frame `f` in the prefix of row `f` (`encode_frames`).
    col, elems: the columns the frames fill, ``0 <= col`` and ``col + elems <= R``.
    skip, return_status: as in `decode_frames`.

  Example::

    payload, _ = encode_frames(x[:, 4:8], capacity=256)               # x: (2, 8) bfloat16
    y = decode_frames_into(jnp.zeros_like(x), payload, col=4, elems=4)  # y[:, 4:8] == x[:, 4:8]
  """
  into, payload = jnp.asarray(into), jnp.asarray(payload)
  if payload.dtype != jnp.uint8:
    raise TypeError(f"zipccl_jax: payload must be uint8, got {payload.dtype}")
  if payload.ndim != 2:
    raise ValueError(f"zipccl_jax: payload must have shape (frames, capacity), got {payload.shape}")
  if into.ndim != 2 or into.shape[0] != payload.shape[0]:
    raise ValueError(f"zipccl_jax: into must have shape (frames, row) = ({payload.shape[0]}, R), "
                     f"got {into.shape}")
  fmt.dtype_code(into.dtype)
  for name, v in (("col", col), ("elems", elems)):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
      raise TypeError(f"zipccl_jax: decode_frames_into {name} must be an int, got {v!r}")
    if v < 0:
      raise ValueError(f"zipccl_jax: decode_frames_into {name} must be >= 0, got {v}")
  if col + elems > into.shape[1]:
    raise ValueError(f"zipccl_jax: decode_frames_into columns [col, col + elems) = [{col}, "
                     f"{col + elems}) must lie in into's rows of {into.shape[1]} elements")
  skip = _check_skip(skip, payload.shape[0], "decode_frames_into", "payload.shape[:-1]")
  _ffi.register()
  operands = _vary_together(payload, into) if skip is None else _vary_together(payload, into, skip)
  payload = operands[0]
  results = [_result(payload, into.shape, into.dtype)]
  if return_status:
    results.append(_result(payload, (payload.shape[0],), jnp.int32))
  out = _codec_call(_ffi.DECODE_INTO_TARGET, tuple(results),
                    _scratch(payload, "decode", payload.shape[0], int(elems)), operands,
                    aliases={1: 0}, col=np.int64(col), elems=np.int64(elems))
  return tuple(out) if return_status else out[0]


def _check_shape(shape) -> tuple[int, ...]:
  try:
    shape = tuple(int(d) for d in shape)
  except TypeError:
    raise TypeError(f"zipccl_jax: shape must be a sequence of ints, got {shape!r}") from None
  if any(d < 0 for d in shape):
    raise ValueError(f"zipccl_jax: shape must be non-negative, got {shape}")
  return shape


def encode(x, *, checksum: bool = False, capacity: int | None = None):
  """Losslessly compresses `x` into one frame.

  Args:
    x: array of any shape with dtype bfloat16, float16, float32 or a float8
      dtype (`format.SUPPORTED_NAMES`; float8 is coded byte by byte; others raise
      TypeError). Elements are coded in row-major order.
    checksum: store an XXH32 checksum of the frame; decode verifies it.
    capacity: length of the returned payload in bytes. Defaults to
      `max_encoded_bytes(x.size, x.dtype)`, which every input fits. With a
      smaller capacity a frame may not fit; then `nbytes > capacity`, only the
      32-byte header is written (its `frame_bytes` field holds `nbytes`), and
      `decode` of that payload raises.

  Returns:
    `(payload, nbytes)`: payload is uint8 of shape `(capacity,)`; nbytes is a
    scalar int32 (int64 with `jax_enable_x64`), the frame's exact size. The
    frame is `payload[:nbytes]`; the rest of the payload is unspecified.

  Example:
    >>> x = jnp.linspace(-1, 1, 4096, dtype=jnp.bfloat16)
    >>> payload, nbytes = zipccl_jax.encode(x)
    >>> y = zipccl_jax.decode(payload, shape=x.shape, dtype=x.dtype)
    >>> bool((y.view(jnp.uint16) == x.view(jnp.uint16)).all())
    True
  """
  x = _as_coded_array(x, "x")
  payload, nbytes = encode_frames(x.reshape(1, x.size), capacity=capacity, checksum=checksum)
  return payload[0], nbytes[0]


def decode(payload, *, shape: Sequence[int], dtype, return_status: bool = False):
  """Decodes the frame at the start of `payload` into an array of `shape`, `dtype`.

  Args:
    payload: uint8 vector holding a frame in its prefix (any trailing bytes are
      ignored); for example `payload[:nbytes]` from `encode`.
    shape, dtype: what was encoded; they must match the frame's header.
    return_status: return `(out, status)` instead of raising on a bad frame;
      `status` is an int32 scalar, 0 or an error code, and a rejected frame's
      `out` is all quiet NaN (see `decode_frames`).

  Returns:
    The bit-exact original array (with `return_status`, `(array, status)`).

  A malformed, truncated or corrupted payload raises `JaxRuntimeError` (a
  `ValueError` on some eager dispatch paths) with the message
  `INVALID_ARGUMENT: zipccl decode (frame 0, ...): <reason>`.
  """
  payload = jnp.asarray(payload)
  if payload.ndim != 1:
    raise ValueError(f"zipccl_jax: payload must be a 1-D uint8 vector, got shape {payload.shape}")
  shape = _check_shape(shape)
  if return_status:
    out, status = decode_frames(payload[None], shape=shape, dtype=dtype, return_status=True)
    return out[0], status[0]
  return decode_frames(payload[None], shape=shape, dtype=dtype)[0]


def _frame_bytes_words(payload):
  """The `frame_bytes` header field of each frame as (low, high) uint32 words."""
  lo_b, hi_b = fmt.FRAME_BYTES_OFFSET, fmt.FRAME_BYTES_OFFSET + fmt.FRAME_BYTES_WIDTH
  b = jnp.asarray(payload)[..., lo_b:hi_b].astype(jnp.uint32)
  lo = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
  hi = b[..., 4] | (b[..., 5] << 8) | (b[..., 6] << 16) | (b[..., 7] << 24)
  return lo, hi


def frame_bytes_of(payload):
  """The `frame_bytes` header field of each frame, as int32, saturated at 2^31-1.

  Reads header bytes [16, 24) with jnp ops, so it is cheap and traceable; a
  receiver uses it to see that a sender's frame overflowed its capacity.
  `payload` has shape `(..., C)` with `C >= 32`.
  """
  lo, hi = _frame_bytes_words(payload)
  big = (hi != 0) | (lo > 0x7FFFFFFF)
  return jnp.where(big, jnp.int32(0x7FFFFFFF), lo.astype(jnp.int32))


def any_overflow(payload, capacity: int):
  """True if any frame of `payload` `(..., C)` says it needs more than `capacity` bytes.

  The same header field as `frame_bytes_of`, compared unsaturated (a poisoned frame,
  `frame_bytes = 2**64 - 1`, counts).
  """
  lo, hi = _frame_bytes_words(payload)
  return jnp.any((hi != 0) | (lo > jnp.uint32(capacity)))


def poison_overflow(payload, nbytes, capacity: int):
  """`(payload, over)`: if any frame overflowed `capacity`, every frame's `frame_bytes` becomes
  2**64 - 1, so that every receiver of any of them sees the overflow (the collectives'
  uniform fallback). `payload` is uint8 `(F, C)`, `nbytes` `(F,)`; `over` is a bool scalar.
  """
  over = jnp.any(nbytes > capacity)
  lo = fmt.FRAME_BYTES_OFFSET
  field = payload[:, lo:lo + fmt.FRAME_BYTES_WIDTH]
  field = jnp.where(over, jnp.full_like(field, 0xFF), field)
  payload = jax.lax.dynamic_update_slice(payload, field, (0, lo))
  return payload, over
