"""Adaptive strategy: a calibrated cost model for ``compress="auto"``.

Every zipccl_jax collective called with ``compress="auto"`` (the default)
asks :func:`decide` at trace time whether to send raw or compressed, with
which per-chunk capacity and transport. The answer is a pure function of the
static call (operation, dtype, chunk size, axis size, axis name, call-site
name) and of the active :class:`Profile`, so every rank that traces the same
program with the same profile decides the same way: no collective is needed
to agree, and the compiled programs match.

Cost model
----------
For one call, per device (``_sent`` is the per-collective byte model of
:func:`zipccl_jax.hlo_wire_bytes`: all-to-all ``S (n-1)/n``, all-gather
``S (n-1)``, collective-permute ``S``)::

  t_raw  = sum over phases p:  link(p).latency + sent_raw(p) / link(p).bandwidth
  t_comp = sum over phases p:  link(p).latency + sent_wire(p) / link(p).bandwidth
           + encode_bytes / codec.encode_Bps + decode_bytes / codec.decode_Bps
           + coded_phases * (codec.encode_overhead_s + codec.decode_overhead_s)
           + extra latencies (ppermute's 4-byte overflow psum, ragged size exchanges, the
             ragged all-to-all's raw-row exchange)
           + fallback_risk * t_raw

=============  ======================  ===========================  ===========================
op             phases (raw = coded)    encode bytes                 decode bytes
=============  ======================  ===========================  ===========================
all_to_all     all_to_all n*chunk      (n-1)*chunk                  (n-1)*chunk
psum_scatter   all_to_all n*chunk      (n-1)*chunk                  (n-1)*chunk
all_gather     all_gather chunk        chunk                        (n-1)*chunk
psum           all_to_all n*chunk,     n*chunk                      (2n-1)*chunk
               all_gather chunk
psum           all_gather message      message                      n*message
 (gather-sum)
ppermute       ppermute chunk          chunk                        chunk
=============  ======================  ===========================  ===========================

The chunk a rank keeps is never coded (``_exchange.own_row``); psum's gather, whose result must
not depend on the rank, decodes every row. (ragged_all_to_all: n frames each way.)

psum has two algorithms (:func:`decide_psum`): ``"a2a-sum+gather"`` (reduce-scatter, then
all-gather; ``chunk = ceil(size / n)``) and ``"gather-sum"`` (one all-gather of the whole message,
then every rank sums the ``n`` rows: one latency instead of two, ``n - 1`` messages on the wire
instead of about 2). Each is costed as above, raw and compressed, and the cheaper one runs; both
compute the same float32 order, so the choice never changes a bit.

Pieces (pipelining): :mod:`zipccl_jax._pipeline` (the K-chain schedule, the fastest ``K``, on
GPU/TPU with the padded transport; ``K = 1`` on CPU and on the ragged transport).
``use_algorithm(pieces=K)`` pins it.

The padded transport's wire chunk is the capacity ``C``; the ragged one's is
the expected frame size ``32 + expected_ratio * raw + 64 * blocks`` (capped at
``C``), plus one size-exchange latency per phase.

Raw is what ``compress=False`` runs: the ``jax.lax`` call as written. For the reductions
that is XLA's ring (`lax_reduction_time`: a ring reduce-scatter of ``S (n-1)/n`` on the axis's
all_gather link, psum twice that), not the table's all-to-all, which is the coded program's
phase; with ``fixed_order=True`` raw is zipccl's fixed-order all-to-all and sum (the table).

The call is compressed when ``t_comp * (1 + min_gain) < t_raw`` (and the
capacity saves bytes, the axis has more than one rank, and the dtype is coded):
``min_gain`` applies once, here, so the decision is monotone in the capacity and the rates.
Solving for the bandwidth gives the crossover of a phase-uniform link::

  bw* = (B_raw - (1 + g) B_wire) / ((1 + g) (L_comp + K) - L_raw)

with ``B`` the sent bytes, ``L`` the latencies, ``K`` the codec time and
``g = min_gain``: links slower than ``bw*`` compress, faster ones stay raw.

Capacity (padded transport, ``compress="auto"``, no explicit ``capacity=``):

1. a per-call-site capacity from observed frame sizes (:func:`observe`):
   ``round_up_8(max_frame_bytes * (1 + margin))``;
2. otherwise :func:`zipccl_jax.padded_capacity` with the profile's
   ``capacity_ratio[role][dtype]`` (role ``activation`` for forward data
   movement, ``gradient`` for reductions and every backward collective).

Transport: on CPU the padded one (XLA:CPU has no ragged all-to-all; the
collectives keep ``lax.platform_dependent`` so a CPU-traced program still
lowers ragged for GPU). On GPU/TPU, with ``transport="auto"``, the cheaper of
padded and ragged under the model.

Profiles and defaults
---------------------
:mod:`zipccl_jax.profile` holds the models and the documented defaults (its docstring has
the table); :func:`calibrate` (:mod:`zipccl_jax.calibration`) measures a profile;
:func:`set_profile`, :func:`use_profile`, :func:`load_profile` and the ``ZIPCCL_PROFILE``
environment variable (a JSON path read at first use) make one active.

Decisions are static per trace: after changing the profile, trace again (a new
``jax.jit``, or ``jax.clear_caches()``) for it to take effect.

Introspection
-------------
Each decision is logged at DEBUG level on the ``zipccl_jax.strategy`` logger::

  zipccl all_to_all site=a2a@model.py:12: compressed (est 1.230 ms vs raw 1.610 ms; ratio 0.70, bw 0.125 GB/s)

and kept in a log: :func:`decisions` (site -> :class:`Decision`) and
:func:`zipccl_jax.explain` (a table, or one site's reasoning; :mod:`zipccl_jax.introspect`).
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
from zipccl_jax._pipeline import PIPELINED_OPS, choose_pieces, pipeline_stages
from zipccl_jax.accounting import sent_bytes
from zipccl_jax.capacity import (BLOCK_SLACK_BYTES, CODED_DTYPES, padded_capacity,
                                 resolve_capacity)
from zipccl_jax.profile import (Profile, axis_key, current_platform, get_profile, np_dtype,
                                platform_key)

__all__ = ["Decision", "Plan", "plan", "decide", "decisions", "reset_decisions", "log_decision",
           "crossover_bandwidth", "observed_capacity"]

_LOG = logging.getLogger("zipccl_jax.strategy")
# --------------------------------------------------------------------------- #
# Decisions
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


# op -> phases [(link collective, chunks sent, chunks encoded, chunks decoded)]: the own row is
# never coded (_exchange.own_row); psum's invariant gather decodes every row
def _structure(op: str, n: int, algorithm: str | None = None):
  if op == "psum" and algorithm == "gather-sum":  # the chunk is the whole message
    return [("all_gather", 1, 1, n)]
  if op == "ragged_all_to_all":  # frames of `bound` rows
    return [("all_to_all", n, n, n)]
  if op in ("all_to_all", "psum_scatter"):
    return [("all_to_all", n, n - 1, n - 1)]
  if op == "all_gather":
    return [("all_gather", 1, 1, n - 1)]
  if op == "psum":
    return [("all_to_all", n, n - 1, n - 1), ("all_gather", 1, 1, n)]
  if op == "ppermute":
    return [("ppermute", 1, 1, 1)]
  raise ValueError(f"zipccl_jax: unknown collective {op!r}")


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


def decide(op: str, dtype, chunk_elems: int, *, axis_size: int, axis_name=None,
           site: str | None = None, role: str = "activation", capacity=None,
           transport: str = "auto", compress="auto", profile: Profile | None = None,
           platform: str | None = None, log: bool = True,
           raw_reason: str | None = None, algorithm: str | None = None,
           pieces: int | None = None, message_elems: int | None = None,
           fixed_order: bool = False) -> Decision:
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
  """
  prof = profile if profile is not None else get_profile()
  plat = platform_key(platform) if platform is not None else current_platform()
  if op == "psum" and algorithm is None:
    return decide_psum(dtype, chunk_elems, axis_size=axis_size, axis_name=axis_name, site=site,
                       role=role, capacity=capacity, transport=transport, compress=compress,
                       profile=prof, platform=plat, log=log, raw_reason=raw_reason,
                       pieces=pieces, message_elems=message_elems, fixed_order=fixed_order)
  dt, n, m = np.dtype(dtype), int(axis_size), int(chunk_elems)
  phases = _structure(op, n, algorithm)
  raw_chunk = m * dt.itemsize
  axis = axis_key(axis_name) if axis_name is not None else None
  algorithm = algorithm or {"psum_scatter": "a2a-sum", "psum": "a2a-sum+gather"}.get(op, "direct")

  links = [prof.link(axis_name, coll, plat)[0] for coll, *_ in phases]
  if op in LAX_REDUCTIONS and not fixed_order:  # raw is the jax.lax call: XLA's ring
    size = message_elems or (m if algorithm == "gather-sum" else n * m)
    t_raw, raw_bytes = lax_reduction_time(prof, op, axis_name, n, size * dt.itemsize, plat)
  else:
    raw_bytes, t_raw = _phases_time(links, phases, raw_chunk, n)
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
  codec, _ = prof.codec_model(dt, plat)
  n_coded = len(phases)
  enc_chunks, dec_chunks = sum(p[2] for p in phases), sum(p[3] for p in phases)
  t_codec = (enc_chunks * raw_chunk / codec.encode_Bps + dec_chunks * raw_chunk / codec.decode_Bps
             + n_coded * (codec.encode_overhead_s + codec.decode_overhead_s))
  exp_frame = min(cap, fmt.FRAME_HEADER_BYTES
                  + math.ceil(prof.ratio("expected_ratio", role, dt) * raw_chunk)
                  + BLOCK_SLACK_BYTES * -(-m // fmt.BLOCK_ELEMS))

  coded_time = functools.partial(
      _coded_time, op=op, links=links, phases=phases, n=n, cap=cap, exp_frame=exp_frame,
      t_fixed=t_codec + prof.fallback_risk * t_raw,
      flag_latency=prof.link(axis_name, "psum", plat)[0].latency_s if op == "ppermute" else 0.0)
  if op in PIPELINED_OPS:  # each transport's time with its best K
    coded_time = _with_pieces(coded_time, pipeline_stages(links, phases, codec, cap, raw_chunk, n),
                              m, plat, pieces, piece)
  tr_best, (t_c, wire) = _best_transport(transport, plat, coded_time)
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
  g = prof.min_gain
  if t_c * (1 + g) < t_raw:
    return out(True, cap, tr_best, t_c, wire, src,
               f"model: {t_c * 1e3:.3f} ms x (1+{g:g}) < raw {t_raw * 1e3:.3f} ms")
  return out(False, 0, transport, t_c, wire, src,
             f"model: {t_c * 1e3:.3f} ms x (1+{g:g}) >= raw {t_raw * 1e3:.3f} ms")


def _phases_time(links, phases, chunk_bytes: int, n: int) -> tuple[int, float]:
  """(bytes one device sends, seconds) of `phases` moving `chunk_bytes` chunks uncoded."""
  sent = [sent_bytes(coll, k * chunk_bytes, n) for coll, k, *_ in phases]
  return sum(sent), sum(lk.time(b) for lk, b in zip(links, sent))


# The reductions whose raw program is jax.lax's own call (unless fixed_order): XLA's ring, which on
# a cluster spreads the host crossings over every device's link (one ring per link), where an
# all-to-all sends (n - L) / n of the message through each device's own.
LAX_REDUCTIONS = ("psum_scatter", "psum")


def lax_reduction_time(prof: Profile, op: str, axis_name, n: int, message_bytes: int,
                       plat: str) -> tuple[float, int]:
  """(seconds, bytes one device sends) of ``jax.lax.psum_scatter`` / ``psum`` of a
  `message_bytes` operand over `n` ranks: a ring reduce-scatter (``S (n-1)/n`` on the profile's
  all_gather link of the axis, the ring's), for psum followed by a ring all-gather."""
  lk, _ = prof.link(axis_name, "all_gather", plat)
  rs = sent_bytes("reduce-scatter", int(message_bytes), n)
  return (lk.time(rs), rs) if op == "psum_scatter" else (2 * lk.time(rs), 2 * rs)


def _coded_time(tr: str, *, op, links, phases, n, cap, exp_frame, t_fixed, flag_latency):
  """(seconds, bytes sent) of the coded call on transport `tr` (`t_fixed`: codec and fallback)."""
  t, wire = t_fixed + flag_latency, 0.0  # flag: ppermute's 4-byte overflow psum
  for i, (lk, (coll, k, *_)) in enumerate(zip(links, phases)):
    ragged = tr == "ragged" and not (op == "psum" and i == 1)  # psum phase 2 stays padded
    chunk = exp_frame if ragged else cap
    s = sent_bytes(coll, k * chunk, n)
    wire += s
    t += lk.time(s)
    if ragged:  # the int32 size exchange; an all-to-all's rows that do not fit move raw in a
      t += lk.latency_s * (2 if coll == "all_to_all" else 1)  # second exchange (_exchange)
  return t, wire


def _with_pieces(coded_time, stages, m: int, plat: str, pinned, piece: list):
  """`coded_time` plus each transport's best K (:func:`choose_pieces`); `piece[2]` collects, per
  transport, [K, reason suffix]."""
  piece.append({})

  def timed(tr: str):
    t, wire = coded_time(tr)
    k, t_k, cands = choose_pieces(stages, m, plat, pinned, transport=tr)
    why = "" if len(cands) == 1 else f"; K={k} ({'use_algorithm' if pinned else 'model'}: " + \
        ", ".join(f"K={i} {t * 1e3:.3f} ms" for i, t in cands) + ")"
    piece[2][tr] = [k, why]
    return t + t_k - cands[0][1], wire

  return timed


def _record(d: Decision) -> None:
  if d.site is not None:
    with _DECISIONS_LOCK:
      _DECISIONS[d.site] = d
    accounting.note_decision(d)  # kept with the site's record in the program (accounting.record)
  if _LOG.isEnabledFor(logging.DEBUG):
    _LOG.debug("%s", d.summary())


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
  phases = _structure(op, axis_size)
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


# --------------------------------------------------------------------------- #
# The plan of one call
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class Plan:
  """What one collective call does (the final word: the collectives obey it as it is)."""
  compress: bool
  capacity: int = 0             # bytes per chunk when compressing
  reason: str = ""
  transport: str | None = None  # None: the caller's transport
  decision: Decision | None = None  # the cost model's decision (compress="auto")
  algorithm: str = ""           # psum: "a2a-sum+gather" or "gather-sum" ("": the op's only one)
  pieces: int = 1               # coded chains per chunk (see _exchange, "Pieces")


def plan(op: str, dtype, chunk_elems: int, *, axis_size: int, compress, capacity,
         role: str = "activation", site: str | None = None, axis_name=None,
         transport: str = "auto", raw_reason: str | None = None, algorithm: str | None = None,
         pieces: int | None = None, message_elems: int | None = None,
         frame_may_exceed_raw: bool = False, fixed_order: bool = False) -> Plan:
  """The single place that decides raw vs. compressed for one call, and logs it.

  Args:
    op: collective name ("all_to_all", "all_gather", "psum_scatter", "psum", "ppermute").
    dtype: element dtype.
    chunk_elems: elements per coded chunk (one frame).
    axis_size: size of the collective's axis.
    compress: the caller's ``compress`` option (True, False or "auto").
    capacity: the caller's ``capacity`` option for this direction (None, an int of bytes, a
      float ratio or "observed").
    role: "activation" or "gradient" (the data's expected statistics; every backward
      collective and the reductions are "gradient").
    site: call-site name (per-site observed capacities, decision log).
    axis_name: the collective's axis (selects the profile's link).
    transport: the caller's transport.
    raw_reason: the call goes raw for this reason (``to="reduced"``, an empty perm); logged.
    algorithm, pieces, message_elems: as :func:`decide`'s (``algorithm``/``pieces`` pinned by
      :func:`zipccl_jax.use_algorithm`).
    frame_may_exceed_raw: ``compress=True`` codes even where a frame would not be smaller than
      the raw chunk (hierarchical's mixed slots, which have no raw plan of their own).
    fixed_order: psum_scatter/psum: raw is zipccl's fixed-order program, not jax.lax's call
      (:func:`decide`).

  ``compress=True`` and ``False`` are obeyed as given (capacity from ``capacity=`` or
  :func:`~zipccl_jax.padded_capacity`), but for one case: where that capacity (a frame's bytes)
  is not smaller than the raw chunk and ``capacity=`` is not a byte count, the call goes raw and
  the decision log says so (a small message: coding it would send more than raw). ``"auto"`` asks the cost model (:func:`decide`), which
  also picks the capacity (observed per call site, else the active profile's ratio) and, off
  CPU, the transport. Every decision is logged (:func:`explain`). The plan carries psum's
  algorithm and the number of pieces of the decision that was logged.
  """
  last, chosen = [], None
  if op == "psum" and algorithm is None and compress in (True, False, "auto"):
    # psum's algorithm first (its frame size decides the capacity), then that algorithm's plan
    chosen = decide_psum(dtype, chunk_elems, axis_size=axis_size, axis_name=axis_name, site=site,
                         role=role, capacity=None if isinstance(capacity, str) else capacity,
                         transport=transport, compress=compress, raw_reason=raw_reason,
                         pieces=pieces, message_elems=message_elems, log=False,
                         fixed_order=fixed_order)
    algorithm = chosen.algorithm
  if op == "psum" and algorithm == "gather-sum":
    chunk_elems = message_elems if message_elems is not None else axis_size * chunk_elems

  def log(mode, cap=None, reason=None):
    last.append(decide(op, dtype, chunk_elems, axis_size=axis_size, axis_name=axis_name,
                       site=site, role=role, capacity=cap, transport=transport, compress=mode,
                       raw_reason=reason, algorithm=algorithm, pieces=pieces,
                       message_elems=message_elems, fixed_order=fixed_order))
    return last[-1]

  p = _plan(op, dtype, chunk_elems, compress, capacity, role, site, log, raw_reason,
            frame_may_exceed_raw)
  if not last:
    return p
  d = last[-1]
  if op == "psum":
    how = f"psum {d.algorithm} (" + ("use_algorithm" if chosen is None else "model: " + "; ".join(
        f"{a} {t * 1e3:.3f} ms" for a, t in chosen.candidates)) + ")"
    d = dataclasses.replace(d, reason=f"{d.reason}; {how}",
                            candidates=chosen.candidates if chosen is not None else ())
    _record(d)
  return dataclasses.replace(p, algorithm=d.algorithm if op == "psum" else "",
                             pieces=d.pieces if p.compress else 1, decision=p.decision and d)


def _plan(op, dtype, chunk_elems, compress, capacity, role, site, log, raw_reason, exceed) -> Plan:
  if compress is not True and compress is not False and compress != "auto":
    raise ValueError(f"zipccl_jax.{op}: compress must be True, False or 'auto', got {compress!r}")
  observed = isinstance(capacity, str)
  if observed and capacity != "observed":
    raise TypeError(f"zipccl_jax.{op}: capacity must be an int, a float, 'observed' or None, "
                    f"got {capacity!r}")
  capacity = None if observed else capacity
  dt = np.dtype(dtype)
  coded = dt in CODED_DTYPES
  if raw_reason is not None:
    return Plan(False, reason=raw_reason, decision=log(compress, reason=raw_reason))
  if compress is False:
    if coded and chunk_elems:
      log(False, capacity)
    return Plan(False, reason="compress=False")
  if not coded or chunk_elems == 0:
    d = log(compress)
    return Plan(False, reason=d.reason if not coded else "empty")
  if compress is True:
    return _plan_compressed(op, dt, chunk_elems, capacity, observed, role, site, log, exceed)
  d = log("auto", capacity)
  if not d.compress:
    return Plan(False, reason=d.reason, decision=d)
  return Plan(True, d.capacity, "auto: " + d.reason, transport=d.transport, decision=d)


def _plan_compressed(op, dt, m, capacity, observed, role, site, log, exceed=False) -> Plan:
  """compress=True: the capacity observed for `site` (if asked and known), else `capacity=`; raw
  where such a frame would not be smaller than the raw chunk (but for a byte count `capacity=`)."""
  cap = observed_capacity(get_profile(), site, op, dt, m) if observed else None
  reason = ("compress=True" if not observed else "compress=True, observed capacity"
            if cap is not None else "compress=True, nothing observed: default capacity")
  if cap is None:
    cap = resolve_capacity(capacity, m, dt, role)
  if cap >= m * dt.itemsize and not exceed and not isinstance(capacity, (int, np.integer)):
    why = (f"compress=True, sent raw: a frame ({cap} B) would not be smaller than the raw chunk "
           f"({m * dt.itemsize} B)")
    log(True, cap, reason=why)
    return Plan(False, reason=why)
  log(True, cap)
  return Plan(True, cap, reason)
