"""The third exchange: permute a row (`zipccl_jax.ppermute`), on the wire of `zipccl_jax._exchange`.

Each sender's row goes to its destination in `perm`. Padded, the overflow flag goes through a 4-byte
psum over every manual mesh axis (a receiver sees one sender only); ragged, the receiver reads its
one sender's size and needs no flag and no conditional. In pieces, the padded transfers are chained
(XLA:GPU combines independent collective-permutes into one) and the ragged ones pipelined
(`_pieces.pipelined_pieces`).
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np
from jax import lax

from zipccl_jax import accounting
from zipccl_jax._bits import uint_of, zero_after
from zipccl_jax._exchange import (_after, _decode_slots, _encode_sized, _ragged_call,
                                  _ragged_frames, _raw_into, by_transport, cond_bits, decode_any,
                                  decode_guarded, encode_rows)
from zipccl_jax._pieces import decode_pieces, unless_fallback
from zipccl_jax._shard import (lax_ppermute, manual_axes, perm_in_tuple_order, ppermute_index, vary,
                               vary_like)
from zipccl_jax.accounting import in_fallback


def permute_row(x, *, axis_name, n: int, perm, capacity: int, transport: str, site: str,
                raw: Callable, pieces: int = 1):
  """`x` of rank s to rank d for (s, d) in `perm` (zeros where no one sends), coded as one row
  (`pieces` > 1: its columns in that many chains, `_pieces`).

  Padded transport: the overflow flag goes through a 4-byte psum over every manual axis (see the
  docstring); a rank that receives nothing decodes the zeros it got (rejected frames,
  `decode_any`) and a select zeroes them, so the only conditional is the call's fallback. Ragged
  transport: no flag and no conditional (`ragged_permute`).
  """
  def ragged(x):
    chain = lambda r, cap: ragged_permute(r, axis_name, n, perm, cap)  # noqa: E731
    return _ragged_call(x.reshape(1, x.size), chain, pieces, capacity, site,
                        lambda got: got.reshape(x.shape),
                        stages=lambda r, cap: permute_stages(r, axis_name, n, perm, cap))

  return by_transport(transport, lambda x: _permute_padded(x, axis_name, n, perm, capacity, site,
                                                           raw, pieces), ragged, x)


def _permute_padded(x, axis_name, n: int, perm, capacity: int, site: str, raw: Callable,
                    pieces: int):
  """`permute_row` on the padded transport."""
  m = x.size
  receivers = np.zeros((n,), bool)
  for _, d in perm:
    receivers[d] = True
  every = receivers.all()

  last = None  # pieces: the previous piece's received frame

  def move(r, cap):  # r (1, m_k) -> (overflowed here, the frame received (C_k,))
    nonlocal last
    payload, _, over = encode_rows(r, cap)
    if last is not None:  # after the previous piece's transfer: XLA would combine independent
      payload, _ = lax.optimization_barrier((payload, last))  # permutes (no overlap left)
    last = lax_ppermute(payload[0], axis_name, perm)
    return over, last

  if pieces > 1:
    def chain(r, cap):
      over, recv = move(r, cap)
      return over, recv[None], None
    over, got = decode_pieces(x.reshape(1, m), pieces, capacity, chain)
    decoded = lambda: got  # noqa: E731
  else:
    over, recv = move(x.reshape(1, m), capacity)
    decoded = ((lambda: decode_guarded(recv[None], any_over, m, x.dtype)) if every
               else (lambda: decode_any(recv[None], m, x.dtype)))
  flag_axes = manual_axes(axis_name)
  any_over = lax.psum(vary(over.astype(jnp.int32), flag_axes), flag_axes) > 0
  accounting.count(site, any_over)

  def coded():
    out = decoded().reshape(x.shape)
    if every:
      return out
    is_recv = jnp.asarray(receivers)[ppermute_index(axis_name)]
    u = uint_of(x.dtype)
    bits = jnp.where(is_recv, lax.bitcast_convert_type(out, u), jnp.zeros((), u))
    return lax.bitcast_convert_type(bits, x.dtype)

  if pieces > 1:
    return unless_fallback(any_over, raw, coded())
  return cond_bits(any_over, lambda: in_fallback(raw), coded)


def ragged_permute(rows, axis_name, n: int, perm, capacity: int):
  """`permute_row` on the ragged transport, with no conditional and no flag: rows (1, m) -> (a row
  came raw, got (1, m): the row from this rank's source in `perm`, zeros if it has none).

  The size goes to the destination by an int32 ppermute (0 arrives where no one sends: a frame is
  never empty), the raw bits, where the frame did not fit, by a ragged exchange into one slot, then
  the frame by a second one into that slot (`permute_stages`). The receiver alone decides how to
  read its slot, so no rank waits on another's overflow.
  """
  flag, fill, transfer, decode = permute_stages(rows, axis_name, n, perm, capacity)
  return flag, decode(transfer(fill(), None), None)


def permute_stages(rows, axis_name, n: int, perm, capacity: int):
  """`ragged_permute` as `pipelined_pieces`' stages (`gather_stages`' contract)."""
  # the ragged exchange numbers ranks as all_to_all does (a tuple's order), `perm` as ppermute
  dest, src = np.full((n,), -1, np.int32), np.full((n,), -1, np.int32)
  for s, d in perm_in_tuple_order(axis_name, perm):
    dest[s], src[d] = d, s
  me = lax.axis_index(axis_name)
  to = jnp.arange(n, dtype=jnp.int32) == jnp.asarray(dest)[me]
  frm = jnp.arange(n, dtype=jnp.int32) == jnp.asarray(src)[me]
  payload, frame_cap, slot, size = _encode_sized(rows, capacity)
  got = lax_ppermute(size[0], axis_name, perm)  # what my source sends: > 0 frame, -1 raw, 0 none
  zeros = vary_like(jnp.full((1, slot), zero_after(payload, jnp.uint8)), payload)
  def fill(tie=None):
    return _raw_into(zeros, rows, jnp.zeros((n,), jnp.int32), to & (size[0] < 0), frm & (got < 0),
                     axis_name, slot, one_slot=True, tie=tie)

  as_raw = (got < 0)[None]

  def transfer(buf, tie):
    return _ragged_frames(payload[0], jnp.where(to, jnp.maximum(size[0], 0), 0),
                          jnp.where(frm, jnp.maximum(got, 0), 0), axis_name, n, frame_cap, slot,
                          one_slot=True, out=buf, tie=tie)

  def decode(received, tie):
    return _decode_slots(_after(received, tie, (1, slot)), rows.shape[1], rows.dtype, as_raw,
                         (got == 0)[None])

  return as_raw[0], fill, transfer, decode
