"""Two-level collectives: a collective over ``(slow, fast)`` mesh axes as phases, one per level.

Real clusters have two levels: devices inside a host talk over a fast link, hosts over a slow one.
A collective over a tuple of two mesh axes such as ``("host", "local")`` can run *flat* (one
``jax.lax`` collective over both axes) or *hierarchically*, as one collective per axis, in the
order that moves the fewest bytes over the slow link, each phase raw or compressed:

==============  ==============================================  ===============================
collective      hierarchical phases (device ``(h, l)``)         bytes over the slow link
==============  ==============================================  ===============================
all_gather      1. all_gather over ``slow`` of the device's     the device's own shard, to
                own shard; 2. all_gather over ``fast`` of the   ``H - 1`` peers (a flat ring
                ``H`` shards (at axis 1: rank order, no copy)   sends ``n - 1`` shards past a
                                                                host boundary)
psum_scatter    1. psum_scatter over ``fast`` (the host's       ``(H - 1)`` chunks of the
                partial sums of the chunks of every device      result size, against
                ``(h', l)``); 2. psum_scatter over ``slow``     ``(H - 1) L`` flat
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
variant. psum_scatter's hierarchical order: inside the host, the float32 sum of the ``L`` local
inputs in ascending ``fast`` rank, rounded once to the dtype; then the float32 sum of the ``H``
host partials in ascending ``slow`` rank, rounded once (the flat order is one float32 sum over all
``n`` ranks, rounded once, so the two algorithms may differ in the last bit). Within an algorithm,
compression never changes a bit: every phase is a zipccl collective, or (all_to_all's cross-host
rounds, its mixed slots) coded frames with the uniform overflow fallback of
:mod:`zipccl_jax._exchange`.

When it applies. Inside :func:`zipccl_jax.all_gather` (``to="varying"``),
:func:`~zipccl_jax.psum_scatter` and :func:`~zipccl_jax.all_to_all`, for an ``axis_name`` of two
axes ``(slow, fast)`` whose link models are both in the active profile (``Profile.links[axis]``,
what :func:`zipccl_jax.calibrate` measures per level for a tuple) with ``slow`` the slower, a
float dtype, and a ``capacity`` that is None, a ratio or ``"observed"``. Then :func:`plan` costs
every candidate with :func:`zipccl_jax.strategy.decide`'s model (flat on the tuple's own link;
each phase on its axis's link; the hierarchical programs, raw and with the slow phase coded, as
:func:`zipccl_jax.calibrate` measured them over the tuple, when it did, see `_candidates`) and runs
the cheapest:

* ``compress="auto"``: flat raw (the ``jax.lax`` call as written), flat compressed, and
  hierarchical with at least one phase compressed (compressed candidates must win by the
  profile's ``min_gain``);
* ``compress=True``: flat compressed or hierarchical with both phases compressed;
* ``compress=False``: flat raw.

With ``fixed_order=True`` (:func:`zipccl_jax.use_defaults`) raw means zipccl's fixed-order programs
and hierarchical with both phases raw is a candidate too (``"auto"`` and ``False``).

:func:`use_algorithm` pins the algorithm (and the per-level compression) at trace time. The
choice is logged under ``"<site> [levels]"`` with every candidate's estimate
(:func:`zipccl_jax.explain`); the phases log under ``"<site>/<axis>"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading

import jax.numpy as jnp
import numpy as np
from jax import lax

from zipccl_jax import _exchange, _mixed, accounting, strategy
from zipccl_jax._bits import uint_of
from zipccl_jax._linear import linear
from zipccl_jax._shard import axis_size, ppermute_rank
from zipccl_jax.observation import record_frames
from zipccl_jax.capacity import CODED_DTYPES
from zipccl_jax.profile import axis_key, current_platform, get_profile

__all__ = ["LevelPlan", "plan", "choose", "run", "use_algorithm", "levels_of", "pinned"]

OPS = ("all_gather", "psum_scatter", "all_to_all")


def hierarchical_key(op: str, slow_coded: bool = False, fixed_order: bool = False) -> str:
  """The key, in the link table of a tuple of axes (``Profile.links["slow,fast"]``), of `op`'s
  two-level program as :func:`zipccl_jax.calibrate` measures it, with both phases raw or
  (`slow_coded`) the slow phase compressed: a model of its time against the bytes one device
  sends in the *flat* raw collective. A psum_scatter's raw level is `jax.lax.psum_scatter`, or
  with `fixed_order` zipccl's all-to-all and ordered sum, two programs of their own (on XLA:CPU
  the first ran 2.6x the second at 2 x 4), measured and keyed apart."""
  order = "_fixed_order" if fixed_order and op == "psum_scatter" else ""
  return f"hierarchical_{op}" + ("_slow_coded" if slow_coded else "") + order


# The dtype calibrate times the coded programs over a tuple on (`hierarchical_key(op, True)`,
# `flat_coded_key`): their measurements cost calls of this dtype only, since the codec's speed and
# the default capacity depend on the dtype (float32 codes at 0.85 of raw, bfloat16 at 0.70).
PROGRAM_DTYPE = np.dtype(jnp.bfloat16)


def flat_coded_key(op: str) -> str:
  """The key, in the link table of a tuple of axes, of `op`'s *flat compressed* program over the
  tuple as :func:`zipccl_jax.calibrate` measures it (against the flat raw bytes, like
  `hierarchical_key`): the plan ranks it against the measured hierarchical programs, where the
  model of its codec and wire (`strategy.decide`) and a measured program can each be off by ~10%
  in opposite directions (2 x 4 testbed, all_to_all: model 84 ms, run 77 ms)."""
  return f"flat_{op}_coded"
_FORCED = threading.local()


@contextlib.contextmanager
def use_algorithm(algorithm: str = "auto", compress=None, *, psum: str = "auto", pieces=None):
  """Pins the algorithms of collectives traced inside the block (every argument left at its
  default is the cost model's choice; a nested block replaces the enclosing one's pins).

  Args:
    algorithm: ``"auto"`` (the cost model), ``"flat"`` or ``"hierarchical"`` (for a tuple of two
      axes, the first one taken as the slow level when the profile does not say).
    compress: None (the call's own ``compress``), or per level ``{axis: True | False}``
      (hierarchical only), e.g. ``{"host": True, "local": False}``.
    psum: ``"auto"``, ``"a2a-sum+gather"`` (reduce-scatter, then all-gather) or
      ``"gather-sum"`` (all-gather, then every rank sums): :func:`zipccl_jax.psum`'s algorithm.
    pieces: None, or the number K of independent coded chains a compressed all_to_all,
      all_gather, psum_scatter or psum splits each chunk into (pipelining, see
      ``zipccl_jax._exchange``); the result's bits do not depend on K.

  Example::

    with zipccl_jax.use_algorithm("hierarchical", {"host": True, "local": False}):
      f = jax.jit(jax.shard_map(lambda v: zipccl_jax.all_gather(v, ("host", "local")), ...))
    with zipccl_jax.use_algorithm(psum="gather-sum", pieces=2):
      g = jax.jit(jax.shard_map(lambda v: zipccl_jax.psum(v, "i"), ...))
  """
  if algorithm not in ("auto", "flat", "hierarchical"):
    raise ValueError(f"use_algorithm: algorithm must be 'auto', 'flat' or 'hierarchical', "
                     f"got {algorithm!r}")
  if compress is not None and (algorithm != "hierarchical" or not isinstance(compress, dict)
                               or not all(isinstance(v, bool) for v in compress.values())):
    raise ValueError("use_algorithm: compress must be None, or with algorithm='hierarchical' a "
                     f"dict {{axis: True | False}}, got {compress!r}")
  if psum not in ("auto", "a2a-sum+gather", "gather-sum"):
    raise ValueError(f"use_algorithm: psum must be 'auto', 'a2a-sum+gather' or 'gather-sum', "
                     f"got {psum!r}")
  if pieces is not None and (isinstance(pieces, bool) or not isinstance(pieces, int)
                             or pieces < 1):
    raise ValueError(f"use_algorithm: pieces must be None or an int >= 1, got {pieces!r}")
  prev = getattr(_FORCED, "value", None), getattr(_FORCED, "single", None)
  _FORCED.value = (algorithm, dict(compress) if compress else None)
  _FORCED.single = (None if psum == "auto" else psum, pieces)
  try:
    yield
  finally:
    _FORCED.value, _FORCED.single = prev


def pinned() -> tuple:
  """``(psum algorithm or None, pieces or None)`` pinned by the innermost :func:`use_algorithm`."""
  return getattr(_FORCED, "single", None) or (None, None)


def _two_axes(axis_name) -> bool:
  return (isinstance(axis_name, (tuple, list)) and len(axis_name) == 2
          and axis_name[0] != axis_name[1])


def levels_of(axis_name, profile=None):
  """``(slow, fast)`` if `axis_name` is two axes whose links the profile both knows, else None."""
  if not _two_axes(axis_name):
    return None
  prof = profile if profile is not None else get_profile()
  a, b = (str(v) for v in axis_name)
  if a not in prof.links or b not in prof.links:
    return None
  bw = {ax: prof.link(ax, "*")[0].bandwidth_Bps for ax in (a, b)}
  return (axis_name[0], axis_name[1]) if bw[a] < bw[b] else None


@dataclasses.dataclass(frozen=True)
class LevelPlan:
  """The algorithm of one two-level call and the estimates behind it (seconds per call)."""
  op: str
  site: str
  slow: str
  fast: str
  sizes: tuple                   # (H, L): ranks along slow and fast
  algorithm: str                 # "flat" or "hierarchical"
  compress: dict                 # {axis: bool} per phase (hierarchical); {"flat": bool}
  est_s: float
  candidates: tuple              # ((name, estimate seconds), ...), in cost order
  reason: str
  role: str = "activation"       # the data's statistics (capacity ratios), as strategy.plan's
  fixed_order: bool = False      # psum_scatter's phases: raw is fixed-order, not jax.lax's call


# op -> phases [(level, phase op, chunk elements as a function of (x elements, H, L))] in the
# order they run; chunk = the elements of one coded frame of the phase (the zipccl collective's).
_PHASES = {
    "all_gather": (("slow", "all_gather", lambda m, H, L: m),
                   ("fast", "all_gather", lambda m, H, L: H * m)),
    "psum_scatter": (("fast", "psum_scatter", lambda m, H, L: m // L),
                     ("slow", "psum_scatter", lambda m, H, L: m // (H * L))),
    "all_to_all": (("fast", "all_to_all", lambda m, H, L: m // (H * L)),
                   ("slow", "ppermute", lambda m, H, L: m // (H * L))),  # x (H - 1) L rounds
}  # (all_to_all host coded / local raw is not these phases: `_mixed_model`)
_FLAT_CHUNK = {"all_gather": lambda m, n: m, "psum_scatter": lambda m, n: m // n,
               "all_to_all": lambda m, n: m // n}


def _candidates(op, dt, m, axis_name, slow, fast, sizes, role, allowed, profile=None,
                platform=None, fixed_order=False):
  """{name: (estimate s, algorithm, {level: compress})} for the `allowed` compression patterns,
  and a note on where the hierarchical estimates come from.

  The model of each variant (`_models`): per phase the model of `strategy.decide` on its level's
  link; all_to_all host coded / local raw is one coded exchange over the tuple plus the fast
  level's tails (`_mixed_model`). Measurements anchor the model: when the profile holds the
  op's hierarchical raw program over the tuple (`hierarchical_key`, what `calibrate` fits beside
  the flat link), a variant costs that time plus the model's difference from the raw variant
  (its codec time, less the link time its smaller wire saves): the phases' copies, sums and the
  fast level's real cost are then measured, not assumed away. A measurement of the program with
  the slow phase coded (``slow_coded``: slow coded, fast raw) is that variant's time, and the
  variant that codes both levels costs it plus the model's fast-phase difference (coding the fast
  level, against raw): the modelled difference from the raw program missed what the coded program
  costs around its codec and wire (all_to_all at 2 x 4 on a quiet machine, rounds form: 12 ms of
  saving modelled, 3.5 ms measured). For all_to_all the measured coded program is the mixed-slot
  exchange, which the both-coded variant does not run; its slow level codes the same (H - 1) L rows.
  Flat compressed, when measured over the tuple (`flat_coded_key`), costs its measurement too.
  Coded programs are measured on `PROGRAM_DTYPE`; a call of another dtype models its coded
  variants (from the raw measurement, as above).
  """
  H, L = sizes
  prof = profile if profile is not None else get_profile()
  plat = platform if platform is not None else current_platform()
  model, flat, flat_sent = _models(op, dt, m, axis_name, slow, fast, sizes, role, prof, plat,
                                   fixed_order)
  tab = prof.links.get(axis_key(axis_name), {}) if str(axis_name[0]) == str(slow) else {}
  measured = tab.get(hierarchical_key(op, fixed_order=fixed_order))  # none: measured the other way
  same_dtype = dt == PROGRAM_DTYPE
  coded = tab.get(hierarchical_key(op, True, fixed_order)) if same_dtype else None
  flat_coded = tab.get(flat_coded_key(op)) if same_dtype else None
  if flat_coded is not None:
    flat = {**flat, True: flat_coded.time(flat_sent)}
  base = measured.time(flat_sent) - model[(False, False)] if measured is not None else 0.0

  def estimate(cs, cf):
    if cs and coded is not None:  # the measured program, plus the model's fast-phase difference
      return coded.time(flat_sent) + model[(False, cf)] - model[(False, False)]
    return model[(cs, cf)] + base

  est = {}
  for c in (False, True):
    if ("flat", c) in allowed:
      est[f"flat {'compressed' if c else 'raw'}"] = (flat[c], "flat", {"flat": c})
  mode = {False: "raw", True: "compressed"}
  for cs in (False, True):
    for cf in (False, True):
      if ("hier", cs, cf) in allowed:
        name = f"hierarchical {slow}:{mode[cs]} {fast}:{mode[cf]}"
        est[name] = (estimate(cs, cf), "hierarchical", {slow: cs, fast: cf})
  note = ("hierarchical raw measured" if measured is not None
          else "hierarchical raw = sum of the phases' models")
  if coded is not None:
    note += ", slow phase coded measured"
  if flat_coded is not None:
    note += ", flat compressed measured"
  if not same_dtype and (hierarchical_key(op, True, fixed_order) in tab or flat_coded_key(op) in tab):
    note += f", coded programs modelled ({dt.name}: measured on {PROGRAM_DTYPE.name})"
  return est, note


def _models(op, dt, m, axis_name, slow, fast, sizes, role, prof, plat, fixed_order=False):
  """({(slow coded, fast coded): modelled seconds}, {compress: flat estimate}, bytes one device
  sends in the flat raw collective): each hierarchical variant as the sum of its phases'
  `strategy.decide` models, all_to_all's slow phase as its (H - 1) L rounds, except all_to_all host
  coded / local raw, which runs the mixed-slot exchange (`_mixed_model`)."""
  H, L = sizes

  def both(o, chunk, axis, n):
    d = strategy.decide(o, dt, chunk, axis_size=n, axis_name=axis, role=role, compress=True,
                        profile=prof, platform=plat, log=False, fixed_order=fixed_order)
    return {False: d.est_raw_s, True: d.est_compressed_s}, d.raw_bytes

  flat, flat_sent = both(op, _FLAT_CHUNK[op](m, H * L), axis_name, H * L)
  phases = [(lvl, both(o, f(m, H, L), slow if lvl == "slow" else fast,
                       H if lvl == "slow" else L)[0]) for lvl, o, f in _PHASES[op]]
  if op == "all_to_all":  # R = (H - 1) L rounds, one encode, one decode and one flag psum
    r = (H - 1) * L
    cm = prof.codec_model(dt, plat)[0]
    once = cm.encode_overhead_s + cm.decode_overhead_s + prof.link(slow, "psum", plat)[0].latency_s
    lvl, p = phases[1]
    phases[1] = (lvl, {False: r * p[False], True: r * p[True] - (r - 1) * once})
  model = {(cs, cf): sum(p[cs if lvl == "slow" else cf] for lvl, p in phases)
           for cs in (False, True) for cf in (False, True)}
  if op == "all_to_all":
    model[(True, False)] = _mixed_model(dt, m // (H * L), axis_name, slow, fast, sizes, role,
                                        prof, plat)
  return model, flat, flat_sent


def _mixed_model(dt, chunk, axis_name, slow, fast, sizes, role, prof, plat):
  """Seconds of all_to_all host coded / local raw (`_all_to_all_mixed`): the flat coded exchange
  over the tuple (its link, its wire of n slots of C bytes, its fallback risk) with n - L rows
  coded instead of n - 1, plus a raw all_to_all over `fast` of the own host's row tails (the
  bytes that do not fit in the slot: about (1 - ratio) of each row)."""
  H, L = sizes
  n = H * L
  d = strategy.decide("all_to_all", dt, chunk, axis_size=n, axis_name=axis_name, role=role,
                      compress=True, profile=prof, platform=plat, log=False, pieces=1)
  cm = prof.codec_model(dt, plat)[0]
  B = chunk * np.dtype(dt).itemsize
  t = d.est_compressed_s - (L - 1) * (B / cm.encode_Bps + B / cm.decode_Bps)
  tail = chunk - _mixed.mixed_head_elems(d.capacity, chunk, dt)   # elements
  if tail:
    t += strategy.decide("all_to_all", dt, tail, axis_size=L, axis_name=fast, role=role,
                         compress=False, profile=prof, platform=plat, log=False).est_raw_s
  return t


def _allowed(compress, forced_alg, forced_levels, slow, fast, fixed_order=False):
  """The (algorithm, compression) patterns a call may run. Raw is jax.lax's own call (flat raw):
  hierarchical with both levels raw, zipccl's program, only when pinned or with `fixed_order`."""
  if forced_levels is not None:
    return {("hier", bool(forced_levels.get(slow, False)), bool(forced_levels.get(fast, False)))}
  modes = (False, True) if compress == "auto" else (bool(compress),)
  out = set()
  if forced_alg != "hierarchical":
    out |= {("flat", c) for c in modes}
  if forced_alg != "flat":
    if compress == "auto":
      out |= {("hier", a, b) for a in (False, True) for b in (False, True)}
    else:
      out.add(("hier", bool(compress), bool(compress)))
    if forced_alg == "auto" and not fixed_order:
      out.discard(("hier", False, False))
  return out


def plan(op: str, x, axis_name, params, compress, capacity, site: str,
         role: str, fixed_order: bool = False) -> LevelPlan | None:
  """The algorithm of one call over a two-level `axis_name`: a hierarchical LevelPlan, or None
  for the flat path (which then decides raw or compressed itself, as without levels).

  `params`: the op's canonical static arguments (as the collectives' recipes hold them).
  """
  if op not in OPS or not _two_axes(axis_name):
    return None  # every call asks: one axis, the common case, returns before any other work
  forced_alg = (getattr(_FORCED, "value", None) or ("auto", None))[0]
  dt = np.dtype(x.dtype)
  if (forced_alg == "flat" or dt not in CODED_DTYPES
      or (op == "all_gather" and params[2] != "varying")
      or isinstance(capacity, (int, np.integer, tuple, list)) and not isinstance(capacity, bool)):
    return None
  levels = levels_of(axis_name)
  if levels is None:
    if forced_alg != "hierarchical":
      return None
    levels = (axis_name[0], axis_name[1])
  slow, fast = levels
  H, L = axis_size(slow, op), axis_size(fast, op)
  if H < 2 or L < 2:
    return None
  lp = choose(op, dt, int(x.size), axis_name, (slow, fast), (H, L), compress, role, site=site,
              fixed_order=fixed_order)
  _log(lp, dt, int(x.size), role, compress)
  return lp if lp.algorithm == "hierarchical" else None


def choose(op: str, dtype, x_elems: int, axis_name, levels, sizes, compress, role: str, *,
           site: str = "", profile=None, platform: str | None = None,
           fixed_order: bool = False) -> LevelPlan:
  """The cheapest algorithm of one two-level call, neither traced nor logged: what :func:`plan`
  runs at trace time, and what :mod:`zipccl_jax.model` predicts with, so a prediction and a run
  cannot disagree.

  Args:
    op: "all_gather", "psum_scatter" or "all_to_all".
    dtype: the operand's float dtype.
    x_elems: elements of one device's operand.
    axis_name: the collective's tuple of two axes.
    levels: ``(slow, fast)`` axis names.
    sizes: ``(H, L)``: ranks along ``slow`` and ``fast``.
    compress, role: the call's options (as the collectives'); the innermost
      :func:`use_algorithm` pins apply.
    profile, platform: default the active profile and ``jax.default_backend()``.
    fixed_order: psum_scatter: raw phases (and flat raw) are zipccl's fixed-order programs, and
      hierarchical raw is a candidate; otherwise raw is jax.lax's call (`_allowed`).

  Returns the :class:`LevelPlan` with every candidate's estimate (``algorithm`` "flat": the flat
  path runs, raw or compressed as its own decision says).
  """
  forced_alg, forced_levels = getattr(_FORCED, "value", None) or ("auto", None)
  prof = profile if profile is not None else get_profile()
  dt = np.dtype(dtype)
  slow, fast = levels
  H, L = sizes
  allowed = _allowed(compress, forced_alg, forced_levels, slow, fast, fixed_order)
  cands, note = _candidates(op, dt, int(x_elems), axis_name, slow, fast, (H, L), role, allowed,
                            profile=prof, platform=platform, fixed_order=fixed_order)
  g = prof.min_gain
  score = {k: t * (1 + g if any(cs.values()) else 1) for k, (t, _, cs) in cands.items()}
  order = sorted(cands, key=lambda k: (score[k], k))
  best = order[0]
  t, alg, cs = cands[best]
  why = ("use_algorithm" if forced_alg != "auto" else f"model (compressed x (1+{g:g}); {note})") \
      + ": " + ", ".join(f"{k} {cands[k][0] * 1e3:.3f} ms" for k in order)
  return LevelPlan(op, site, str(slow), str(fast), (H, L), alg, cs, float(t),
                   tuple((k, float(cands[k][0])) for k in order), why, role, fixed_order)


def _log(lp: LevelPlan, dt, m: int, role: str, mode) -> None:
  """Records the level choice under "<site> [levels]" (explain() shows it next to the phases)."""
  raw_flat = dict(lp.candidates).get("flat raw", math.nan)
  prof = get_profile()
  slow_link = prof.link(lp.slow, "*")[0]
  strategy.log_decision(strategy.Decision(
      op=lp.op, site=f"{lp.site} [levels]", dtype=dt.name, chunk_elems=m,
      axis_size=int(lp.sizes[0] * lp.sizes[1]), axis=axis_key((lp.slow, lp.fast)), role=role,
      compress=any(lp.compress.values()), capacity=0, transport="-",
      algorithm=lp.algorithm if lp.algorithm == "flat" else
      "hierarchical(" + ",".join(f"{a}:{'c' if c else 'r'}" for a, c in lp.compress.items()) + ")",
      est_raw_s=float(raw_flat), est_compressed_s=lp.est_s, raw_bytes=0, wire_bytes=0,
      bandwidth_Bps=float(slow_link.bandwidth_Bps), latency_s=float(slow_link.latency_s),
      capacity_source="-",
      reason=f"{lp.algorithm}: {lp.reason}", profile=prof.fingerprint(), mode=str(mode)))


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

  def phase(op, v, level, **kw):
    axis = lp.slow if level == "slow" else lp.fast
    c = lp.compress[axis]
    if op == "psum_scatter":
      kw["fixed_order"] = lp.fixed_order
    return fns[op](v, axis, compress=c, capacity=capacity if c else None, transport=transport,
                   name=f"{lp.site}/{axis}", **kw)

  if lp.op == "all_gather":
    return _all_gather(x, args, H, L, phase)
  if lp.op == "psum_scatter":
    return _psum_scatter(x, args, H, L, phase)
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


def _all_gather(x, args, H, L, phase):
  axis, tiled, _ = args
  g = phase("all_gather", x, "slow", axis=0, tiled=False)          # (H, *x): (h', l) for every h'
  g = phase("all_gather", g, "fast", axis=1, tiled=False)          # (H, L, *x): [h', l']
  g = g.reshape((H * L,) + x.shape)                                # rank order h * L + l
  if not tiled:
    return jnp.moveaxis(g, 0, axis)
  g = jnp.moveaxis(g, 0, axis)                                     # (..., n, x.shape[axis], ...)
  return g.reshape(x.shape[:axis] + (H * L * x.shape[axis],) + x.shape[axis + 1:])


def _psum_scatter(x, args, H, L, phase):
  dim, tiled = args
  n = H * L
  xs = jnp.moveaxis(x, dim, 0)
  rest = xs.shape[1:]
  c = xs.shape[0] // n
  r = xs.reshape((H, L, c) + rest)                                 # [dest h', dest l']
  r = jnp.swapaxes(r, 0, 1).reshape((L * H * c,) + rest)           # grouped by destination l'
  p = phase("psum_scatter", r, "fast", scatter_dimension=0, tiled=True)   # (H c): host partials
  y = phase("psum_scatter", p, "slow", scatter_dimension=0, tiled=True)   # (c): my chunk
  if not tiled:                                                    # x.shape[dim] == n: c == 1
    return y.reshape(rest)
  return jnp.moveaxis(y, 0, dim)


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
  axes = (lp.slow, lp.fast)
  xs_shape = (x.shape[split],) + x.shape[:split] + x.shape[split + 1:]

  def raw():  # the flat jax.lax all_to_all on the bits of x rebuilt from `rows` (one operand buffer)
    x_again = jnp.moveaxis(rows.reshape(xs_shape), 0, split)
    return _exchange.raw_bits(lambda u: lax.all_to_all(u, axes, split, concat, tiled=tiled),
                              x_again)

  def finish(got):  # the layout copies on bit patterns (under vmap XLA:CPU may copy via float32)
    bits = lax.bitcast_convert_type(got, uint_of(dt))
    out = _a2a_assemble(bits, x, split, concat, tiled)
    return lax.bitcast_convert_type(out, dt)

  return _mixed.exchange_mixed(rows, slow=lp.slow, fast=lp.fast, capacity=C, site=site,
                                  raw=raw, finish=finish)


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
  h = lax.axis_index(lp.slow)
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
  frames are padded to `capacity` (`_exchange.exchange_rounds`, whose fallback every device
  takes together).

  Runs for the raw slow level, and for the coded one when the fast level is coded too. With the
  slow level coded and the fast one raw, `_all_to_all_mixed` runs instead: on the 2 x 4 testbed
  these rounds plus the separate raw fast all_to_all of the own host's rows only tied flat
  compressed (see the module docstring).
  """
  H, L = lp.sizes
  n, m = rows.shape
  axes = (lp.slow, lp.fast)
  rounds = _rounds(H, L)
  t = np.array([r[0] for r in rounds], np.int32)
  s = np.array([r[1] for r in rounds], np.int32)
  h = lax.axis_index(lp.slow).astype(jnp.int32)
  l = lax.axis_index(lp.fast).astype(jnp.int32)
  dest = ((h + t) % H) * L + (l + s) % L                       # (R,): the row sent in round r
  src = np.arange(n, dtype=np.int32)
  own = jnp.asarray(src // L) == h                             # (n,): rows of the own host
  arrival = jnp.where(own, 0, ((h - src // L) % H - 1) * L + (l - src % L) % L)  # round of row j
  rank = ppermute_rank(axes)                                   # ppermute's numbering (_compat)
  perms = [[(rank((a, b)), rank(((a + ti) % H, (b + si) % L))) for a in range(H) for b in range(L)]
           for ti, si in rounds]

  route = dict(axes=axes, perms=perms, send=dest, arrival=arrival)
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
    return _exchange.raw_rounds(rows, **route)
  record_frames(site, "all_to_all", lambda: rows)
  return _exchange.exchange_rounds(rows, **route, skip=own, flag_axis=lp.fast,
                                   capacity=plan.capacity, site=site)
