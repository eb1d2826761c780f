"""The wire protocol, written once: exchange rows, gather a row, permute a row.

Every compressed collective is one of five exchanges of coded rows. On the padded transport each
ends in a uniform overflow test and a `lax.cond` between the coded result and the raw fallback;
on the ragged transport the first three have no conditional: a row that does not fit travels raw:

* `exchange_rows`: row j of each sender's `(n, m)` rows goes to rank j (all_to_all,
  psum_scatter and psum's first phase);
* `gather_row`: each sender's row goes to every rank (all_gather, psum's second phase);
* `permute_row` (`zipccl_jax._permute`): each sender's row goes to its destination in `perm`
  (ppermute);
* `exchange_rounds` (`zipccl_jax._by_rounds`): rows in rounds of collective-permutes, one row per
  round (`zipccl_jax.hierarchical`'s all_to_all: the rows that cross the slow level, when the fast
  level is coded too or the slow one raw);
* `exchange_mixed` (`zipccl_jax._mixed`): row j to rank j over ``(slow, fast)``, coded only for the
  ranks of other `slow` groups (the two-level all_to_all, slow level coded, fast raw).

Padded transport (everywhere)
-----------------------------
Each row of ``m`` elements is encoded into exactly ``C = capacity`` bytes, and the ``jax.lax``
collective moves ``C`` bytes per row. What crosses the wire per sender, for an axis of size
``n``::

  exchange_rows:   uint8[n, C]   (row j goes to rank j)
  gather_row:      uint8[C]      (to every rank)
  permute_row:     uint8[C]      (+ one int32 psum, see below)
  exchange_rounds: uint8[C] per round, (H - 1) L rounds   (+ one int32 psum over fast)
  exchange_mixed:  uint8[n, C] over (slow, fast) + tails over fast (`zipccl_jax._mixed`)

The row a rank keeps (row ``me`` of `exchange_rows`, its own row of `gather_row`) never crosses
the network, so it is not coded: the codec skips that row (an all-zero row of ``C`` bytes goes
to itself) and the result takes the raw row in its place (`with_own_row`). That saves ``1/n``
of the codec work and changes no result bit.

Ragged transport (``transport="ragged"``, or ``"auto"`` off CPU)
-----------------------------------------------------------------
The same frames go through ``jax.lax.ragged_all_to_all``, so only each frame's ``nbytes`` move,
after a tiny int32 exchange of the sizes (-1: the row did not fit and travels raw)::

  exchange_rows:   int32[n] all_to_all,  then the raw rows, then the frames (bytes that move only)
  gather_row:      int32[1] all_gather,  then the raw row, then the frame to every other rank
  permute_row:     int32 collective-permute,  then the raw row, then the frame (one slot)

XLA:CPU does not implement ragged-all-to-all: there
`zipccl_jax._ragged.exchange` runs an exact emulation (the frames move padded to ``C`` bytes), so
the ragged transport executes, and is tested, on CPU too. Frame offsets are int64 once ``n * C``
can pass 2**31. A device-invariant gather (psum's second phase, ``all_gather(to="invarying")``)
stays padded.

On the ragged transport (XLA:GPU's default) `exchange_rows` (all_to_all, ragged_all_to_all,
psum_scatter, psum's first phase), `gather_row` (all_gather, psum's gather when its result may
vary) and `permute_row` (ppermute) have no fallback and no ``lax.cond``: a row whose frame does
not fit travels raw, alone, in a ragged exchange of its own, into the same receive buffer
(`ragged_rows`, `ragged_gather`, `ragged_permute`; `_raw_into`). XLA:GPU runs a conditional by
copying its predicate to the host and waiting for the stream, so a padded call stops the host
once; these never do (on XLA's one-shot ragged kernel, intra-node; its NCCL path reads the sizes
on the host itself). A device-invariant gather and the two-level rounds keep the uniform
fallback below.

Overflow (uniform fallback)
---------------------------
A row whose frame does not fit in ``C`` overflows: the codec writes only the 32-byte header,
whose ``frame_bytes`` field (bytes [16, 24)) is the needed size, > C. If any row of a sender
overflows, the sender also sets ``frame_bytes = 2**64 - 1`` in every other frame it sends
(`codec.poison_overflow`). In `exchange_rows` every receiver gets one frame from every sender,
and in `gather_row` every frame, so every rank sees the same set of poisoned senders and
computes the same predicate ``any(frame_bytes > C)`` (`codec.any_overflow`) without an extra
collective (the two-level exchanges, whose receivers get frames only from other `slow` groups,
carry the own group's flags otherwise: `_by_rounds`, `_mixed`); then every rank takes the same
branch: the raw ``jax.lax`` collective on the bits of the original operand (the coded bytes
already moved are wasted), inside the named scope `accounting.FALLBACK_SCOPE`. The predicate
agrees within each group of the collective; XLA lowers these collectives to per-group
operations, so groups may decide differently. A padded `permute_row` receiver sees one sender
only, and XLA lowers a ppermute over one mesh axis to a single collective-permute that every
device joins, so there the flag goes through a 4-byte ``psum`` over every manual mesh axis.

Under ``jax.vmap`` the predicate is per example and the cond becomes a select: both branches run
(both collectives run everywhere, still matched), `decode_guarded` skips the examples that fell
back, and the select works on uint views (`cond_bits`) so NaN payloads survive.

Pieces (pipelining)
-------------------
`exchange_rows`, `gather_row` and `permute_row` take ``pieces=K``: the columns are split into K
pieces (`capacity.piece_bounds`), each coded in its own frames with its share of the capacity
(`capacity.piece_capacities`), moved by its own collective and decoded outside any conditional
(`zipccl_jax._pieces`). Padded, each piece is decoded into its columns of one result and one loop
per call takes the raw collective if any piece overflowed; ragged, the pieces are joined (no
fallback: each piece sends its own raw rows). The padded transfers share no value, so XLA:GPU
overlaps encoding piece k+1 with the transfer of piece k and decodes with the last transfers
(`strategy.programs.SCHEDULED`); on the ragged transport the pieces are ordered by data so that
decode k runs while exchange k+1 is in flight (`_pieces.pipelined_pieces`). The bits do
not depend on K. The strategy picks K (`strategy.decide`): 1 on CPU, whose collectives are blocking
thunks on devices that share the host's cores (K > 1 only adds per-piece overheads). `permute_row`'s
padded transfers are chained (piece k+1's frame waits for piece k's transfer behind an optimization
barrier), since XLA:GPU combines independent collective-permutes into one. psum_scatter's pieces are
not independent: `zipccl_jax._reduce` runs them one after another, for memory.

Reductions
----------
`zipccl_jax._reduce` sums what these exchanges deliver (`ordered_sum`: ascending rank order in
float32, rounded once, raw or coded, so reductions return the same bits whatever the transport),
and runs psum_scatter's pieces one after another (`reduce_rows`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from zipccl_jax import _ragged, accounting, codec
from zipccl_jax._bits import uint_of, zero_after
from zipccl_jax._pieces import decode_pieces, pipelined_pieces, unless_fallback
from zipccl_jax._shard import vary_like
from zipccl_jax.accounting import in_fallback

# --------------------------------------------------------------------------- #
# Bits, branches and the own row
# --------------------------------------------------------------------------- #

def raw_bits(fn, x):
  """`fn` (a data-movement collective) applied to the bit pattern of `x`.

  Moving bits instead of floats keeps NaN payloads intact and stops XLA:CPU
  from widening 16-bit float collectives to float32.
  """
  dt = x.dtype
  u = lax.bitcast_convert_type(x, uint_of(dt))
  return lax.bitcast_convert_type(fn(u), dt)


def cond_bits(pred, raw_fn: Callable, coded_fn: Callable):
  """`lax.cond(pred, raw_fn, coded_fn)` carried as bit patterns.

  Under `jax.vmap` a cond with a batched predicate becomes a select, which
  XLA:CPU evaluates on floats and which may rewrite NaN payloads; selecting
  the uint views keeps every bit.
  """
  box = {}

  def as_bits(fn):
    def g():
      y = fn()
      box["dtype"] = y.dtype
      return lax.bitcast_convert_type(y, uint_of(y.dtype))
    return g

  out = lax.cond(pred, as_bits(raw_fn), as_bits(coded_fn))
  return lax.bitcast_convert_type(out, box["dtype"])


# Own-row skipping off: on an axis of size 1 the one row is the own row, so nothing would be coded.
# Tests on a one-GPU host turn it off (`code_own_row`) to run encode, transport, the overflow test,
# the raw fallback and decode there; read at trace time, and no result bit changes.
_CODE_OWN_ROW: contextvars.ContextVar[bool] = contextvars.ContextVar("zipccl_code_own_row",
                                                                     default=False)


@contextlib.contextmanager
def code_own_row():
  """Within the block, collectives traced code and decode the own row too (for tests on one device).

  >>> with code_own_row():            # doctest: +SKIP
  ...   f = jax.jit(shard_map_over_one_device)   # its one row goes through the codec
  """
  token = _CODE_OWN_ROW.set(True)
  try:
    yield
  finally:
    _CODE_OWN_ROW.reset(token)


def coding_own_row() -> bool:
  """Whether `code_own_row` is active (then an axis of size 1 takes the coded path too)."""
  return _CODE_OWN_ROW.get()


# The `axis_index_groups` of the collective being traced (None: the whole axis). Set by the
# collectives' recipes around a grouped call's coded exchange (`in_groups`), read by every exchange
# below: n is then the group's size and a rank's index its position in its group, as in jax.lax.
_GROUPS: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("zipccl_groups",
                                                                       default=None)


@contextlib.contextmanager
def in_groups(groups: tuple | None):
  """Within the block, the exchanges traced run inside `groups` (``axis_index_groups`` as
  `_shard.check_groups` returns them; None: the whole axis)."""
  token = _GROUPS.set(groups)
  try:
    yield
  finally:
    _GROUPS.reset(token)


def rank(axis_name, dtype=jnp.int32):
  """This device's rank on `axis_name`, or its position in its group (`in_groups`), as `dtype`."""
  groups = _GROUPS.get()
  me = lax.axis_index(axis_name)
  if groups is None:
    return me.astype(dtype)
  position = np.zeros((sum(len(g) for g in groups),), np.int64)
  for g in groups:
    position[list(g)] = np.arange(len(g))
  return jnp.asarray(position, dtype)[me]


def own_row(axis_name, n: int):
  """The (n,) mask of this rank's own row on `axis_name` (never coded, see the docstring), all
  False inside `code_own_row`."""
  rows = jnp.arange(n, dtype=jnp.int32)  # before axis_index: the lowering's order as it always was
  me = rank(axis_name)
  if coding_own_row():
    me = me - n  # a rank no row has: the mask stays device-varying, as the skipping one is
  return rows == me


def put_own_row(got, rows, axis_name):
  """`got` (n, m) with this rank's row taken from `rows` ((n, m): row `rank`; (1, m): that row),
  updated in place (no row of `got` is this rank's inside `code_own_row`). Where `got` is a buffer
  the pieces were decoded into (`_pieces.decode_pieces`), `with_own_row`'s select would write a
  new one (a result's bytes more) where XLA cannot reuse it."""
  if coding_own_row():
    return got
  u = uint_of(got.dtype)
  me = rank(axis_name)
  bits = lax.bitcast_convert_type(rows, u)
  own = bits if bits.shape[0] == 1 else lax.dynamic_slice_in_dim(bits, me, 1, 0)
  out = lax.dynamic_update_slice_in_dim(lax.bitcast_convert_type(got, u), own, me, 0)
  return lax.bitcast_convert_type(out, got.dtype)


def with_own_row(decoded, rows, skip):
  """`decoded` (n, m) with the rows flagged in `skip` (n,) taken from `rows` ((n, m), or (m,) for all).

  One select on the bit patterns, which XLA fuses with the decoder's output: a row update
  (dynamic_update_slice on the bit view) cost three passes over it on XLA:CPU (bitcast, copy,
  update), as a 16-bit float array cannot be bitcast in place.
  """
  u = uint_of(rows.dtype)
  own = lax.bitcast_convert_type(rows, u)
  bits = jnp.where(skip[:, None], own if own.ndim == 2 else own[None, :],
                   lax.bitcast_convert_type(decoded, u))
  return lax.bitcast_convert_type(bits, rows.dtype)


# --------------------------------------------------------------------------- #
# Coding
# --------------------------------------------------------------------------- #

def encode_rows(rows, capacity: int, skip=None):
  """rows (F, m) -> payload uint8 (F, C), nbytes (F,), any_overflow (bool).

  If any frame overflowed, every frame's `frame_bytes` is poisoned to 2^64-1.
  Rows flagged in `skip` (F,) are not coded (zero row, nbytes 0).
  """
  payload, nbytes = codec.encode_frames(rows, capacity=capacity, skip=skip)
  payload, over = codec.poison_overflow(payload, nbytes, capacity)
  return payload, nbytes, over


def decode_guarded(recv, fallback, m: int, dtype, skip=None):
  """Decode in the coded branch of `lax.cond(fallback, raw, coded)`.

  Unbatched, the cond never runs this on poisoned frames. Under `jax.vmap`
  the predicate is per example and the cond becomes a select that runs both
  branches, so the batching rule decodes example by example and skips the
  ones that fell back (their rows are discarded by the select). Rows flagged
  in `skip` (R,) are not read and come out as zeros.
  """
  if skip is None:
    skip = jnp.zeros((recv.shape[0],), jnp.bool_)

  @jax.custom_batching.custom_vmap
  def dec(recv, fallback, skip):
    return codec.decode_frames(recv, shape=(m,), dtype=dtype, skip=skip)

  @dec.def_vmap
  def dec_vmap(axis_size, in_batched, recv, fallback, skip):
    rb, fb, sb = in_batched
    if not rb:
      recv = jnp.broadcast_to(recv, (axis_size,) + recv.shape)
    if not fb:
      fallback = jnp.broadcast_to(fallback, (axis_size,))
    if not sb:
      skip = jnp.broadcast_to(skip, (axis_size,) + skip.shape)

    u = uint_of(dtype)

    def one(args):  # bit patterns: XLA:CPU updates the map's float carry through float32,
      r, f, k = args  # which rewrites NaN payloads (0x7fc1 -> 0x7fc0 in bfloat16)
      return lax.cond(f, lambda: vary_like(jnp.zeros((r.shape[0], m), u), r),
                      lambda: lax.bitcast_convert_type(dec(r, f, k), u))

    return lax.bitcast_convert_type(lax.map(one, (recv, fallback, skip)), dtype), True

  return dec(recv, fallback, skip)


def decode_any(recv, m: int, dtype, skip=None):
  """Decode outside the fallback's conditional: never raises (a poisoned frame's row comes out as
  NaNs, `codec.decode_frames` with a status), so it runs unconditionally, batched or not, and
  the caller's `lax.cond` discards it when the call fell back."""
  return codec.decode_frames(recv, shape=(m,), dtype=dtype, skip=skip, return_status=True)[0]


# --------------------------------------------------------------------------- #
# Transport: padded or ragged
# --------------------------------------------------------------------------- #

def _zero_like_batch(p):
  """An int32 zero that is batched exactly when `p` is (ragged_all_to_all's
  batching rule needs every offset/size operand batched)."""
  return (p.reshape(-1)[0] & 0).astype(jnp.int32)


def by_transport(transport: str, padded: Callable, ragged: Callable, *args):
  if transport == "padded":
    return padded(*args)
  if transport == "ragged":
    return ragged(*args)
  if transport != "auto":
    raise ValueError(f"zipccl_jax: transport must be 'auto', 'padded' or 'ragged', got "
                     f"{transport!r}")
  return lax.platform_dependent(*args, cpu=padded, default=ragged)


# A ragged exchange moves bytes in rows of this many (or of the largest power of two dividing every
# buffer's width, `_unit`): XLA:GPU's ragged-all-to-all moved 64 MiB to itself on one H200 in 186 ms as
# 1-byte rows, 48 ms as 4-byte rows and 25 ms as rows of 64 bytes or more
# (benchmarks/ragged_rows_gpu.py, benchmarks/results/ragged_rows_h200.json).
_UNIT_BYTES = 64


def _unit(*widths: int) -> int:
  """The row width, in bytes, that divides every one of `widths` (bytes), at most `_UNIT_BYTES`."""
  return math.gcd(_UNIT_BYTES, *(int(w) for w in widths))


def _in_units(nbytes, unit: int):
  """Rows of `unit` bytes that hold `nbytes` (a frame's zero tail pads its last row)."""
  return (nbytes + (unit - 1)) // unit


def _ragged_frames(payload, send, recv_sizes, axis_name, n: int, capacity: int,
                   slot: int | None = None, one_slot: bool = False, out=None, tie=None):
  """The ragged transport of frames: payload (n, C), frame j to rank j (`ragged_rows`), or (C,),
  the one frame to every rank with ``send[j] > 0`` (`ragged_gather`, `ragged_permute`). Only
  ``send[j]`` bytes go to rank j; returns (n, slot), row s holding the ``recv_sizes[s]`` bytes from
  rank s, zeros after (``slot`` bytes per received row, default C: room for a raw row too), or,
  `one_slot` (one sender at most: ppermute), (1, slot). The bytes move in rows of `_unit` bytes,
  a frame's last row padded by its zero tail. `out`: the receive buffer ((slots, slot) uint8,
  e.g. `_raw_into`'s, whose raw rows the frames leave in place), instead of zeros. `tie`: a zero
  (int32 scalar, `zero_after` what must come first) added to the offsets, so that the exchange
  waits for it; then returns (received, in the exchange's own (rows, unit) shape for `_after`,
  and a zero made from every operand: what reads it comes after all of them, `pipelined_pieces`)."""
  slot = capacity if slot is None else slot
  u = _unit(capacity, slot)
  slots = 1 if one_slot else n
  # tied: 64-bit offsets, the type XLA:GPU's ragged exchange runs on; 32-bit ones it converts in
  # fusions of their own, past the barrier below, which its scheduler may place after the decode
  # that should run during this exchange
  dt = (np.dtype(np.int64) if tie is not None
        else _ragged.offsets_dtype(max(n * capacity, slots * slot) // u))
  with _ragged.index_scope(dt):
    z = _zero_like_batch(payload).astype(dt)
    start = jnp.arange(n, dtype=dt) * (capacity // u) if payload.ndim == 2 else jnp.zeros((n,), dt)
    in_off = vary_like(start, payload) + z
    at = jnp.zeros((), dt) if one_slot else rank(axis_name, dt)
    out_off = vary_like(jnp.full((n,), slot // u, dt) * at, payload) + z
    if tie is not None:
      out_off = out_off + tie.astype(dt)
    send, recv_sizes = _in_units(send.astype(dt), u), _in_units(recv_sizes.astype(dt), u)
  # the receive buffer, zeros made from the payload: created once the frames exist, not hoisted (alive
  # through everything before them; in pieces, every piece's buffer at once)
  out = (vary_like(jnp.full((slots * slot // u, u), zero_after(payload, jnp.uint8)), payload)
         if out is None else out.reshape(-1, u))
  if tie is None:
    r = _ragged.exchange(payload.reshape(-1, u), out, in_off, send, out_off, recv_sizes,
                         axis_name=axis_name, axis_index_groups=_GROUPS.get(),
                         max_send_rows=capacity // u)
    return r.reshape(slots, slot)
  # Tied (`pipelined_pieces`): the operands pass one optimization barrier, and the zero returned
  # is read from its outputs, so what reads the zero (the previous piece's decode) comes after every
  # operand (XLA would otherwise fuse a copy of an operand's arithmetic into the zero and leave the
  # operand itself to be scheduled after that decode), and XLA:GPU starts the exchange before that
  # decode. `out` is read before the barrier (the offsets wait for it), not after: the exchange
  # updates it in place, and a read left beside that update would cost a copy of the buffer.
  with _ragged.index_scope(dt):
    out_off = out_off + zero_after(out, dt)
    ops = lax.optimization_barrier((payload.reshape(-1, u), in_off, send, out_off, recv_sizes))
    zero = sum(zero_after(v) for v in ops)
  r = _ragged.exchange(ops[0], out, *ops[1:], axis_name=axis_name,
                       axis_index_groups=_GROUPS.get(), max_send_rows=capacity // u)
  return r, zero


def _after(received, tie, shape):
  """`received` (an exchange's result) reshaped to `shape`, read only once `tie` (a zero) exists:
  a one-byte in-place update comes first (tie None: `received`, already of `shape`). A reshape
  of an exchange's result is a bitcast, which XLA places right after the exchange, and an
  exchange ends (its done) before its first user: the update is that user, so the exchange can
  stay in flight until `tie`."""
  if tie is None:
    return received
  first = lax.slice(received, (0, 0), (1, 1))
  tied = lax.dynamic_update_slice(received, first ^ tie.astype(received.dtype), (0, 0))
  return tied.reshape(shape)


def _raw_into(recv, rows, send_row, sending, receiving, axis_name, slot: int,
              one_slot: bool = False, tie=None):
  """The ragged transport's raw-row exchange: the raw bit patterns of `rows` (F, m), written in place
  into `recv` ((S, slot) uint8, the frames' receive buffer; ragged_all_to_all updates its
  `output`). Row ``send_row[j]`` goes to rank j where ``sending[j]``, into this rank's slot there
  (slot 0 if `one_slot`); slot s here takes rank s's raw row where ``receiving[s]`` (slot 0 if
  `one_slot`). (n,) each; it moves no data when nothing is flagged. `tie`: a zero (int32) added
  to the offsets, so that the exchange waits for what made it. Returns recv (S, slot)."""
  m = rows.shape[1]
  row_bytes = m * rows.dtype.itemsize
  u = _unit(row_bytes, slot)
  n = sending.shape[0]
  dt = _ragged.offsets_dtype(max(rows.shape[0], recv.shape[0]) * slot // u)
  with _ragged.index_scope(dt):
    z = _zero_like_batch(recv).astype(dt)
    in_off = vary_like(send_row.astype(dt) * (row_bytes // u), recv) + z
    at = jnp.zeros((), dt) if one_slot else rank(axis_name, dt)
    out_off = vary_like(jnp.full((n,), slot // u, dt) * at, recv) + z
    if tie is not None:
      out_off = out_off + tie.astype(dt)
    send = jnp.where(sending, row_bytes // u, 0).astype(dt) + z
    take = jnp.where(receiving, row_bytes // u, 0).astype(dt) + z
  bits = lax.bitcast_convert_type(lax.bitcast_convert_type(rows, uint_of(rows.dtype)), jnp.uint8)
  out = _ragged.exchange(bits.reshape(-1, u), recv.reshape(-1, u), in_off, send, out_off, take,
                         axis_name=axis_name, axis_index_groups=_GROUPS.get(),
                         max_send_rows=row_bytes // u)
  return out.reshape(recv.shape)


def _decode_slots(recv, m: int, dtype, raw, empty=None):
  """recv (S, slot) from `_raw_into` -> (S, m): slot s decoded, or its raw bits where ``raw[s]``,
  or zeros where ``empty[s]`` (nothing arrived). One select on the bit patterns."""
  u = uint_of(dtype)
  skip = raw if empty is None else raw | empty
  dec = codec.decode_frames(recv, shape=(m,), dtype=dtype, skip=skip)
  got = recv[:, :m * np.dtype(dtype).itemsize].reshape(recv.shape[0], m, np.dtype(dtype).itemsize)
  got = lax.bitcast_convert_type(got if got.shape[-1] > 1 else got[..., 0], u)
  bits = jnp.where(raw[:, None], got, lax.bitcast_convert_type(dec, u))
  return lax.bitcast_convert_type(bits, dtype)


def _encode_sized(rows, capacity: int, skip=None):
  """Encode `rows` (F, m) for the ragged transport -> (payload (F, C'), C', slot bytes, sizes (F,)
  int32: a frame's bytes, -1 where it did not fit in `capacity`, 0 where `skip`ped). Frames and
  raw rows move in rows of `_unit` bytes into one buffer, so a frame is C' wide (`capacity`
  rounded up to the unit) and a receive slot holds either (``max(C', m * itemsize)`` bytes)."""
  row_bytes = rows.shape[1] * rows.dtype.itemsize
  unit = _unit(row_bytes)
  frame_cap = -(-capacity // unit) * unit
  payload, nbytes = codec.encode_frames(rows, capacity=frame_cap, skip=skip)
  size = jnp.where(nbytes <= capacity, nbytes, -1).astype(jnp.int32)  # capacity < 2**31
  return payload, frame_cap, max(frame_cap, row_bytes), size


# --------------------------------------------------------------------------- #
# The three coded exchanges
# --------------------------------------------------------------------------- #

def exchange_rows(rows, *, axis_name, n: int, capacity: int, transport: str, site: str,
                  raw: Callable, finish: Callable = lambda out: out, pieces: int = 1,
                  own: bool = True):
  """rows (n, m), row j for rank j -> `finish(got)`, got (n, m) with row s from rank s.

  Not `own`: got's own row is whatever the path left there (padded and coded: zeros; raw or
  ragged: the row itself), for a caller that reads it from `rows` where it consumes got
  (`own_of`; psum_scatter's sum): the select that puts it in place is a pass over the n rows,
  which a conditional between the decode and the sum keeps XLA from fusing into either.

  Padded transport: `raw()` is the fallback branch (the `jax.lax` collective on the operand's
  bits), traced in the fallback scope; it must return what `finish` returns. Ragged transport:
  no fallback and no conditional, a row that does not fit travels raw (`ragged_rows`).
  `pieces` > 1 codes the columns in that many independent chains (`_pieces`); padded, one
  fallback for the call. psum_scatter sums inside each branch (`finish` and `raw`): its sum pins
  a NaN result to the first NaN in row order (`_reduce.ordered_sum`), so the two compilations
  give the same bits, and the coded branch's sum reads the decoded rows where they are written.
  """
  def padded(rows):
    if pieces > 1:
      fallback, got = decode_pieces(rows, pieces, capacity,
                                    lambda r, cap: _send_rows(r, axis_name, n, cap))
      accounting.count(site, fallback)
      return unless_fallback(fallback, raw,
                             finish(put_own_row(got, rows, axis_name) if own else got))
    fallback, coded = exchange_chain(rows, axis_name, n, capacity, own=own)
    accounting.count(site, fallback)
    return cond_bits(fallback, lambda: in_fallback(raw), lambda: finish(coded()))

  def ragged(rows):
    return _ragged_call(rows, lambda r, cap: ragged_rows(r, axis_name, n, cap), pieces, capacity,
                        site, finish, stages=lambda r, cap: rows_stages(r, axis_name, n, cap))

  return by_transport(transport, padded, ragged, rows)


def _ragged_call(rows, chain: Callable, pieces: int, capacity: int, site: str, finish: Callable,
                 stages: Callable):
  """One call on the ragged transport: `chain(rows, capacity)` -> (a row came raw, got), or in
  `pieces` its `stages` pipelined (`pipelined_pieces`), counted once; returns `finish(got)`."""
  if pieces > 1:
    return finish(pipelined_pieces(rows, pieces, capacity, site, stages)[1]())
  any_raw, got = chain(rows, capacity)
  accounting.count(site, any_raw)
  return finish(got)


def _send_rows(rows, axis_name, n: int, capacity: int):
  """Encode rows (n, m) (the own row skipped) -> all-to-all -> (fallback flag, frames received
  (n, C), the own row's flag (n,), the frames sent)."""
  skip = own_row(axis_name, n)
  payload, _, _ = encode_rows(rows, capacity, skip)
  recv = lax.all_to_all(payload, axis_name, 0, 0, tiled=True, axis_index_groups=_GROUPS.get())
  return codec.any_overflow(recv, capacity), recv, skip, payload


def exchange_chain(rows, axis_name, n: int, capacity: int, eager: bool = False, own: bool = True):
  """Encode -> all-to-all -> (fallback flag, thunk decoding the rows (n, m), row s from rank s);
  `eager`: the decode runs outside the fallback's conditional (`decode_any`); not `own`: the own
  row comes out as zeros (not coded, not sent), for a caller that reads it from its operand where
  it consumes the rows (`own_of`)."""
  fallback, recv, skip, _ = _send_rows(rows, axis_name, n, capacity)
  m = rows.shape[1]
  dec = (lambda: decode_any(recv, m, rows.dtype, skip)) if eager else \
      (lambda: decode_guarded(recv, fallback, m, rows.dtype, skip))
  return fallback, (lambda: with_own_row(dec(), rows, skip)) if own else dec


def own_of(rows, axis_name, n: int):
  """(the (n,) mask of this rank's own row, `rows` (n, m)): what a caller of an exchange without
  its own row (``own=False``) reads in its place, row j of `rows` where the mask is set (a static
  row, read where the caller consumes the rows; a dynamic slice of the own row is a pass of its
  own, fused with whatever produced `rows`: 2.4 ms a call where that was the hierarchical
  program's transpose, benchmarks/program_passes.py). Inside `code_own_row` the mask is all False
  (the own row was coded and sent like any other)."""
  return own_row(axis_name, n), rows


def ragged_rows(rows, axis_name, n: int, capacity: int):
  """`exchange_rows` on the ragged transport, with no conditional: (any row came raw, got).

  Each sender sends one int32 per row: the frame's size, or -1 where the frame did not fit in
  `capacity` (the own row: 0, it is not coded). The receiver holds one buffer of n slots, each
  wide enough for a frame or a raw row (``max(C, m * itemsize)`` bytes), filled by two
  `ragged_all_to_all`s: the raw bit patterns of the rows that did not fit and of the own row (a
  local copy), sent straight from the operand's bits, then, written into that same buffer in
  place (ragged_all_to_all updates its `output` operand), the frames that fit (their bytes
  only). The frames are decoded with the raw slots skipped, and one select takes the raw slots'
  bits instead. A row that does not compress costs its raw bytes and nothing else; when every
  row fits, the raw exchange moves no data. The only buffer beyond the frames sent is the
  receive buffer, the size of the operand (XLA:GPU keeps a ragged exchange's output in its
  collective memory space, so a decode written there would be copied out once more). Returns
  the flag for `accounting.count` and (n, m), row s from rank s, the bits of a raw exchange.
  """
  flag, fill, transfer, decode = rows_stages(rows, axis_name, n, capacity)
  return flag, decode(transfer(fill(), None), None)


def rows_stages(rows, axis_name, n: int, capacity: int):
  """`ragged_rows` as `pipelined_pieces`' stages (`gather_stages`' contract)."""
  skip = own_row(axis_name, n)
  payload, frame_cap, slot, size = _encode_sized(rows, capacity, skip)
  got = lax.all_to_all(size, axis_name, 0, 0, tiled=True,       # (n,): row s's from rank s
                       axis_index_groups=_GROUPS.get())
  as_raw = got < 0
  zeros = vary_like(jnp.full((n, slot), zero_after(payload, jnp.uint8)), payload)
  def fill(tie=None):
    return _raw_into(zeros, rows, jnp.arange(n), (size < 0) | skip, as_raw | skip, axis_name, slot,
                     tie=tie)

  def transfer(buf, tie):
    return _ragged_frames(payload, jnp.maximum(size, 0), jnp.maximum(got, 0), axis_name, n,
                          frame_cap, slot, out=buf, tie=tie)

  def decode(received, tie):
    return _decode_slots(_after(received, tie, (n, slot)), rows.shape[1], rows.dtype,
                         as_raw | skip)

  return jnp.any(as_raw), fill, transfer, decode


def ragged_gather(rows, axis_name, n: int, capacity: int):
  """`gather_row` on the ragged transport, with no conditional: rows (1, m) -> (a row came raw,
  got (n, m), row s from rank s).

  `ragged_rows`' design with one row sent to every rank: its size goes out by an int32
  all_gather (-1: did not fit), where it did not fit its raw bits by a ragged exchange into the
  receive buffer (n slots: the result's size), and its frame by another, into that buffer, to
  every other rank. The own row goes to itself raw (a local copy) and is not decoded.
  """
  flag, fill, transfer, decode = gather_stages(rows, axis_name, n, capacity)
  return flag, decode(transfer(fill(), None), None)


def gather_stages(rows, axis_name, n: int, capacity: int):
  """`ragged_gather` as `pipelined_pieces`' stages: (a row came raw, fill: tie -> the receive buffer
  with the raw rows in it (their exchange waits for tie), transfer: (buffer, tie) -> (frames
  received into it, a zero made from its operands), decode: (received, tie) -> got (n, m), once tie
  exists; tie None: untied, transfer gives the received slots alone). The raw rows go first, so
  that the frames exchange's users are the decode's and the next piece's ties alone."""
  own = own_row(axis_name, n)
  payload, frame_cap, slot, size = _encode_sized(rows, capacity)
  got = lax.all_gather(size, axis_name, tiled=True, axis_index_groups=_GROUPS.get())  # (n,)
  as_raw = (got < 0) & ~own
  zeros = vary_like(jnp.full((n, slot), zero_after(payload, jnp.uint8)), payload)
  def fill(tie=None):
    return _raw_into(zeros, rows, jnp.zeros((n,), jnp.int32), (size < 0) | own, as_raw | own,
                     axis_name, slot, tie=tie)

  def transfer(buf, tie):
    return _ragged_frames(payload[0], jnp.where(own, 0, jnp.maximum(size, 0)),
                          jnp.where(own, 0, jnp.maximum(got, 0)), axis_name, n, frame_cap, slot,
                          out=buf, tie=tie)

  def decode(received, tie):
    return _decode_slots(_after(received, tie, (n, slot)), rows.shape[1], rows.dtype, as_raw | own)

  return jnp.any(as_raw), fill, transfer, decode


def gather_row(x, *, axis_name, n: int, capacity: int, transport: str, site: str,
               invariant: bool, raw: Callable, finish: Callable = lambda out: out,
               pieces: int = 1):
  """Every rank's `x` (coded as one row of x.size elements) -> `finish(got)`, got (n, x.size).

  Padded transport: `raw()` is the fallback (see `exchange_rows`). Ragged transport: no fallback
  and no conditional (`ragged_gather`). `invariant`: the result must not depend on the rank
  (padded transport, every row decoded). `pieces` > 1: the row's columns in that many
  independent chains (`_pieces`); padded, one fallback for the call.
  """
  def padded(x):
    if pieces > 1:
      def move(r, cap):  # the own row is decoded too where the result must not depend on the rank
        fallback, recv = _gather_frames(r, axis_name, cap, invariant)
        return fallback, recv, None if invariant else own_row(axis_name, n)
      fallback, got = decode_pieces(x.reshape(1, x.size), pieces, capacity, move)
      accounting.count(site, fallback)
      got = got if invariant else put_own_row(got, x.reshape(1, x.size), axis_name)
      return unless_fallback(fallback, raw, finish(got))
    fallback, coded = _gather_chain(x, axis_name, n, capacity, invariant)
    accounting.count(site, fallback)
    return cond_bits(fallback, lambda: in_fallback(raw), lambda: finish(coded()))

  def ragged(x):
    return _ragged_call(x.reshape(1, x.size), lambda r, cap: ragged_gather(r, axis_name, n, cap),
                        pieces, capacity, site, finish,
                        stages=lambda r, cap: gather_stages(r, axis_name, n, cap))

  if invariant:
    return padded(x)
  return by_transport(transport, padded, ragged, x)


def _gather_frames(x, axis_name, capacity: int, invariant: bool):
  """Encode `x` as one frame -> all-gather -> (fallback flag, frames received (n, C))."""
  payload, nbytes, _ = encode_rows(x.reshape(1, x.size), capacity)
  recv = (lax.all_gather(payload[0], axis_name, to="invarying") if invariant
          else lax.all_gather(payload[0], axis_name, axis_index_groups=_GROUPS.get()))
  return codec.any_overflow(recv, capacity), recv


def _gather_chain(x, axis_name, n: int, capacity: int, invariant: bool):
  """Encode `x` (m elements) -> all-gather -> (fallback flag, thunk decoding (n, m), row s from
  rank s, inside the fallback's conditional)."""
  m = x.size
  fallback, recv = _gather_frames(x, axis_name, capacity, invariant)

  def coded():
    if invariant:  # the result must not depend on the rank: decode every row
      return decode_guarded(recv, fallback, m, x.dtype)
    skip = own_row(axis_name, n)
    return with_own_row(decode_guarded(recv, fallback, m, x.dtype, skip), x.reshape(m), skip)

  return fallback, coded
