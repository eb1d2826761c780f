"""What compression buys on a cluster, predicted on paper: the strategy's own cost model, at scale.

    python -m zipccl_jax.model --hosts 16 --per-host 8 --intra 450GB/s --inter 400Gbit/s \
        --workload moe_dispatch --bytes 64MiB --json out.json --png out.png

A :class:`Topology` (hosts of ``per_host`` devices; the link between hosts and the one inside a host,
each per device; the codec's speed on the device kind) becomes a :class:`~zipccl_jax.Profile`, and
every prediction is a call of the functions ``compress="auto"`` decides with:
:func:`zipccl_jax.strategy.decision.decide` for a collective over one level, and
:func:`zipccl_jax.strategy.levels.choose` over two. So what is predicted to run is what would run for
that profile and call, and a prediction never disagrees with a decision (``tests/test_model.py``).

The mesh of a topology is ``("host", "local")`` (``H x L`` devices); with one device per host the
axis is ``"host"``, with one host ``"local"``. Its links, per device and per collective:

===============  ===========================================================================
axis             link model (``t = latency + bytes one device sends / bandwidth``)
===============  ===========================================================================
``host``         ``--inter``: one device's share of the network between hosts (a rail: every
                 device its own NIC); ``--shared-link host``: the ``L`` devices of a host share
                 its link (``bandwidth / L`` each: one NIC per host; the two-level CPU testbed's
                 shaped link per host); ``--shared-link``: all ``n`` devices share one link
                 (``bandwidth / n``: the flat CPU testbed's one shaped loopback, ``L = 1``)
``local``        ``--intra`` (NVLink: the rate one GPU sends at, one direction: 450 GB/s on an
                 H100)
``host,local``   the flat collective over both: of the bytes a device sends, the rows for other
                 hosts cross at the inter rate while the rows for its own host move at the intra
                 rate, at once (all_to_all and the reductions built on it: ``(n - L)`` of ``n - 1``
                 rows cross); a flat all_gather (and jax.lax's reductions) is a ring: each of its
                 edges carries ``n - 1`` shards, the edge out of a host through the ``L`` devices'
                 inter links together (one ring per link, a 1/L slice each), so it runs at
                 ``min(L x inter, intra)`` per device; levels a profile measured (``points``)
                 compose their curves, not their slopes (`links.flat_links`)
===============  ===========================================================================

A level given per collective (``{"all_to_all": ..., "all_gather": ..., "*": ...}``, what
:func:`zipccl_jax.calibrate` measures per level) costs each collective with its own link, and the
flat collectives compose the levels' links of their kind; a ``"stream"`` entry, where given, is the
rate a flat collective's crossings reach on the level (`links.stream_link`): the flat ring's edge
and the flat all_to_all's crossings use it.

Every collective pays the slower level's latency once (one launch; per-message costs inside a
collective are not modelled). A training step is its collectives, one after another, plus
``--compute-ms`` of work that does not overlap them (0: the step's communication alone).

What is assumed, not measured, is labelled as such in every result (``assumptions``).

From Python::

  from zipccl_jax import model
  from zipccl_jax.strategy.links import LinkModel

  top = model.Topology(16, 8, inter=LinkModel(15e-6, model.parse_rate("400Gbit/s")),
                       intra=LinkModel(5e-6, model.parse_rate("450GB/s")))
  res = model.predict_step(top, model.workload("moe_dispatch", 64 << 20, top.devices))
  res["auto_choice"]          # the step variant compress="auto" runs
  res["calls"][0]["variants"]  # [{"name": "raw", "time_s": ..., "speedup_vs_raw": 1.0}, ...]
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np

from zipccl_jax.strategy import levels as two_level
from zipccl_jax.capacity import CODED_DTYPES
from zipccl_jax.strategy.codec_cost import DEFAULT_CODEC, DEFAULT_CODEC_SOURCE
from zipccl_jax.strategy.decision import decide
from zipccl_jax.strategy.links import LinkModel, flat_links
from zipccl_jax.strategy.profile import Profile, get_profile, np_dtype, platform_key

__all__ = ["Topology", "Call", "WORKLOADS", "workload", "predict_call", "predict_step", "crossover",
           "assumptions", "sweep", "parse_rate", "parse_bytes"]


SLOW, FAST = "host", "local"
OPS = ("all_to_all", "all_gather", "psum_scatter", "psum", "ppermute")


# --------------------------------------------------------------------------- #
# Units
# --------------------------------------------------------------------------- #


_RATE_UNITS = {"b/s": 1 / 8, "bit/s": 1 / 8, "bps": 1 / 8, "B/s": 1.0, "Bps": 1.0}
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}  # either case: no rate is in milli-units

_SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20,
               "GiB": 2**30}

_NUMBER = r"((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)"


def parse_rate(text: str) -> float:
  """Bytes per second of a rate such as ``"400Gbit/s"``, ``"400Gb/s"``, ``"900GB/s"``, ``"100Gbps"``
  (bits: ``b``, ``bit``, ``bps``; bytes: ``B``, ``Bps``; the prefix k, M, G or T in either case)."""
  m = re.fullmatch(rf"\s*{_NUMBER}\s*([kKmMgGtT]?)(b/s|bit/s|bps|B/s|Bps)\s*", str(text))
  if not m:
    raise ValueError(f"zipccl_jax.model: a rate is a number, a prefix (k, M, G, T) and a unit (bit/s, "
                     f"b/s, bps or B/s), e.g. 400Gbit/s or 900GB/s; got {text!r}")
  v = float(m.group(1)) * _PREFIX[m.group(2).lower()] * _RATE_UNITS[m.group(3)]
  if not 0 < v < math.inf:
    raise ValueError(f"zipccl_jax.model: a rate must be > 0 and finite, got {text!r}")
  return v


def parse_bytes(text: str) -> int:
  """Bytes of a size such as ``"64MiB"``, ``"5MB"`` or ``"4096"``."""
  m = re.fullmatch(rf"\s*{_NUMBER}\s*([KMG]i?B|B)?\s*", str(text))
  v = float(m.group(1)) * _SIZE_UNITS[m.group(2) or "B"] if m else math.nan
  if not math.isfinite(v):
    raise ValueError(f"zipccl_jax.model: a size is a number and a unit (B, KB, MB, GB, KiB, MiB, "
                     f"GiB), e.g. 64MiB; got {text!r}")
  v = int(v)
  if v <= 0:
    raise ValueError(f"zipccl_jax.model: a size must be > 0, got {text!r}")
  return v


def _gbit(bps: float) -> float:
  return bps * 8 / 1e9


# --------------------------------------------------------------------------- #
# The topology and its profile
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class Topology:
  """A cluster of ``hosts`` x ``per_host`` devices.

  Attributes:
    hosts, per_host: the mesh ``("host", "local")``.
    inter: the link between hosts, per device (``LinkModel``: latency s, bandwidth bytes/s), or
      its links per collective, ``{"all_to_all": LinkModel, "all_gather": ..., "*": ...}`` as a
      calibrated profile holds a level's (``Profile.links["host"]``: a level's all_gather can run
      at another rate than its all_to_all); ``"*"`` costs the collectives without an entry.
    intra: the link inside a host, per device, or its links per collective (None with
      ``per_host == 1``).
    platform: the device kind whose codec model applies ("gpu", "cpu", "tpu").
    codec: ``{dtype name: CodecModel}`` overriding the base profile's for `platform`, or None.
    shared_link: False; "host" (or ``--shared-link host``): the devices of a host share its `inter`
      link (each sends at ``bandwidth / per_host``); "all" (or True): every device shares one
      (``bandwidth / devices``; only with ``per_host == 1``, the flat CPU testbed's loopback).
    base: the profile the rest comes from (codec, ratios, min_gain, fallback risk); None: the
      active one (:func:`zipccl_jax.get_profile`: calibrated, ``$ZIPCCL_PROFILE``, or defaults).
    link_source: where `inter` and `intra` come from (reported in ``assumptions``).
  """
  hosts: int
  per_host: int
  inter: LinkModel
  intra: LinkModel | None = None
  platform: str = "gpu"
  codec: dict | None = None
  shared_link: bool | str = False
  base: Profile | None = None
  link_source: str = "given"

  def __post_init__(self):
    if int(self.hosts) < 1 or int(self.per_host) < 1:
      raise ValueError(f"zipccl_jax.model: hosts and per_host must be >= 1, got {self.hosts} x "
                       f"{self.per_host}")
    if self.per_host > 1 and self.intra is None:
      raise ValueError("zipccl_jax.model: per_host > 1 needs the link inside a host (intra)")
    if self.hosts * self.per_host < 2:
      raise ValueError("zipccl_jax.model: a collective needs at least 2 devices")
    share = {True: "all"}.get(self.shared_link, self.shared_link or False)
    if share not in (False, "all", "host") or (share == "all" and self.per_host > 1):
      raise ValueError(f"zipccl_jax.model: shared_link is False, 'host' (a host's devices share its "
                       f"link) or 'all' (every device shares one; per_host 1 only), got "
                       f"{self.shared_link!r} with per_host {self.per_host}")
    object.__setattr__(self, "shared_link", share)
    for name in ("inter", "intra"):
      link = getattr(self, name)
      if isinstance(link, dict) and not isinstance(link.get("*"), LinkModel):
        raise ValueError(f"zipccl_jax.model: {name} per collective needs a '*' LinkModel (the "
                         f"collectives without their own), got keys {sorted(link)}")

  @property
  def devices(self) -> int:
    return self.hosts * self.per_host

  @property
  def axis(self):
    """The mesh axis a collective over every device names."""
    if self.per_host == 1:
      return SLOW
    return FAST if self.hosts == 1 else (SLOW, FAST)

  def level_links(self) -> tuple[LinkModel, LinkModel | None]:
    """(inter, intra) per device, each the level's ``"*"`` link: a shared link divided among the
    devices that share it."""
    inter, intra = self._level_tables()
    return inter["*"], intra["*"] if intra else None

  def _level_tables(self) -> tuple[dict, dict | None]:
    """(inter, intra) per device as ``{collective: LinkModel}``, the shared link divided."""
    share = {"host": self.per_host, "all": self.devices}.get(self.shared_link, 1)
    inter = dict(self.inter) if isinstance(self.inter, dict) else {"*": self.inter}
    if share != 1:
      inter = {op: LinkModel(lk.latency_s, lk.bandwidth_Bps / share) for op, lk in inter.items()}
    if self.intra is None:
      return inter, None
    return inter, dict(self.intra) if isinstance(self.intra, dict) else {"*": self.intra}

  def profile(self) -> Profile:
    """The profile of this topology: the base profile's codec, ratios and thresholds, with the
    links above (docstring table) and the codec overrides."""
    p = (self.base if self.base is not None else get_profile()).copy()
    p.sites = {}  # observed capacities belong to another program's call sites
    inter, intra = self._level_tables()
    H, L = self.hosts, self.per_host
    p.links = {}
    if H > 1:
      p.links[SLOW] = inter
    if L > 1:
      p.links[FAST] = intra
    if H > 1 and L > 1:
      p.links[f"{SLOW},{FAST}"] = flat_links(H, L, inter, intra)
    plat = platform_key(self.platform)
    if self.codec:  # given rates are no in-situ scaling of calibrate's
      p.codec = {**p.codec, plat: {**p.codec.get(plat, {}), **self.codec}}
      p.codec_in_situ = {k: v for k, v in p.codec_in_situ.items() if k != plat}
    p.platform = plat
    p.meta = {"topology": self.describe()}
    return p

  def describe(self) -> dict:
    inter, intra = self.level_links()
    return {"hosts": self.hosts, "per_host": self.per_host, "devices": self.devices,
            "platform": platform_key(self.platform), "shared_link": self.shared_link,
            "inter_Gbit_s": _gbit(inter.bandwidth_Bps), "inter_latency_us": inter.latency_s * 1e6,
            "intra_GB_s": intra.bandwidth_Bps / 1e9 if intra else None,
            "intra_latency_us": intra.latency_s * 1e6 if intra else None}

  def with_inter(self, bandwidth_Bps: float) -> "Topology":
    """This topology with one line between hosts, at `bandwidth_Bps` (the latency of `inter`'s
    ``"*"``; links per collective become that one)."""
    star = self.inter["*"] if isinstance(self.inter, dict) else self.inter
    return dataclasses.replace(self, inter=LinkModel(star.latency_s, float(bandwidth_Bps)))


# --------------------------------------------------------------------------- #
# Workloads
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class Call:
  """One collective of a step: ``op`` on a per-device operand of ``nbytes`` bytes of ``dtype``,
  ``calls`` times per step, with the data statistics of ``role`` ("activation" or "gradient");
  ``capacity`` as the collectives' ``capacity=`` (None: the profile's ratio)."""
  name: str
  op: str
  nbytes: int
  dtype: str = "bfloat16"
  role: str = "activation"
  calls: int = 1
  capacity: int | float | None = None

  def __post_init__(self):
    if self.op not in OPS:
      raise ValueError(f"zipccl_jax.model: op must be one of {OPS}, got {self.op!r}")
    if self.role not in ("activation", "gradient"):
      raise ValueError(f"zipccl_jax.model: role must be 'activation' or 'gradient', got {self.role!r}")
    for field in ("nbytes", "calls"):
      v = getattr(self, field)
      if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not v >= 1 \
          or v == float("inf"):
        raise ValueError(f"zipccl_jax.model: {field} must be a number >= 1, got {v!r} ({self.name})")
    try:
      np_dtype(self.dtype)
    except TypeError:
      raise ValueError(f"zipccl_jax.model: dtype must name a numpy or ml_dtypes type, got "
                       f"{self.dtype!r} ({self.name})") from None


def _moe_dispatch(nbytes: int, dtype: str, layers: int) -> list[Call]:
  # per MoE layer: dispatch and combine forward; their transposes (all_to_all's) backward
  return [Call("dispatch", "all_to_all", nbytes, dtype, "activation", layers),
          Call("combine", "all_to_all", nbytes, dtype, "activation", layers),
          Call("combine grad", "all_to_all", nbytes, dtype, "gradient", layers),
          Call("dispatch grad", "all_to_all", nbytes, dtype, "gradient", layers)]


def _fsdp(nbytes: int, dtype: str, layers: int, n: int) -> list[Call]:
  # `nbytes`: one layer's parameters, gathered; each device holds 1/n of them
  shard = max(1, nbytes // n)
  return [Call("params (forward)", "all_gather", shard, dtype, "activation", layers),
          Call("params (backward)", "all_gather", shard, dtype, "activation", layers),
          Call("grads", "psum_scatter", nbytes, dtype, "gradient", layers)]


def _ddp(nbytes: int, dtype: str, layers: int) -> list[Call]:
  # `nbytes`: one layer's gradients, every device's whole copy, summed over every device
  return [Call("grads", "psum", nbytes, dtype, "gradient", layers)]


WORKLOADS = {
    "moe_dispatch": "MoE expert parallelism: per layer, dispatch and combine all_to_all of --bytes "
                    "per device, forward and backward",
    "fsdp": "dense FSDP: per layer, all_gather of the parameters (--bytes gathered) forward and "
            "backward, psum_scatter of the gradients",
    "ddp": "data parallelism: per layer, psum of the gradients (--bytes per device)",
}


def workload(name: str, nbytes: int, devices: int, *, dtype: str = "bfloat16",
             layers: int = 1) -> list[Call]:
  """The calls of a named workload (:data:`WORKLOADS`) or of a JSON file: a list of
  ``{"name", "op", "nbytes", "dtype", "role", "calls"}`` (bytes of one device's operand)."""
  if name == "moe_dispatch":
    return _moe_dispatch(nbytes, dtype, layers)
  if name == "fsdp":
    return _fsdp(nbytes, dtype, layers, devices)
  if name == "ddp":
    return _ddp(nbytes, dtype, layers)
  if name.endswith(".json"):
    return _workload_file(name)
  raise ValueError(f"zipccl_jax.model: workload must be one of {sorted(WORKLOADS)} or a .json "
                   f"file, got {name!r}")


def _workload_file(path: str) -> list[Call]:
  """The calls of a JSON workload file; ValueError naming the file for anything that is not a
  non-empty list of call objects (`workload`'s docstring) or not JSON at all."""
  try:
    with open(path) as f:
      rows = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"zipccl_jax.model: workload {path}: not JSON ({e})") from None
  if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
    raise ValueError(f"zipccl_jax.model: workload {path}: a non-empty JSON list of calls, each an "
                     f"object with name, op and nbytes (and dtype, role, calls), got "
                     f"{json.dumps(rows)[:60]}")
  try:
    return [Call(**r) for r in rows]
  except (TypeError, ValueError) as e:  # a key Call does not have or needs, or a bad value
    raise ValueError(f"zipccl_jax.model: workload {path}: {e}") from None


# --------------------------------------------------------------------------- #
# Predictions
# --------------------------------------------------------------------------- #


def _elems(call: Call, n: int) -> tuple[np.dtype, int, int]:
  """(dtype, operand elements, chunk elements: one coded frame) of `call` over `n` devices."""
  dt = np.dtype(np_dtype(call.dtype))
  m = max(1, int(call.nbytes) // dt.itemsize)
  if call.op in ("all_to_all", "psum_scatter"):
    m = max(n, m - m % n)  # split into n equal chunks
    return dt, m, m // n
  if call.op == "psum":
    return dt, m, -(-m // n)
  return dt, m, m


def _variant(name: str, t: float, raw: float, **kw) -> dict:
  return {"name": name, "time_s": float(t), "speedup_vs_raw": float(raw / t) if t > 0 else math.inf,
          **kw}


# zipccl's fixed-order reductions run raw (fixed_order=True): an all-to-all and a float32 sum in
# rank order, whose bits never depend on the decision; raw is otherwise jax.lax's ring
_REDUCTIONS = {"psum_scatter": "raw fixed-order a2a-sum (zipccl, fixed_order=True)",
               "psum": "raw fixed-order a2a-sum+gather (zipccl, fixed_order=True)"}


def predict_call(top: Topology, call: Call, *, profile: Profile | None = None,
                 fixed_order: bool = False) -> dict:
  """Variants (raw: the jax.lax call; for reductions zipccl's fixed-order raw too; flat
  compressed with 1 and the model's K pieces; hierarchical per level compression) and
  ``auto_choice``, the variant ``compress="auto"`` runs, for one call (`fixed_order`: as the
  reductions' argument, raw then being zipccl's fixed-order program)."""
  prof = profile if profile is not None else top.profile()
  plat, n, axis = prof.platform, top.devices, top.axis
  dt, m, chunk = _elems(call, n)
  kw = dict(axis_size=n, axis_name=axis, role=call.role, profile=prof, platform=plat, log=False,
            message_elems=m if call.op == "psum" else None, capacity=call.capacity)
  t_raw = decide(call.op, dt, chunk, compress=False, **kw).est_raw_s  # jax.lax's call
  own_raw = decide(call.op, dt, chunk, compress=False, fixed_order=True, **kw).est_raw_s
  variants = [_variant("raw", t_raw, t_raw, pieces=1, compressed=False, program="jax.lax")]
  if call.op in _REDUCTIONS:  # zipccl's fixed-order raw reduction is not jax.lax's ring
    variants.append(_variant(_REDUCTIONS[call.op], own_raw, t_raw, pieces=1, compressed=False))
  if dt in CODED_DTYPES:
    for k in sorted({1, decide(call.op, dt, chunk, compress=True, **kw).pieces}):
      d = decide(call.op, dt, chunk, compress=True, pieces=k, **kw)
      variants.append(_variant(f"flat compressed K={d.pieces}", d.est_compressed_s, t_raw,
                               pieces=d.pieces, compressed=True, transport=d.transport,
                               wire_bytes=d.wire_bytes, raw_bytes=d.raw_bytes))
  levels = two_level.levels_of(axis, prof) if isinstance(axis, tuple) else None
  lp = None
  if (levels is not None and call.op in two_level.OPS and dt in CODED_DTYPES
      and not isinstance(call.capacity, int)):  # as two_level.plan: else the flat path runs
    lp = two_level.choose(call.op, dt, m, axis, levels, (top.hosts, top.per_host), "auto",
                             call.role, profile=prof, platform=plat, fixed_order=fixed_order)
    for name, t in lp.candidates:
      if name.startswith("hierarchical"):
        variants.append(_variant(name, t, t_raw, compressed="compressed" in name))
  # the flat path decides with the plan's flat estimates, as a run does (`_recipe`)
  auto = decide(call.op, dt, chunk, compress="auto", fixed_order=fixed_order,
                flat_est=lp.flat_estimates() if lp is not None else None, **kw)
  choice = (f"flat compressed K={auto.pieces}" if auto.compress
            else _REDUCTIONS.get(call.op, "raw") if fixed_order else "raw")
  why = auto.reason
  if lp is not None:
    if lp.algorithm == "hierarchical":
      choice = next(name for name, _ in lp.candidates if name.startswith("hierarchical"))
    why = lp.reason + "; flat: " + auto.reason
  if not any(v["name"] == choice for v in variants):  # K pinned away from the listed ones
    variants.append(_variant(choice, auto.est_compressed_s, t_raw, pieces=auto.pieces,
                             compressed=True))
  t_auto = next(v["time_s"] for v in variants if v["name"] == choice)
  return {"name": call.name, "op": call.op, "dtype": dt.name, "role": call.role, "calls": call.calls,
          "operand_bytes": int(m * dt.itemsize), "chunk_elems": int(chunk),
          "variants": variants, "auto_choice": choice,
          "auto_time_s": t_auto, "raw_time_s": t_raw, "zipccl_raw_time_s": own_raw, "reason": why}


def _auto_compresses(top: Topology, call: Call) -> bool:
  r = predict_call(top, call)
  return bool(next(v for v in r["variants"] if v["name"] == r["auto_choice"])["compressed"])


def crossover(top: Topology, call: Call, lo: float = 1e7, hi: float = 1e13) -> float | None:
  """The inter-host bandwidth (bytes/s, as `top.inter`: per device, or the shared link's with
  ``shared_link``) below which ``compress="auto"`` runs a compressed variant of `call` (log-scale
  bisection between `lo` and `hi`); None when it does at neither end or at both (then no single
  crossover in the range)."""
  a, b = _auto_compresses(top.with_inter(lo), call), _auto_compresses(top.with_inter(hi), call)
  if a == b:
    return None
  for _ in range(40):  # to ~0.1% in log space
    mid = math.sqrt(lo * hi)
    if _auto_compresses(top.with_inter(mid), call) == a:
      lo = mid
    else:
      hi = mid
  return math.sqrt(lo * hi)


_BEST_K = "flat compressed, model's K"


def _step_key(name: str, best_k: str | None) -> str:
  """The step variant a call's variant adds to: its own name, except that each call's K (calls of
  other sizes pick other K) is one step variant and zipccl's raw reductions are "zipccl raw"."""
  if name in _REDUCTIONS.values():
    return "zipccl raw"
  return _BEST_K if name == best_k else name


def predict_step(top: Topology, calls: list[Call], *, compute_s: float = 0.0,
                 crossovers: bool = True) -> dict:
  """Every call's prediction and the step's: per variant, every call run that way (a variant some
  call lacks is left out), plus ``auto`` (each call as ``compress="auto"`` runs it), each plus
  `compute_s` of work the collectives do not overlap. ``auto_choice`` names the step variant ``auto``
  equals when every call chose alike, else ``"auto"``."""
  prof = top.profile()
  rows = [predict_call(top, c, profile=prof) for c in calls]
  totals, auto_keys = {}, set()
  for r, c in zip(rows, calls):
    flat = [v for v in r["variants"] if v["name"].startswith("flat compressed K=")]
    best_k = max(flat, key=lambda v: v["pieces"])["name"] if flat else None
    keys = {_step_key(v["name"], best_k): v["time_s"] for v in r["variants"]}
    keys["zipccl raw"] = r["zipccl_raw_time_s"]
    if best_k == "flat compressed K=1":
      keys["flat compressed K=1"] = keys[_BEST_K]
    auto_keys.add(_step_key(r["auto_choice"], best_k))
    for k, t in keys.items():
      totals.setdefault(k, []).append(c.calls * t)
    if crossovers:
      x = crossover(top, c)
      r["crossover_inter_Gbit_s"] = _gbit(x) if x is not None else None
  if sum(totals["zipccl raw"]) == sum(totals["raw"]):
    del totals["zipccl raw"]  # no reduction: zipccl's raw programs are jax.lax's collectives
  raw = compute_s + sum(totals["raw"])
  step = [_variant(k, compute_s + sum(ts), raw) for k, ts in totals.items() if len(ts) == len(rows)]
  step.append(_variant("auto", compute_s + sum(c.calls * r["auto_time_s"] for r, c in zip(rows, calls)),
                       raw))
  choice = auto_keys.pop() if len(auto_keys) == 1 else "auto"
  if choice not in {v["name"] for v in step}:
    choice = "auto"
  return {"topology": top.describe(), "assumptions": assumptions(top, prof, calls),
          "calls": rows, "step": {"compute_s": compute_s, "variants": step},
          "variants": step, "auto_choice": choice}


def _codec_source(table: str, dt: np.dtype) -> str:
  return (DEFAULT_CODEC_SOURCE[table][dt.name] + " (strategy.codec_cost.DEFAULT_CODEC"
          + ("; the H200's rates, whatever the GPU)" if table == "gpu" else ")"))


def assumptions(top: Topology, prof: Profile, calls: list[Call]) -> dict:
  """What the prediction rests on, each with where it comes from."""
  plat = prof.platform
  codec = {}
  for name in sorted({c.dtype for c in calls}):
    dt = np.dtype(np_dtype(name))
    if dt not in CODED_DTYPES:
      continue
    cm, src = prof.codec_model(dt, plat)
    if top.codec and dt.name in top.codec:  # --codec: a documented table's rates, or given ones
      table = next((p for p, tab in DEFAULT_CODEC.items() if tab.get(dt.name) is cm), None)
      src = f"given (--codec {table}): {_codec_source(table, dt)}" if table else "given (--codec)"
    elif src.startswith("default"):
      src = _codec_source(plat if plat in DEFAULT_CODEC else "cpu", dt)  # codec_model's fallback
    else:
      src = f"calibrated profile ({src})"
    codec[name] = {"encode_GB_s": cm.encode_Bps / 1e9, "decode_GB_s": cm.decode_Bps / 1e9,
                   "overhead_us": (cm.encode_overhead_s + cm.decode_overhead_s) * 1e6,
                   # the mixed slot exchange's own-row passes; None: not measured, costed as nothing
                   "slot_GB_s": cm.slot_Bps / 1e9 if cm.slot_Bps > 0 else None,
                   "source": src}
  return {"codec": codec,
          "capacity_ratio": {c.name: prof.ratio("capacity_ratio", c.role, np.dtype(np_dtype(c.dtype)))
                             for c in calls if np.dtype(np_dtype(c.dtype)) in CODED_DTYPES},
          "min_gain": prof.min_gain, "fallback_risk": prof.fallback_risk,
          "links": f"per device, {top.link_source}; flat collectives over both levels: "
                   "zipccl_jax.model docstring; no overlap of compute and communication",
          "levels": "the two-level programs run over mesh axes (host, local), or for all_gather, "
                    "psum_scatter, all_to_all and psum (check_vma=False) over one axis across "
                    "hosts declared with zipccl_jax.use_levels; psum's is psum_scatter's then "
                    "all_gather's"}


def sweep(top: Topology, calls: list[Call], scales, rates_Bps, *, compute_s: float = 0.0) -> dict:
  """``{devices: [(inter Gbit/s, step speedup of auto over raw), ...]}``: per scale (devices,
  keeping `top`'s devices per host) the step's speedup against the inter-host bandwidth."""
  out = {}
  for devices in scales:
    L = min(top.per_host, int(devices))
    H = max(1, int(devices) // L)
    t = dataclasses.replace(top, hosts=H, per_host=L)
    cs = [dataclasses.replace(c, nbytes=_rescale(c, top.devices, t.devices)) for c in calls]
    pts = []
    for bw in rates_Bps:
      step = predict_step(t.with_inter(bw), cs, compute_s=compute_s, crossovers=False)["step"]
      pts.append((_gbit(bw), next(v["speedup_vs_raw"] for v in step["variants"] if v["name"] == "auto")))
    out[t.devices] = pts
  return out


def _rescale(call: Call, n0: int, n1: int) -> int:
  """A call's operand at another scale: all_gather shards of the same gathered size shrink as the
  devices grow; every other operand (a device's tokens, its gradients) stays."""
  if call.op == "all_gather":
    return max(1, call.nbytes * n0 // n1)
  return call.nbytes
