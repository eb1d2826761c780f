"""Collectives in K pieces: each chain its own frames and collective, so that XLA:GPU overlaps
one piece's codec with another's transfer (`zipccl_jax._exchange`, "Pieces").

`decode_pieces` (the padded transport) decodes every piece into its columns of one result and
`unless_fallback` keeps that result's buffer where the call falls back to the raw collective;
`pipelined_pieces` (the ragged transport, which needs no fallback) orders the pieces so that each
decode runs behind the next piece's exchange, and joins their results.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
from jax import lax

from zipccl_jax import accounting, codec
from zipccl_jax._bits import uint_of, zero_after
from zipccl_jax.accounting import in_fallback
from zipccl_jax.capacity import piece_capacities


def decode_pieces(rows, pieces: int, capacity: int, move: Callable):
  """The padded transport in pieces: the columns of `rows` (R, m) as `pieces` chains, each decoded
  into its columns of one result; returns (whether any piece overflowed, got (F, m)).

  `move(columns, capacity)` -> (overflowed, frames received (F, C_k), rows not to decode (F,) or
  None[, frames sent]) encodes and moves one piece. Each piece's frames are decoded outside any
  conditional (a poisoned frame's row comes out NaN and the caller's `unless_fallback` discards the
  call), straight into its columns of the result (`codec.decode_frames_into`): K decoded pieces
  joined afterwards were alive together (XLA:GPU runs most decodes after the last transfer), a
  result's bytes more. No transfer reads a decode, so XLA:GPU overlaps codec and transfers
  (`strategy.programs.SCHEDULED`). Where `move` gives the frames it sent and `rows` has several
  rows, the next piece's columns are sliced once those exist (a dynamic slice at `zero_after`
  them): a column slice of several rows is a copy, and XLA:GPU makes independent ones together, in
  one fusion before the first encode.
  """
  dt = rows.dtype
  u = uint_of(dt)
  bits = lax.bitcast_convert_type(rows, u)  # the slices move bit patterns
  got, flags, sent = None, [], None
  for lo, hi, cap in piece_capacities(capacity, rows.shape[1], pieces, dt):
    cols = bits[:, lo:hi] if sent is None else \
        lax.dynamic_slice_in_dim(bits, lo + zero_after(sent), hi - lo, axis=1)
    flag, recv, skip, *more = move(lax.bitcast_convert_type(cols, dt), cap)
    sent = more[0] if more and rows.shape[0] > 1 else None
    if got is None:  # made from the frames: hoisted, XLA would make every such buffer at once
      zeros = jnp.full((recv.shape[0], rows.shape[1]), zero_after(recv, u))
      got = lax.bitcast_convert_type(zeros, dt)
    got = codec.decode_frames_into(got, recv, col=lo, elems=hi - lo, skip=skip,
                                   return_status=True)[0]
    flags.append(flag)
  return jnp.any(jnp.stack(flags)), got


def unless_fallback(fallback, raw: Callable, coded):
  """`coded`, or `raw()` (in the fallback scope) where `fallback` (uniform over the ranks).

  A loop that runs `raw` once or never, on bit patterns, rather than `lax.cond`: a conditional's
  result is a buffer of its own, into which XLA copies a value made before it (a result's bytes
  of temp), where a loop's carry keeps the buffer `coded` was written in. XLA:GPU reads the
  predicate on the host either way (WhileThunk, as ConditionalThunk). Under `jax.vmap` with a
  per-example flag the loop runs `raw` for all and keeps, per example, the bits it should.
  """
  u = uint_of(coded.dtype)

  def body(c):
    return c[0] & False, lax.bitcast_convert_type(in_fallback(raw), u)

  _, out = lax.while_loop(lambda c: c[0], body, (fallback, lax.bitcast_convert_type(coded, u)))
  return lax.bitcast_convert_type(out, coded.dtype)


def pipelined_pieces(rows, pieces: int, capacity: int, site: str, stages: Callable):
  """The ragged transport in pieces: the columns of `rows` (R, m) as `pieces` chains, each piece's
  decode ordered to run while the next piece's frames exchange is in flight; returns (whether any
  piece came raw, a thunk concatenating the results into (R', m)). The call is counted once.
  Every piece's receive buffer and decoded columns are alive together, about twice the call's
  size of temp where one shot holds one receive buffer (`strategy.programs.choose_pieces` keeps
  K = 1 on this transport unless pinned).

  `stages(columns, capacity)` -> (flag, fill, transfer, decode): ``fill(tie)`` -> the piece's
  receive buffer with its raw rows in it, ``transfer(buffer, tie)`` -> (the frames received into
  it, a zero made from its operands), ``decode(received, tie)`` -> its result (`rows_stages`,
  `gather_stages`, `permute_stages`). Independent chains left the order to XLA:GPU's default
  scheduler, which ran every exchange synchronously and every decode after the last
  (docs/gpu.md). Here data orders it, through zeros XLA cannot fold (`zero_after`): piece k's
  raw rows and frames wait for transfer k-1's bytes and decode k-2's result; decode k-1 reads a
  zero of transfer k's operands (`_ragged_frames`: through one barrier), so it comes after them
  and XLA starts transfer k before it; and transfer k's first reader needs decode k-1, so the
  exchange is still in flight while decode k-1 runs. The bits are the chains'.
  """
  dt = rows.dtype
  u = uint_of(dt)
  bits = lax.bitcast_convert_type(rows, u)
  preps = [stages(lax.bitcast_convert_type(bits[:, lo:hi], dt), cap)
           for lo, hi, cap in piece_capacities(capacity, rows.shape[1], pieces, dt)]
  outs = [None] * len(preps)
  recv, _ = preps[0][2](preps[0][1](), jnp.zeros((), jnp.int32))
  for k in range(1, len(preps)):
    # piece k's raw rows and frames wait for transfer k-1's bytes and decode k-2's result (raw
    # rows left free, XLA:GPU's latency-hiding scheduler ran decodes beside them instead); decode
    # k-1 reads a zero made from transfer k's operands, so it comes after all of them
    tie = zero_after(recv) + (zero_after(outs[k - 2]) if k >= 2 else 0)
    prev, (recv, after) = recv, preps[k][2](preps[k][1](tie), tie)
    outs[k - 1] = preps[k - 1][3](prev, after)
  # the last transfer ends after the decode before it (its result is read once that exists)
  last_tie = zero_after(outs[-2]) if len(preps) > 1 else jnp.zeros((), jnp.int32)
  outs[-1] = preps[-1][3](recv, last_tie)
  flag = jnp.any(jnp.stack([p[0] for p in preps]))
  accounting.count(site, flag)
  return flag, lambda: lax.bitcast_convert_type(
      jnp.concatenate([lax.bitcast_convert_type(o, u) for o in outs], axis=1), dt)
