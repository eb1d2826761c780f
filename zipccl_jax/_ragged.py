"""``ragged_all_to_all`` that runs everywhere: XLA's on GPU/TPU, an exact emulation on CPU.

XLA:CPU has no ragged-all-to-all. :func:`exchange` takes ``jax.lax.ragged_all_to_all``'s
arguments and semantics and picks, with ``lax.platform_dependent``, the real collective on
GPU/TPU or, on CPU, an emulation made of one padded ``jax.lax.all_to_all``::

  K = len(input_offsets) = n * spd     (n = axis size, spd = slices per destination)
  sender:    send[d] = the spd slices for destination d, rows packed back to back,
             zero rows after them                        # (n, bound, *row) as bit patterns
  wire:      recv = all_to_all(send)  and  off_ = all_to_all(output_offsets)   (tiled)
  receiver:  block s of recv holds sender s's slices in order; slice j has
             recv_sizes[s*spd + j] rows and lands at off_[s*spd + j]; rows that are
             not written keep ``output``'s bits

There is no pure ``jax.lax`` reference to compare against on CPU: XLA:CPU cannot run
``jax.lax.ragged_all_to_all`` at all, so this emulation stands in for it there (tests check it
against a NumPy model written from jax.lax's documented pseudocode, tests/test_ragged.py, and the
dropless example against its unsharded model; the native collective only runs on GPU/TPU).

``bound`` is a static number of rows that bounds what one sender sends one destination:
``min(M, spd * N)`` for ``operand`` (N, ...) and ``output`` (M, ...), which holds for every
call whose result jax.lax defines (the slices a receiver gets do not overlap, so they hold
at most M rows), or the caller's ``max_send_rows``. Every payload moves as its bit pattern
(uint views), so NaN payloads, -0 and subnormals arrive unchanged.

Outside jax.lax's contract (a slice reaching outside ``operand`` or ``output``, slices that
overlap in the receiver's buffer, ``send_sizes != all_to_all(recv_sizes)``) XLA leaves the
result undefined. Here: a slice that does not fit in ``operand`` sends zero rows, one that
does not fit in ``output`` writes nothing, and overlapping rows are written in the
pseudocode's order (sender-major, then slice) on CPU; no memory outside the buffers is read
or written. Row indices are int64 whenever a row count, offset or running sum can reach 2**31
(or the caller's offsets are 64-bit), int32 otherwise.
"""

from __future__ import annotations

import contextlib
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from zipccl_jax._bits import uint_of
from zipccl_jax._shard import axes_of, vary_together

__all__ = ["exchange", "check_operands", "axis_size", "transposed_offsets",
           "keep_unreceived", "offsets_dtype", "index_scope", "rows_bound", "layout_dtype",
           "pack_bits", "place_bits", "to_bits", "from_bits"]

_INT32_LIMIT = 2**31 - 1
_OFFSET_ARGS = ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")


def axis_size(axis_name, axis_index_groups=None) -> int:
  """Ranks taking part in one exchange: the group size, or the (product of the) axis size(s)."""
  if axis_index_groups is not None:
    return len(axis_index_groups[0])
  return math.prod(lax.axis_size(a) for a in axes_of(axis_name))


def check_operands(api: str, operand, output, input_offsets, send_sizes, output_offsets,
                   recv_sizes, n: int) -> int:
  """Trace-time checks of jax.lax.ragged_all_to_all's contract; returns slices per destination."""
  for arg, x in (("operand", operand), ("output", output)):
    if np.ndim(x) < 1:
      raise ValueError(f"{api}: {arg} must have a leading (row) axis, got shape {np.shape(x)}")
  if operand.dtype != output.dtype:
    raise TypeError(f"{api}: operand and output must have the same dtype, got {operand.dtype} "
                    f"and {output.dtype}")
  if operand.shape[1:] != output.shape[1:]:
    raise ValueError(f"{api}: operand and output must have the same row shape, got "
                     f"operand {operand.shape} and output {output.shape}")
  k = None
  for arg, x in zip(_OFFSET_ARGS, (input_offsets, send_sizes, output_offsets, recv_sizes)):
    if not jnp.issubdtype(x.dtype, jnp.integer):
      raise TypeError(f"{api}: {arg} must be an integer array, got dtype {x.dtype}")
    if np.ndim(x) != 1 or x.shape[0] < 1:
      raise ValueError(f"{api}: {arg} must be rank 1 with a positive length, got shape "
                       f"{np.shape(x)}")
    if k is not None and x.shape[0] != k:
      raise ValueError(f"{api}: input_offsets, send_sizes, output_offsets and recv_sizes must "
                       f"have the same length, got {arg} of length {x.shape[0]} and {k}")
    k = x.shape[0]
  if k % n:
    raise ValueError(f"{api}: the length of the offsets and sizes ({k}) must be a multiple of "
                     f"the number of ranks taking part ({n})")
  _check_concrete_slices(api, "input_offsets", input_offsets, "send_sizes", send_sizes,
                         operand.shape[0], "operand")
  _check_concrete_slices(api, "output_offsets", output_offsets, "send_sizes", send_sizes,
                         output.shape[0], "output")  # the receiver's buffer has M rows too
  return k // n


def _check_concrete_slices(api, off_arg, offsets, size_arg, sizes, rows: int, buf: str):
  """Offsets and sizes known at trace time (NumPy constants, not traced values) must give slices
  inside `buf`."""
  if isinstance(offsets, jax.core.Tracer) or isinstance(sizes, jax.core.Tracer):
    return
  off, size = np.asarray(offsets, np.int64), np.asarray(sizes, np.int64)
  bad = np.flatnonzero((size < 0) | (off < 0) | (off + size > rows))
  if bad.size:
    i = int(bad[0])
    raise ValueError(f"{api}: slice {i} ({off_arg}[{i}] = {off[i]}, {size_arg}[{i}] = {size[i]}) "
                     f"does not fit in {buf}'s {rows} rows")


def exchange(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
             axis_name, axis_index_groups=None, max_send_rows: int | None = None,
             api: str = "zipccl_jax.ragged_all_to_all"):
  """``jax.lax.ragged_all_to_all`` with the same arguments and result, on every platform.

  Must run inside ``jax.shard_map`` (``axis_name`` bound). Not differentiable by itself
  (the CPU path moves bit patterns): callers declare autodiff.

  Args:
    operand: (N, *row) rows to send.
    output: (M, *row) same dtype; the result is ``output`` with the received rows written.
    input_offsets, send_sizes, output_offsets, recv_sizes: (K,) integers, K = n * spd; see
      ``jax.lax.ragged_all_to_all``.
    axis_name, axis_index_groups: as in ``jax.lax.ragged_all_to_all``.
    max_send_rows: static bound on the rows one rank sends to one destination (the sum of
      its spd slices for it), when the caller knows a tighter one than ``min(M, spd * N)``;
      it only sizes the CPU emulation's padded buffers, and rows beyond it are lost there.
    api: the name used in error messages.

  Returns:
    (M, *row), ``output``'s dtype.
  """
  n = axis_size(axis_name, axis_index_groups)
  spd = check_operands(api, operand, output, input_offsets, send_sizes, output_offsets,
                       recv_sizes, n)
  bound = rows_bound(operand, output, spd, max_send_rows, api)
  operand, output, *sizes = vary_together(axes_of(axis_name), operand, output, input_offsets,
                                          send_sizes, output_offsets, recv_sizes)
  index_dtype = layout_dtype(operand, output, sizes, n, spd, bound)
  groups = None if axis_index_groups is None else tuple(tuple(g) for g in axis_index_groups)

  def native(op, out, *offsets_and_sizes):
    with index_scope(index_dtype):  # XLA wants the four index operands of one type
      idx = [x.astype(index_dtype) for x in offsets_and_sizes]
      return lax.ragged_all_to_all(op, out, *idx, axis_name=axis_name, axis_index_groups=groups)

  def emulated(op, out, input_offsets, send_sizes, output_offsets, recv_sizes):
    if bound == 0:
      return out
    a2a = lambda x: lax.all_to_all(x, axis_name, 0, 0, tiled=True, axis_index_groups=groups)
    layout = dict(n=n, spd=spd, bound=bound, index_dtype=index_dtype)
    recv = a2a(pack_bits(op, input_offsets, send_sizes, **layout))
    with index_scope(index_dtype):
      offsets_here = a2a(output_offsets.astype(index_dtype))
    return from_bits(place_bits(to_bits(out), recv, offsets_here, recv_sizes, **layout),
                      out.dtype)

  return lax.platform_dependent(operand, output, *sizes, cpu=emulated, default=native)


def rows_bound(operand, output, spd: int, max_send_rows=None, api: str = "") -> int:
  """Rows one rank can send one destination in a call jax.lax defines: ``min(M, spd * N)``
  (the destination's slices do not overlap in its M rows), or the caller's tighter bound."""
  bound = min(output.shape[0], spd * operand.shape[0])
  if max_send_rows is not None:
    if int(max_send_rows) < 0:
      raise ValueError(f"{api}: max_send_rows must be >= 0, got {max_send_rows}")
    bound = min(bound, int(max_send_rows))
  return bound


def layout_dtype(operand, output, sizes, n: int, spd: int, bound: int):
  """The index dtype of a packed layout: int64 once a row index or running sum can pass 2**31
  or the caller's offsets are 64-bit."""
  N, M = operand.shape[0], output.shape[0]
  wide = any(np.dtype(x.dtype).itemsize > 4 for x in sizes)
  return offsets_dtype(n * bound + spd * max(N, M) + max(N, M), _INT32_LIMIT + 1 if wide else 0)


def pack_bits(operand, input_offsets, send_sizes, *, n: int, spd: int, bound: int, index_dtype):
  """(n, bound, *row) bit patterns: block d holds the slices for rank d back to back, then zeros."""
  with index_scope(index_dtype):
    src = _slice_rows(input_offsets, send_sizes, operand.shape[0], n, spd, bound, index_dtype)
    return to_bits(operand).at[src].get(mode="fill", fill_value=0)


def place_bits(output_bits, packed_bits, offsets_here, recv_sizes, *, n: int, spd: int, bound: int,
               index_dtype):
  """`output_bits` (M, *row) with block s of `packed_bits` (n, bound, *row) written at its slices.

  Block s holds sender s's slices for this rank back to back; slice j (``recv_sizes[s*spd+j]``
  rows) lands at ``offsets_here[s*spd+j]`` (``all_to_all(output_offsets)``).
  """
  M = output_bits.shape[0]
  with index_scope(index_dtype):
    dst = _slice_rows(offsets_here, recv_sizes, M, n, spd, bound, index_dtype)
    rows = packed_bits.reshape((n * bound,) + packed_bits.shape[2:])
    return output_bits.at[dst.reshape(-1)].set(rows, mode="drop")


def _slice_rows(offsets, sizes, limit: int, n: int, spd: int, bound: int, index_dtype):
  """(n, bound) row index in a buffer of `limit` rows of each packed row, `limit` if none.

  Block d packs slices d*spd .. d*spd+spd-1 back to back: row t of block d is row
  ``t - start[j]`` of its slice j (start = exclusive running sum of the sizes). A slice
  that does not fit in [0, limit) maps every row to `limit` (gathers fill, scatters drop).
  """
  size = jnp.clip(sizes.astype(index_dtype), 0, limit).reshape(n, spd)
  off = offsets.astype(index_dtype).reshape(n, spd)
  fits = (off >= 0) & (off <= limit - size)
  end = jnp.cumsum(size, axis=1)
  start = end - size
  t = lax.broadcasted_iota(index_dtype, (n, bound), 1)
  if spd == 1:
    j = jnp.zeros((n, bound), np.int32)
  else:  # the slice a packed row belongs to: how many slices end at or before it
    j = jnp.sum((end[:, None, :] <= t[:, :, None]).astype(np.int32), axis=-1)
  live = t < end[:, -1:]
  j = jnp.minimum(j, spd - 1)
  pick = lambda a: jnp.take_along_axis(a, j, axis=1)
  row = pick(off) + (t - pick(start))
  return jnp.where(live & pick(fits), row, jnp.asarray(limit, index_dtype))


def offsets_dtype(*limits: int):
  """int32, or int64 if one of `limits` (largest offset or size to represent) exceeds it."""
  return np.dtype(np.int64 if max(limits) > _INT32_LIMIT else np.int32)


def index_scope(index_dtype):
  """Where 64-bit offsets are traced: jax only keeps int64 with x64 enabled, so the offset
  arithmetic runs inside this context (a no-op for int32)."""
  return jax.enable_x64(True) if np.dtype(index_dtype).itemsize == 8 else contextlib.nullcontext()




def to_bits(x):
  """Bit pattern of `x` as unsigned integers (complex: (..., 2) of real and imaginary parts)."""
  if jnp.issubdtype(x.dtype, jnp.complexfloating):
    x = jnp.stack([lax.real(x), lax.imag(x)], axis=-1)
  if jnp.issubdtype(x.dtype, jnp.floating):
    return lax.bitcast_convert_type(x, uint_of(x.dtype))
  return x


def from_bits(bits, dtype):
  dt = np.dtype(dtype)
  if jnp.issubdtype(dt, jnp.complexfloating):
    part = np.dtype(np.float32 if dt == np.complex64 else np.float64)
    f = lax.bitcast_convert_type(bits, part)
    return lax.complex(f[..., 0], f[..., 1])
  if jnp.issubdtype(dt, jnp.floating):
    return lax.bitcast_convert_type(bits, dt)
  return bits


# --------------------------------------------------------------------------- #
# Transposition (the cotangent of a ragged exchange is a ragged exchange back)
# --------------------------------------------------------------------------- #

def transposed_offsets(input_offsets, send_sizes, output_offsets, recv_sizes, *, axis_name,
                       axis_index_groups=None):
  """The offsets and sizes of the transposed exchange, as jax.lax's transpose rule uses them.

  The cotangent rows a rank received travel back: it sends from where they landed
  (``all_to_all(output_offsets)``, ``recv_sizes`` rows) to where they came from in the
  sender's operand (``all_to_all(input_offsets)``, ``send_sizes`` rows).
  """
  groups = None if axis_index_groups is None else tuple(tuple(g) for g in axis_index_groups)
  a2a = lambda x: lax.all_to_all(x, axis_name, 0, 0, tiled=True, axis_index_groups=groups)
  return a2a(output_offsets), recv_sizes, a2a(input_offsets), send_sizes


def keep_unreceived(ct, output_offsets_here, recv_sizes):
  """`ct` (M, ...) with the rows the exchange wrote replaced by zeros (the cotangent of `output`).

  ``output_offsets_here`` is ``all_to_all(output_offsets)``, where the received slices landed.
  """
  M = ct.shape[0]
  k = recv_sizes.shape[0]
  wide = np.dtype(output_offsets_here.dtype).itemsize > 4
  index_dtype = offsets_dtype(2 * M * k, _INT32_LIMIT + 1 if wide else 0)
  with index_scope(index_dtype):
    dst = _slice_rows(output_offsets_here, recv_sizes, M, 1, k, M, index_dtype)
    written = jnp.zeros((M,), jnp.bool_).at[dst.reshape(-1)].set(True, mode="drop")
  bits = to_bits(ct)
  written = written.reshape((M,) + (1,) * (bits.ndim - 1))
  return from_bits(jnp.where(written, jnp.zeros_like(bits), bits), ct.dtype)
