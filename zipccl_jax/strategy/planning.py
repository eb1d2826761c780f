"""The plan of one call: what a collective does, the final word (the collectives obey it as it is).

``compress=True`` and ``False`` are obeyed as given (but for a frame that would not be smaller than
the raw chunk); ``"auto"`` asks :func:`~zipccl_jax.strategy.decision.decide`. Every plan is logged.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from zipccl_jax.capacity import CODED_DTYPES, resolve_capacity
from zipccl_jax.strategy.decision import (Decision, decide, decide_psum, log_decision,
                                          observed_capacity)
from zipccl_jax.strategy.profile import get_profile

__all__ = ["Plan", "plan"]


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
         frame_may_exceed_raw: bool = False, fixed_order: bool = False,
         flat_est: tuple[float, float, float] | None = None) -> Plan:
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
    flat_est: the (raw, compressed, margin) a two-level plan costed and ranked this flat call with
      (`levels.LevelPlan.flat_estimates`), which ``"auto"`` decides with (:func:`decide`).

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
                       message_elems=message_elems, fixed_order=fixed_order,
                       flat_est=flat_est))
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
    log_decision(d)
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
