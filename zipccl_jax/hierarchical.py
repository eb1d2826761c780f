"""Two-level collectives: a collective over ``(slow, fast)`` mesh axes as phases, one per level.

Real clusters have two levels: devices inside a host talk over a fast link, hosts over a slow one.
A collective over a tuple of two mesh axes such as ``("host", "local")`` can run *flat* (one
``jax.lax`` collective over both axes) or *hierarchically*, as one collective per axis, in the
order that moves the fewest bytes over the slow link, each phase raw or compressed. all_gather,
psum_scatter, all_to_all and psum (``check_vma=False``) over ONE axis that spans hosts
(`strategy.levels.use_levels`) run the same programs, each level's collectives over its
``axis_index_groups`` of that axis and all_to_all's exchanges over every rank over the axis
itself (`_shard.TwoLevels`):

==============  ==============================================  ===============================
collective      hierarchical phases (device ``(h, l)``)         bytes over the slow link
==============  ==============================================  ===============================
all_gather      1. all_gather over ``slow`` of the device's     the device's own shard, to
                own shard; 2. all_gather over ``fast`` of the   ``H - 1`` peers (a flat ring
                ``H`` shards (rows, put in rank order by        sends ``n - 1`` shards past a
                ``by_second``)                                  host boundary)
psum_scatter    1. psum_scatter over ``fast`` (the host's       ``(H - 1)`` chunks of the
                partial sums of the chunks of every device      result size, against
                ``(h', l)``); 2. psum_scatter over ``slow``     ``(H - 1) L`` flat
psum            psum_scatter's two phases (device ``(h, l)``    twice psum_scatter's: the
                sums chunk ``l H + h``), then all_gather's      ring's reach (each device
                (slow, then fast: every chunk back in place)    its own link)
all_to_all      see below                                       the same bytes as flat (the
                                                                coded ones: C per row), and
                                                                only those rows are coded
                                                                (flat codes ``n - 1`` rows)
==============  ==============================================  ===============================

all_to_all runs one of two algorithms, by the compression of the levels (rows of ``B`` bytes, one
per destination rank, coded into slots of ``C`` bytes):

===================  ===========================================================================
slow / fast          algorithm (device ``(h, l)``)
===================  ===========================================================================
coded / raw          *mixed slots* (`_all_to_all_mixed`, `_mixed.exchange_mixed`): ONE
                     all_to_all over ``(slow, fast)`` of ``n`` slots: the ``(H - 1) L`` rows for
                     other hosts coded, the ``L`` own-host rows raw (their first ``C - 8``
                     bytes, then the sender's overflow flag), plus a raw all_to_all over
                     ``fast`` of the own-host rows' tails (``B - C + 8`` bytes, if positive)
raw / raw,           *rounds* (`_all_to_all`, `_cross_hosts`): 1. all_to_all over ``fast`` of the
raw / coded,         own host's rows (a zipccl collective, coded or not); 2. the rows for other
coded / coded        hosts straight to their device in ``(H - 1) L`` collective-permute rounds
                     ``(h, l) -> (h + t, l + s)`` (coded or not)
===================  ===========================================================================

Why two. On the 2 x 4 CPU testbed (gloo; the fast level is loopback TCP on the same 2 cores, the
slow one 1 Gbit/s shaped TCP; the codec on the CPU is the bottleneck, ~27 ms for 7 rows of MoE
dispatch) the rounds form with the slow level coded only tied flat compressed (hier / flat 0.975
to 1.06 over five runs): a flat all_to_all moves the own-host rows concurrently with the
cross-host ones, while the rounds form paid a separate, sequential fast all_to_all of ``L`` full
raw rows (~9 ms) and per-round overheads, which ate most of the codec it saved (it codes ``(H - 1)
L = 4`` rows per device instead of ``n - 1 = 7``). The mixed slots keep flat compressed's one
exchange and codec only the rows that cross hosts; what is left over the fast level is the tails
(about ``(1 - C / B)`` of ``L`` rows). Measured there (benchmarks/collectives.py ``--mesh 2x4``,
MoE dispatch, ``C / B = 0.70``, two runs) it ran at 0.97 of flat compressed where the rounds form
ran at 1.04 in the runs alternating with it: better, not a clear win; the raw own-host rows cost
the CPU about what coding them saves (their extra bytes through loopback TCP, the byte shuffles
of the heads, the second exchange of the tails; a flag psum cost 5-9 ms more, so the flags ride
in the slots), see the README. On a machine whose codec is cheaper against the link (session 7:
flat compressed 76-79 ms, flat raw 95-98) it ran at 1.03-1.08 of flat compressed: in one process
(8 virtual devices, XLA's profiler, milliseconds summed over the devices' threads per call) the
codec it saves (encode + decode, 43.5 -> 27.8) is less than what it adds: the heads' byte
shuffles (u16 <-> u8 in XLA loops, 24), the tails' second all_to_all (39, mostly waiting for the
slowest device) and their concatenations. With both removed (a bound, not a program: session 8,
benchmarks/patches/mixed_slots_bound.diff) it measured 0.976-0.990 of flat compressed, within the
noise between two runs of one program: the slow link carries the same coded bytes either way (~61
of ~77 ms), so on that testbed no layout of the own host's rows beats flat compressed. `plan` costs
it from calibrate's measurement, beside the measured flat compressed program, so `auto` runs flat
compressed there.

The other patterns keep the rounds: one exchange over the tuple
with every row raw or every row coded is flat raw or flat compressed, which `plan` costs anyway,
and raw / coded codes only rows that stay inside a host.

all_to_all does not aggregate per remote host and forward inside it (a relay): that moved every
remote row over the fast level a second time, which on the 2 x 4 CPU testbed cost more than the
codec it saved: the relay's raw variant was 40 ms slower than flat raw, the direct rounds one is
as fast. The price of the rounds is ``(H - 1) L`` collectives instead of one over the slow link
(latency, in the cost model).

Exactness. Data movement (all_gather, all_to_all) is bit-identical to ``jax.lax`` in every
variant. psum_scatter's and psum's hierarchical order: inside the host, the float32 sum of the
``L`` local inputs in ascending ``fast`` rank, rounded once to the dtype; then the float32 sum of
the ``H`` host partials in ascending ``slow`` rank, rounded once (the flat order is one float32 sum
over all ``n`` ranks, rounded once, so the two algorithms may differ in the last bit). Within an
algorithm, compression never changes a bit: every phase is a zipccl collective, or (all_to_all's
cross-host rounds, its mixed slots) coded frames with the uniform overflow fallback of
:mod:`zipccl_jax._exchange`.

When it applies, and how the algorithm is chosen: :mod:`zipccl_jax.strategy.levels` (the plan,
:func:`~zipccl_jax.use_algorithm`'s pins); this module runs the plan it returns (`run`).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax

from zipccl_jax import _by_rounds, _exchange, _mixed, accounting, strategy
from zipccl_jax._bits import uint_of
from zipccl_jax._linear import linear
from zipccl_jax._shard import TwoLevels, check_vma_on
from zipccl_jax.observation import record_frames
from zipccl_jax.strategy.levels import LevelPlan

__all__ = ["run"]


# --------------------------------------------------------------------------- #
# The phases (each `fns[op]` is the public zipccl collective, with its autodiff)
# --------------------------------------------------------------------------- #


def run(lp: LevelPlan, x, args, fns: dict, *, capacity, transport: str, backward=None):
  """Runs the hierarchical form of `lp.op` on one array `x` (the op's canonical `args`).

  `backward(ct, args)`: the op's transposed collective on a cotangent (all_to_all, whose coded
  cross-host rounds are declared linear here; the other ops' phases are public collectives).
  """
  H, L = lp.sizes
  capacity = "observed" if capacity is None else capacity
  grid = _grid(lp)

  def phase(op, v, level, part="", **kw):  # part: psum's gathers log apart from its scatters
    axis = lp.slow if level == "slow" else lp.fast
    c = lp.compress[axis]
    if op == "psum_scatter":
      kw["fixed_order"] = lp.fixed_order
    where = grid.over(level)  # the level's axis, or its groups of the one axis (use_levels)
    return fns[op](v, where.pop("axis_name"), compress=c, capacity=capacity if c else None,
                   transport=transport, name=f"{lp.site}/{part}{axis}", **where, **kw)

  if lp.op == "all_gather":
    return _all_gather(x, args, H, L, phase)
  if lp.op == "psum_scatter":
    return _psum_scatter(x, args, H, L, phase, fused=lp.fixed_order and not lp.compress[lp.fast])
  if lp.op == "psum":
    return _psum(x, H, L, phase, invariant=lp.axis is None and check_vma_on())
  c = lp.compress[lp.slow]
  split, concat, tiled = args
  if c and not lp.compress[lp.fast]:  # the mixed-slot exchange (see the module docstring)
    mixed = functools.partial(_all_to_all_mixed, args=args, lp=lp, capacity=capacity,
                              site=f"{lp.site}/{lp.slow}")
    return linear(mixed, lambda ct: backward(ct, (concat, split, tiled)), x)
  cross = functools.partial(_cross_hosts, lp=lp, compress=c, capacity=capacity if c else None,
                            site=f"{lp.site}/{lp.slow}", role=lp.role)
  return linear(functools.partial(_all_to_all, args=args, lp=lp, phase=phase, cross=cross),
                lambda ct: backward(ct, (concat, split, tiled)), x)


def _grid(lp: LevelPlan) -> TwoLevels:
  return TwoLevels(lp.slow, lp.fast, *lp.sizes, lp.axis)


def _all_gather(x, args, H, L, phase):
  axis, tiled, _ = args
  g = phase("all_gather", x, "slow", axis=0, tiled=False)          # (H, *x): (h', l) for every h'
  g = _gather_fast(phase, g)                                       # (H, L, *x): [h', l']
  g = g.reshape((H * L,) + x.shape)                                # rank order h * L + l
  if not tiled:
    return jnp.moveaxis(g, 0, axis)
  g = jnp.moveaxis(g, 0, axis)                                     # (..., n, x.shape[axis], ...)
  return g.reshape(x.shape[:axis] + (H * L * x.shape[axis],) + x.shape[axis + 1:])


def _gather_fast(phase, g):
  """The fast level's all_gather of `g` (H, *x), as (H, L, *x): gathered as rows (L, H, *x), then
  reordered (`by_second`). Gathered along axis 1, XLA:CPU gathers rows and transposes them element by
  element, a pass as long as the whole result (2 x 4 CPU devices, 4 MiB a device:
  benchmarks/coded_passes_ab.py)."""
  return by_second(phase("all_gather", g, "fast", axis=0, tiled=False))


def by_second(a):
  """`a` (A, B, ...) as (B, A, ...): ``swapaxes(a, 0, 1)``, written as the concatenation of its B static
  slices, which XLA:CPU copies row by row where it emits a transpose element by element (2 x 4 CPU
  devices, bfloat16, 4 MiB a device, all devices at once: 4.9 against 13.2 ms a call). For the reorder
  between the levels' layouts wherever it is a pass of its own: before or after a coded phase (the
  encoder reads, the decoder writes, one contiguous buffer), around jax.lax's all_gather and
  reduce-scatter. zipccl's raw fixed-order psum_scatter keeps the transpose, which XLA fuses into the
  slices its all-to-all sends. On the bit patterns: XLA:CPU moves 16- and 8-bit floats through float32,
  which rewrites NaN payloads."""
  rows = lambda u: jnp.concatenate([u[:, b][None] for b in range(u.shape[1])])  # noqa: E731
  return _exchange.raw_bits(rows, a) if jnp.issubdtype(a.dtype, jnp.floating) else rows(a)


def _psum_scatter(x, args, H, L, phase, fused: bool):
  """`fused`: the fast phase is zipccl's raw fixed-order exchange, into whose slices XLA fuses the
  reorder (`by_second` otherwise)."""
  dim, tiled = args
  n = H * L
  xs = jnp.moveaxis(x, dim, 0)
  rest = xs.shape[1:]
  c = xs.shape[0] // n
  r = xs.reshape((H, L, c) + rest)                                 # [dest h', dest l']
  r = (jnp.swapaxes(r, 0, 1) if fused else by_second(r))          # grouped by destination l'
  r = r.reshape((L * H * c,) + rest)
  p = phase("psum_scatter", r, "fast", scatter_dimension=0, tiled=True)   # (H c): host partials
  y = phase("psum_scatter", p, "slow", scatter_dimension=0, tiled=True)   # (c): my chunk
  if not tiled:                                                    # x.shape[dim] == n: c == 1
    return y.reshape(rest)
  return jnp.moveaxis(y, 0, dim)


def _psum(x, H, L, phase, invariant: bool):
  """psum_scatter's two phases, then all_gather's: device ``(h, l)`` sums chunk ``l H + h`` of the
  operand (flattened, zero-padded to ``n c`` elements), in psum_scatter's hierarchical order, and
  the gathers bring every chunk back in place. `invariant` (check_vma): the gathers'
  ``to="invarying"`` makes the result invariant over both axes, as jax types a psum."""
  n, size = H * L, x.size
  c = -(-size // n)
  flat = x.reshape(size)
  if n * c != size:
    flat = jnp.concatenate([flat, jnp.zeros((n * c - size,), x.dtype)])
  p = phase("psum_scatter", flat, "fast", scatter_dimension=0, tiled=True)  # (H c): block l
  y = phase("psum_scatter", p, "slow", scatter_dimension=0, tiled=True)     # (c): chunk l H + h
  to = "invarying" if invariant else "varying"
  g = phase("all_gather", y, "slow", "gather/", axis=0, tiled=True, to=to)  # (H c): block l
  g = phase("all_gather", g, "fast", "gather/", axis=0, tiled=True, to=to)  # (n c)
  return g[:size].reshape(x.shape)


def _a2a_assemble(got, x, split: int, concat: int, tiled: bool):
  """got (n, m) bit patterns, row s from rank s -> jax.lax.all_to_all's result layout."""
  n = got.shape[0]
  xs_shape = (x.shape[split],) + x.shape[:split] + x.shape[split + 1:]
  chunk = (xs_shape[0] // n,) + xs_shape[1:] if tiled else xs_shape[1:]
  got = got.reshape((n,) + chunk)                       # [src rank h * L + l]
  if not tiled:
    return jnp.moveaxis(got, 0, concat)
  chunks = jnp.moveaxis(got, 1, split + 1)              # each source's chunk, in x's axis order
  out = jnp.moveaxis(chunks, 0, concat)                 # (..., n, chunk[concat], ...)
  return out.reshape(out.shape[:concat] + (n * out.shape[concat + 1],) + out.shape[concat + 2:])


def _all_to_all_mixed(x, args, lp, capacity, site: str):
  """Host coded, local raw: one `_mixed.exchange_mixed` over ``(slow, fast)``, whose slots carry
  the coded frames of the ``(H - 1) L`` rows for other hosts and the raw heads of the own host's,
  plus a raw all_to_all over ``fast`` of the own host's row tails; raw fallback: the flat
  ``jax.lax.all_to_all``. Padded transport, whatever the call's ``transport``. Layout copies run
  on bit patterns (NaN payloads under vmap).

  Recorded at `site` with the bytes one device sends: ``n`` slots of ``C`` bytes over the tuple
  (the self slot counted as `_exchange.exchange_rows` counts it: ``(n - 1) C``) plus ``L`` tails of
  ``T`` bytes over ``fast`` (``(L - 1) T``, ``T = B - C + 8`` rounded up to whole elements, or 0).
  Raw: the flat all_to_all's ``(n - 1) B``, what a fallback moves after the slots."""
  split, concat, tiled = args
  H, L = lp.sizes
  n = H * L
  dt = np.dtype(x.dtype)
  m = x.size // n
  rows = jnp.moveaxis(x, split, 0).reshape(n, m)       # the encoder's operand, as flat's
  plan = strategy.plan("all_to_all", dt, m, axis_size=n, compress=True, capacity=capacity,
                       role=lp.role, site=site, axis_name=lp.slow, frame_may_exceed_raw=True)
  C, B = plan.capacity, m * dt.itemsize
  tail = (m - _mixed.mixed_head_elems(C, m, dt)) * dt.itemsize   # bytes per own-host row
  sent = accounting.sent_bytes
  key = accounting.record(site, "all_to_all", rows, n, plan, sent("all-to-all", n * B, n),
                          sent("all-to-all", n * C, n) + sent("all-to-all", L * tail, L))
  with accounting.site_scope(key):
    return _mixed_exchange(rows, x, lp, args, site, C)


def _mixed_exchange(rows, x, lp, args, site, C):
  """The mixed-slot exchange of `rows` (x's chunks) at capacity `C`, in the site's scope."""
  split, concat, tiled = args
  dt = np.dtype(x.dtype)
  record_frames(site, "all_to_all", lambda: rows)
  grid = _grid(lp)
  xs_shape = (x.shape[split],) + x.shape[:split] + x.shape[split + 1:]

  def raw():  # the flat jax.lax all_to_all on the bits of x rebuilt from `rows` (one operand buffer)
    x_again = jnp.moveaxis(rows.reshape(xs_shape), 0, split)
    return _exchange.raw_bits(lambda u: lax.all_to_all(u, grid.axes, split, concat, tiled=tiled),
                              x_again)

  def finish(got):  # the layout copies on bit patterns (under vmap XLA:CPU may copy via float32)
    bits = lax.bitcast_convert_type(got, uint_of(dt))
    out = _a2a_assemble(bits, x, split, concat, tiled)
    return lax.bitcast_convert_type(out, dt)

  return _mixed.exchange_mixed(rows, grid=grid, capacity=C, site=site, raw=raw, finish=finish)


def _all_to_all(x, args, lp, phase, cross):
  """The rounds form (every compression pattern but host coded / local raw): own-host rows over
  ``fast``, the others straight to their device over the slow link (`_cross_hosts`), so no row
  crosses a level twice."""
  split, concat, tiled = args
  H, L = lp.sizes
  n = H * L
  xs = jnp.moveaxis(x, split, 0)
  m = x.size // n
  rows = xs.reshape(H, L * m)                           # [dest h'], row for (h', l') at l' * m
  h = _grid(lp).coords()[0]
  # sliced as bits: under vmap XLA:CPU computes a bfloat16 slice in float32 and quiets NaN payloads
  own = _exchange.raw_bits(lambda u: lax.dynamic_index_in_dim(u, h, 0, keepdims=False), rows)
  own = own.reshape(L, m)
  got_own = phase("all_to_all", own, "fast", split_axis=0, concat_axis=0, tiled=True)  # [src l]
  got = cross(rows.reshape(n, m))                       # [src h * L + l], own host's rows unset
  got = _exchange.with_own_row(got.reshape(H, L * m), got_own.reshape(L * m),
                               jnp.arange(H, dtype=jnp.int32) == h.astype(jnp.int32))
  u = uint_of(x.dtype)
  out = _a2a_assemble(lax.bitcast_convert_type(got.reshape(n, m), u), x, split, concat, tiled)
  return lax.bitcast_convert_type(out, x.dtype)


def _rounds(H: int, L: int):
  """The rounds of the cross-host exchange: (host offset t, local offset s), t >= 1."""
  return [(t, s) for t in range(1, H) for s in range(L)]


def _cross_hosts(rows, lp, *, compress: bool, capacity, site: str, role: str):
  """rows (n, m), row j for rank j -> (n, m), row j from rank j; the rows of the own host are
  not sent (zeros).

  One collective-permute per round (t, s) of `_rounds`: device (h, l) sends its row for
  ((h + t) % H, (l + s) % L), so every row for another host goes straight to its device over
  the slow link, and only those (H - 1) L rows are coded (flat compressed codes n - 1). Coded
  frames are padded to `capacity` (`_by_rounds.exchange_rounds`, whose fallback every device
  takes together).

  Runs for the raw slow level, and for the coded one when the fast level is coded too. With the
  slow level coded and the fast one raw, `_all_to_all_mixed` runs instead: on the 2 x 4 testbed
  these rounds plus the separate raw fast all_to_all of the own host's rows only tied flat
  compressed (see the module docstring).
  """
  H, L = lp.sizes
  n, m = rows.shape
  grid = _grid(lp)
  rounds = _rounds(H, L)
  t = np.array([r[0] for r in rounds], np.int32)
  s = np.array([r[1] for r in rounds], np.int32)
  h, l = grid.coords()
  dest = ((h + t) % H) * L + (l + s) % L                       # (R,): the row sent in round r
  src = np.arange(n, dtype=np.int32)
  own = jnp.asarray(src // L) == h                             # (n,): rows of the own host
  arrival = jnp.where(own, 0, ((h - src // L) % H - 1) * L + (l - src % L) % L)  # round of row j
  rank = grid.rank()                                           # ppermute's numbering (_compat)
  perms = [[(rank((a, b)), rank(((a + ti) % H, (b + si) % L))) for a in range(H) for b in range(L)]
           for ti, si in rounds]

  route = dict(axes=grid.axes, perms=perms, send=dest, arrival=arrival)
  dt = np.dtype(rows.dtype)
  plan = strategy.plan("all_to_all", dt, m, axis_size=n, compress=compress, capacity=capacity,
                       role=role, site=site, axis_name=lp.slow)
  raw_b = len(rounds) * m * dt.itemsize
  key = accounting.record(site, "all_to_all", rows, n, plan, raw_b, len(rounds) * plan.capacity)
  with accounting.site_scope(key):
    return _rounds_exchange(rows, plan, route, own, lp, site)


def _rounds_exchange(rows, plan, route, own, lp, site):
  """The rounds exchange of `rows` as `plan` says, in the site's scope."""
  if not plan.compress:
    accounting.count(site, jnp.bool_(False))
    return _by_rounds.raw_rounds(rows, **route)
  record_frames(site, "all_to_all", lambda: rows)
  return _by_rounds.exchange_rounds(rows, **route, skip=own, flag_over=_grid(lp).over("fast"),
                                    capacity=plan.capacity, site=site)
