"""The reductions' side of the wire: the fixed-order sum, and psum_scatter in sequential pieces.

`ordered_sum` adds rows in ascending rank order in float32 and rounds once, raw or coded, so a
reduction returns the same bits whatever the transport and however many pieces; a NaN result is
pinned to the first NaN in row order, so two compilations of the same sum (XLA may order an
addition's operands differently in each) cannot differ in a NaN's sign or payload.

`reduce_rows` is psum_scatter's exchange and sum in K pieces run one after another: one piece's
frames, decoded rows and sum alive at a time. In one shot (`_exchange.exchange_rows`, then the
sum) the frames sent, the frames received and every decoded row are alive together: 2.7x the
operand on a padded 8 x H100 compile (benchmarks/gpu_memory.py), where jax.lax's reduce-scatter
needs none.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
from jax import lax

from zipccl_jax import accounting
from zipccl_jax._bits import uint_of
from zipccl_jax._exchange import (by_transport, cond_bits, exchange_chain, in_fallback, own_of,
                                  ragged_rows, zero_after)
from zipccl_jax.capacity import piece_capacities

# Fixed-order sums are unrolled up to this many ranks, then use a sequential loop.
_UNROLL_MAX = 64


def _add_pinned(acc, x):
  """``acc + x`` (float32), whose NaN is pinned: `acc`'s if it is one, else `x`'s, else the sum's.
  x86 returns one operand's NaN for a sum of two, whichever operand the compiler put first, and
  XLA may order them differently in two compilations of the same sum (the coded and the raw path,
  one piece and the whole row), so unpinned the sign and payload of a NaN result could differ."""
  return jnp.where(jnp.isnan(acc), acc, jnp.where(jnp.isnan(x), x, acc + x))


def ordered_sum(rows, dtype, own=None):
  """((f32(r0) + f32(r1)) + ...) in ascending row order, rounded once to `dtype`; a NaN result is
  the first NaN in row order (`_add_pinned`), so every compilation of the sum gives the same bits.

  `own`: (mask (n,), operand (n, m)) from `_exchange.own_of`: the row flagged in the mask is read
  from the operand (this rank's own, which a coded exchange does not send), selected inside the
  sum's loop (in float32 after an exact widening, so every bit is kept), not in a pass of its own."""
  n = rows.shape[0]

  def row(j):
    r = rows[j].astype(jnp.float32)
    return r if own is None else jnp.where(own[0][j], own[1][j].astype(jnp.float32), r)

  if n <= _UNROLL_MAX:
    acc = row(0)
    for j in range(1, n):
      acc = _add_pinned(acc, row(j))
  else:
    acc = lax.fori_loop(1, n, lambda j, a: _add_pinned(a, row(j)), row(0))
  return acc.astype(dtype)


def reduce_rows(rows, *, axis_name, n: int, capacity: int, transport: str, site: str,
                raw: Callable, pieces: int):
  """psum_scatter's exchange and sum in `pieces` sequential pieces: rows (n, m), row j for rank j
  -> (m,), the `ordered_sum` of row `me` over the ranks.

  Each piece of columns is exchanged as `exchange_rows` would (padded: decoded outside the
  conditional; ragged: its raw rows in its frames' buffer) and summed at once, and the next piece
  is read only once that sum exists (`_in_sequence`), so one piece's frames, rows and sum are alive
  at a time: the temp of one piece, not of the call. Padded, one `lax.cond` per call takes the raw
  exchange (in the same pieces) if any piece overflowed. Coded and raw sums are two computations
  here; `ordered_sum` pins NaN results, so they give the same bits. `raw(columns)` is the raw
  exchange of a piece's columns (n, m_k) -> (n, m_k), row s from rank s.
  """
  dt = rows.dtype

  def padded(rows):
    def coded(r, cap):
      fallback, got = exchange_chain(r, axis_name, n, cap, eager=True, own=False)
      return fallback, ordered_sum(got(), dt, own=own_of(r, axis_name, n))

    fallback, summed = _in_sequence(rows, pieces, capacity, coded)
    accounting.count(site, fallback)
    raw_sum = lambda: _in_sequence(rows, pieces, capacity,
                                   lambda r, cap: (fallback, ordered_sum(raw(r), dt)))[1]
    return cond_bits(fallback, lambda: in_fallback(raw_sum), lambda: summed)

  def ragged(rows):
    def piece(r, cap):
      any_raw, got = ragged_rows(r, axis_name, n, cap)
      return any_raw, ordered_sum(got, dt)

    any_raw, summed = _in_sequence(rows, pieces, capacity, piece)
    accounting.count(site, any_raw)
    return summed

  return by_transport(transport, padded, ragged, rows)


def _in_sequence(rows, pieces: int, capacity: int, piece: Callable):
  """The columns of `rows` (R, m) as `pieces` chains run one after another: `piece(columns,
  capacity)` -> (flag, result (m_k,)); returns (whether any flag is set, the results concatenated).

  Piece k+1's columns are a dynamic slice whose start depends on piece k's result (`zero_after`:
  a zero XLA cannot prove zero), so its encode cannot start before piece k is summed. An
  optimization barrier would not do: XLA:GPU removes them before it schedules (its remat
  pipeline's expander), and then ran every piece's encode first. Bit patterns through the slices
  and the concatenation."""
  dt = rows.dtype
  u = uint_of(dt)
  bits = lax.bitcast_convert_type(rows, u)
  outs, flags, prev = [], [], None
  for lo, hi, cap in piece_capacities(capacity, rows.shape[1], pieces, dt):
    start = lo if prev is None else lo + zero_after(jnp.max(prev, keepdims=True))
    cols = lax.dynamic_slice_in_dim(bits, start, hi - lo, axis=1)
    flag, out = piece(lax.bitcast_convert_type(cols, dt), cap)
    prev = lax.bitcast_convert_type(out, u)
    outs.append(prev)
    flags.append(flag)
  return jnp.any(jnp.stack(flags)), lax.bitcast_convert_type(jnp.concatenate(outs), dt)
