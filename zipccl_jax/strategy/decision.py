"""The decision: raw or compressed for one call, with which capacity, transport and pieces, and the
log of every decision (:func:`decisions`, what :func:`zipccl_jax.explain` reads).

:func:`decide` compares the raw program's cost with the coded one's (:mod:`.programs`) under the
active profile (:mod:`.profile`); ``min_gain`` applies once, so the decision is monotone in the
capacity and the rates. :func:`decide_psum` picks psum's algorithm, :func:`crossover_bandwidth`
solves for the link where the decision flips.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading

import numpy as np

from zipccl_jax import accounting
from zipccl_jax import format as fmt
from zipccl_jax.capacity import (BLOCK_SLACK_BYTES, CODED_DTYPES, padded_capacity,
                                 resolve_capacity)
from zipccl_jax.strategy.codec_cost import codec_time
from zipccl_jax.strategy.profile import (Profile, axis_key, current_platform, get_profile,
                                         platform_key)
from zipccl_jax.strategy.programs import (LAX_REDUCTIONS, PIPELINED_OPS, coded_time,
                                          lax_reduction_time, phases_time, pipeline_stages,
                                          structure, with_pieces)

__all__ = ["Decision", "decide", "decide_psum", "decisions", "reset_decisions", "log_decision",
           "forget_decision", "crossover_bandwidth", "observed_capacity", "PSUM_ALGORITHMS"]


_LOG = logging.getLogger("zipccl_jax.strategy")


# --------------------------------------------------------------------------- #
# The decision log
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class Decision:
  """One call site's plan and the estimates behind it (times per call, per device)."""
  op: str
  site: str | None
  dtype: str
  chunk_elems: int
  axis_size: int
  axis: str | None
  role: str
  compress: bool
  capacity: int              # bytes per chunk (0 when raw)
  transport: str             # "auto" (padded on CPU, ragged elsewhere), "padded" or "ragged"
  algorithm: str             # "direct" (data movement) or "a2a-sum[+gather]" (reductions)
  est_raw_s: float
  est_compressed_s: float
  raw_bytes: int             # bytes one device sends raw
  wire_bytes: int            # bytes one device sends compressed (transport as estimated)
  bandwidth_Bps: float
  latency_s: float
  capacity_source: str
  reason: str
  profile: str = ""          # fingerprint of the profile used
  mode: str = "auto"         # the caller's compress option
  pieces: int = 1            # independent encode -> collective -> decode chains (pipelining)
  candidates: tuple = ()     # ((algorithm or "K=k", estimate s), ...) the choice compared

  @property
  def ratio(self) -> float:
    return self.wire_bytes / self.raw_bytes if self.raw_bytes else 1.0

  def summary(self) -> str:
    what = "compressed" if self.compress else "raw"
    if self.pieces > 1:
      what += f" in {self.pieces} pieces"
    est = (f"est {self.est_compressed_s * 1e3:.3f} ms vs raw {self.est_raw_s * 1e3:.3f} ms"
           if math.isfinite(self.est_compressed_s) else f"raw est {self.est_raw_s * 1e3:.3f} ms")
    return (f"zipccl {self.op} site={self.site}: {what} ({est}; ratio {self.ratio:.2f}, "
            f"bw {self.bandwidth_Bps / 1e9:.3g} GB/s) [{self.reason}]")


_DECISIONS: dict[str, Decision] = {}
_DECISIONS_LOCK = threading.Lock()


def decisions() -> dict[str, Decision]:
  """The latest decision per call site (traced since the last :func:`reset_decisions`)."""
  with _DECISIONS_LOCK:
    return dict(_DECISIONS)


def reset_decisions() -> None:
  with _DECISIONS_LOCK:
    _DECISIONS.clear()


def log_decision(d: Decision) -> None:
  """Records a decision made outside :func:`decide` (a two-level call's algorithm, hierarchical.py)."""
  _record(d)


def forget_decision(site: str) -> None:
  """Drops one call site's decision (calibrate's internal measurement)."""
  with _DECISIONS_LOCK:
    _DECISIONS.pop(site, None)


def _record(d: Decision) -> None:
  if d.site is not None:
    with _DECISIONS_LOCK:
      _DECISIONS[d.site] = d
    accounting.note_decision(d)  # kept with the site's record in the program (accounting.record)
  if _LOG.isEnabledFor(logging.DEBUG):
    _LOG.debug("%s", d.summary())


# --------------------------------------------------------------------------- #
# Capacity and transport
# --------------------------------------------------------------------------- #


def _round8(v: float) -> int:
  return int(-(-int(math.ceil(v)) // 8) * 8)


def observed_capacity(profile: Profile, site: str | None, op: str, dt, m: int):
  if site is None:
    return None
  obs = [profile.sites.get(s) for s in ((site, site + "/gather") if op == "psum" else (site,))]
  obs = [o for o in obs if o is not None]
  if not obs:
    return None
  best = 0
  for o in obs:
    if o.dtype == dt.name and int(o.chunk_elems) == m:
      c = _round8(o.max_frame_bytes * (1 + profile.margin))
    else:  # observed with another shape: reuse its worst ratio
      c = padded_capacity(m, dt, ratio=o.max_ratio * (1 + profile.margin))
    best = max(best, c)
  return int(min(max(best, fmt.FRAME_HEADER_BYTES), fmt.max_encoded_bytes(m, dt)))


def _model_capacity(prof: Profile, capacity, compress, site, op: str, dt, m: int, role: str):
  """(capacity in bytes, where it came from) for the cost model's compressed estimate."""
  if capacity is not None:
    return resolve_capacity(capacity, m, dt, role), "explicit"
  if compress == "auto":
    cap = observed_capacity(prof, site, op, dt, m)
    if cap is not None:
      return cap, "observed"
    ratio = prof.ratio("capacity_ratio", role, dt)
    return padded_capacity(m, dt, ratio=ratio), f"profile ratio {ratio:.3g} ({role})"
  return padded_capacity(m, dt, kind=role), f"default ratio ({role})"


def _best_transport(transport: str, plat: str, coded_time):
  """(transport, (time, wire bytes)): the caller's, or off CPU with "auto" the cheaper one."""
  if transport == "auto" and plat != "cpu":
    cands = {tr: coded_time(tr) for tr in ("padded", "ragged")}
    best = min(cands, key=lambda k: (cands[k][0], k))
    return best, cands[best]
  if transport == "auto":
    return "auto", coded_time("padded")  # platform_dependent lowers padded on CPU
  return transport, coded_time(transport)


# --------------------------------------------------------------------------- #
# One call
# --------------------------------------------------------------------------- #


def decide(op: str, dtype, chunk_elems: int, *, axis_size: int, axis_name=None,
           site: str | None = None, role: str = "activation", capacity=None,
           transport: str = "auto", compress="auto", profile: Profile | None = None,
           platform: str | None = None, log: bool = True,
           raw_reason: str | None = None, algorithm: str | None = None,
           pieces: int | None = None, message_elems: int | None = None,
           fixed_order: bool = False, flat_est: tuple[float, float, float] | None = None) -> Decision:
  """The cost-model decision for one call (pure: same inputs, same answer).

  Args:
    op: "all_to_all", "all_gather", "psum_scatter", "psum" or "ppermute".
    dtype: element dtype (bfloat16, float16 or float32; others are raw).
    chunk_elems: elements per coded chunk (one frame).
    axis_size: ranks in the collective's axis.
    axis_name: the mesh axis (selects the profile's link).
    site: call-site name (selects observed capacities; keys the log).
    role: "activation" or "gradient" (capacity and expected ratios).
    capacity: an explicit capacity (as the collectives' ``capacity=``), or
      None for the observed / profile capacity.
    transport: the caller's transport ("auto", "padded" or "ragged").
    compress: the caller's mode; True/False are reported, not changed.
    profile: default :func:`get_profile`.
    platform: default ``jax.default_backend()``.
    log: record in :func:`decisions` and log at DEBUG level.
    raw_reason: the call goes raw for this reason whatever the model says
      (``all_gather(to="reduced")``, an empty ``ppermute`` perm).
    algorithm: psum only: ``"a2a-sum+gather"`` or ``"gather-sum"`` pinned (then
      ``chunk_elems`` is the algorithm's frame: ``ceil(size / n)``, resp. ``size``); None:
      the cheaper of the two (:func:`decide_psum`, with ``chunk_elems = ceil(size / n)``).
    pieces: K pinned (:func:`choose_pieces`); None: the model's K.
    message_elems: psum only: the operand's elements (default ``n * chunk_elems``).
    fixed_order: reductions: raw is zipccl's fixed-order program, not jax.lax's ring.
    flat_est: ``(raw, compressed, margin)`` of this flat call as a two-level plan costed and
      ranked them (`levels.choose`: seconds, measured programs where calibrate timed them over the
      tuple; the margin compressed was ranked with, ``timed_gain`` for a timed program); they
      replace the model's and ``min_gain``, so a call the plan kept flat is decided as the plan
      ranked it, once.
  """
  prof = profile if profile is not None else get_profile()
  plat = platform_key(platform) if platform is not None else current_platform()
  if op == "psum" and algorithm is None:
    return decide_psum(dtype, chunk_elems, axis_size=axis_size, axis_name=axis_name, site=site,
                       role=role, capacity=capacity, transport=transport, compress=compress,
                       profile=prof, platform=plat, log=log, raw_reason=raw_reason,
                       pieces=pieces, message_elems=message_elems, fixed_order=fixed_order)
  dt, n, m = np.dtype(dtype), int(axis_size), int(chunk_elems)
  phases = structure(op, n, algorithm)
  raw_chunk = m * dt.itemsize
  axis = axis_key(axis_name) if axis_name is not None else None
  algorithm = algorithm or {"psum_scatter": "a2a-sum", "psum": "a2a-sum+gather"}.get(op, "direct")

  links = [prof.link(axis_name, coll, plat)[0] for coll, *_ in phases]
  if op in LAX_REDUCTIONS and not fixed_order:  # raw is the jax.lax call: XLA's ring
    size = message_elems or (m if algorithm == "gather-sum" else n * m)
    t_raw, raw_bytes = lax_reduction_time(prof, op, axis_name, n, size * dt.itemsize, plat)
  else:
    raw_bytes, t_raw = phases_time(links, phases, raw_chunk, n)
  t_raw = float(flat_est[0]) if flat_est is not None else t_raw  # the plan's costing: one decision
  bw, lat = links[0].bandwidth_Bps, links[0].latency_s

  piece = [1, ""]  # K and why (compressed estimates only)

  def out(compress_, cap, transport_, t_c, wire, src, reason):
    d = Decision(op=op, site=site, dtype=dt.name, chunk_elems=m, axis_size=n, axis=axis,
                 role=role, compress=bool(compress_), capacity=int(cap if compress_ else 0),
                 transport=transport_, algorithm=algorithm, est_raw_s=float(t_raw),
                 est_compressed_s=float(t_c), raw_bytes=int(raw_bytes), wire_bytes=int(wire),
                 bandwidth_Bps=float(bw), latency_s=float(lat), capacity_source=src,
                 reason=reason + (piece[1] if compress_ else ""), profile=prof.fingerprint(),
                 mode=str(compress), pieces=piece[0] if compress_ else 1)
    if log:
      _record(d)
    return d

  if raw_reason is not None:
    return out(False, 0, transport, math.inf, raw_bytes, "-", raw_reason)
  if dt not in CODED_DTYPES:
    return out(False, 0, transport, math.inf, raw_bytes, "-", f"dtype {dt.name} not coded")
  if m == 0:
    return out(False, 0, transport, math.inf, raw_bytes, "-", "empty")

  cap, src = _model_capacity(prof, capacity, compress, site, op, dt, m, role)

  # compressed estimate, per transport
  codecs = prof.phase_codecs(dt, plat, phases, n)
  t_codec = codec_time(codecs, phases, raw_chunk)
  exp_frame = min(cap, fmt.FRAME_HEADER_BYTES
                  + math.ceil(prof.ratio("expected_ratio", role, dt) * raw_chunk)
                  + BLOCK_SLACK_BYTES * -(-m // fmt.BLOCK_ELEMS))

  timed = functools.partial(
      coded_time, op=op, links=links, phases=phases, n=n, cap=cap, exp_frame=exp_frame,
      t_fixed=t_codec + prof.fallback_risk * t_raw,
      flag_latency=prof.link(axis_name, "psum", plat)[0].latency_s if op == "ppermute" else 0.0)
  if op in PIPELINED_OPS:  # each transport's time with its best K
    def stages(tr):  # a ragged phase sends the expected frames, a padded one its capacity
      return pipeline_stages(links, phases, codecs, cap, raw_chunk, n, transport=tr, op=op,
                             exp_frame=exp_frame)
    timed = with_pieces(timed, stages, m, plat, pieces, piece, op)
  tr_best, (t_c, wire) = _best_transport(transport, plat, timed)
  t_c = float(flat_est[1]) if flat_est is not None else t_c
  if op in PIPELINED_OPS:
    piece[:] = piece[2][tr_best if tr_best in piece[2] else "padded"]

  if compress is True:
    return out(True, cap, transport, t_c, wire, src, "compress=True")
  if compress is False:
    return out(False, 0, transport, t_c, wire, src, "compress=False")
  if n == 1:
    return out(False, 0, transport, t_c, wire, src, "axis of size 1")
  if cap >= raw_chunk:
    return out(False, 0, transport, t_c, wire, src, "capacity saves nothing")
  g, how = (prof.min_gain, "model") if flat_est is None else (flat_est[2], "two-level plan's flat estimates")
  wins = t_c * (1 + g) < t_raw
  return out(wins, cap, tr_best if wins else transport, t_c, wire, src,
             f"{how}: {t_c * 1e3:.3f} ms x (1+{g:g}) {'<' if wins else '>='} raw {t_raw * 1e3:.3f} ms")


# --------------------------------------------------------------------------- #
# psum's algorithm
# --------------------------------------------------------------------------- #


# "a2a-sum+gather": reduce-scatter (coded all-to-all, ordered sum of my chunk), then an
# all-gather of the sums: 2 collectives, ~2 (n-1)/n of the message on the wire.
# "gather-sum": one all-gather of the whole message, then every rank sums all n rows in the
# same order: 1 collective, (n-1) messages on the wire. Latency-bound messages favour it.
PSUM_ALGORITHMS = ("a2a-sum+gather", "gather-sum")


def decide_psum(dtype, chunk_elems: int, *, axis_size: int, message_elems=None, capacity=None,
                compress="auto", profile: Profile | None = None, log: bool = True,
                **kw) -> Decision:
  """psum's decision: each algorithm's own :func:`decide`, the cheaper one kept.

  Candidates are compared on what each would run: ``t_comp * (1 + min_gain)`` when its own
  decision compresses under ``compress="auto"``, ``t_comp`` under ``compress=True``, else
  ``t_raw``; ties keep ``"a2a-sum+gather"``. The local sums' arithmetic is not modelled (the
  links and the codec are). An explicit ``int`` capacity is bytes per frame of the
  reduce-scatter chunk (``ceil(size / n)`` elements), so it keeps ``"a2a-sum+gather"``
  (:func:`zipccl_jax.use_algorithm` can still pin ``"gather-sum"``).
  """
  prof = profile if profile is not None else get_profile()
  n = int(axis_size)
  size = int(message_elems) if message_elems is not None else n * int(chunk_elems)
  algs = PSUM_ALGORITHMS
  if isinstance(capacity, (int, np.integer)) and not isinstance(capacity, bool):
    algs = algs[:1]
  g = prof.min_gain
  cands = {}
  for a in algs:
    d = decide("psum", dtype, chunk_elems if a == "a2a-sum+gather" else size, axis_size=n,
               capacity=capacity, compress=compress, profile=prof, log=False, algorithm=a,
               message_elems=size, **kw)
    t = ((d.est_compressed_s * (1 + g) if compress == "auto" else d.est_compressed_s)
         if d.compress else d.est_raw_s)
    cands[a] = (t, d)
  best = min(algs, key=lambda a: (cands[a][0], algs.index(a)))
  d = cands[best][1]
  why = "; ".join(f"{a} {cands[a][0] * 1e3:.3f} ms" for a in algs)
  d = dataclasses.replace(d, reason=f"{d.reason}; psum {best} (model: {why})",
                          candidates=tuple((a, float(cands[a][0])) for a in algs))
  if log:
    _record(d)
  return d


def crossover_bandwidth(op: str, dtype, chunk_elems: int, *, axis_size: int,
                        role: str = "activation", profile: Profile | None = None,
                        platform: str = "cpu", capacity=None) -> float:
  """The link bandwidth (bytes/s) below which ``decide`` compresses (padded transport).

  Assumes one latency ``L`` for every collective of the call (the profile's
  ``"*"`` link latency). Returns ``inf`` if compression always pays, 0 if never.
  """
  prof = profile if profile is not None else get_profile()
  d = decide(op, dtype, chunk_elems, axis_size=axis_size, role=role, compress=True,
             capacity=capacity, profile=prof, platform=platform, log=False, pieces=1,
             algorithm="a2a-sum+gather" if op == "psum" else None)
  lk, _ = prof.link(None, "*", platform)
  phases = structure(op, axis_size)
  b_raw, b_wire = d.raw_bytes, d.wire_bytes
  # t_comp - wire/bw = fixed part (latencies + codec + extras)
  fixed_c = d.est_compressed_s - prof.fallback_risk * d.est_raw_s - b_wire / lk.bandwidth_Bps
  fixed_r = len(phases) * lk.latency_s
  g = prof.min_gain
  r = prof.fallback_risk
  # compress iff (fixed_c + b_wire/bw + r (fixed_r + b_raw/bw)) (1+g) < fixed_r + b_raw/bw
  num = b_raw - (1 + g) * (b_wire + r * b_raw)
  den = (1 + g) * (fixed_c + r * fixed_r) - fixed_r
  if num <= 0:
    return 0.0
  if den <= 0:
    return math.inf
  return num / den
