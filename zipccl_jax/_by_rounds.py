"""The two-level all_to_all's rounds: rows out one per round of collective-permutes, coded or raw.

`exchange_rounds` is the fourth exchange of `zipccl_jax._exchange` (whose docstring has the others,
the own row, overflow and the uniform fallback), used by `zipccl_jax.hierarchical` for the rows that
cross the slow level when the fast level is coded too or the slow one raw. Wire, per sender:
``uint8[C]`` per round, ``(H - 1) L`` rounds, and one int32 psum over `fast`. Padded only: the
receivers of a round are fixed, and its fallback spans every device.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from zipccl_jax import accounting, codec
from zipccl_jax._exchange import cond_bits, decode_guarded, encode_rows, in_fallback, raw_bits
from zipccl_jax._shard import lax_ppermute, vary


def _permute_rounds(payload, axes, perms, send, arrival):
  """Row `send[r]` of `payload` (F, w) goes out in round r, a collective-permute `perms[r]` over
  `axes`; returns (rows in `arrival` order: row j is what round `arrival[j]` brought, (R, w) as
  received)."""
  out = payload[send]
  recv = jnp.stack([lax_ppermute(out[i], axes, p) for i, p in enumerate(perms)])
  return recv[arrival], recv


def raw_rounds(rows, *, axes, perms, send, arrival):
  """`_permute_rounds` of the bit patterns of `rows` (F, m), uncoded."""
  return raw_bits(lambda u: _permute_rounds(u, axes, perms, send, arrival)[0], rows)


def exchange_rounds(rows, *, axes, perms, send, arrival, skip, flag_axis, capacity: int,
                    site: str):
  """`raw_rounds`, coded: rows (F, m) -> (F, m) in `arrival` order; rows flagged in `skip` (F,)
  are neither coded nor read (zeros).

  Uniform fallback: the raw rounds span every device, so all must agree. A receiver sees the
  poisoned frames of every sender whose rows reach it; the senders that send it nothing (the
  rest of its `flag_axis` group, e.g. its own host) report their overflow through a 4-byte
  psum over `flag_axis`.
  """
  payload, _, over = encode_rows(rows, capacity, skip)
  by_src, recv = _permute_rounds(payload, axes, perms, send, arrival)
  group_over = lax.psum(vary(over.astype(jnp.int32), (flag_axis,)), flag_axis) > 0
  fallback = codec.any_overflow(recv, capacity) | group_over
  accounting.count(site, fallback)

  def coded():
    return decode_guarded(by_src, fallback, rows.shape[1], rows.dtype, skip)

  def raw():
    return raw_rounds(rows, axes=axes, perms=perms, send=send, arrival=arrival)

  return cond_bits(fallback, lambda: in_fallback(raw), coded)
