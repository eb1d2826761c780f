"""Lossless compressed collectives: drop-in replacements for ``jax.lax``.

``all_to_all``, ``all_gather``, ``psum_scatter``, ``psum`` and ``ppermute``
take the same positional arguments as their ``jax.lax`` namesakes and must be
called inside ``jax.shard_map`` (under ``jit`` or not). Each one encodes its
chunks with the zipccl codec, runs the ``jax.lax`` collective on the uint8
payload, and decodes on the receiving side. Data-movement collectives return
results bit-identical to ``jax.lax``; reductions return the documented
fixed-order float32 reduction (see `psum_scatter`). Whenever a float message
goes raw (``compress=False``, ``"auto"`` deciding raw, or the overflow
fallback) its bit pattern moves as a uint16/uint32 view, so NaN payloads
survive too (XLA:CPU's own 16-bit float collectives widen to float32 on the
wire and quiet signalling NaNs).

Keyword options shared by all five:

* ``compress``: ``True`` codes every bfloat16/float16/float32 message (other
  dtypes raise ``TypeError``); ``False`` always sends raw; ``"auto"`` (default)
  asks the cost model of :mod:`zipccl_jax.strategy` at trace time (raw for
  dtypes the codec does not cover, for an axis of size 1, when the capacity
  would not save bytes, and whenever the estimated compressed time does not
  beat the raw one for the active :class:`~zipccl_jax.strategy.Profile`; see
  :func:`zipccl_jax.calibrate` and :func:`zipccl_jax.explain`). ``_decide`` is
  the one place the decision is made.
* ``capacity``: padded bytes per chunk. ``None`` uses :func:`padded_capacity`;
  an ``int`` is a byte count (>= 32); a ``float`` is a fraction of the chunk's
  raw bytes; ``"observed"`` is the largest frame :func:`zipccl_jax.observe`
  recorded for this call site (``name``) in the active profile, plus its margin,
  and :func:`padded_capacity` if none was (this is what ``compress="auto"`` always
  does; ``"observed"`` gives it to ``compress=True``); a pair
  ``(forward, backward)`` sets the capacity of the transposed collective in
  ``jax.grad`` separately (gradients code worse than activations).
* ``transport``: ``"auto"`` (padded on CPU, ragged elsewhere, chosen with
  ``lax.platform_dependent``), ``"padded"`` or ``"ragged"``.
* ``name``: call-site name for :func:`stats` (default: ``op@file:line``).

Transports
----------
Padded (everywhere): each chunk of ``m`` elements is encoded into exactly
``C = capacity`` bytes, and the ``jax.lax`` collective moves ``C`` bytes per
chunk. What crosses the wire per sender, for an axis of size ``n``::

  all_to_all / psum_scatter:  uint8[n, C]   (row j goes to rank j)
  all_gather:                 uint8[C]      (to every rank)
  ppermute:                   uint8[C]      (+ one int32 psum, see ppermute)

The chunk a rank keeps (row ``me`` of an ``all_to_all``/``psum_scatter``, its
own row of an ``all_gather``) never crosses the network, so it is not coded:
the codec skips that row (an all-zero row of ``C`` bytes goes to itself) and
the collective copies the raw chunk into place. That saves ``1/n`` of the codec
work and changes no result bit.

Ragged (``transport="ragged"``, or ``"auto"`` on GPU/TPU): the same frames go
through ``jax.lax.ragged_all_to_all`` so only each frame's ``nbytes`` move (an
overflowed frame sends its 32-byte header only), after a tiny int32 exchange of
the sizes. XLA:CPU does not implement ragged-all-to-all. The second phase of
``psum`` stays padded (it must return a device-invariant value).

Overflow protocol (uniform fallback)
------------------------------------
A chunk whose frame does not fit in ``C`` overflows. The codec then writes only
the 32-byte header, whose ``frame_bytes`` field (bytes [16, 24)) is the needed
size, > C. If any chunk of a sender overflows, the sender also sets
``frame_bytes = 2**64 - 1`` ("poisons") in the header of every other chunk it
sends. In ``all_to_all``/``psum_scatter`` every receiver gets exactly one chunk
from every sender, and in ``all_gather`` every receiver gets every sender's
chunk, so every rank sees the same set of poisoned senders and computes the same
predicate ``any(frame_bytes > C)`` without an extra collective. Then every rank
takes the same branch of a ``lax.cond``: the raw ``jax.lax`` collective on the
bits of the original operand (the coded bytes already moved are wasted). The
result is bit-exact either way. The predicate agrees within each group of the
collective; XLA lowers these collectives to per-group operations, so groups
(e.g. the rows of a 2-D mesh) may decide differently. ``ppermute`` receivers do
not see every sender, and XLA lowers a ppermute over one mesh axis to a single
collective-permute that every device joins, so there the flag goes through a
4-byte ``psum`` over every manual mesh axis.

Under ``jax.vmap`` the predicate is per example and the ``lax.cond`` becomes a
select: both branches run (so both collectives run everywhere, still matched),
the coded branch skips decoding the examples that fell back, and the select
works on uint views so NaN payloads survive.

Reductions
----------
``psum_scatter`` and ``psum`` on bfloat16/float16/float32 always compute, for
every output element::

  out = round_to_dtype(((f32(x_0) + f32(x_1)) + f32(x_2)) + ... + f32(x_{n-1}))

where ``x_r`` is rank ``r``'s input (rank = index along ``axis_name``; for a
tuple of axes, the row-major linear index), the additions are IEEE float32
additions performed in ascending rank order, and the single rounding to the
input dtype is round-to-nearest-even (a no-op for float32). ``compress=False``
and the raw fallback use the same order with raw transport, so the results are
bit-identical whatever the strategy decides. ``jax.lax.psum`` leaves the order
(and, for 16-bit types, the accumulation precision) to XLA, so it may differ in
the last bits. Other dtypes go to ``jax.lax`` unchanged.

Statistics
----------
Each call site records, at trace time, the bytes one device sends per call
with ``jax.lax`` (``raw_bytes``) and with the padded coded transport
(``wire_bytes``), using the per-collective model of :func:`hlo_wire_bytes`.
With :func:`set_runtime_stats` enabled before tracing, every execution also
counts calls and fallbacks: on CPU with the ``zipccl_count`` FFI handler
(a counter in this process, no Python), elsewhere with one
``jax.debug.callback`` per call per device (which cannot be lowered for
another platform).
:func:`hlo_collectives` and :func:`hlo_wire_bytes` read the same figures from
compiled HLO text, leaving out the raw-fallback branches.

Not supported: ``axis_index_groups`` (``NotImplementedError``) and
``all_gather(..., to="reduced")`` (sent raw through ``jax.lax``). Partially
automatic ``shard_map`` (``axis_names=`` a subset) is untested.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
import threading
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

# Everything here is re-exported at the package top level by zipccl_jax/__init__.
__all__ = [
    "all_to_all", "all_gather", "psum_scatter", "psum", "ppermute",
    "padded_capacity", "CallSiteStats", "stats", "totals", "reset_stats", "set_runtime_stats",
    "hlo_collectives", "hlo_wire_bytes",
    # the strategy layer (zipccl_jax/strategy.py), re-exported at the bottom of this module
    "Profile", "calibrate", "explain", "decisions", "observe", "get_profile", "set_profile",
    "use_profile", "load_profile",
]

HEADER_BYTES = 32            # frame header size (FORMAT.md)
_FRAME_BYTES_FIELD = (16, 24)  # u64 little-endian `frame_bytes` in the header

_BF16 = np.dtype(ml_dtypes.bfloat16)
_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
CODED_DTYPES = (_BF16, _F16, _F32)

# Expected coded size as a fraction of the raw bytes, with a margin (see
# padded_capacity). "activation": forward activations and parameters
# (near-Gaussian); "gradient": gradients and cotangents (heavier tails), used by
# psum_scatter, psum and every backward collective.
EXPECTED_RATIO = {
    "activation": {_BF16: 0.70, _F16: 0.86, _F32: 0.85},
    "gradient": {_BF16: 0.74, _F16: 0.88, _F32: 0.86},
}
# Fixed-order sums are unrolled up to this many ranks, then use a sequential loop.
_UNROLL_MAX = 64
_FALLBACK_SCOPE = "zipccl_raw_fallback"


def _codec():
  from zipccl_jax import codec  # lazy: zipccl_jax/__init__ imports this module
  return codec


def _max_encoded_bytes(n: int, dtype) -> int:
  return int(_codec().max_encoded_bytes(int(n), np.dtype(dtype)))


# --------------------------------------------------------------------------- #
# Capacity and the compress decision
# --------------------------------------------------------------------------- #

def padded_capacity(n_elems: int, dtype, *, ratio: float | None = None,
                    kind: str = "activation") -> int:
  """Static per-chunk capacity ``C(n, dtype)`` in bytes for the padded transport.

  ::

    C = min(max_encoded_bytes(n, dtype),
            round_up_8(32 + ceil(ratio * n * itemsize) + 64 * ceil(n / 65536)))

  ``ratio`` defaults to ``EXPECTED_RATIO[kind][dtype]``, the codec's size as
  a fraction of the raw size plus a margin, measured per 64K-element chunk on
  Gaussian data and on shared/corpus:

  ============  =====================================  =======  ========
  dtype         measured (max over chunks)             act.     gradient
  ============  =====================================  =======  ========
  bfloat16      Gaussian 0.664-0.670, activations and  0.70     0.74
                params <= 0.69 (MoE expert_out 0.725),
                activation grads <= 0.714, weight
                grads <= 0.704 (lm_head 0.740)
  float16       Gaussian 0.845-0.857                   0.86     0.88
  float32       Gaussian 0.832, corpus <= 0.841        0.85     0.86
  ============  =====================================  =======  ========

  ``kind="gradient"`` is used by ``psum_scatter``, ``psum`` and all backward
  collectives. The ``64 * blocks`` term covers the header and per-block
  tables of small chunks. Chunks that code larger than ``C`` take the raw
  fallback, so a tighter ``C`` saves more wire bytes on typical data at the
  price of more fallbacks on atypical data; pass ``capacity=`` per call site
  to calibrate.
  """
  n = int(n_elems)
  dt = np.dtype(dtype)
  if dt not in CODED_DTYPES:
    raise TypeError(f"zipccl_jax: padded_capacity: dtype {dt.name} is not coded; "
                    "supported: bfloat16, float16, float32")
  if kind not in EXPECTED_RATIO:
    raise ValueError(f"zipccl_jax: kind must be one of {sorted(EXPECTED_RATIO)}, got {kind!r}")
  r = EXPECTED_RATIO[kind][dt] if ratio is None else float(ratio)
  if not r > 0:
    raise ValueError(f"zipccl_jax: capacity ratio must be > 0, got {r}")
  blocks = -(-n // 65536)
  c = HEADER_BYTES + math.ceil(r * n * dt.itemsize) + 64 * blocks
  c = -(-c // 8) * 8
  return int(min(c, _max_encoded_bytes(n, dt)))


def _resolve_capacity(capacity, n: int, dtype, kind: str = "activation") -> int:
  if capacity is None:
    return padded_capacity(n, dtype, kind=kind)
  if isinstance(capacity, bool):
    raise TypeError(f"zipccl_jax: capacity must be an int, a float, 'observed' or None, got {capacity!r}")
  if isinstance(capacity, (int, np.integer)):
    c = int(capacity)
    if c < HEADER_BYTES:
      raise ValueError(f"zipccl_jax: capacity must be >= {HEADER_BYTES} bytes, got {c}")
    return min(c, _max_encoded_bytes(n, dtype))
  if isinstance(capacity, (float, np.floating)):
    return padded_capacity(n, dtype, ratio=float(capacity))
  raise TypeError(f"zipccl_jax: capacity must be an int, a float, 'observed' or None, got {capacity!r}")


def _split_capacity(capacity):
  """`capacity` -> (forward, backward)."""
  if isinstance(capacity, (tuple, list)):
    if len(capacity) != 2:
      raise ValueError("zipccl_jax: capacity pair must be (forward, backward)")
    return capacity[0], capacity[1]
  return capacity, capacity


def _grad_capacity(capacity, dtype):
  """Backward collectives default to the "gradient" role (capacity ratio and statistics).

  ``None`` becomes the ``"gradient"`` marker: with ``compress=True`` it means
  ``padded_capacity(..., kind="gradient")`` exactly as before; with
  ``compress="auto"`` the strategy uses the observed or profile capacity of the
  gradient role.
  """
  if capacity is None:
    return "gradient" if np.dtype(dtype) in CODED_DTYPES else None
  if isinstance(capacity, str) and capacity == "observed":
    return "observed:gradient"
  return capacity


@dataclasses.dataclass(frozen=True)
class _Plan:
  compress: bool
  capacity: int = 0     # bytes per chunk when compressing
  reason: str = ""
  transport: str | None = None  # None: the caller's transport
  decision: object = None       # strategy.Decision (compress="auto")


def _decide(op: str, dtype, chunk_elems: int, *, n_chunks: int, axis_size: int,
            compress, capacity, kind: str = "activation", site: str | None = None,
            axis_name=None, transport: str = "auto") -> _Plan:
  """The single place that decides raw vs. compressed for one call.

  Args:
    op: collective name ("all_to_all", "all_gather", "psum_scatter", "psum",
      "ppermute").
    dtype: element dtype.
    chunk_elems: elements per coded chunk (one frame).
    n_chunks: frames each device encodes per call.
    axis_size: size of the collective's axis.
    compress: the caller's ``compress`` option (True, False or "auto").
    capacity: the caller's ``capacity`` option for this direction (or the
      internal ``"gradient"`` marker of backward collectives).
    kind: "activation" or "gradient" (the data's expected statistics).
    site: call-site name (per-site observed capacities, decision log).
    axis_name: the collective's axis (selects the profile's link).
    transport: the caller's transport.

  ``compress=True`` and ``False`` are obeyed as given (capacity from
  ``capacity=`` or :func:`padded_capacity`). ``"auto"`` asks the cost model of
  :mod:`zipccl_jax.strategy` (:func:`zipccl_jax.strategy.decide`), which
  also picks the capacity (observed per call site, else the active profile's
  ratio) and, off CPU, the transport. Every decision is logged
  (:func:`zipccl_jax.explain`).
  """
  from zipccl_jax import strategy
  if compress is not True and compress is not False and compress != "auto":
    raise ValueError(f"zipccl_jax.{op}: compress must be True, False or 'auto', got {compress!r}")
  observed = False
  if isinstance(capacity, str):
    if capacity not in ("gradient", "observed", "observed:gradient"):
      raise TypeError(f"zipccl_jax.{op}: capacity must be an int, a float, 'observed' or None, "
                      f"got {capacity!r}")
    if capacity.endswith("gradient"):  # the internal marker of backward collectives
      kind = "gradient"
    observed, capacity = capacity.startswith("observed"), None
  dt = np.dtype(dtype)

  def log(mode, cap=None):
    strategy.decide(op, dt, chunk_elems, axis_size=axis_size, axis_name=axis_name, site=site,
                    role=kind, capacity=cap, transport=transport, compress=mode)

  if compress is False:
    if dt in CODED_DTYPES and chunk_elems:
      log(False, capacity)
    return _Plan(False, reason="compress=False")
  if dt not in CODED_DTYPES:
    if compress is True:
      raise TypeError(
          f"zipccl_jax.{op}: compress=True but x has dtype {dt.name}; the codec supports "
          "bfloat16, float16, float32 (use compress='auto' to send other dtypes raw)")
    log(compress)
    return _Plan(False, reason=f"dtype {dt.name} not coded")
  if chunk_elems == 0:
    log(compress)
    return _Plan(False, reason="empty")
  if compress is True:
    cap = None
    if observed:
      cap = strategy._observed_capacity(strategy.get_profile(), site, op, dt, chunk_elems)
    reason = ("compress=True" if not observed else "compress=True, observed capacity" if cap is not None
              else "compress=True, nothing observed: default capacity")
    if cap is None:
      cap = _resolve_capacity(capacity, chunk_elems, dt, kind)
    log(True, cap)
    return _Plan(True, cap, reason)
  d = strategy.decide(op, dt, chunk_elems, axis_size=axis_size, axis_name=axis_name, site=site,
                      role=kind, capacity=capacity, transport=transport, compress="auto")
  if not d.compress:
    return _Plan(False, reason=d.reason, decision=d)
  return _Plan(True, d.capacity, "auto: " + d.reason, transport=d.transport, decision=d)


# --------------------------------------------------------------------------- #
# Statistics
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
  fallbacks: int = 0  # runtime, per local device execution (set_runtime_stats)


_STATS: dict[str, CallSiteStats] = {}
_STATS_LOCK = threading.Lock()
_RUNTIME_STATS = os.environ.get("ZIPCCL_RUNTIME_STATS", "0") not in ("", "0")


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
  """`s` plus what the zipccl_count handler counted for it (`counts`: _runtime_counts())."""
  calls, fallbacks = counts.get(_SITE_IDS.get(s.name), (0, 0))
  return dataclasses.replace(s, calls=s.calls + int(calls), fallbacks=s.fallbacks + int(fallbacks))


def _runtime_counts() -> dict:
  from zipccl_jax import _ffi
  return _ffi.extension().runtime_counts()


def stats() -> dict[str, CallSiteStats]:
  """A snapshot of the per-call-site statistics."""
  with _STATS_LOCK:
    counts = _runtime_counts() if _SITE_IDS else {}
    return {k: _with_runtime_counts(v, counts) for k, v in _STATS.items()}


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
  """Forgets all call sites and counters."""
  with _STATS_LOCK:
    _STATS.clear()
    if _SITE_IDS:
      from zipccl_jax import _ffi
      _ffi.extension().reset_runtime_counts()


def _record(name, op, x, n, plan, raw_bytes, wire_bytes):
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


_SITE_IDS: dict[str, int] = {}  # call-site name -> the zipccl_count handler's `site` attribute


def _site_id(name: str) -> int:
  with _STATS_LOCK:
    return _SITE_IDS.setdefault(name, len(_SITE_IDS))


def _count(name: str, fallback) -> None:
  """Counts one execution of call site `name` (and whether it fell back), if runtime stats are on."""
  if not _RUNTIME_STATS:
    return
  flag = jnp.asarray(fallback, jnp.bool_)

  def on_cpu(fb):
    from zipccl_jax import _ffi
    _ffi.register()
    jax.ffi.ffi_call("zipccl_count", (), has_side_effect=True, vmap_method="broadcast_all")(
        fb, site=np.int64(_site_id(name)))
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


def _observe(site: str, op: str, rows_fn: Callable) -> None:
  """Inside :func:`zipccl_jax.strategy.observe`: report this call's frame sizes to the host.

  Encodes the rows once more at full capacity (only while observing) and
  folds ``nbytes`` into the observer with a debug callback.
  """
  from zipccl_jax import strategy
  if not strategy._observing():
    return
  rows = rows_fn()
  if np.dtype(rows.dtype) not in CODED_DTYPES or rows.size == 0:
    return
  _, nbytes = _codec().encode_frames(rows)
  jax.debug.callback(strategy._observe_callback(site, op, np.dtype(rows.dtype).name,
                                                rows.shape[-1]), nbytes)


def _call_site(op: str, name) -> str:
  if name is not None:
    return str(name)
  here = os.path.abspath(__file__)
  jax_dir = os.path.dirname(os.path.abspath(jax.__file__))
  f = sys._getframe(1)
  while f is not None:
    fn = os.path.abspath(f.f_code.co_filename)
    if fn != here and not fn.startswith(jax_dir):
      return f"{op}@{os.path.basename(fn)}:{f.f_lineno}"
    f = f.f_back
  return op


# --------------------------------------------------------------------------- #
# Wire-byte model and HLO parsing
# --------------------------------------------------------------------------- #

def _sent_bytes(kind: str, operand_bytes: int, n: int) -> int:
  """Bytes one device sends for a collective with the given operand size."""
  if kind == "collective-permute":
    return operand_bytes
  if n <= 1:
    return 0
  if kind in ("all-to-all", "ragged-all-to-all", "reduce-scatter"):
    return operand_bytes * (n - 1) // n
  if kind == "all-gather":
    return operand_bytes * (n - 1)
  if kind == "all-reduce":
    return 2 * operand_bytes * (n - 1) // n
  raise ValueError(kind)


_HLO_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2,
                 "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
                 "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1}
_HLO_OPS = ("ragged-all-to-all", "all-to-all", "all-gather", "reduce-scatter", "all-reduce",
            "collective-permute")
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


def _hlo_group_size(line: str, default: int) -> int:
  m = re.search(r"replica_groups=\{(\{[^}]*\})", line)
  if m:
    return len([t for t in m.group(1).strip("{}").split(",") if t.strip()])
  m = re.search(r"replica_groups=\[(\d+),(\d+)\]", line)
  if m:
    return int(m.group(2))
  return default


def hlo_collectives(hlo_text: str, *, num_devices: int | None = None) -> list[dict]:
  """The collectives in an HLO module's text (e.g. ``jit(f).lower(..).compile().as_text()``).

  Returns one record per collective instruction: ``op``, ``shape`` (the
  result type text), ``result_bytes``, ``operand_bytes``, ``group_size``,
  ``sent_bytes`` (bytes one device sends: all-to-all and reduce-scatter
  ``S (n-1)/n``, all-gather ``S (n-1)``, all-reduce ``2 S (n-1)/n``,
  collective-permute ``S``, for operand bytes ``S`` and group size ``n``) and
  ``fallback`` (True inside this module's raw-fallback branch). Async
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
    else:
      operand = res
    if op == "ragged-all-to-all":
      # result type is the output buffer; the operand is sent at most once
      operand = res
    recs.append(dict(op=op, shape=shape, result_bytes=res, operand_bytes=operand, group_size=n,
                     sent_bytes=_sent_bytes(op, operand, n),
                     fallback=_FALLBACK_SCOPE in line))
  return recs


def hlo_wire_bytes(hlo_text: str, *, include_fallback: bool = False,
                   num_devices: int | None = None) -> int:
  """Bytes one device sends per execution, summed over the module's collectives.

  Collectives inside this module's raw-fallback branches are excluded unless
  ``include_fallback``; they only run when a chunk overflowed.
  """
  return sum(r["sent_bytes"] for r in hlo_collectives(hlo_text, num_devices=num_devices)
             if include_fallback or not r["fallback"])


# --------------------------------------------------------------------------- #
# Trace-time helpers
# --------------------------------------------------------------------------- #

def _axes(axis_name) -> tuple:
  return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _axis_size(axis_name, api: str) -> int:
  axes = _axes(axis_name)
  if not axes:
    raise ValueError(f"zipccl_jax.{api}: axis_name must name at least one mesh axis")
  try:
    from jax._src import core as _core
    bound = tuple(_core.get_axis_env().axis_names())
  except Exception:  # pragma: no cover - internal API moved
    bound = None
  if bound is not None:
    for a in axes:
      if a not in bound:
        if not bound:
          raise NameError(
              f"zipccl_jax.{api}: axis name {a!r} is not bound. This collective must be called "
              f"inside jax.shard_map over a mesh that has the axis {a!r} (no mesh axes are "
              "bound here).")
        raise NameError(f"zipccl_jax.{api}: unknown axis name {a!r}; the axes bound here are "
                        f"{bound}.")
  try:
    return int(math.prod(lax.axis_size(a) for a in axes))
  except NameError as e:
    raise NameError(f"zipccl_jax.{api}: {e}; call it inside jax.shard_map") from None


def _manual_axes(axis_name) -> tuple:
  """Every manual mesh axis of the enclosing shard_map (at least `axis_name`'s)."""
  axes = ()
  try:
    axes = tuple(jax.sharding.get_abstract_mesh().manual_axes)
  except Exception:  # pragma: no cover - API moved
    pass
  for a in _axes(axis_name):
    if a not in axes:
      axes += (a,)
  return axes


def _check_vma_on() -> bool:
  try:
    from jax._src import config as _cfg
    return bool(_cfg._check_vma.value)
  except Exception:  # pragma: no cover
    return True


def _vary(x, axes):
  """pcast `x` to varying over `axes` where it is not already (check_vma only)."""
  if not _check_vma_on():
    return x
  try:
    varying = jax.typeof(x).mat.varying
  except AttributeError:  # pragma: no cover
    return x
  missing = tuple(a for a in axes if a not in varying)
  return lax.pcast(x, missing, to="varying") if missing else x


def _canon(axis: int, ndim: int, what: str, api: str) -> int:
  if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
    raise TypeError(f"zipccl_jax.{api}: {what} must be an int, got {axis!r}")
  a = int(axis)
  if not -ndim <= a < ndim:
    raise ValueError(f"zipccl_jax.{api}: {what}={axis} is out of range for an operand of "
                     f"rank {ndim}")
  return a % ndim


def _check_split(x, dim: int, what: str, n: int, tiled: bool, axis_name, api: str) -> None:
  """The dimension split across `n` ranks: divisible by n (tiled) or equal to n."""
  size = x.shape[dim]
  if tiled and size % n:
    raise ValueError(
        f"zipccl_jax.{api}: x.shape[{what}={dim}] = {size} is not divisible by the size {n} "
        f"of axis {axis_name!r} (tiled=True)")
  if not tiled and size != n:
    raise ValueError(
        f"zipccl_jax.{api}: x.shape[{what}={dim}] = {size} must equal the size {n} of axis "
        f"{axis_name!r} (tiled=False)")


def _no_groups(axis_index_groups, api):
  if axis_index_groups is not None:
    raise NotImplementedError(f"zipccl_jax.{api}: axis_index_groups is not supported; use a "
                              "mesh axis instead")


def _itemsize(x) -> int:
  return np.dtype(x.dtype).itemsize


def _tree_apply(fn, x, name):
  leaves, treedef = jax.tree_util.tree_flatten(x)
  if len(leaves) == 1:
    return jax.tree_util.tree_unflatten(treedef, [fn(leaves[0], name)])
  return jax.tree_util.tree_unflatten(
      treedef, [fn(leaf, f"{name}[{i}]") for i, leaf in enumerate(leaves)])


# --------------------------------------------------------------------------- #
# Coding and transport
# --------------------------------------------------------------------------- #

def _encode_rows(rows, capacity: int, skip=None):
  """rows (F, m) -> payload uint8 (F, C), nbytes (F,), any_overflow (bool).

  If any frame overflowed, every frame's `frame_bytes` is poisoned to 2^64-1.
  Rows flagged in `skip` (F,) are not coded (zero row, nbytes 0).
  """
  payload, nbytes = _codec().encode_frames(rows, capacity=capacity, skip=skip)
  over = jnp.any(nbytes > capacity)
  lo, hi = _FRAME_BYTES_FIELD
  field = payload[:, lo:hi]
  field = jnp.where(over, jnp.full_like(field, 0xFF), field)
  payload = lax.dynamic_update_slice(payload, field, (0, lo))
  return payload, nbytes, over


def _any_overflow(recv, capacity: int):
  """any(frame_bytes > C) over the received frames (R, C)."""
  lo, hi = _FRAME_BYTES_FIELD
  b = recv[:, lo:hi].astype(jnp.uint32)
  f_lo = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)
  f_hi = b[:, 4] | (b[:, 5] << 8) | (b[:, 6] << 16) | (b[:, 7] << 24)
  return jnp.any((f_hi != 0) | (f_lo > jnp.uint32(capacity)))


def _send_sizes(nbytes, capacity: int):
  """Bytes of each frame to send on the ragged transport (header only if overflowed)."""
  nb = nbytes.astype(jnp.int32) if nbytes.dtype != jnp.int32 else nbytes
  over = jnp.any(nbytes > capacity)
  return jnp.where(over | (nbytes > capacity), jnp.int32(HEADER_BYTES), nb)


def _platform_select(transport: str, padded: Callable, ragged: Callable, *args):
  if transport == "padded":
    return padded(*args)
  if transport == "ragged":
    return ragged(*args)
  if transport != "auto":
    raise ValueError(f"zipccl_jax: transport must be 'auto', 'padded' or 'ragged', got "
                     f"{transport!r}")
  return lax.platform_dependent(*args, cpu=padded, default=ragged)


def _xchg_a2a(payload, nbytes, axis_name, n: int, capacity: int, transport: str):
  """Row j of each sender's (n, C) payload goes to rank j; returns (n, C), row s from rank s."""
  def padded(p, s):
    return lax.all_to_all(p, axis_name, 0, 0, tiled=True)

  def ragged(p, s):
    C = capacity
    send = _send_sizes(s, C)
    recv_sizes = lax.all_to_all(send, axis_name, 0, 0, tiled=True)
    me = lax.axis_index(axis_name).astype(jnp.int32)
    z = _zero_like_batch(p)
    in_off = _vary_like(jnp.arange(n, dtype=jnp.int32) * C, p) + z
    out_off = jnp.full((n,), C, jnp.int32) * me + z
    out = _vary_like(jnp.zeros((n * C,), jnp.uint8), p)
    r = lax.ragged_all_to_all(p.reshape(n * C), out, in_off, send, out_off, recv_sizes,
                              axis_name=axis_name)
    return r.reshape(n, C)

  return _platform_select(transport, padded, ragged, payload, nbytes)


def _xchg_gather(payload, nbytes, axis_name, n: int, capacity: int, transport: str,
                 invariant: bool = False):
  """Every sender's (C,) payload to every rank; returns (n, C), row s from rank s."""
  def padded(p, s):
    if invariant:
      return lax.all_gather(p, axis_name, to="invarying")
    return lax.all_gather(p, axis_name)

  def ragged(p, s):
    C = capacity
    send1 = _send_sizes(s[None], C)
    send = jnp.broadcast_to(send1, (n,))
    recv_sizes = lax.all_gather(send1, axis_name, tiled=True)
    me = lax.axis_index(axis_name).astype(jnp.int32)
    z = _zero_like_batch(p)
    in_off = _vary_like(jnp.zeros((n,), jnp.int32), p) + z
    out_off = jnp.full((n,), C, jnp.int32) * me + z
    out = _vary_like(jnp.zeros((n * C,), jnp.uint8), p)
    r = lax.ragged_all_to_all(p, out, in_off, send, out_off, recv_sizes, axis_name=axis_name)
    return r.reshape(n, C)

  if invariant:
    return padded(payload, nbytes)
  return _platform_select(transport, padded, ragged, payload, nbytes)


def _xchg_permute(payload, nbytes, axis_name, n: int, perm, capacity: int, transport: str):
  """ppermute of one (C,) frame; returns (C,) (zeros on ranks that receive nothing)."""
  def padded(p, s):
    return lax.ppermute(p, axis_name, perm)

  def ragged(p, s):
    C = capacity
    dest = np.full((n,), -1, np.int32)
    for src, dst in perm:
      dest[src] = dst
    me = lax.axis_index(axis_name).astype(jnp.int32)
    send1 = _send_sizes(s[None], C)[0]
    my_dest = jnp.asarray(dest)[me]
    send = jnp.where(jnp.arange(n, dtype=jnp.int32) == my_dest, send1, 0).astype(jnp.int32)
    got = lax.ppermute(send1, axis_name, perm)  # size my source sends me (0 if none)
    src_of = np.full((n,), -1, np.int32)
    for src, dst in perm:
      src_of[dst] = src
    my_src = jnp.asarray(src_of)[me]
    recv_sizes = jnp.where(jnp.arange(n, dtype=jnp.int32) == my_src, got, 0).astype(jnp.int32)
    zeros = _vary_like(jnp.zeros((n,), jnp.int32), p) + _zero_like_batch(p)
    out = _vary_like(jnp.zeros((C,), jnp.uint8), p)
    return lax.ragged_all_to_all(p, out, zeros, send, zeros, recv_sizes, axis_name=axis_name)

  return _platform_select(transport, padded, ragged, payload, nbytes)


def _vary_like(z, ref):
  """pcast `z` to the varying axes of `ref` (check_vma only)."""
  if not _check_vma_on():
    return z
  try:
    axes = tuple(sorted(jax.typeof(ref).mat.varying - jax.typeof(z).mat.varying, key=str))
  except AttributeError:  # pragma: no cover
    return z
  return lax.pcast(z, axes, to="varying") if axes else z


def _decode_guarded(recv, fallback, m: int, dtype, skip=None):
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
    return _codec().decode_frames(recv, shape=(m,), dtype=dtype, skip=skip)

  @dec.def_vmap
  def dec_vmap(axis_size, in_batched, recv, fallback, skip):
    rb, fb, sb = in_batched
    if not rb:
      recv = jnp.broadcast_to(recv, (axis_size,) + recv.shape)
    if not fb:
      fallback = jnp.broadcast_to(fallback, (axis_size,))
    if not sb:
      skip = jnp.broadcast_to(skip, (axis_size,) + skip.shape)

    def one(args):
      r, f, k = args
      return lax.cond(f, lambda: _vary_like(jnp.zeros((r.shape[0], m), dtype), r),
                      lambda: dec(r, f, k))

    return lax.map(one, (recv, fallback, skip)), True

  return dec(recv, fallback, skip)


def _own_row(axis_name, n: int):
  """The (n,) mask of this rank's own row on `axis_name`.

  The chunk a rank sends to itself (all_to_all, psum_scatter) or receives
  from itself (all_gather) never crosses the network, so it is not coded: the
  codec skips that row and the collective copies the raw chunk in place.
  """
  return jnp.arange(n, dtype=jnp.int32) == lax.axis_index(axis_name).astype(jnp.int32)


def _with_own_row(decoded, rows, skip):
  """`decoded` (n, m) with the rows flagged in `skip` (n,) taken from `rows` ((n, m), or (m,) for all).

  One select on the bit patterns, which XLA fuses with the decoder's output: a row update
  (dynamic_update_slice on the bit view) cost three passes over it on XLA:CPU (bitcast, copy,
  update), as a 16-bit float array cannot be bitcast in place.
  """
  u = _UINT_OF_SIZE[np.dtype(rows.dtype).itemsize]
  own = lax.bitcast_convert_type(rows, u)
  bits = jnp.where(skip[:, None], own if own.ndim == 2 else own[None, :],
                   lax.bitcast_convert_type(decoded, u))
  return lax.bitcast_convert_type(bits, rows.dtype)


def _ordered_sum(rows, dtype):
  """((f32(r0) + f32(r1)) + ...) in ascending row order, rounded once to `dtype`."""
  n = rows.shape[0]
  if n <= _UNROLL_MAX:
    acc = rows[0].astype(jnp.float32)
    for j in range(1, n):
      acc = acc + rows[j].astype(jnp.float32)
  else:
    acc = lax.fori_loop(1, n, lambda j, a: a + rows[j].astype(jnp.float32),
                        rows[0].astype(jnp.float32))
  return acc.astype(dtype)


def _fallback(fn):
  with jax.named_scope(_FALLBACK_SCOPE):
    return fn()


_UINT_OF_SIZE = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def _raw(fn, x):
  """`fn` (a data-movement collective) applied to the bit pattern of `x`.

  Moving bits instead of floats keeps NaN payloads intact and stops XLA:CPU
  from widening 16-bit float collectives to float32.
  """
  dt = x.dtype
  u = lax.bitcast_convert_type(x, _UINT_OF_SIZE[np.dtype(dt).itemsize])
  return lax.bitcast_convert_type(fn(u), dt)


def _cond_bits(pred, raw_fn: Callable, coded_fn: Callable):
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
      return lax.bitcast_convert_type(y, _UINT_OF_SIZE[np.dtype(y.dtype).itemsize])
    return g

  out = lax.cond(pred, as_bits(raw_fn), as_bits(coded_fn))
  return lax.bitcast_convert_type(out, box["dtype"])


def _zero_like_batch(p):
  """An int32 zero that is batched exactly when `p` is (ragged_all_to_all's
  batching rule needs every offset/size operand batched)."""
  return (p.reshape(-1)[0] & 0).astype(jnp.int32)


# --------------------------------------------------------------------------- #
# all_to_all
# --------------------------------------------------------------------------- #

def all_to_all(x, axis_name, split_axis, concat_axis, *, axis_index_groups=None, tiled=False,
               compress="auto", capacity=None, transport="auto", name=None):
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
    axis_index_groups: must be None.
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

  The transpose (``jax.grad``) is ``all_to_all(ct, axis_name, concat_axis,
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
  api = "all_to_all"
  _no_groups(axis_index_groups, api)
  cap_f, cap_b = _split_capacity(capacity)
  site = _call_site(api, name)

  def leaf(x, site):
    x = jnp.asarray(x)
    n = _axis_size(axis_name, api)
    if x.ndim == 0:
      raise ValueError(f"zipccl_jax.{api}: x must have at least one positional axis")
    sa = _canon(split_axis, x.ndim, "split_axis", api)
    ca = _canon(concat_axis, x.ndim, "concat_axis", api)
    _check_split(x, sa, "split_axis", n, tiled, axis_name, api)
    m = x.size // n
    plan = _decide(api, x.dtype, m, n_chunks=n, axis_size=n, compress=compress, capacity=cap_f,
                   site=site, axis_name=axis_name, transport=transport)
    raw_b = _sent_bytes("all-to-all", x.size * _itemsize(x), n)
    _record(site, api, x, n, plan, raw_b, _sent_bytes("all-to-all", n * plan.capacity, n))
    if np.dtype(x.dtype) not in CODED_DTYPES:
      return lax.all_to_all(x, axis_name, sa, ca, tiled=tiled)
    return _a2a_vjp(x, axis_name, sa, ca, tiled, plan.capacity if plan.compress else 0,
                    plan.transport or transport, site, (compress, cap_b))

  return _tree_apply(leaf, x, site)


def _a2a_impl(x, axis_name, sa, ca, tiled, C, transport, site):
  n = _axis_size(axis_name, "all_to_all")
  x = _vary(x, _axes(axis_name))
  _observe(site, "all_to_all", lambda: jnp.moveaxis(x, sa, 0).reshape(n, x.size // n))
  if not C:
    _count(site, jnp.bool_(False))
    return _raw(lambda u: lax.all_to_all(u, axis_name, sa, ca, tiled=tiled), x)
  m = x.size // n
  k = x.shape[sa] // n
  rows = jnp.moveaxis(x, sa, 0).reshape(n, m)
  skip = _own_row(axis_name, n)
  payload, nbytes, _ = _encode_rows(rows, C, skip)
  recv = _xchg_a2a(payload, nbytes, axis_name, n, C, transport)
  fallback = _any_overflow(recv, C)
  _count(site, fallback)

  def raw():
    # x rebuilt from `rows`, the encoder's operand: passing x itself made XLA materialise the
    # (often transposed) operand twice, once per consumer.
    x_again = jnp.moveaxis(rows.reshape((x.shape[sa],) + x.shape[:sa] + x.shape[sa + 1:]), 0, sa)
    return _fallback(lambda: _raw(lambda u: lax.all_to_all(u, axis_name, sa, ca, tiled=tiled),
                                  x_again))

  def coded():
    out = _with_own_row(_decode_guarded(recv, fallback, m, x.dtype, skip), rows, skip)
    rest = x.shape[:sa] + x.shape[sa + 1:]
    if tiled:
      pieces = jnp.moveaxis(out.reshape((n, k) + rest), 1, sa + 1)  # (n, *x.shape[sa]->k)
      y = jnp.moveaxis(pieces, 0, ca)
      shp = list(pieces.shape[1:])
      shp[ca] *= n
      return y.reshape(shp)
    return jnp.moveaxis(out.reshape((n,) + rest), 0, ca)

  return _cond_bits(fallback, raw, coded)


def _a2a_vjp(x, axis_name, sa, ca, tiled, C, transport, site, bwd_opts):
  @jax.custom_vjp
  def f(x):
    return _a2a_impl(x, axis_name, sa, ca, tiled, C, transport, site)

  def fwd(x):
    return f(x), None

  def bwd(_, g):
    comp, cap = bwd_opts
    return (all_to_all(g, axis_name, ca, sa, tiled=tiled, compress=comp,
                       capacity=_grad_capacity(cap, g.dtype), transport=transport,
                       name=site + "/bwd"),)

  f.defvjp(fwd, bwd)
  return f(x)


# --------------------------------------------------------------------------- #
# all_gather
# --------------------------------------------------------------------------- #

def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False, to="varying",
               compress="auto", capacity=None, transport="auto", name=None):
  """Compressed :func:`jax.lax.all_gather`: same signature, bit-identical result.

  Must be called inside ``jax.shard_map``.

  Args:
    x: array(s) with a mapped axis named ``axis_name`` (pytree: per leaf).
    axis_name: a mesh axis name, or a tuple of them.
    axis_index_groups: must be None.
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
  api = "all_gather"
  _no_groups(axis_index_groups, api)
  if to not in ("varying", "invarying", "reduced"):
    raise ValueError(f"zipccl_jax.{api}: to must be 'varying', 'invarying' or 'reduced', "
                     f"got {to!r}")
  cap_f, cap_b = _split_capacity(capacity)
  site = _call_site(api, name)

  def leaf(x, site):
    x = jnp.asarray(x)
    n = _axis_size(axis_name, api)
    if tiled:
      if x.ndim == 0:
        raise ValueError(f"zipccl_jax.{api}: tiled=True needs x with at least one axis")
      ax = _canon(axis, x.ndim, "axis", api)
    else:
      ax = _canon(axis, x.ndim + 1, "axis", api)
    m = x.size
    plan = _decide(api, x.dtype, m, n_chunks=1, axis_size=n, compress=compress, capacity=cap_f,
                   site=site, axis_name=axis_name, transport=transport)
    if to == "reduced":
      plan = _Plan(False, reason="to='reduced'")
    raw_b = _sent_bytes("all-gather", m * _itemsize(x), n)
    _record(site, api, x, n, plan, raw_b, _sent_bytes("all-gather", plan.capacity, n))
    if np.dtype(x.dtype) not in CODED_DTYPES or to == "reduced":
      return lax.all_gather(x, axis_name, axis=ax, tiled=tiled, to=to)
    return _ag_vjp(x, axis_name, ax, tiled, to, plan.capacity if plan.compress else 0,
                   plan.transport or transport, site, (compress, cap_b))

  return _tree_apply(leaf, x, site)


def _ag_impl(x, axis_name, ax, tiled, to, C, transport, site):
  n = _axis_size(axis_name, "all_gather")
  x = _vary(x, _axes(axis_name))
  _observe(site, "all_gather", lambda: x.reshape(1, x.size))
  if not C:
    _count(site, jnp.bool_(False))
    return _raw(lambda u: lax.all_gather(u, axis_name, axis=ax, tiled=tiled, to=to), x)
  m = x.size
  payload, nbytes, _ = _encode_rows(x.reshape(1, m), C)
  recv = _xchg_gather(payload[0], nbytes[0], axis_name, n, C, transport,
                      invariant=(to == "invarying"))
  fallback = _any_overflow(recv, C)
  _count(site, fallback)

  def raw():
    return _fallback(lambda: _raw(
        lambda u: lax.all_gather(u, axis_name, axis=ax, tiled=tiled, to=to), x))

  def coded():
    if to == "invarying":  # the result must not depend on the rank: decode every row
      out = _decode_guarded(recv, fallback, m, x.dtype)
    else:
      skip = _own_row(axis_name, n)
      out = _with_own_row(_decode_guarded(recv, fallback, m, x.dtype, skip), x.reshape(m), skip)
    out = out.reshape((n,) + x.shape)
    y = jnp.moveaxis(out, 0, ax)
    if tiled:
      shp = list(x.shape)
      shp[ax] *= n
      y = y.reshape(shp)
    return y

  return _cond_bits(fallback, raw, coded)


def _ag_vjp(x, axis_name, ax, tiled, to, C, transport, site, bwd_opts):
  @jax.custom_vjp
  def f(x):
    return _ag_impl(x, axis_name, ax, tiled, to, C, transport, site)

  def fwd(x):
    return f(x), None

  def bwd(_, g):
    if to == "invarying":
      n = _axis_size(axis_name, "all_gather")
      me = lax.axis_index(axis_name)
      g = _vary(g, _axes(axis_name))
      if tiled:
        size = g.shape[ax] // n
        return (lax.dynamic_slice_in_dim(g, me * size, size, axis=ax),)
      return (lax.dynamic_index_in_dim(g, me, axis=ax, keepdims=False),)
    comp, cap = bwd_opts
    return (psum_scatter(g, axis_name, scatter_dimension=ax, tiled=tiled, compress=comp,
                         capacity=_grad_capacity(cap, g.dtype), transport=transport,
                         name=site + "/bwd"),)

  f.defvjp(fwd, bwd)
  return f(x)


# --------------------------------------------------------------------------- #
# psum_scatter
# --------------------------------------------------------------------------- #

def psum_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False,
                 compress="auto", capacity=None, transport="auto", name=None):
  """Compressed :func:`jax.lax.psum_scatter` with a fixed float32 reduction order.

  Must be called inside ``jax.shard_map``. For bfloat16/float16/float32
  inputs, rank ``i`` returns chunk ``i`` of the sum over ranks, computed as::

    out = round_to_dtype(((f32(x_0[i]) + f32(x_1[i])) + ...) + f32(x_{n-1}[i]))

  with ``x_r[i]`` the ``i``-th chunk (along ``scatter_dimension``) of rank
  ``r``'s input: float32 additions in ascending rank order and one
  round-to-nearest-even at the end. ``compress=False``, ``'auto'`` and the
  overflow fallback compute exactly this too, so the result never depends on
  the transport. ``jax.lax.psum_scatter`` lets XLA choose order and precision;
  the two agree to within the rounding of the sum. Other dtypes call
  ``jax.lax.psum_scatter``.

  Args:
    x: array(s) with a mapped axis named ``axis_name``.
    axis_name: a mesh axis name, or a tuple of them.
    scatter_dimension: positional axis of ``x`` to scatter; its size must
      equal ``n`` (``tiled=False``) or be divisible by ``n`` (``tiled=True``).
    axis_index_groups: must be None.
    tiled: as in ``jax.lax.psum_scatter``.
    compress, capacity, transport, name: see the module docstring.

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
  api = "psum_scatter"
  _no_groups(axis_index_groups, api)
  cap_f, cap_b = _split_capacity(capacity)
  site = _call_site(api, name)

  def leaf(x, site):
    x = jnp.asarray(x)
    n = _axis_size(axis_name, api)
    if x.ndim == 0:
      raise ValueError(f"zipccl_jax.{api}: x must have at least one positional axis")
    sd = _canon(scatter_dimension, x.ndim, "scatter_dimension", api)
    _check_split(x, sd, "scatter_dimension", n, tiled, axis_name, api)
    m = x.size // n
    plan = _decide(api, x.dtype, m, n_chunks=n, axis_size=n, compress=compress, capacity=cap_f,
                   kind="gradient", site=site, axis_name=axis_name, transport=transport)
    raw_b = _sent_bytes("reduce-scatter", x.size * _itemsize(x), n)
    _record(site, api, x, n, plan, raw_b, _sent_bytes("all-to-all", n * plan.capacity, n))
    if np.dtype(x.dtype) not in CODED_DTYPES:
      return lax.psum_scatter(x, axis_name, scatter_dimension=sd, tiled=tiled)
    return _rs_vjp(x, axis_name, sd, tiled, plan.capacity if plan.compress else 0,
                   plan.transport or transport, site, (compress, cap_b))

  return _tree_apply(leaf, x, site)


def _reduce_scatter_rows(rows, axis_name, n, C, transport, site):
  """rows (n, m) -> this rank's fixed-order sum of row `me` over ranks, (m,)."""
  if C:
    skip = _own_row(axis_name, n)
    payload, nbytes, _ = _encode_rows(rows, C, skip)
    recv = _xchg_a2a(payload, nbytes, axis_name, n, C, transport)
    fallback = _any_overflow(recv, C)
    _count(site, fallback)
    got = _cond_bits(
        fallback,
        lambda: _fallback(lambda: _raw(lambda u: lax.all_to_all(u, axis_name, 0, 0, tiled=True),
                                       rows)),
        lambda: _with_own_row(_decode_guarded(recv, fallback, rows.shape[1], rows.dtype, skip),
                              rows, skip))
  else:
    got = _raw(lambda u: lax.all_to_all(u, axis_name, 0, 0, tiled=True), rows)
    _count(site, jnp.bool_(False))
  return _ordered_sum(got, rows.dtype)


def _rs_impl(x, axis_name, sd, tiled, C, transport, site):
  n = _axis_size(axis_name, "psum_scatter")
  x = _vary(x, _axes(axis_name))
  m = x.size // n
  k = x.shape[sd] // n
  rows = jnp.moveaxis(x, sd, 0).reshape(n, m)
  _observe(site, "psum_scatter", lambda: rows)
  red = _reduce_scatter_rows(rows, axis_name, n, C, transport, site)
  rest = x.shape[:sd] + x.shape[sd + 1:]
  y = jnp.moveaxis(red.reshape((k,) + rest), 0, sd)
  return y if tiled else jnp.squeeze(y, sd)


def _rs_vjp(x, axis_name, sd, tiled, C, transport, site, bwd_opts):
  @jax.custom_vjp
  def f(x):
    return _rs_impl(x, axis_name, sd, tiled, C, transport, site)

  def fwd(x):
    return f(x), None

  def bwd(_, g):
    comp, cap = bwd_opts
    return (all_gather(g, axis_name, axis=sd, tiled=tiled, compress=comp,
                       capacity=_grad_capacity(cap, g.dtype), transport=transport,
                       name=site + "/bwd"),)

  f.defvjp(fwd, bwd)
  return f(x)


# --------------------------------------------------------------------------- #
# psum
# --------------------------------------------------------------------------- #

def psum(x, axis_name, *, axis_index_groups=None, compress="auto", capacity=None,
         transport="auto", name=None):
  """Compressed :func:`jax.lax.psum` (all-reduce) with a fixed float32 order.

  Must be called inside ``jax.shard_map``. For bfloat16/float16/float32 it is
  a reduce-scatter followed by an all-gather, each compressed::

    flat = pad(x.reshape(-1), to a multiple of n)       # m = ceil(x.size / n)
    mine = psum_scatter(flat.reshape(n, m), axis_name)  # fixed-order f32 sum, rounded once
    out = all_gather(mine, axis_name)[:x.size].reshape(x.shape)

  so every element is ``round(((f32(x_0) + f32(x_1)) + ...) + f32(x_{n-1}))``
  (see :func:`psum_scatter`) and every rank holds the same bits. The wire
  carries ``n * C1`` bytes (all-to-all) plus ``C2`` bytes per sender
  (all-gather), about ``2 (n-1)/n`` times the coded size like a ring
  all-reduce. ``compress=False`` runs the same algorithm raw, so results are
  identical in all modes; ``jax.lax.psum`` may round differently. Other dtypes
  call ``jax.lax.psum``. Under ``check_vma`` the result is device-invariant
  like ``jax.lax.psum``'s, and the transpose is a (free) ``pcast``; without
  ``check_vma`` the transpose is this ``psum``.

  Args:
    x: array(s) with a mapped axis named ``axis_name``.
    axis_name: a mesh axis name, or a tuple of them.
    axis_index_groups: must be None.
    compress, capacity, transport, name: see the module docstring (both
      phases use the same options; the all-gather phase is always padded).

  Returns:
    Array(s) of ``x.shape``: the sum over ``axis_name``.

  Example, two devices::

    rank 0: x = [1, 2]     rank 1: x = [10, 20]
    phase 1: rank 0 keeps 1 + 10 = 11, rank 1 keeps 2 + 20 = 22 (frames of one element)
    phase 2: all_gather -> [11, 22] on both ranks
  """
  api = "psum"
  _no_groups(axis_index_groups, api)
  cap_f, cap_b = _split_capacity(capacity)
  site = _call_site(api, name)

  def leaf(x, site):
    x = jnp.asarray(x)
    n = _axis_size(axis_name, api)
    if np.dtype(x.dtype) not in CODED_DTYPES:
      if compress is True:
        _decide(api, x.dtype, x.size, n_chunks=n, axis_size=n, compress=compress,
                capacity=cap_f)  # raises the TypeError
      return lax.psum(x, axis_name)
    m = -(-x.size // n)
    plan = _decide(api, x.dtype, m, n_chunks=n + 1, axis_size=n, compress=compress,
                   capacity=cap_f, kind="gradient", site=site, axis_name=axis_name,
                   transport=transport)
    raw_b = _sent_bytes("all-reduce", x.size * _itemsize(x), n)
    _record(site, api, x, n, plan, raw_b,
            _sent_bytes("all-to-all", n * plan.capacity, n)
            + _sent_bytes("all-gather", plan.capacity, n))
    return _psum_vjp(x, axis_name, plan.capacity if plan.compress else 0,
                     plan.transport or transport, site, (compress, cap_b))

  return _tree_apply(leaf, x, site)


def _gather_rows(red, axis_name, n, C, transport, site, invariant):
  """red (m,) per rank -> (n, m), row s from rank s (padded transport when invariant)."""
  m = red.shape[0]

  def raw_gather(u):
    return lax.all_gather(u, axis_name, to="invarying" if invariant else "varying")

  if not C:
    return _raw(raw_gather, red)
  payload, nbytes, _ = _encode_rows(red.reshape(1, m), C)
  recv = _xchg_gather(payload[0], nbytes[0], axis_name, n, C, transport, invariant=invariant)
  fallback = _any_overflow(recv, C)
  _count(site, fallback)

  def raw():
    return _fallback(lambda: _raw(raw_gather, red))

  def coded():
    if invariant:  # the result must not depend on the rank: decode every row
      return _decode_guarded(recv, fallback, m, red.dtype)
    skip = _own_row(axis_name, n)
    return _with_own_row(_decode_guarded(recv, fallback, m, red.dtype, skip), red, skip)

  return _cond_bits(fallback, raw, coded)


def _psum_impl(x, axis_name, C, transport, site):
  n = _axis_size(axis_name, "psum")
  x = _vary(x, _axes(axis_name))
  N = x.size
  m = -(-N // n)
  flat = x.reshape(N)
  if n * m != N:
    flat = jnp.concatenate([flat, jnp.zeros((n * m - N,), x.dtype)])
  _observe(site, "psum", lambda: flat.reshape(n, m))
  red = _reduce_scatter_rows(flat.reshape(n, m), axis_name, n, C, transport, site)
  _observe(site + "/gather", "psum", lambda: red.reshape(1, m))
  invariant = _check_vma_on()
  got = _gather_rows(red, axis_name, n, C, transport, site + "/gather", invariant)
  return got.reshape(n * m)[:N].reshape(x.shape)


def _psum_vjp(x, axis_name, C, transport, site, bwd_opts):
  axes = _axes(axis_name)
  x = _vary(x, axes)

  @jax.custom_vjp
  def f(x):
    return _psum_impl(x, axis_name, C, transport, site)

  def fwd(x):
    return f(x), None

  def bwd(_, g):
    if _check_vma_on():
      return (_vary(g, axes),)
    comp, cap = bwd_opts
    return (psum(g, axis_name, compress=comp, capacity=_grad_capacity(cap, g.dtype),
                 transport=transport, name=site + "/bwd"),)

  f.defvjp(fwd, bwd)
  return f(x)


# --------------------------------------------------------------------------- #
# ppermute
# --------------------------------------------------------------------------- #

def _check_perm(perm, n, api):
  try:
    pairs = [(int(s), int(d)) for s, d in perm]
  except (TypeError, ValueError):
    raise TypeError(f"zipccl_jax.{api}: perm must be a sequence of (source, destination) int "
                    f"pairs, got {perm!r}") from None
  srcs = [s for s, _ in pairs]
  dsts = [d for _, d in pairs]
  for v in srcs + dsts:
    if not 0 <= v < n:
      raise ValueError(f"zipccl_jax.{api}: perm index {v} is out of range for an axis of "
                       f"size {n}")
  if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
    raise ValueError(f"zipccl_jax.{api}: perm has a repeated source or destination: {pairs}")
  return tuple(pairs)


def ppermute(x, axis_name, perm, *, compress="auto", capacity=None, transport="auto",
             name=None):
  """Compressed :func:`jax.lax.ppermute`: same signature, bit-identical result.

  Must be called inside ``jax.shard_map``.

  Args:
    x: array(s) with a mapped axis named ``axis_name``.
    axis_name: a mesh axis name, or a tuple of them.
    perm: ``(source_index, destination_index)`` pairs; no repeated source or
      destination. Ranks that are no destination receive zeros.
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
  api = "ppermute"
  cap_f, cap_b = _split_capacity(capacity)
  site = _call_site(api, name)

  def leaf(x, site):
    x = jnp.asarray(x)
    n = _axis_size(axis_name, api)
    pairs = _check_perm(perm, n, api)
    m = x.size
    plan = _decide(api, x.dtype, m, n_chunks=1, axis_size=n, compress=compress, capacity=cap_f,
                   site=site, axis_name=axis_name, transport=transport)
    if not pairs:
      plan = _Plan(False, reason="empty perm")
    raw_b = _sent_bytes("collective-permute", m * _itemsize(x), n)
    _record(site, api, x, n, plan, raw_b,
            _sent_bytes("collective-permute", plan.capacity, n) + _sent_bytes("all-reduce", 4, n))
    if np.dtype(x.dtype) not in CODED_DTYPES:
      return lax.ppermute(x, axis_name, pairs)
    return _pp_vjp(x, axis_name, pairs, plan.capacity if plan.compress else 0,
                   plan.transport or transport, site, (compress, cap_b))

  return _tree_apply(leaf, x, site)


def _pp_impl(x, axis_name, perm, C, transport, site):
  n = _axis_size(axis_name, "ppermute")
  axes = _axes(axis_name)
  x = _vary(x, axes)
  _observe(site, "ppermute", lambda: x.reshape(1, x.size))
  if not C:
    _count(site, jnp.bool_(False))
    return _raw(lambda u: lax.ppermute(u, axis_name, perm), x)
  m = x.size
  payload, nbytes, over = _encode_rows(x.reshape(1, m), C)
  # XLA lowers a ppermute over one axis of a multi-axis mesh to one collective-permute that every
  # device joins, so the fallback decision must agree across all manual axes, not just axis_name.
  flag_axes = _manual_axes(axis_name)
  any_over = lax.psum(_vary(over.astype(jnp.int32), flag_axes), flag_axes) > 0
  recv = _xchg_permute(payload[0], nbytes[0], axis_name, n, perm, C, transport)
  _count(site, any_over)
  receivers = np.zeros((n,), bool)
  for _, d in perm:
    receivers[d] = True

  def raw():
    return _fallback(lambda: _raw(lambda u: lax.ppermute(u, axis_name, perm), x))

  def coded():
    def dec():
      return _decode_guarded(recv[None], any_over, m, x.dtype).reshape(x.shape)
    if receivers.all():
      return dec()
    is_recv = jnp.asarray(receivers)[lax.axis_index(axis_name)]
    return _cond_bits(is_recv, dec, lambda: _vary(jnp.zeros(x.shape, x.dtype), axes))

  return _cond_bits(any_over, raw, coded)


def _pp_vjp(x, axis_name, perm, C, transport, site, bwd_opts):
  @jax.custom_vjp
  def f(x):
    return _pp_impl(x, axis_name, perm, C, transport, site)

  def fwd(x):
    return f(x), None

  def bwd(_, g):
    comp, cap = bwd_opts
    inv = tuple((d, s) for s, d in perm)
    return (ppermute(g, axis_name, inv, compress=comp, capacity=_grad_capacity(cap, g.dtype),
                     transport=transport, name=site + "/bwd"),)

  f.defvjp(fwd, bwd)
  return f(x)


# --------------------------------------------------------------------------- #
# Strategy layer re-exports (zipccl_jax/__init__ star-imports this module)
# --------------------------------------------------------------------------- #

from zipccl_jax.strategy import (  # noqa: E402
    Profile, calibrate, decisions, explain, get_profile, load_profile, observe, set_profile,
    use_profile)
