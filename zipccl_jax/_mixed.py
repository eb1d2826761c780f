"""The two-level all_to_all's mixed slot exchange: host coded, local raw, in one collective.

`exchange_mixed` is the fifth exchange of `zipccl_jax._exchange` (whose docstring has the others,
the own row, overflow and the uniform fallback), used by `zipccl_jax.hierarchical`'s "host coded,
local raw" all_to_all over ``(slow, fast)`` (or over one axis split into those levels,
`zipccl_jax._shard.TwoLevels`). Wire, per sender: ``uint8[n, C]`` over ``(slow,
fast)``, then the tails, ``[L, T]`` elements over `fast`, when ``T > 0``.

The mixed slot exchange (``n = H L`` ranks ``h' L + l'``, rows of ``B = m * itemsize`` bytes): the
slot for a rank of another `slow` group (``h' != h``) holds the row's coded frame; the slot for a
rank of the own group holds, raw, the first ``min(C - 8, B)`` bytes of the row's bit pattern (whole
elements), zero-padded, and in its last 8 bytes the sender's overflow flag (0xFF or 0); what is
left of those L rows (``T = B - head`` bytes each, as elements) goes in one all_to_all over `fast`.
So every row crosses one level once: the coded ones in the slot exchange, the own group's raw,
split between the slot exchange and the tails. The self slot carries the rank's own head (a local
copy inside the collective); the result takes the self row from the operand. The ragged transport
does not apply (a raw head fills its slot): this exchange is padded only.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np
from jax import lax

from zipccl_jax import accounting, codec
from zipccl_jax import format as fmt
from zipccl_jax._bits import uint_of
from zipccl_jax._exchange import cond_bits, decode_guarded, encode_rows, in_fallback, with_own_row
from zipccl_jax._shard import TwoLevels

# The last bytes of an own-group slot of `exchange_mixed`: its sender's overflow flag.
MIXED_FLAG_BYTES = 8


def _byte_view(bits):
  """uint (F, w) -> uint8 (F, w * itemsize): the bytes of the words (bitcasts, no float op).

  16-bit words go through uint32 pairs behind an optimization barrier: XLA:CPU splits a u16 into
  bytes ~4x slower than a u32 (and would fold the two bitcasts into that one)."""
  F, w = bits.shape
  if bits.dtype == jnp.uint16 and w % 2 == 0:
    bits = lax.optimization_barrier(lax.bitcast_convert_type(bits.reshape(F, w // 2, 2),
                                                             jnp.uint32))
  return lax.bitcast_convert_type(bits, jnp.uint8).reshape(F, -1)


def _words(b, u):
  """uint8 (F, w * itemsize) -> (F, w) of the uint type `u`: the inverse of `_byte_view`."""
  k = np.dtype(u).itemsize
  return b if k == 1 else lax.bitcast_convert_type(b.reshape(b.shape[0], -1, k), u)


def mixed_head_elems(capacity: int, m: int, dtype) -> int:
  """Elements of an own-group row of `m` that ride raw in its `exchange_mixed` slot of `capacity`
  bytes: as many whole elements as fit before the flag (the other ones move in the tails)."""
  return min((capacity - MIXED_FLAG_BYTES) // np.dtype(dtype).itemsize, m)


def own_slots(bits, capacity: int, over):
  """bits (L, m), the own group's rows as bit patterns -> uint8 (L, C): each row's slot of
  `exchange_mixed`, its first whole elements that fit before the flag (`mixed_head_elems`) as bytes,
  zero-padded, and `over`, the sender's overflow flag, in the last ``MIXED_FLAG_BYTES``."""
  L, m = bits.shape
  hw = mixed_head_elems(capacity, m, bits.dtype)
  flag_at = capacity - MIXED_FLAG_BYTES
  flag = jnp.broadcast_to(jnp.where(over, jnp.uint8(0xFF), jnp.uint8(0)), (L, MIXED_FLAG_BYTES))
  pad = flag_at - hw * bits.dtype.itemsize  # bytes between the head and the flag
  return jnp.concatenate([jnp.pad(_byte_view(bits[:, :hw]), ((0, 0), (0, pad))), flag], axis=1)


def own_rows(slots, tails, m: int, u):
  """The inverse of `own_slots`: slots uint8 (L, C) and tails (L, m - hw) of the uint type `u` (None
  when the rows fit in their slots) -> the rows' bit patterns (L, m)."""
  hw = mixed_head_elems(slots.shape[1], m, u)
  got = _words(slots[:, :hw * np.dtype(u).itemsize], u)
  return got if tails is None else jnp.concatenate([got, tails], axis=1)


def slot_passes(rows, capacity: int):
  """rows (R, m) -> their bit patterns (R, m): what `exchange_mixed` runs over its own group's rows
  besides the exchange, on every row: into their slots of `capacity` bytes (`own_slots`), back out
  (`own_rows`), and joined with their tails. :func:`zipccl_jax.calibrate` times it, the rate
  ``CodecModel.slot_Bps`` that the cost model charges the mixed exchange's own rows."""
  bits = lax.bitcast_convert_type(rows, uint_of(rows.dtype))
  m = rows.shape[1]
  hw = mixed_head_elems(capacity, m, rows.dtype)
  over = jnp.any(bits[:, 0] == 0)  # traced, as the exchange's overflow flag is
  return own_rows(own_slots(bits, capacity, over), bits[:, hw:] if hw < m else None, m, bits.dtype)


def exchange_mixed(rows, *, grid: TwoLevels, capacity: int, site: str, raw: Callable,
                   finish: Callable = lambda out: out):
  """rows (n, m), row j for rank j = h' L + l' of `grid` (the axes ``(slow, fast)``, or one axis
  split into levels) -> `finish(got)`, got (n, m) with row s from rank s: the rows for other
  hosts coded, the own host's raw.

  The "mixed slot" exchange (padded transport only; wire layout in the module docstring): one
  all_to_all over every rank (`grid.axes`) of ``uint8[n, C]`` slots, where the slot of a rank of
  another group holds the coded frame (the encoder skips the own group's rows) and the slot of a rank of
  the own group holds the first ``min(C - 8, B)`` bytes of the row's bit pattern (``B = m *
  itemsize``) and, in its last 8 bytes, the sender's overflow flag; the rest of the own group's
  rows (when ``B > C - 8``) goes in one all_to_all over the fast level, as elements. The self row is
  taken from `rows`.

  Uniform fallback: `raw()` (the flat `jax.lax` all_to_all on the operand's bits, returning what
  `finish` returns) spans every device, so all must agree, and they do without a collective of
  its own: every receiver gets one slot from every sender, a frame (poisoned if its sender
  overflowed anywhere) from the other groups and a flag from its own group, so every receiver
  sees every sender's overflow. The frame test reads only the slots that hold frames (a raw
  head's bytes [16, 24) could read as any ``frame_bytes``).
  """
  n, m = rows.shape
  dt = np.dtype(rows.dtype)
  u = uint_of(dt)
  L = grid.L
  flag_at = capacity - MIXED_FLAG_BYTES                 # C >= 32 (a frame header)
  hw = mixed_head_elems(capacity, m, dt)                # elements of an own-group row in its slot
  # varying over the axes like the data: vmap's dynamic-slice rule combines them with the rows'
  h, l = grid.coords()
  own = jnp.arange(n, dtype=jnp.int32) // L == h        # (n,): rows for / from the own group
  payload, _, over = encode_rows(rows, capacity, own)
  bits = lax.bitcast_convert_type(rows, u)
  mine = lax.dynamic_slice_in_dim(bits, h * L, L, 0)                        # (L, m)
  slots = lax.dynamic_update_slice_in_dim(payload, own_slots(mine, capacity, over), h * L, 0)
  recv = lax.all_to_all(slots, grid.axes, 0, 0, tiled=True)                # (n, C): row s from s
  tails = None
  if hw < m:  # (L, m - hw): from (h, l')
    tails = lax.all_to_all(mine[:, hw:], split_axis=0, concat_axis=0, tiled=True,
                           **grid.over("fast"))
  frames = jnp.where(own[:, None], jnp.uint8(0), recv[:, :fmt.FRAME_HEADER_BYTES])
  flags = jnp.where(own, recv[:, flag_at], jnp.uint8(0))
  fallback = codec.any_overflow(frames, capacity) | jnp.any(flags != 0)
  accounting.count(site, fallback)
  self_row = lax.dynamic_index_in_dim(bits, h * L + l, 0, keepdims=False)   # never moved

  def coded():
    dec = decode_guarded(recv, fallback, m, rows.dtype, own)                # own group's rows: 0
    got = own_rows(lax.dynamic_slice_in_dim(recv, h * L, L, 0), tails, m, u)  # (L, m)
    got = jnp.where((jnp.arange(L, dtype=jnp.int32) == l)[:, None], self_row[None, :], got)
    H = n // L
    out = with_own_row(dec.reshape(H, L * m), lax.bitcast_convert_type(got, rows.dtype).reshape(
        L * m), jnp.arange(H, dtype=jnp.int32) == h)
    return finish(out.reshape(n, m))

  return cond_bits(fallback, lambda: in_fallback(raw), coded)
