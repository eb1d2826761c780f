"""Lossless compressed collectives: drop-in replacements for ``jax.lax``.

``all_to_all``, ``all_gather``, ``psum_scatter``, ``psum``, ``ppermute``, ``pmean`` and
``all_gather_invariant`` take the arguments of their ``jax.lax`` namesakes. Over the manual axes
of a ``jax.shard_map`` (under ``jit`` or not) each one encodes its chunks with the zipccl codec,
runs the ``jax.lax`` collective on the uint8 payload, and decodes on the receiving side.
Data-movement collectives return results bit-identical to ``jax.lax``; coded reductions return
the documented fixed-order float32 reduction (see `psum_scatter`). A float message moved raw
(``compress=False``, ``"auto"`` deciding raw, the overflow fallback) moves as a uint view, so NaN
payloads survive (XLA:CPU's 16-bit float collectives widen to float32 and quiet signalling NaNs).

Wherever else ``jax.lax`` accepts a call there is no wire of ours, and the call is exactly
``jax.lax``'s (`_shard.lax_only_reason`): axes bound by ``jax.vmap(..., axis_name=)`` or
``pmap`` (and unbound names, which raise ``jax.lax``'s error), symbolic shapes
(``jax.export`` shape polymorphism), and reduced/unreduced operands.

Keyword options shared by all:

* ``compress``: ``True`` codes every bfloat16/float16/float32/float8 message
  (``format.SUPPORTED_NAMES``; other dtypes go through ``jax.lax`` unchanged); ``False``
  always sends raw; ``"auto"`` asks the cost model of :mod:`zipccl_jax.strategy` at trace time
  (raw for dtypes the codec does not cover, for an axis of size 1, when the capacity would not
  save bytes, and whenever the estimated compressed time does not beat the raw one for the
  active :class:`~zipccl_jax.Profile`; see :func:`zipccl_jax.calibrate` and :func:`zipccl_jax.explain`).
  :func:`zipccl_jax.strategy.plan` is the one place the decision is made.
  ``None`` (the default) takes :func:`zipccl_jax.use_defaults`' setting, ``"auto"`` unless set.
* ``capacity``: padded bytes per chunk. ``None`` takes :func:`zipccl_jax.use_defaults`'
  setting, else :func:`padded_capacity`; an ``int`` is a byte count (>= 32); a ``float`` is a
  fraction of the chunk's raw bytes; ``"observed"`` is the largest frame :func:`zipccl_jax.observe`
  recorded for this call site (``name``) in the active profile, plus its margin, and
  :func:`padded_capacity` if none was (this is what ``compress="auto"`` always does; ``"observed"``
  gives it to ``compress=True``); a pair ``(forward, backward)`` sets the capacity of the
  transposed collective in ``jax.grad`` separately (gradients code worse than activations).
* ``transport``: ``"auto"`` (padded on CPU, ragged elsewhere), ``"padded"`` or ``"ragged"``.
* ``name``: call-site name for :func:`stats` (default: ``op@file:line``).

The wire, own-row skipping, ragged transport, uniform overflow fallback and pieces (K independent
coded chains per chunk, same bits for every K) are the protocol of :mod:`zipccl_jax._exchange`.

Autodiff
--------
Each collective is linear in ``x`` and declared once as a linear function with a named
transpose rule (``_all_to_all_transpose_rule``, ...; :mod:`zipccl_jax._linear`): ``jax.jvp``/
``jax.linearize``/``jax.jacfwd`` run the compressed collective on the tangent, ``jax.grad``/
``jax.vjp``/``jax.linear_transpose`` the one the ``jax.lax`` transpose uses on the cotangent, in
the "gradient" role, with the ``backward`` half of a ``capacity`` pair. ``jax.vmap`` works over all.

Reductions and statistics
-------------------------
Coded, ``psum_scatter`` (pieces in turn: `_reduce.reduce_rows`) and ``psum`` compute the fixed-order
float32 sum of `_reduce.ordered_sum` (so does their fallback); raw they run the ``jax.lax`` call as
written (XLA's ring: its host crossings use every device's link). ``fixed_order=True`` (per call, or
`use_defaults`) makes raw the fixed-order all-to-all and sum too, so the bits never depend on the
decision, at the all-to-all's cost (``python -m zipccl_jax.model`` prices both). Each call site records
the bytes one device sends (:mod:`zipccl_jax.accounting`, also home of `set_runtime_stats`' counters).

Differences from ``jax.lax`` (deliberate)
-----------------------------------------
* ``psum_scatter``/``psum``/``pmean`` of floats, coded (or ``fixed_order=True``): the documented
  fixed-order float32 sum, not XLA's order; equal to ``jax.lax`` within one rounding.
* A compiled program holds our custom calls and byte exchanges: HLO inspection sees those; roofline
  estimates are ``jax.lax``'s with the bytes we send plus the codec's (:mod:`zipccl_jax._roofline`);
  ``jax.export`` needs :func:`zipccl_jax.export_disabled_checks`.
* :func:`zipccl_jax.set_runtime_stats` does not count calls inside a partially automatic
  ``shard_map`` (a side-effecting op cannot be replicated there), and counts a rematerialized
  collective once per execution.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from zipccl_jax import _exchange, _permute, _recipe, _reduce, accounting
from zipccl_jax._recipe import (Call, Recipe, check_positional, lax_raw, raw_path, run, size_of,
                                transposed)
from zipccl_jax._shard import (axes_of, axis_size, canonical_axis, check_perm, check_split,
                               check_vma_on, itemsize, lax_ppermute, perm_argument, vary)
from zipccl_jax.observation import record_frames
from zipccl_jax.strategy.programs import SEQUENTIAL_OPS

__all__ = ["all_to_all", "all_gather", "psum_scatter", "psum", "ppermute", "pmean",
           "all_gather_invariant"]


# --------------------------------------------------------------------------- #
# all_to_all
# --------------------------------------------------------------------------- #

def all_to_all(x, axis_name, split_axis, concat_axis, *, axis_index_groups=None, tiled=False,
               compress=None, capacity=None, transport="auto", name=None):
  """Compressed :func:`jax.lax.all_to_all`: same signature, bit-identical result.

  Must be called inside ``jax.shard_map`` (``axis_name`` must be bound).
  In the output, the mapped axis ``axis_name`` is materialized at position
  ``concat_axis`` and the positional axis ``split_axis`` is mapped with the
  name ``axis_name``, exactly as in ``jax.lax.all_to_all``.

  Args:
    x: array(s) with a mapped axis named ``axis_name``. If ``x`` is a pytree,
      each leaf is one collective.
    axis_name: a mesh axis name, or a tuple of them (rank = row-major index).
    split_axis: int, the positional axis of ``x`` to split into ``n =
      axis_size(axis_name)`` chunks (``x.shape[split_axis] == n`` when
      ``tiled=False``, divisible by ``n`` when ``tiled=True``).
    concat_axis: int, the output position of the mapped axis.
    axis_index_groups: as in ``jax.lax``; coded within each group (n: a group's size).
    tiled: as in ``jax.lax.all_to_all``.
    compress, capacity, transport, name: see the module docstring.

  Returns:
    When ``tiled`` is False, an array of shape
    ``np.insert(np.delete(x.shape, split_axis), concat_axis, n)``; otherwise
    ``x.shape`` with ``split_axis`` divided by ``n`` and ``concat_axis``
    multiplied by ``n``.

  What crosses the wire (padded transport, ``m = x.size // n`` elements per
  chunk, capacity ``C`` bytes)::

    chunks = moveaxis(x, split_axis, 0).reshape(n, m)   # chunk j is for rank j
    payload[j] = encode(chunks[j]) if j != me else 0    # uint8[n, C]; poisoned if any overflowed
    recv = lax.all_to_all(payload, axis_name, 0, 0, tiled=True)   # n * C bytes
    if any(recv[s].frame_bytes > C for s in range(n)):  # same on every rank
      return lax.all_to_all(x, ...)                     # raw fallback
    return assemble(decode(recv[s]) if s != me else chunks[me]   # chunk from rank s
                    for s in range(n))                           # at concat_axis

  The transpose (``jax.grad``, ``jax.linear_transpose``) is ``all_to_all(ct, axis_name, concat_axis,
  split_axis, tiled=tiled)``, itself compressed.

  Example, two devices, ``x`` of shape ``(2, 3)`` per device::

    rank 0: x = [[a0, a1, a2],          rank 1: x = [[c0, c1, c2],
                 [b0, b1, b2]]                       [d0, d1, d2]]
    y = all_to_all(x, 'i', split_axis=0, concat_axis=0)
    rank 0 sends frame(a) to itself and frame(b) to rank 1; rank 1 sends
    frame(c) to rank 0 and frame(d) to itself. Then
    rank 0: y = [[a0, a1, a2],          rank 1: y = [[b0, b1, b2],
                 [c0, c1, c2]]                       [d0, d1, d2]]
  """
  return run(_ALL_TO_ALL, x, axis_name, (split_axis, concat_axis, tiled), compress=compress,
             capacity=capacity, transport=transport, name=name, groups=axis_index_groups)


def _all_to_all_params(x, n, axis_name, args):
  split_axis, concat_axis, tiled = args
  check_positional(x, "all_to_all")
  split = canonical_axis(split_axis, x.ndim, "split_axis", "all_to_all")
  concat = canonical_axis(concat_axis, x.ndim, "concat_axis", "all_to_all")
  check_split(x, split, "split_axis", n, tiled, axis_name, "all_to_all")
  return (split, concat, tiled), x.size // n, None


def _all_to_all_wire(x, n, params, capacity, algorithm=""):
  return (accounting.sent_bytes("all-to-all", x.size * itemsize(x), n),
          accounting.sent_bytes("all-to-all", n * capacity, n))


def _all_to_all_lax(x, axis_name, params, groups=None):
  split, concat, tiled = params
  return lax.all_to_all(x, axis_name, split, concat, tiled=tiled, axis_index_groups=groups)


def _all_to_all_impl(call: Call, x):
  split, concat, tiled = call.params
  axis_name = call.axis_name
  n = size_of(call)
  x = vary(x, axes_of(axis_name))
  record_frames(call.site, "all_to_all",
                        lambda: jnp.moveaxis(x, split, 0).reshape(n, x.size // n))
  on_bits = lambda u: _all_to_all_lax(u, axis_name, call.params, call.groups)
  if not call.capacity:
    return raw_path(call, x, on_bits)
  m = x.size // n
  k = x.shape[split] // n
  rows = jnp.moveaxis(x, split, 0).reshape(n, m)
  rest = x.shape[:split] + x.shape[split + 1:]

  def raw():
    # x rebuilt from `rows`, the encoder's operand: passing x itself made XLA materialise the
    # (often transposed) operand twice, once per consumer.
    x_again = jnp.moveaxis(rows.reshape((x.shape[split],) + rest), 0, split)
    return _exchange.raw_bits(on_bits, x_again)

  def assemble(out):  # (n, m), row s from rank s -> the jax.lax layout
    if tiled:
      pieces = jnp.moveaxis(out.reshape((n, k) + rest), 1, split + 1)  # (n, *x.shape[split]->k)
      y = jnp.moveaxis(pieces, 0, concat)
      shp = list(pieces.shape[1:])
      shp[concat] *= n
      return y.reshape(shp)
    return jnp.moveaxis(out.reshape((n,) + rest), 0, concat)

  return _exchange.exchange_rows(rows, axis_name=axis_name, n=n, capacity=call.capacity,
                                 transport=call.transport, site=call.site, raw=raw,
                                 finish=assemble, pieces=call.pieces)


def _all_to_all_transpose_rule(call: Call, ct):
  split, concat, tiled = call.params
  return transposed(_ALL_TO_ALL, call, ct, (concat, split, tiled))


_ALL_TO_ALL = Recipe("all_to_all", "activation", _all_to_all_params, _all_to_all_wire,
                      _all_to_all_lax, _all_to_all_impl, _all_to_all_transpose_rule)


# --------------------------------------------------------------------------- #
# all_gather
# --------------------------------------------------------------------------- #

def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False, to="varying",
               compress=None, capacity=None, transport="auto", name=None):
  """Compressed :func:`jax.lax.all_gather`: same signature, bit-identical result.

  Must be called inside ``jax.shard_map``.

  Args:
    x: array(s) with a mapped axis named ``axis_name`` (pytree: per leaf).
    axis_name: a mesh axis name, or a tuple of them.
    axis_index_groups: as in ``jax.lax``; coded within each group (n: a group's size).
    axis: output position of the gathered axis (``tiled=False``: a new axis,
      ``0 <= axis <= x.ndim``; ``tiled=True``: an existing axis, concatenated).
    tiled: as in ``jax.lax.all_gather``.
    to: ``'varying'`` (default) or ``'invarying'`` (result is device-invariant,
      transpose is a local slice); ``'reduced'`` goes to ``jax.lax`` uncompressed.
    compress, capacity, transport, name: see the module docstring.

  Returns:
    ``x.shape`` with ``n = axis_size(axis_name)`` inserted at ``axis``
    (``tiled=False``), or with ``x.shape[axis]`` multiplied by ``n``
    (``tiled=True``).

  What crosses the wire (padded transport, capacity ``C``)::

    payload = encode(x.reshape(-1))                   # uint8[C], one frame
    recv = lax.all_gather(payload, axis_name)         # uint8[n, C]; C bytes per sender
    if any(recv[s].frame_bytes > C for s in range(n)):   # same on every rank
      return lax.all_gather(x, ...)                   # raw fallback
    return stack_or_concat(decode(recv[s]) if s != me else x for s in range(n))

  The transpose is the compressed :func:`psum_scatter` (``to='invarying'``:
  a local slice of the cotangent).

  Example, two devices::

    rank 0: x = [a0, a1]     rank 1: x = [b0, b1]
    y = all_gather(x, 'i')   # each rank sends one frame, receives both
    rank 0 and rank 1: y = [[a0, a1],
                            [b0, b1]]
    all_gather(x, 'i', tiled=True) -> [a0, a1, b0, b1] on both ranks.
  """
  if to not in ("varying", "invarying", "reduced"):
    raise ValueError(f"zipccl_jax.all_gather: to must be 'varying', 'invarying' or 'reduced', "
                     f"got {to!r}")
  return run(_ALL_GATHER, x, axis_name, (axis, tiled, to), compress=compress, capacity=capacity,
             transport=transport, name=name, groups=axis_index_groups)


def _all_gather_params(x, n, axis_name, args):
  axis, tiled, to = args
  if tiled:
    if x.ndim == 0:
      raise ValueError("zipccl_jax.all_gather: tiled=True needs x with at least one axis")
    ax = canonical_axis(axis, x.ndim, "axis", "all_gather")
  else:
    ax = canonical_axis(axis, x.ndim + 1, "axis", "all_gather")
  return (ax, tiled, to), x.size, ("to='reduced'" if to == "reduced" else None)


def _all_gather_wire(x, n, params, capacity, algorithm=""):
  return (accounting.sent_bytes("all-gather", x.size * itemsize(x), n),
          accounting.sent_bytes("all-gather", capacity, n))


def _all_gather_lax(x, axis_name, params, groups=None):
  ax, tiled, to = params
  return lax.all_gather(x, axis_name, axis=ax, tiled=tiled, to=to, axis_index_groups=groups)


def _all_gather_impl(call: Call, x):
  ax, tiled, to = call.params
  axis_name = call.axis_name
  n = size_of(call)
  x = vary(x, axes_of(axis_name))
  record_frames(call.site, "all_gather", lambda: x.reshape(1, x.size))
  on_bits = lambda u: _all_gather_lax(u, axis_name, call.params, call.groups)
  if not call.capacity:
    return raw_path(call, x, on_bits)

  def arrange(out):  # (n, x.size), row s from rank s -> the jax.lax layout
    y = jnp.moveaxis(out.reshape((n,) + x.shape), 0, ax)
    if tiled:
      shp = list(x.shape)
      shp[ax] *= n
      y = y.reshape(shp)
    return y

  return _exchange.gather_row(
      x, axis_name=axis_name, n=n, capacity=call.capacity, transport=call.transport,
      site=call.site, invariant=(to == "invarying"), finish=arrange, pieces=call.pieces,
      raw=lambda: _exchange.raw_bits(on_bits, x))


def _all_gather_transpose_rule(call: Call, ct):
  ax, tiled, to = call.params
  if to == "invarying":  # every rank holds the whole result: the transpose is a local slice
    n = axis_size(call.axis_name, "all_gather")
    me = lax.axis_index(call.axis_name)
    ct = vary(ct, axes_of(call.axis_name))
    if tiled:
      size = ct.shape[ax] // n
      return lax.dynamic_slice_in_dim(ct, me * size, size, axis=ax)
    return lax.dynamic_index_in_dim(ct, me, axis=ax, keepdims=False)
  return transposed(_PSUM_SCATTER, call, ct, (ax, tiled))


_ALL_GATHER = Recipe("all_gather", "activation", _all_gather_params, _all_gather_wire,
                      _all_gather_lax, _all_gather_impl, _all_gather_transpose_rule,
                      lax_when_forced_raw=True)


# --------------------------------------------------------------------------- #
# psum_scatter
# --------------------------------------------------------------------------- #

def psum_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False,
                 compress=None, capacity=None, transport="auto", name=None, fixed_order=None):
  """Compressed :func:`jax.lax.psum_scatter`; coded, with a fixed float32 reduction order.

  Must be called inside ``jax.shard_map``. For bfloat16/float16/float32/float8
  inputs, rank ``i`` returns chunk ``i`` of the sum over ranks, computed as::

    out = round_to_dtype(((f32(x_0[i]) + f32(x_1[i])) + ...) + f32(x_{n-1}[i]))

  with ``x_r[i]`` the ``i``-th chunk (along ``scatter_dimension``) of rank ``r``'s input: float32
  additions in ascending rank order, one round-to-nearest-even at the end; the overflow fallback
  too, so the result never depends on the transport. Raw (``compress=False``, or ``'auto'``
  deciding raw) it is ``jax.lax.psum_scatter`` as called (XLA's order, within the rounding of the
  sum); with ``fixed_order=True`` raw sums in the fixed order too. Other dtypes: ``jax.lax``'s.

  Args:
    x: array(s) with a mapped axis named ``axis_name``.
    axis_name: a mesh axis name, or a tuple of them.
    scatter_dimension: positional axis of ``x`` to scatter; its size must
      equal ``n`` (``tiled=False``) or be divisible by ``n`` (``tiled=True``).
    axis_index_groups: as in ``jax.lax``; coded within each group (n: a group's size).
    tiled: as in ``jax.lax.psum_scatter``.
    compress, capacity, transport, name: see the module docstring.
    fixed_order: ``True``: raw computes the fixed-order sum too (bits independent of the
      decision, at an all-to-all's cost); ``False``: raw is ``jax.lax``'s call; ``None``:
      :func:`zipccl_jax.use_defaults`' (False unless set).

  Returns:
    ``x.shape`` with ``scatter_dimension`` divided by ``n`` (``tiled=True``)
    or removed (``tiled=False``).

  What crosses the wire (padded transport; one all-to-all, then a local sum)::

    chunks = moveaxis(x, scatter_dimension, 0).reshape(n, m)
    recv = lax.all_to_all(encode_rows(chunks, skip=me), axis_name, 0, 0, tiled=True)  # n * C bytes
    rows = lax.all_to_all(chunks, ...) if any_overflow(recv) else decode(recv, skip=me)
    rows[me] = chunks[me]         # the chunk this rank keeps is never coded
    out = ordered_f32_sum(rows)   # rows[s] came from rank s

  The transpose is the compressed :func:`all_gather`.

  Example, two devices::

    rank 0: x = [1, 2]     rank 1: x = [10, 20]
    psum_scatter(x, 'i')   # rank 0 sends frame([2]) to rank 1, rank 1 sends frame([10]) to rank 0
    rank 0: 1 + 10 = 11    rank 1: 2 + 20 = 22
  """
  return run(_PSUM_SCATTER, x, axis_name, (scatter_dimension, tiled), compress=compress,
             capacity=capacity, transport=transport, name=name, groups=axis_index_groups,
             fixed_order=fixed_order)


def _psum_scatter_params(x, n, axis_name, args):
  scatter_dimension, tiled = args
  check_positional(x, "psum_scatter")
  dim = canonical_axis(scatter_dimension, x.ndim, "scatter_dimension", "psum_scatter")
  check_split(x, dim, "scatter_dimension", n, tiled, axis_name, "psum_scatter")
  return (dim, tiled), x.size // n, None


def _psum_scatter_wire(x, n, params, capacity, algorithm=""):
  return (accounting.sent_bytes("reduce-scatter", x.size * itemsize(x), n),
          accounting.sent_bytes("all-to-all", n * capacity, n))


def _psum_scatter_lax(x, axis_name, params, groups=None):
  dim, tiled = params
  return lax.psum_scatter(x, axis_name, scatter_dimension=dim, tiled=tiled,
                          axis_index_groups=groups)


def _reduce_scatter_rows(rows, axis_name, n, call: Call):
  """rows (n, m) -> this rank's fixed-order sum of row `me`, (m,) (psum_scatter's pieces in turn)."""
  def raw(r):
    return _exchange.raw_bits(lambda u: lax.all_to_all(u, axis_name, 0, 0, tiled=True,
                                                       axis_index_groups=call.groups), r)

  if call.capacity and call.pieces > 1 and call.op in SEQUENTIAL_OPS:  # one piece alive at a time
    return _reduce.reduce_rows(rows, axis_name=axis_name, n=n, capacity=call.capacity, raw=raw,
                               transport=call.transport, site=call.site, pieces=call.pieces)
  if not call.capacity:
    accounting.count(call.site, jnp.bool_(False))
    return _reduce.ordered_sum(raw(rows), rows.dtype)
  own = _exchange.own_of(rows, axis_name, n)  # read inside the sum, which runs in each branch
  total = lambda got: _reduce.ordered_sum(got, rows.dtype, own=own)
  return _exchange.exchange_rows(rows, axis_name=axis_name, n=n, capacity=call.capacity, own=False,
                                 transport=call.transport, site=call.site, pieces=call.pieces,
                                 raw=lambda: total(raw(rows)), finish=total)


def _psum_scatter_impl(call: Call, x):
  if lax_raw(call):
    accounting.count(call.site, jnp.bool_(False))
    return _psum_scatter_lax(x, call.axis_name, call.params, call.groups)
  dim, tiled = call.params
  n = size_of(call)
  x = vary(x, axes_of(call.axis_name))
  m = x.size // n
  k = x.shape[dim] // n
  rows = jnp.moveaxis(x, dim, 0).reshape(n, m)
  record_frames(call.site, "psum_scatter", lambda: rows)
  red = _reduce_scatter_rows(rows, call.axis_name, n, call)
  rest = x.shape[:dim] + x.shape[dim + 1:]
  y = jnp.moveaxis(red.reshape((k,) + rest), 0, dim)
  return y if tiled else jnp.squeeze(y, dim)


def _psum_scatter_transpose_rule(call: Call, ct):
  dim, tiled = call.params
  return transposed(_ALL_GATHER, call, ct, (dim, tiled, "varying"))


_PSUM_SCATTER = Recipe("psum_scatter", "gradient", _psum_scatter_params, _psum_scatter_wire,
                        _psum_scatter_lax, _psum_scatter_impl, _psum_scatter_transpose_rule)


# --------------------------------------------------------------------------- #
# psum
# --------------------------------------------------------------------------- #

def psum(x, axis_name, *, axis_index_groups=None, compress=None, capacity=None,
         transport="auto", name=None, fixed_order=None):
  """Compressed :func:`jax.lax.psum` (all-reduce); coded, with a fixed float32 order.

  Must be called inside ``jax.shard_map``. For the coded float dtypes it runs one of two
  algorithms, chosen per call at trace time by the cost model of :mod:`zipccl_jax.strategy`
  (``explain()`` lists both estimates; :func:`zipccl_jax.use_algorithm` ``(psum=...)`` pins one):

  * ``"a2a-sum+gather"`` (reduce-scatter + all-gather, for large messages; two collectives,
    about ``2 (n-1)/n`` times the coded size on the wire, like a ring all-reduce)::

      flat = pad(x.reshape(-1), to a multiple of n)       # m = ceil(x.size / n)
      mine = psum_scatter(flat.reshape(n, m), axis_name)  # fixed-order f32 sum, rounded once
      out = all_gather(mine, axis_name)[:x.size].reshape(x.shape)

  * ``"gather-sum"`` (all-gather + local sum, when latency dominates: one collective, but
    ``n - 1`` coded messages on the wire)::

      rows = all_gather(x.reshape(-1), axis_name)        # (n, x.size), row s from rank s
      out = ordered_f32_sum(rows).reshape(x.shape)       # on every rank, the same order

  Coded, every element is ``round(((f32(x_0) + f32(x_1)) + ...) + f32(x_{n-1}))`` in both
  algorithms (see :func:`psum_scatter`): the same bits on every rank, for either algorithm and
  for the overflow fallback. Raw (``compress=False``, or ``"auto"`` deciding raw) it is
  ``jax.lax.psum`` as called (within one rounding of that); with ``fixed_order=True`` raw sums in
  the fixed order too. Other dtypes call ``jax.lax.psum``. An int ``capacity`` is the bytes of
  one frame of the algorithm's chunk (``ceil(x.size / n)`` elements, resp. ``x.size``), so with
  one ``"auto"`` keeps ``"a2a-sum+gather"``. Under ``check_vma`` the result is device-invariant
  like ``jax.lax.psum``'s, and the transpose is a (free) ``pcast``; without, this ``psum``.

  Over two levels (a ``(slow, fast)`` tuple with per-level links, or a ``use_levels`` axis
  without ``check_vma``) it may run :func:`psum_scatter`'s two phases, then :func:`all_gather`'s
  (:mod:`zipccl_jax.hierarchical`), in psum_scatter's two-level order.

  Args:
    x: array(s) with a mapped axis named ``axis_name``.
    axis_name: a mesh axis name, or a tuple of them.
    axis_index_groups: passed to ``jax.lax.psum``, which raises ``NotImplementedError`` for
      them inside ``shard_map``.
    compress, capacity, transport, name: see the module docstring (both
      phases use the same options; under ``check_vma`` the all-gather phase, and the whole
      ``"gather-sum"``, are padded: their result is device-invariant).
    fixed_order: as :func:`psum_scatter`'s.

  Returns:
    Array(s) of ``x.shape``: the sum over ``axis_name``.

  Example, two devices, rank 0: x = [1, 2], rank 1: x = [10, 20]::

    "a2a-sum+gather": rank 0 keeps 1 + 10 = 11, rank 1 keeps 2 + 20 = 22, all_gather -> [11, 22]
    "gather-sum": both ranks receive [[1, 2], [10, 20]] and add the rows: [11, 22]
  """
  return run(_PSUM, x, axis_name, (), compress=compress, capacity=capacity, transport=transport,
             name=name, groups=axis_index_groups, fixed_order=fixed_order)


def _psum_params(x, n, axis_name, args):
  return (), -(-x.size // n), None


def _psum_wire(x, n, params, capacity, algorithm=""):
  raw = accounting.sent_bytes("all-reduce", x.size * itemsize(x), n)
  if algorithm == "gather-sum":  # one frame of the whole message, to every rank
    return raw, accounting.sent_bytes("all-gather", capacity, n)
  return (raw, accounting.sent_bytes("all-to-all", n * capacity, n)
          + accounting.sent_bytes("all-gather", capacity, n))


def _psum_lax(x, axis_name, params, groups=None):
  return lax.psum(x, axis_name, axis_index_groups=groups)


def _gather_sums(red, axis_name, n, call: Call, invariant, site=None):
  """red (m,) per rank -> (n, m), row s from rank s (padded transport when invariant); counted
  under `site` (default: psum's gather phase, ``<site>/gather``)."""
  def raw_gather(u):
    return lax.all_gather(u, axis_name, to="invarying" if invariant else "varying")

  if not call.capacity:
    return _exchange.raw_bits(raw_gather, red)
  return _exchange.gather_row(red, axis_name=axis_name, n=n, capacity=call.capacity,
                              transport=call.transport, site=site or call.site + "/gather",
                              invariant=invariant, pieces=call.pieces,
                              raw=lambda: _exchange.raw_bits(raw_gather, red))


def _psum_impl(call: Call, x):
  if lax_raw(call):
    accounting.count(call.site, jnp.bool_(False))
    return _psum_lax(x, call.axis_name, call.params)
  n = axis_size(call.axis_name, "psum")
  x = vary(x, axes_of(call.axis_name))
  if call.algorithm == "gather-sum":
    return _psum_gather_sum(call, x, n)
  size = x.size
  m = -(-size // n)
  flat = x.reshape(size)
  if n * m != size:
    flat = jnp.concatenate([flat, jnp.zeros((n * m - size,), x.dtype)])
  record_frames(call.site, "psum", lambda: flat.reshape(n, m))
  red = _reduce_scatter_rows(flat.reshape(n, m), call.axis_name, n, call)
  record_frames(call.site + "/gather", "psum", lambda: red.reshape(1, m))
  got = _gather_sums(red, call.axis_name, n, call, check_vma_on())
  return got.reshape(n * m)[:size].reshape(x.shape)


def _psum_gather_sum(call: Call, x, n: int):
  """One all-gather of the whole message, then every rank's ordered f32 sum of the rows."""
  record_frames(call.site, "psum", lambda: x.reshape(1, x.size))
  if not call.capacity:
    accounting.count(call.site, jnp.bool_(False))
  rows = _gather_sums(x.reshape(x.size), call.axis_name, n, call, check_vma_on(), site=call.site)
  return _reduce.ordered_sum(rows, x.dtype).reshape(x.shape)


def _psum_transpose_rule(call: Call, ct):
  if check_vma_on():  # the result is device-invariant: the transpose is a (free) pcast
    return vary(ct, axes_of(call.axis_name))
  return transposed(_PSUM, call, ct, ())


def _psum_prepare(call: Call, x):
  # varying before the linear function, so that its input and the transpose's pcast agree
  return vary(x, axes_of(call.axis_name))


_PSUM = Recipe("psum", "gradient", _psum_params, _psum_wire, _psum_lax, _psum_impl,
                _psum_transpose_rule, prepare=_psum_prepare)


# --------------------------------------------------------------------------- #
# ppermute
# --------------------------------------------------------------------------- #

def ppermute(x, axis_name, perm, *, compress=None, capacity=None, transport="auto",
             name=None):
  """Compressed :func:`jax.lax.ppermute`: same signature, bit-identical result.

  Must be called inside ``jax.shard_map``.

  Args:
    x: array(s) with a mapped axis named ``axis_name``.
    axis_name: a mesh axis name, or a tuple of them.
    perm: ``(source_index, destination_index)`` pairs, no repeats; a rank no pair reaches gets
      zeros; numbered as the running ``jax.lax.ppermute`` does (tuples: README, Supported versions).
    compress, capacity, transport, name: see the module docstring.

  Returns:
    Array(s) of ``x.shape``: on rank ``d``, ``x`` of rank ``s`` for ``(s, d)``
    in ``perm``, zeros if ``d`` is no destination.

  What crosses the wire (padded transport)::

    payload, over = encode(x.reshape(-1))        # uint8[C]
    any_over = lax.psum(int32(over), all_manual_axes)  # 4 bytes, beside the payload
    recv = lax.ppermute(payload, axis_name, perm)      # C bytes
    return lax.ppermute(x, ...) if any_over else decode(recv)

  A receiver sees only its own sender's header, so it cannot tell that another
  pair overflowed; the tiny ``psum`` makes the fallback decision uniform (all
  ranks must run the same collectives). It runs over every manual axis of the
  enclosing ``shard_map``, not only ``axis_name``: XLA lowers a ppermute over
  one axis of a multi-axis mesh to a single collective-permute that all
  devices join, so all of them must take the same branch. (The other
  collectives lower to per-group operations, so their header-based decision
  only needs to agree within each group, and it does.) The transpose is the compressed
  ``ppermute`` with the inverse permutation.

  Example, two devices, ``perm=[(0, 1), (1, 0)]``::

    rank 0: x = [a0, a1]      rank 1: x = [b0, b1]
    rank 0 sends frame(a) to rank 1, rank 1 sends frame(b) to rank 0; then
    rank 0: y = [b0, b1]      rank 1: y = [a0, a1]
  """
  return run(_PPERMUTE, x, axis_name, perm_argument(perm, "ppermute"), compress=compress,
             capacity=capacity, transport=transport, name=name)


def _ppermute_params(x, n, axis_name, perm):
  pairs = check_perm(perm, n, "ppermute", axis_name)
  return pairs, x.size, (None if pairs else "empty perm")


def _ppermute_wire(x, n, pairs, capacity, algorithm=""):
  return (accounting.sent_bytes("collective-permute", x.size * itemsize(x), n),
          accounting.sent_bytes("collective-permute", capacity, n)
          + accounting.sent_bytes("all-reduce", 4, n))


def _ppermute_lax(x, axis_name, pairs, groups=None):
  return lax.ppermute(x, axis_name, pairs)


def _ppermute_impl(call: Call, x):
  axis_name, pairs = call.axis_name, call.params
  n = axis_size(axis_name, "ppermute")
  x = vary(x, axes_of(axis_name))
  record_frames(call.site, "ppermute", lambda: x.reshape(1, x.size))
  move = lambda u: lax_ppermute(u, axis_name, pairs)
  if not call.capacity:
    return raw_path(call, x, move)
  return _permute.permute_row(
      x, axis_name=axis_name, n=n, perm=pairs, capacity=call.capacity, transport=call.transport,
      site=call.site, pieces=call.pieces, raw=lambda: _exchange.raw_bits(move, x))


def _ppermute_transpose_rule(call: Call, ct):
  return transposed(_PPERMUTE, call, ct, tuple((d, s) for s, d in call.params))


_PPERMUTE = Recipe("ppermute", "activation", _ppermute_params, _ppermute_wire, _ppermute_lax,
                    _ppermute_impl, _ppermute_transpose_rule)


# --------------------------------------------------------------------------- #
# Derived: pmean, all_gather_invariant
# --------------------------------------------------------------------------- #

def pmean(x, axis_name, *, axis_index_groups=None, compress=None, capacity=None,
          transport="auto", name=None, fixed_order=None):
  """Compressed :func:`jax.lax.pmean`: :func:`psum`, then a division by the number of ranks.

  As in ``jax.lax.pmean``, ``psum(x) / n`` with ``n`` the size of ``axis_name`` (a Python int:
  the quotient keeps ``x``'s float dtype). The sum is :func:`psum`'s (raw: ``jax.lax.psum``'s, so
  the bits are ``jax.lax.pmean``'s). Same arguments and options as :func:`psum`.

  Example, two devices::

    rank 0: x = [1., 2.]     rank 1: x = [3., 6.]
    pmean(x, 'i')            # [2., 4.] on both ranks
  """
  summed = psum(x, axis_name, axis_index_groups=axis_index_groups, compress=compress,
                capacity=capacity, transport=transport, name=name, fixed_order=fixed_order)
  n = lax.psum(1, axis_name, axis_index_groups=axis_index_groups)  # jax.lax's own count
  return jax.tree_util.tree_map(lambda v: v / n, summed)


def all_gather_invariant(x, axis_name, *, axis=0, tiled=False, compress=None, capacity=None,
                         transport="auto", name=None):
  """:func:`all_gather` with ``to="invarying"``: a device-invariant result, bit-identical.

  ``jax.lax.all_gather(x, axis_name, to="invarying")`` under its own name (newer jax versions
  export ``jax.lax.all_gather_invariant``). The transpose is a local slice of the cotangent::

    rank 0: x = [a0, a1]     rank 1: x = [b0, b1]
    all_gather_invariant(x, 'i', tiled=True)   # [a0, a1, b0, b1], invariant over 'i'
  """
  return all_gather(x, axis_name, axis=axis, tiled=tiled, to="invarying", compress=compress,
                    capacity=capacity, transport=transport, name=name)


_recipe.PUBLIC.update(all_to_all=all_to_all, all_gather=all_gather, psum_scatter=psum_scatter,
                      psum=psum, ppermute=ppermute)
