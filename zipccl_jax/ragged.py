"""Compressed :func:`jax.lax.ragged_all_to_all` (dropless MoE dispatch and combine).

Sizes are data, not shapes: each rank sends every destination a number of rows only known at
run time. The static shape of what is coded is a frame per destination sized for the largest
legal message, ``bound = min(M, spd * N)`` rows (the destination's slices cannot overlap in its
``M`` rows); the rows after a destination's slices are zeros, which the codec codes as the ZERO
symbol (no raw bytes: at most one code bit each, and 8 bytes per all-zero block of 65,536
elements, FORMAT.md). What crosses the wire per sender, for an axis of size ``n``::

  packed[d] = rows of the spd slices for rank d, back to back, then zeros   # (n, bound, *row)
  frame[d]  = encode(packed[d]) if d != me else nothing                     # <= C bytes each
  off_here  = all_to_all(output_offsets)                   # K ints: where my incoming slices go
  frames    -> jax.lax.ragged_all_to_all: only each frame's nbytes move, after an int32 exchange
               of the sizes (on CPU, which has no ragged-all-to-all, the exact emulation of
               zipccl_jax._ragged moves the frames padded to C bytes)
  receiver: decode frame s, write slice j of it (recv_sizes[s*spd + j] rows) at
            off_here[s*spd + j] in ``output``; its own slices go from ``packed[me]``, uncoded

Overflow is uniform, as in the other collectives: a frame larger than ``C`` poisons every frame
its sender sends, every rank sees it, and every rank takes the raw exact ragged exchange of the
operand's bits. Raw (``compress=False``, ``"auto"`` deciding raw, a dtype the codec does not
cover) is that exact exchange too, so results never depend on the decision.

Statistics: a ragged call site's ``raw_bytes`` and ``wire_bytes`` are models (the sizes are
data): a balanced exchange of the smaller buffer's rows, ``(n-1)/n`` of them leaving, raw and at
the capacity's ratio plus a frame header per peer. The cost model of ``compress="auto"`` sees
frames of ``bound`` rows (op ``ragged_all_to_all``, an all-to-all phase, ragged transport).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from zipccl_jax import _exchange, _ours, _ragged, accounting, defaults, strategy
from zipccl_jax import format as fmt
from zipccl_jax._linear import linear
from zipccl_jax._shard import axes_of, axis_size, call_site, vary_together
from zipccl_jax.capacity import split_capacity
from zipccl_jax.observation import record_frames

__all__ = ["ragged_all_to_all"]

_OP = "ragged_all_to_all"
_API = "zipccl_jax.ragged_all_to_all"


@dataclasses.dataclass(frozen=True)
class _Call:
  """The static parameters of one traced ragged_all_to_all."""
  axis_name: Any
  n: int          # ranks
  spd: int        # slices per destination
  bound: int      # rows per destination frame
  capacity: int   # bytes per frame, 0 for the raw path
  site: str
  backward: tuple  # (compress, capacity) of the transposed exchange


@_ours.ours  # the jax.lax collectives it binds are ours (never rewritten by compress_collectives)
def ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
                      axis_name, axis_index_groups=None, compress="auto", capacity=None,
                      name=None):
  """Compressed :func:`jax.lax.ragged_all_to_all`: same arguments, bit-identical result.

  Must be called inside ``jax.shard_map``. Rank ``r`` sends its slice ``i`` (rows
  ``input_offsets[i] : input_offsets[i] + send_sizes[i]`` of ``operand``) to rank
  ``i // spd``, where it lands at ``output_offsets[i]`` (an offset in the *receiver's*
  buffer); rank ``r`` writes the slice it receives as its ``i``-th (from rank ``i // spd``,
  ``recv_sizes[i]`` rows) at ``all_to_all(output_offsets)[i]`` and keeps ``output`` elsewhere.

  Args:
    operand: ``(N, *row)`` bfloat16/float16/float32 rows to send (other dtypes go raw).
    output: ``(M, *row)``, same dtype: the rows not written keep these bits.
    input_offsets, send_sizes, output_offsets, recv_sizes: (K,) integer arrays, ``K = n * spd``
      with ``n = axis_size(axis_name)``; ``spd`` slices per destination, gaps allowed. As in
      jax.lax, ``send_sizes == all_to_all(recv_sizes)`` and every slice must fit its buffer.
    axis_name: a mesh axis name, or a tuple of them (rank = row-major index).
    axis_index_groups: must be None.
    compress: True, False or "auto" (the cost model), as in the other collectives.
    capacity: bytes per frame (an int), a fraction of the frame's raw bytes (``bound * row``
      elements; a float), "observed", None (:func:`zipccl_jax.padded_capacity`), or a pair
      ``(forward, backward)``.
    name: call-site name for :func:`zipccl_jax.stats`.

  Returns:
    ``(M, *row)``: ``output`` with the received rows written.

  The call is linear in ``(operand, output)`` (:mod:`zipccl_jax._linear`): ``jax.jvp`` and
  ``jax.linearize`` send the tangents through the same compressed exchange; the transpose
  (``jax.grad``) is a compressed ragged_all_to_all back, with offsets and sizes swapped (the rows
  go from where they landed to where they came from), in the "gradient" role; ``output``'s
  cotangent is the incoming cotangent with the written rows zeroed. Either argument may be left
  undifferentiated. Under ``jax.vmap`` every example is one exchange with its own sizes.

  Example, two devices (``spd = 1``, rows of one element; the example of jax.lax's docstring)::

    rank 0: operand = [1, 2, 2]   input_offsets = [0, 1]  send_sizes = [1, 2]
            output  = [0, 0, 0, 0]  output_offsets = [0, 0]  recv_sizes = [1, 1]
    rank 1: operand = [3, 4, 0]   input_offsets = [0, 1]  send_sizes = [1, 1]
            output  = [0, 0, 0, 0]  output_offsets = [1, 2]  recv_sizes = [2, 1]
    bound = min(M, spd * N) = 3 rows per frame. Rank 0 packs [1, 0, 0] for itself (kept,
    uncoded) and frames [2, 2, 0] for rank 1; rank 1 frames [3, 0, 0] for rank 0 and keeps
    [4, 0, 0]. Rank 0 writes 1 row of its own at 0 and 1 row from rank 1 at 1; rank 1 writes
    2 rows from rank 0 at 0 and 1 of its own at 2:
    rank 0: result = [1, 3, 0, 0]     rank 1: result = [2, 2, 4, 0]
  """
  defaults.check_call(_OP, compress, capacity)  # at the door, whatever the plan
  if axis_index_groups is not None:  # sent uncompressed: a grouped ragged exchange is not coded
    return _ragged.exchange(operand, output, input_offsets, send_sizes, output_offsets,
                            recv_sizes, axis_name=axis_name, axis_index_groups=axis_index_groups)
  fwd_cap, bwd_cap = split_capacity(capacity)
  return _ragged_call(operand, output, (input_offsets, send_sizes, output_offsets, recv_sizes),
                      axis_name=axis_name, compress=compress, capacity=fwd_cap,
                      backward=(compress, bwd_cap), site=call_site(_OP, name), role="activation")


def _ragged_call(operand, output, idx, *, axis_name, compress, capacity, backward, site, role):
  """Plans and records one call, then runs it through the differentiable `_bind`."""
  operand, output = jnp.asarray(operand), jnp.asarray(output)
  idx = tuple(x if hasattr(x, "dtype") else np.asarray(x) for x in idx)  # constants stay checkable
  n = axis_size(axis_name, _OP)
  spd = _ragged.check_operands(_API, operand, output, *idx, n)
  idx = tuple(jnp.asarray(x) for x in idx)
  bound = _ragged.rows_bound(operand, output, spd)
  m = bound * math.prod(operand.shape[1:])
  p = strategy.plan(_OP, operand.dtype, m, axis_size=n, compress=compress, capacity=capacity,
                    role=role, site=site, axis_name=axis_name, transport="ragged")
  key = accounting.record(site, _OP, operand, n, p, *_modeled_bytes(operand, output, n, m, p))
  call = _Call(axis_name, n, spd, bound, p.capacity if p.compress else 0, site, backward)
  args = vary_together(axes_of(axis_name), operand, output, *idx)
  with accounting.site_scope(key):
    return _bind(call, *args)


def _modeled_bytes(operand, output, n: int, m: int, plan):
  """(raw, wire) bytes one device sends per call, modeled (see the module docstring)."""
  row_bytes = math.prod(operand.shape[1:]) * np.dtype(operand.dtype).itemsize
  raw = accounting.sent_bytes("all-to-all", min(operand.shape[0], output.shape[0]) * row_bytes, n)
  if not plan.compress or not m:
    return raw, raw
  ratio = plan.capacity / (m * np.dtype(operand.dtype).itemsize)
  return raw, min(raw, math.ceil(raw * ratio)) + (n - 1) * fmt.FRAME_HEADER_BYTES


def _bind(call: _Call, operand, output, *idx):
  """`_impl`, declared linear in (operand, output) with `_ragged_all_to_all_transpose_rule`."""
  return linear(lambda ops, *i: _impl(call, *ops, *i),
                _ours.ours(functools.partial(_ragged_all_to_all_transpose_rule, call,
                                             operand.shape[0])),
                (operand, output), *idx)


def _ragged_all_to_all_transpose_rule(call: _Call, operand_rows: int, ct, *idx):
  """The cotangent rows travel back, compressed: from where they landed to where they came from."""
  back = _ragged.transposed_offsets(*idx, axis_name=call.axis_name)
  compress, capacity = call.backward
  zeros = jnp.zeros((operand_rows,) + ct.shape[1:], ct.dtype)
  operand_ct = _ragged_call(ct, zeros, back, axis_name=call.axis_name, compress=compress,
                            capacity=capacity, backward=call.backward, site=call.site + "/bwd",
                            role="gradient")
  return operand_ct, _ragged.keep_unreceived(ct, back[0], idx[3])


def _impl(call: _Call, operand, output, input_offsets, send_sizes, output_offsets, recv_sizes):
  idx = (input_offsets, send_sizes, output_offsets, recv_sizes)
  n, spd, bound = call.n, call.spd, call.bound
  layout = dict(n=n, spd=spd, bound=bound,
                index_dtype=_ragged.layout_dtype(operand, output, idx, n, spd, bound))

  def packed_rows():  # (n, bound * row elements): frame d for rank d
    packed = _ragged.pack_bits(operand, input_offsets, send_sizes, **layout)
    return _ragged.from_bits(packed, operand.dtype).reshape(n, -1)

  def raw():
    return _ragged.exchange(operand, output, *idx, axis_name=call.axis_name, api=_API)

  record_frames(call.site, _OP, packed_rows)
  if not call.capacity:
    accounting.count(call.site, jnp.bool_(False))
    return raw()
  with _ragged.index_scope(layout["index_dtype"]):
    offsets_here = lax.all_to_all(output_offsets.astype(layout["index_dtype"]), call.axis_name, 0,
                                  0, tiled=True)

  def place(got):  # (n, bound * row elements), row s from rank s -> output
    bits = _ragged.to_bits(got).reshape((n, bound) + operand.shape[1:])
    out = _ragged.place_bits(_ragged.to_bits(output), bits, offsets_here, recv_sizes, **layout)
    return _ragged.from_bits(out, output.dtype)

  return _exchange.exchange_rows(packed_rows(), axis_name=call.axis_name, n=n,
                                 capacity=call.capacity, transport="ragged", site=call.site,
                                 raw=raw, finish=place)
