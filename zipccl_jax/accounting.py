"""Bytes on the wire: the one bytes-sent model, HLO reading, call-site stats, runtime counters.

`sent_bytes` is the model every part of the project uses (the collectives' statistics, the
strategy's cost model, `hlo_collectives`, the examples' accounting): the bytes one device sends
for one collective whose operand holds `S` bytes, over a group of `n` devices::

  all-to-all, ragged-all-to-all, reduce-scatter   S (n-1)/n
  all-gather                                      S (n-1)
  all-reduce                                      2 S (n-1)/n   (ring: reduce-scatter + all-gather)
  collective-permute                              S

Kinds are HLO op names; the `jax.lax` names (``all_to_all``, ``all_gather``, ``psum``,
``ppermute``, ``psum_scatter``) are accepted too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core, dispatch, effects
from jax._src.interpreters import batching, mlir

from zipccl_jax import _ffi

__all__ = ["sent_bytes", "hlo_collectives", "hlo_wire_bytes", "CallSiteStats", "stats",
           "totals", "reset_stats", "set_runtime_stats", "FALLBACK_SCOPE", "SITE_SCOPE"]

# The named scope of every raw-fallback branch (`in_fallback`); hlo_collectives reads it.
FALLBACK_SCOPE = "zipccl_raw_fallback"
# The named scope of the ops one recorded call binds, followed by the record's key (`record`).
SITE_SCOPE = "zipccl_site_"


def in_fallback(fn):
  """`fn()` inside the raw-fallback named scope (what `hlo_collectives` calls fallback)."""
  with jax.named_scope(FALLBACK_SCOPE):
    return fn()


_KIND = {"all_to_all": "all-to-all", "ragged_all_to_all": "ragged-all-to-all",
         "psum_scatter": "reduce-scatter", "all_gather": "all-gather", "psum": "all-reduce",
         "ppermute": "collective-permute"}
# (numerator, denominator) of the bytes sent per operand byte, as functions of n
_FACTOR = {
    "all-to-all": lambda n: (n - 1, n), "ragged-all-to-all": lambda n: (n - 1, n),
    "reduce-scatter": lambda n: (n - 1, n), "all-gather": lambda n: (n - 1, 1),
    "all-reduce": lambda n: (2 * (n - 1), n),
}


def sent_bytes(kind: str, operand_bytes, n: int):
  """Bytes one device sends (see the module docstring); exact (floor) for an int operand.

  >>> sent_bytes("all-to-all", 8 * 1024, 8), sent_bytes("all_gather", 1024, 8)
  (7168, 7168)
  """
  kind = _KIND.get(kind, kind)
  if kind == "collective-permute":
    return operand_bytes
  if kind not in _FACTOR:
    raise ValueError(kind)
  if n <= 1:
    return 0 if isinstance(operand_bytes, (int, np.integer)) else 0.0
  num, den = _FACTOR[kind](n)
  if isinstance(operand_bytes, (int, np.integer)):
    return operand_bytes * num // den
  return operand_bytes * num / den


# --------------------------------------------------------------------------- #
# Reading compiled HLO text
# --------------------------------------------------------------------------- #

_HLO_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2,
                 "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
                 "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1}
_HLO_LINE = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.+?)\s+"
    r"(?P<op>ragged-all-to-all|all-to-all|all-gather|reduce-scatter|all-reduce|"
    r"collective-permute)(?P<start>-start)?\(")
_HLO_SHAPE = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")


def _hlo_shape_bytes(text: str) -> int:
  total = 0
  for dt, dims in _HLO_SHAPE.findall(text):
    if dt not in _HLO_ITEMSIZE:
      continue
    total += _HLO_ITEMSIZE[dt] * math.prod(int(d) for d in dims.split(",") if d)
  return total


_MESH_GROUPS = re.compile(r"replica_groups=mesh\[(?P<mesh>[^\]]*)\]\s*\{(?P<axes>[^}]*)\}")
_MESH_AXIS = re.compile(r"'(?P<name>[^']+)'\s*=\s*(?P<size>\d+)")
_GROUP_AXIS = re.compile(r"'(?P<name>[^']+)'(?::\((?P<pre>\d+)\)(?P<sub>\d+))?")


def _hlo_group_size(line: str, default: int) -> int:
  """Devices per replica group of one collective line. Three forms:

  * listed groups ``replica_groups={{0,1,2,3},{4,5,6,7}}`` (jax 0.10);
  * iota groups ``replica_groups=[2,4]<=[8]`` (groups x size, then the device order);
  * mesh axes ``replica_groups=mesh['a'=2,'b'=4] {'a','b'}`` (jax 0.11+, XLA's mesh-axes replica groups):
    the product of the sizes of the axes named in braces (a sub-axis ``'a':(1)2`` counts its own size).

  Only a line with no groups at all (collective-permute; ``replica_groups={}``: one group of every device)
  takes `default`. A groups form not recognised is a ValueError: a guessed size would make the byte counts
  wrong without a sign.
  """
  m = _MESH_GROUPS.search(line)
  if m:
    sizes = {a["name"]: int(a["size"]) for a in _MESH_AXIS.finditer(m["mesh"])}
    n = 1
    for a in _GROUP_AXIS.finditer(m["axes"]):
      if a["name"] not in sizes:
        raise ValueError(f"zipccl_jax.hlo_collectives: axis {a['name']!r} of the replica groups is not in "
                         f"the mesh [{m['mesh']}]: {line.strip()[:300]}")
      n *= int(a["sub"]) if a["sub"] else sizes[a["name"]]
    return n
  m = re.search(r"replica_groups=\{(\{[^}]*\})", line)
  if m:
    return len([t for t in m.group(1).strip("{}").split(",") if t.strip()])
  m = re.search(r"replica_groups=\[(\d+),(\d+)\]", line)
  if m:
    return int(m.group(2))
  if "replica_groups=" not in line or re.search(r"replica_groups=\{\s*\}", line):
    return default
  raise ValueError("zipccl_jax.hlo_collectives: unrecognised replica_groups form (please report it with your "
                   f"jax version): {line.strip()[:300]}")


def hlo_collectives(hlo_text: str, *, num_devices: int | None = None) -> list[dict]:
  """The collectives in an HLO module's text (e.g. ``jit(f).lower(..).compile().as_text()``).

  Returns one record per collective instruction: ``op``, ``shape`` (the
  result type text), ``result_bytes``, ``operand_bytes``, ``group_size``,
  ``sent_bytes`` (bytes one device sends: all-to-all and reduce-scatter
  ``S (n-1)/n``, all-gather ``S (n-1)``, all-reduce ``2 S (n-1)/n``,
  collective-permute ``S``, for operand bytes ``S`` and group size ``n``) and
  ``fallback`` (True inside zipccl's raw-fallback branch). Async
  ``*-start`` forms are counted once from their result tuple's second half.
  """
  recs = []
  for line in hlo_text.splitlines():
    m = _HLO_LINE.match(line)
    if not m:
      continue
    op = m.group("op")
    shape = m.group("shape")
    n = _hlo_group_size(line, num_devices or 1)
    res = _hlo_shape_bytes(shape)
    if m.group("start"):
      res //= 2  # ((operands), results): count the results
    if op == "all-gather":
      operand = res // max(n, 1)
    elif op == "reduce-scatter":
      operand = res * n
    else:  # ragged-all-to-all: the result type is the output buffer, sent at most once
      operand = res
    recs.append(dict(op=op, shape=shape, result_bytes=res, operand_bytes=operand, group_size=n,
                     sent_bytes=sent_bytes(op, operand, n),
                     fallback=FALLBACK_SCOPE in line))
  return recs


def hlo_wire_bytes(hlo_text: str, *, include_fallback: bool = False,
                   num_devices: int | None = None) -> int:
  """Bytes one device sends per execution, summed over the module's collectives.

  Collectives inside zipccl's raw-fallback branches are excluded unless
  ``include_fallback``; they only run when a chunk overflowed.
  """
  return sum(r["sent_bytes"] for r in hlo_collectives(hlo_text, num_devices=num_devices)
             if include_fallback or not r["fallback"])


# --------------------------------------------------------------------------- #
# Call-site statistics (trace time) and runtime counters
# --------------------------------------------------------------------------- #

@dataclasses.dataclass
class CallSiteStats:
  """Per call site; byte figures are per device per call (see hlo_wire_bytes)."""
  name: str
  op: str
  dtype: str
  shape: tuple
  axis_size: int
  compressed: bool
  capacity: int       # bytes per chunk (0 when raw)
  raw_bytes: int      # bytes one device sends with jax.lax
  wire_bytes: int     # bytes one device sends on the padded coded path (raw_bytes if raw)
  reason: str = ""
  traces: int = 0
  calls: int = 0      # runtime, per local device execution (set_runtime_stats)
  fallbacks: int = 0  # runtime, per local device execution (set_runtime_stats); ragged transport:
                      # executions in which this device received a raw row


_STATS: dict[str, CallSiteStats] = {}
_STATS_LOCK = threading.Lock()
_RUNTIME_STATS = os.environ.get("ZIPCCL_RUNTIME_STATS", "0") not in ("", "0")
_SITE_IDS: dict[str, int] = {}  # call-site name -> the zipccl_count handler's `site` attribute


def set_runtime_stats(enabled: bool = True) -> bool:
  """Counts calls and fallbacks at run time in functions traced from now on.

  On CPU each call adds to an in-process counter through the ``zipccl_count``
  FFI handler (well under a microsecond). On other platforms it costs one
  ``jax.debug.callback`` per call per device, and such a function cannot be
  lowered for another platform (``lowering_platforms=``). Returns the previous
  setting.
  """
  global _RUNTIME_STATS
  prev, _RUNTIME_STATS = _RUNTIME_STATS, bool(enabled)
  return prev


def _with_runtime_counts(s: CallSiteStats, counts: dict) -> CallSiteStats:
  """`s` plus what the zipccl_count handler counted for it (`counts`: runtime_counts())."""
  calls, fallbacks = counts.get(_SITE_IDS.get(s.name), (0, 0))
  return dataclasses.replace(s, calls=s.calls + int(calls), fallbacks=s.fallbacks + int(fallbacks))


def runtime_counts() -> dict:
  """`{site id: (calls, fallbacks)}` counted by the zipccl_count handler in this process."""
  return _ffi.extension().runtime_counts()


def stats(program=None) -> dict[str, CallSiteStats]:
  """The per-call-site statistics: of the sites traced since :func:`reset_stats`, or of a program.

  Args:
    program: None, or a program: ``jax.jit(f).trace(x)``, ``.lower(x)``, ``.lower(x).compile()``
      (or its HLO text). Its call sites are read from the program itself (each recorded call's
      ops carry its record's key in their HLO metadata), so they are there after
      :func:`reset_stats`, also when JAX reused a cached trace without running zipccl_jax's code
      again; and a compiled program lists only the sites XLA kept.

  Without a program, a site traced again counts its ``traces``; a cached step is not traced
  again (pass the program). Runtime counters (:func:`set_runtime_stats`) are added either way.
  """
  sites = None if program is None else program_sites(program)  # may lower: outside the lock
  with _STATS_LOCK:
    counts = runtime_counts() if _SITE_IDS else {}
    if sites is None:
      return {k: _with_runtime_counts(v, counts) for k, v in _STATS.items()}
    return {s.name: _with_runtime_counts(s, counts) for s, _ in sites.values()}


def totals() -> dict[str, int]:
  """Totals over call sites and counted executions (needs set_runtime_stats).

  ``raw_bytes = sum(calls * raw_bytes)``,
  ``wire_bytes = sum(calls * wire_bytes + fallbacks * raw_bytes)`` (a fallback
  moves the padded bytes and then the raw ones), plus ``calls`` and
  ``fallbacks``. Counts are per local device execution.
  """
  out = dict(raw_bytes=0, wire_bytes=0, calls=0, fallbacks=0)
  for s in stats().values():
    out["raw_bytes"] += s.calls * s.raw_bytes
    out["wire_bytes"] += s.calls * s.wire_bytes + s.fallbacks * s.raw_bytes
    out["calls"] += s.calls
    out["fallbacks"] += s.fallbacks
  return out


def reset_stats() -> None:
  """Forgets all call sites and counters (a program's sites stay readable: ``stats(program)``)."""
  with _STATS_LOCK:
    _STATS.clear()
    if _SITE_IDS:
      _ffi.extension().reset_runtime_counts()


def forget_site(name: str) -> None:
  """Drops one call site's statistics (calibrate's internal measurement)."""
  with _STATS_LOCK:
    _STATS.pop(name, None)


def record(name, op, x, n, plan, raw_bytes, wire_bytes) -> str:
  """Records one trace of call site `name` (`plan`: strategy.Plan; bytes per device per call);
  returns the record's key: bind the call's ops in `site_scope(key)`."""
  with _STATS_LOCK:
    s = _STATS.get(name)
    traces = s.traces if s is not None else 0
    calls = s.calls if s is not None else 0
    fallbacks = s.fallbacks if s is not None else 0
    _STATS[name] = CallSiteStats(
        name=name, op=op, dtype=np.dtype(x.dtype).name, shape=tuple(x.shape), axis_size=n,
        compressed=plan.compress, capacity=plan.capacity, raw_bytes=int(raw_bytes),
        wire_bytes=int(wire_bytes if plan.compress else raw_bytes), reason=plan.reason,
        traces=traces + 1, calls=calls, fallbacks=fallbacks)
    rec = dataclasses.replace(_STATS[name], traces=1, calls=0, fallbacks=0)
    key = hashlib.sha1(repr((rec, _DECISION_OF.get(name))).encode()).hexdigest()[:12]
    _PROGRAM_SITES[key] = (rec, _DECISION_OF.get(name))
    return key


# Every record, for good (reset_stats keeps them): key -> (stats, the site's decision). The key is
# a digest of the record, so a site traced again with the same outcome writes the same program.
_PROGRAM_SITES: dict[str, tuple] = {}
_DECISION_OF: dict = {}  # site -> its latest strategy.Decision (strategy logs it before `record`)
_KEY = re.compile(SITE_SCOPE + r"([0-9a-f]{12})")


def note_decision(d) -> None:
  with _STATS_LOCK:
    _DECISION_OF[d.site] = d


def site_scope(key: str):
  """The named scope of a recorded call's ops: its key reaches the HLO metadata (`program_sites`)."""
  return jax.named_scope(SITE_SCOPE + key)


def program_text(program) -> str:
  """HLO text of a program that keeps the ops' scope names: a compiled one's (metadata), a lowered
  one's with debug info; a traced one is lowered (from jax's cache) for the default platform."""
  if isinstance(program, str):
    return program
  if hasattr(program, "lower") and not hasattr(program, "compile"):
    program = program.lower()
  try:
    return program.as_text(debug_info=True)  # jax.stages.Lowered
  except TypeError:
    return program.as_text()  # jax.stages.Compiled: op_name metadata


def program_sites(program) -> dict:
  """{key: (CallSiteStats, Decision or None)} of the recorded calls whose ops are in `program`."""
  keys = set(_KEY.findall(program_text(program)))
  return {k: _PROGRAM_SITES[k] for k in sorted(keys) if k in _PROGRAM_SITES}


def _site_id(name: str) -> int:
  with _STATS_LOCK:
    return _SITE_IDS.setdefault(name, len(_SITE_IDS))


class _CountEffect(effects.Effect):
  """The runtime counter's side effect: it changes no value, so every transformation may keep,
  repeat (remat recomputes a forward collective: it is counted again) or move it."""

  def __str__(self):
    return "ZipcclCount"


_COUNT_EFFECT = _CountEffect()
for _allowed in (effects.lowerable_effects, effects.control_flow_allowed_effects,
                 effects.custom_derivatives_allowed_effects, effects.remat_allowed_effects):
  _allowed.add_type(_CountEffect)

# zipccl_count(fallback, site): adds one call (and a fallback if any element is set) to `site`.
# Its own primitive rather than `jax.ffi.ffi_call(has_side_effect=True)`: that effect is not
# allowed under jax.checkpoint, custom_jvp/custom_vjp or enable_checks, so counting would change
# what a program may do.
_count_p = core.Primitive("zipccl_count")
_count_p.multiple_results = True
_count_p.def_effectful_abstract_eval(lambda fallback, *, site: ([], {_COUNT_EFFECT}))
_count_p.def_impl(lambda fallback, *, site: dispatch.apply_primitive(_count_p, fallback, site=site))
batching.primitive_batchers[_count_p] = (
    lambda args, dims, *, site: (_count_p.bind(*args, site=site), []))  # one call per execution
mlir.register_lowering(_count_p, jax.ffi.ffi_lowering(_ffi.COUNT_TARGET, has_side_effect=True),
                       platform="cpu")


def _partially_automatic() -> bool:
  """Inside a shard_map that leaves some mesh axes automatic (``axis_names=`` a subset)."""
  mesh = jax.sharding.get_abstract_mesh()
  return bool(set(mesh.axis_names) - set(mesh.manual_axes))


def count(name: str, fallback) -> None:
  """Counts one execution of call site `name` (and whether it fell back), if runtime stats are on.

  Not inside a partially automatic shard_map: XLA's partitioner cannot replicate a side-effecting
  op over the automatic axes, so there the call is not counted (its trace-time stats remain).
  """
  if not _RUNTIME_STATS or _partially_automatic():
    return
  flag = jnp.asarray(fallback, jnp.bool_)

  def on_cpu(fb):
    _ffi.register()
    _count_p.bind(fb, site=np.int64(_site_id(name)))
    return jnp.int32(0)

  def elsewhere(fb):
    def cb(fb, name=name):
      with _STATS_LOCK:
        s = _STATS.get(name)
        if s is not None:
          s.calls += 1
          s.fallbacks += int(np.asarray(fb).any())

    jax.debug.callback(cb, fb)
    return jnp.int32(0)

  lax.platform_dependent(flag, cpu=on_cpu, default=elsewhere)
