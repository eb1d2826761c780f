"""The two-level all_to_all's rounds: rows out one per round of collective-permutes, coded or raw.

`exchange_rounds` is the fourth exchange of `zipccl_jax._exchange` (whose docstring has the others,
the own row, overflow and the uniform fallback), used by `zipccl_jax.hierarchical` for the rows that
cross the slow level when the fast level is coded too or the slow one raw. Wire, per sender:
``uint8[C]`` per round, ``(H - 1) L`` rounds, and one int32 psum over `fast` (an all_gather over one
axis split into levels). Padded only: the receivers of a round are fixed, and its fallback spans
every device.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from zipccl_jax import accounting, codec
from zipccl_jax._exchange import cond_bits, decode_guarded, encode_rows, in_fallback, raw_bits
from zipccl_jax._shard import axes_of, lax_ppermute, vary


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


def exchange_rounds(rows, *, axes, perms, send, arrival, skip, flag_over: dict, capacity: int,
                    site: str):
  """`raw_rounds`, coded: rows (F, m) -> (F, m) in `arrival` order; rows flagged in `skip` (F,)
  are neither coded nor read (zeros).

  Uniform fallback: the raw rounds span every device, so all must agree. A receiver sees the
  poisoned frames of every sender whose rows reach it; the senders that send it nothing (the
  rest of its group, e.g. its own host) report their overflow through a 4-byte psum over
  `flag_over` (``axis_name`` of that group's collective; with ``axis_index_groups``, an all_gather
  of the flags, ``4 L`` bytes).
  """
  payload, _, over = encode_rows(rows, capacity, skip)
  by_src, recv = _permute_rounds(payload, axes, perms, send, arrival)
  flag = vary(over.astype(jnp.int32), axes_of(flag_over["axis_name"]))
  if flag_over.get("axis_index_groups") is None:
    group_over = lax.psum(flag, **flag_over) > 0
  else:  # jax's psum over axis_index_groups raises NotImplementedError under check_vma
    group_over = jnp.any(lax.all_gather(flag, **flag_over) > 0)
  fallback = codec.any_overflow(recv, capacity) | group_over
  accounting.count(site, fallback)

  def coded():
    return decode_guarded(by_src, fallback, rows.shape[1], rows.dtype, skip)

  def raw():
    return raw_rounds(rows, axes=axes, perms=perms, send=send, arrival=arrival)

  return cond_bits(fallback, lambda: in_fallback(raw), coded)
