"""The decision over two levels: flat or hierarchical, and which level codes, for a collective
over ``(slow, fast)`` mesh axes (the programs: :mod:`zipccl_jax.hierarchical`).

When it applies. Inside :func:`zipccl_jax.all_gather` (``to="varying"``),
:func:`~zipccl_jax.psum_scatter`, :func:`~zipccl_jax.all_to_all` and :func:`~zipccl_jax.psum`
(costed as psum_scatter's programs followed by all_gather's), for an ``axis_name`` of two
axes ``(slow, fast)`` whose link models are both in the active profile (``Profile.links[axis]``,
what :func:`zipccl_jax.calibrate` measures per level for a tuple) with ``slow`` the slower, a
float dtype, and a ``capacity`` that is None, a ratio or ``"observed"``. Then :func:`plan` costs
every candidate with :func:`zipccl_jax.strategy.decide`'s model (flat on the tuple's own link;
each phase on its axis's link; the hierarchical programs, raw and with the slow phase coded, as
:func:`zipccl_jax.calibrate` measured them over the tuple, when it did, see `_candidates`) and runs
the cheapest:

* ``compress="auto"``: flat raw (the ``jax.lax`` call as written), flat compressed, and
  hierarchical with at least one phase compressed (compressed candidates must win by the
  profile's ``min_gain``; one calibrate timed over the tuple, by its ``timed_gain``, default 0);
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
import math
import threading

import jax.numpy as jnp
import numpy as np

from zipccl_jax import _mixed
from zipccl_jax._shard import axis_size, batched, check_vma_on, level_groups
from zipccl_jax.capacity import CODED_DTYPES
from zipccl_jax.strategy.decision import Decision, decide, log_decision
from zipccl_jax.strategy.profile import Profile, axis_key, current_platform, get_profile

__all__ = ["LevelPlan", "plan", "choose", "use_algorithm", "use_levels", "pinned", "levels_of",
           "level_groups", "hierarchical_key", "flat_coded_key", "PROGRAM_DTYPE", "OPS",
           "SPLIT_OPS", "PROGRAM_OPS"]


OPS = ("all_gather", "psum_scatter", "all_to_all", "psum")
SPLIT_OPS = ("all_gather", "psum_scatter", "psum", "all_to_all")  # over one axis split into levels
PROGRAM_OPS = ("all_gather", "psum_scatter", "all_to_all")  # calibrate measures their programs


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


# --------------------------------------------------------------------------- #
# Pins
# --------------------------------------------------------------------------- #


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
      ``zipccl_jax._exchange``; psum_scatter's run one after another, for memory:
      ``zipccl_jax._reduce``); the result's bits do not depend on K.

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


_SPLIT = threading.local()


@contextlib.contextmanager
def use_levels(per_host: dict, levels=("host", "local")):
  """Declares mesh axes that span hosts, for collectives traced inside the block: a call over one
  of them is a two-level call, as over a tuple ``levels`` of two axes.

  Users write one axis across hosts (``fsdp``, ``data``): its ``n`` ranks are ``H = n / L`` hosts
  of ``L = per_host[axis]`` devices, rank ``h * L + l`` on host ``h`` (a mesh made host-major, as
  ``jax.make_mesh`` and ``mesh_utils.create_device_mesh`` make one). :func:`all_gather`,
  :func:`psum_scatter`, :func:`all_to_all` and, under ``check_vma=False``, :func:`psum` over such
  an axis then cost flat (the ``jax.lax`` call as written, or flat compressed) against the
  hierarchical programs, whose phases are collectives over the level's
  ``axis_index_groups`` of the axis: the ``L`` ranks of a host (``fast``), the ``H`` ranks of one
  local index (``slow``). The links are the profile's for ``levels`` (``Profile.links["host"]``,
  ``["local"]`` and ``["host,local"]``, what :func:`zipccl_jax.calibrate` measures over a mesh
  with those two axes, or ``zipccl_jax.model.Topology(...).profile()``); :func:`use_algorithm`
  pins apply as for a tuple (all_to_all's exchange over every rank runs over the axis itself).
  psum with ``check_vma`` stays flat: jax types its result invariant over the axis, which grouped
  gathers cannot give.

  Args:
    per_host: ``{axis name: devices per host}``, each an int >= 2.
    levels: the ``(slow, fast)`` names whose links the profile holds.

  Example::

    with zipccl_jax.use_levels({"fsdp": 8}):   # 64 devices: 8 hosts of 8
      step = jax.jit(jax.shard_map(train_step, mesh=mesh, in_specs=..., out_specs=...))
  """
  if not isinstance(per_host, dict) or not all(
      isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 2
      for k, v in per_host.items()):
    raise ValueError("use_levels: per_host must be a dict {axis name: devices per host >= 2}, "
                     f"got {per_host!r}")
  if (not isinstance(levels, (tuple, list)) or len(levels) != 2
      or not all(isinstance(v, str) for v in levels) or levels[0] == levels[1]):
    raise ValueError(f"use_levels: levels must be two distinct axis names, got {levels!r}")
  prev = getattr(_SPLIT, "value", None)
  _SPLIT.value = (dict(per_host), tuple(levels))
  try:
    yield
  finally:
    _SPLIT.value = prev


def _split(axis_name):
  """(devices per host, (slow, fast)) if `axis_name` is one axis `use_levels` declared, else None."""
  declared = getattr(_SPLIT, "value", None)
  if declared is None:
    return None
  one = axis_name[0] if isinstance(axis_name, (tuple, list)) and len(axis_name) == 1 else axis_name
  if not isinstance(one, str) or one not in declared[0]:
    return None
  return declared[0][one], declared[1]


def pinned() -> tuple:
  """``(psum algorithm or None, pieces or None)`` pinned by the innermost :func:`use_algorithm`."""
  return getattr(_FORCED, "single", None) or (None, None)


# --------------------------------------------------------------------------- #
# The levels and their candidates
# --------------------------------------------------------------------------- #


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
  axis: object = None            # the one mesh axis `slow` and `fast` split (`use_levels`), or None
  flat_gain: float = Profile.min_gain  # the margin flat compressed was ranked with (`choose`)

  def flat_estimates(self) -> tuple[float, float, float] | None:
    """(flat raw, flat compressed, the margin compressed was ranked with) as this plan costed them,
    where it costed both: the flat path of an "auto" call decides with them (`strategy.decide`'s
    ``flat_est``), so a call that stays flat is decided once, as the plan ranked it."""
    est = dict(self.candidates)
    if "flat raw" in est and "flat compressed" in est:
      return est["flat raw"], est["flat compressed"], self.flat_gain
    return None


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
               "all_to_all": lambda m, n: m // n, "psum": lambda m, n: -(-m // n)}


def _programs_timed(op, dt, axis_name, slow, prof, fixed_order=False):
  """(the tuple's link table, then calibrate's models of `op`'s programs over it, each None where
  not measured: hierarchical raw, hierarchical with the slow level coded, flat compressed). The
  table is read with `slow` first only (none: measured the other way); coded programs only for
  `PROGRAM_DTYPE`, the dtype they were timed on."""
  tab = prof.links.get(axis_key(axis_name), {}) if str(axis_name[0]) == str(slow) else {}
  same_dtype = dt == PROGRAM_DTYPE
  return (tab, tab.get(hierarchical_key(op, fixed_order=fixed_order)),
          tab.get(hierarchical_key(op, True, fixed_order)) if same_dtype else None,
          tab.get(flat_coded_key(op)) if same_dtype else None)


def _timed(op, dt, axis_name, slow, fast, prof, fixed_order=False) -> set:
  """The compressed candidates whose estimate is calibrate's timing of that very program, beside
  its raw program (`calibration._paired`), not a model: the slow level coded over the tuple, flat
  compressed over it; psum's two-level variants where both its programs are (psum_scatter's and
  all_gather's). `choose` ranks them with ``Profile.timed_gain``, the others with ``min_gain``."""
  if op == "psum":
    both = [_timed(o, dt, axis_name, slow, fast, prof, fixed_order) for o in ("psum_scatter", "all_gather")]
    return (both[0] & both[1]) - {"flat compressed"}
  _, _, coded, flat_coded = _programs_timed(op, dt, axis_name, slow, prof, fixed_order)
  return ({f"hierarchical {slow}:compressed {fast}:raw"} if coded is not None else set()) | \
      ({"flat compressed"} if flat_coded is not None else set())


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
  if op == "psum":
    return _psum_candidates(dt, m, axis_name, slow, fast, sizes, role, allowed, prof, plat,
                            fixed_order)
  model, flat, flat_sent = _models(op, dt, m, axis_name, slow, fast, sizes, role, prof, plat,
                                   fixed_order)
  tab, measured, coded, flat_coded = _programs_timed(op, dt, axis_name, slow, prof, fixed_order)
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
  if dt != PROGRAM_DTYPE and (hierarchical_key(op, True, fixed_order) in tab or flat_coded_key(op) in tab):
    note += f", coded programs modelled ({dt.name}: measured on {PROGRAM_DTYPE.name})"
  return est, note


def _psum_candidates(dt, m, axis_name, slow, fast, sizes, role, allowed, prof, plat, fixed_order):
  """psum's candidates: flat (`strategy.decide`'s psum: ``jax.lax.psum``, or zipccl's own), and
  each hierarchical variant as psum_scatter's over the operand padded to ``n c`` elements plus
  all_gather's of the ``c``-element result (`zipccl_jax.hierarchical._psum` runs those two
  programs), so a measured psum_scatter or all_gather program anchors it as it anchors them."""
  H, L = sizes
  n = H * L
  c = -(-m // n)
  d = decide("psum", dt, c, axis_size=n, axis_name=axis_name, role=role, compress=True,
             profile=prof, platform=plat, log=False, fixed_order=fixed_order)
  flat = {False: d.est_raw_s, True: d.est_compressed_s}
  hier = {a for a in allowed if a[0] == "hier"}
  kw = dict(profile=prof, platform=plat, fixed_order=fixed_order)
  rs, note = _candidates("psum_scatter", dt, n * c, axis_name, slow, fast, sizes, role, hier, **kw)
  ag, _ = _candidates("all_gather", dt, c, axis_name, slow, fast, sizes, role, hier, **kw)
  est = {f"flat {'compressed' if cf else 'raw'}": (flat[cf], "flat", {"flat": cf})
         for cf in (False, True) if ("flat", cf) in allowed}
  est.update({k: (t + ag[k][0], alg, cs) for k, (t, alg, cs) in rs.items()})
  return est, "psum_scatter then all_gather: " + note


def _models(op, dt, m, axis_name, slow, fast, sizes, role, prof, plat, fixed_order=False):
  """({(slow coded, fast coded): modelled seconds}, {compress: flat estimate}, bytes one device
  sends in the flat raw collective): each hierarchical variant as the sum of its phases'
  `strategy.decide` models, all_to_all's slow phase as its (H - 1) L rounds, except all_to_all host
  coded / local raw, which runs the mixed-slot exchange (`_mixed_model`)."""
  H, L = sizes
  # The fast level's codec runs with nothing to hide behind (no slow link whose wait its peers'
  # codecs fill), so it costs the codec as measured alone; calibrate's in-situ scale, measured over
  # the slow link, applies to the flat and slow-level phases. (2 x 4 CPU testbed: the variants that
  # code both levels, anchored, were 6-21% under their medians with the in-situ codec on the fast
  # level, and are within 11% without it; benchmarks/README.md.)
  isolated = prof.isolated_codec()

  def both(o, chunk, axis, n, p=prof):
    d = decide(o, dt, chunk, axis_size=n, axis_name=axis, role=role, compress=True,
                        profile=p, platform=plat, log=False, fixed_order=fixed_order)
    return {False: d.est_raw_s, True: d.est_compressed_s}, d.raw_bytes

  flat, flat_sent = both(op, _FLAT_CHUNK[op](m, H * L), axis_name, H * L)
  phases = [(lvl, both(o, f(m, H, L), slow, H)[0] if lvl == "slow" else
             both(o, f(m, H, L), fast, L, isolated)[0]) for lvl, o, f in _PHASES[op]]
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


def codec_hidden(prof, plat) -> bool:
  """Whether calibrate measured `plat`'s codec hidden behind the slow link: its in-situ factor under 1
  (`Profile.codec_in_situ`; none: not hidden)."""
  return prof.codec_in_situ.get(plat, 1.0) < 1.0


def uncoded_rows_codec_s(cm, row_bytes: int, L: int) -> float:
  """Seconds of the encode and decode of the L - 1 rows of its own host that the mixed exchange leaves
  uncoded (rows of `row_bytes`, codec model `cm`): what `_mixed_model` saves where the codec binds."""
  return (L - 1) * (row_bytes / cm.encode_Bps + row_bytes / cm.decode_Bps)


def _mixed_model(dt, chunk, axis_name, slow, fast, sizes, role, prof, plat):
  """Seconds of all_to_all host coded / local raw (`_all_to_all_mixed`): the flat coded exchange
  over the tuple (its link, its wire of n slots of C bytes, its fallback risk) with n - L rows
  coded instead of n - 1, plus a raw all_to_all over `fast` of the own host's row tails (the
  bytes that do not fit in the slot: about (1 - ratio) of each row), plus the passes that move the
  own host's L rows into their slots and back (`CodecModel.slot_time`, as calibrate measured them
  beside the codec; 0 where it did not. On the 2 x 4 CPU testbed they cost several ms a call:
  benchmarks/program_passes.py).

  The L - 1 rows it does not code save their codec time only where the codec is not hidden behind
  the slow link: where calibrate measured it in situ under its cost alone (`Profile.codec_in_situ`
  below 1), the devices' codecs run while their peers' bytes cross, and coding fewer rows saves
  nothing a call waits for. On the 2 x 4 CPU testbed (in-situ factors 0.25-0.88) this exchange ran
  4.0-11.8 ms slower than the flat coded one in each of the sixteen newest runs (mean 7.7), where the
  saving put it up to 2.4 ms faster (mean 1.0); without the saving, links only's error on it over
  the 66 runs went from -9.4% to -0.5% on average (`benchmarks/model_record.py`'s
  `mixed_over_flat`; benchmarks/README.md, "The mixed exchange saves no hidden codec")."""
  H, L = sizes
  n = H * L
  d = decide("all_to_all", dt, chunk, axis_size=n, axis_name=axis_name, role=role,
                      compress=True, profile=prof, platform=plat, log=False, pieces=1)
  cm = prof.codec_model(dt, plat)[0]
  B = chunk * np.dtype(dt).itemsize
  saved = 0.0 if codec_hidden(prof, plat) else uncoded_rows_codec_s(cm, B, L)
  t = d.est_compressed_s - saved + cm.slot_time(L * B)
  tail = chunk - _mixed.mixed_head_elems(d.capacity, chunk, dt)   # elements
  if tail:
    t += decide("all_to_all", dt, tail, axis_size=L, axis_name=fast, role=role,
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


# --------------------------------------------------------------------------- #
# The plan of one call
# --------------------------------------------------------------------------- #


def plan(op: str, x, axis_name, params, compress, capacity, site: str,
         role: str, fixed_order: bool = False) -> LevelPlan | None:
  """The algorithm of one call over a two-level `axis_name` (a LevelPlan, hierarchical or flat), or
  None where levels do not apply. A flat plan's estimates go to the flat path
  (`LevelPlan.flat_estimates`), which decides raw or compressed with them: one decision per call.

  `params`: the op's canonical static arguments (as the collectives' recipes hold them).
  """
  if op not in OPS:
    return None
  # one axis split into levels: not under jax.vmap, whose batching of the phases' grouped exchanges
  # jax does not implement (a batched call over the axis is flat)
  split = _split(axis_name) if op in SPLIT_OPS and not batched(x) else None
  if split is not None and op == "psum" and check_vma_on():
    return None  # its last phase is a grouped all_gather: varying, where jax types psum invariant
  if split is None and not _two_axes(axis_name):
    return None  # every call asks: one axis, the common case, returns before any other work
  forced_alg = (getattr(_FORCED, "value", None) or ("auto", None))[0]
  dt = np.dtype(x.dtype)
  if (forced_alg == "flat" or dt not in CODED_DTYPES
      or (op == "all_gather" and params[2] != "varying")
      or isinstance(capacity, (int, np.integer, tuple, list)) and not isinstance(capacity, bool)):
    return None
  named = axis_name if split is None else split[1]  # the axes, or the levels, whose links cost it
  n = axis_size(axis_name, op) if split is not None else 0
  if split is not None and n % split[0]:
    raise ValueError(f"zipccl_jax.{op}: use_levels declares {split[0]} devices per host on axis "
                     f"{axis_name!r}, whose {n} devices are not whole hosts")
  levels = levels_of(named)
  if levels is None:
    if forced_alg != "hierarchical":
      return None
    levels = (named[0], named[1])
  slow, fast = levels
  if split is None:
    H, L = axis_size(slow, op), axis_size(fast, op)
  else:
    H, L = n // split[0], split[0]
  if H < 2 or L < 2:
    return None
  lp = choose(op, dt, int(x.size), tuple(named), (slow, fast), (H, L), compress, role, site=site,
              fixed_order=fixed_order)
  if split is not None:
    lp = dataclasses.replace(lp, axis=axis_name)
  _log(lp, dt, int(x.size), role, compress)
  return lp


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
  g, gt = prof.min_gain, prof.timed_gain
  timed = _timed(op, dt, axis_name, slow, fast, prof, fixed_order) & set(cands)
  gain = {k: (gt if k in timed else g) if any(cs.values()) else 0.0 for k, (_, _, cs) in cands.items()}
  order = sorted(cands, key=lambda k: (cands[k][0] * (1 + gain[k]), k))
  best = order[0]
  t, alg, cs = cands[best]
  margins = f"compressed x (1+{g:g})" + (f", timed x (1+{gt:g})" if timed else "")
  why = ("use_algorithm" if forced_alg != "auto" else f"model ({margins}; {note})") \
      + ": " + ", ".join(f"{k} {cands[k][0] * 1e3:.3f} ms" for k in order)
  return LevelPlan(op, site, str(slow), str(fast), (H, L), alg, cs, float(t),
                   tuple((k, float(cands[k][0])) for k in order), why, role, fixed_order,
                   flat_gain=gain.get("flat compressed", g))


def _log(lp: LevelPlan, dt, m: int, role: str, mode) -> None:
  """Records the level choice under "<site> [levels]" (explain() shows it next to the phases)."""
  raw_flat = dict(lp.candidates).get("flat raw", math.nan)
  prof = get_profile()
  slow_link = prof.link(lp.slow, "*")[0]
  log_decision(Decision(
      op=lp.op, site=f"{lp.site} [levels]", dtype=dt.name, chunk_elems=m,
      axis_size=int(lp.sizes[0] * lp.sizes[1]), axis=axis_key((lp.slow, lp.fast)), role=role,
      compress=any(lp.compress.values()), capacity=0, transport="-",
      algorithm=lp.algorithm if lp.algorithm == "flat" else
      "hierarchical(" + ",".join(f"{a}:{'c' if c else 'r'}" for a, c in lp.compress.items()) + ")",
      est_raw_s=float(raw_flat), est_compressed_s=lp.est_s, raw_bytes=0, wire_bytes=0,
      bandwidth_Bps=float(slow_link.bandwidth_Bps), latency_s=float(slow_link.latency_s),
      capacity_source="-",
      reason=f"{lp.algorithm}: {lp.reason}", profile=prof.fingerprint(), mode=str(mode)))
