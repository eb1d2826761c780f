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
           + extra latencies (ppermute's 4-byte overflow psum, ragged size exchanges)
           + fallback_risk * t_raw

=============  ======================  ===========================  ===========================
op             phases (raw = coded)    encode bytes                 decode bytes
=============  ======================  ===========================  ===========================
all_to_all     all_to_all n*chunk      n*chunk                      n*chunk
psum_scatter   all_to_all n*chunk      n*chunk                      n*chunk
all_gather     all_gather chunk        chunk                        n*chunk
psum           all_to_all n*chunk,     (n+1)*chunk                  2n*chunk
               all_gather chunk
ppermute       ppermute chunk          chunk                        chunk
=============  ======================  ===========================  ===========================

The padded transport's wire chunk is the capacity ``C``; the ragged one's is
the expected frame size ``32 + expected_ratio * raw + 64 * blocks`` (capped at
``C``), plus one size-exchange latency per phase. The reductions run the same
fixed-order algorithm raw and compressed (an all-to-all, a float32 sum in
rank order, an all-gather for ``psum``), which is the only algorithm
collectives.py has, so the result bits never depend on the decision.

The call is compressed when ``t_comp * (1 + min_gain) < t_raw`` (and the
capacity saves bytes, the axis has more than one rank, and the dtype is coded).
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
:func:`calibrate` measures a profile; :func:`set_profile`,
:func:`use_profile`, :func:`load_profile` and the ``ZIPCCL_PROFILE``
environment variable (a JSON path read at first use) make one active. With no
profile, these documented defaults apply (:data:`DEFAULT_LINKS`,
:data:`DEFAULT_CODEC`, ratios from ``zipccl_jax.collectives.EXPECTED_RATIO``):

==========  ======================  ===========================================
platform    link (per device)       codec (per device)
==========  ======================  ===========================================
cpu         1 Gbit/s (0.125 GB/s),  bf16/f16: encode 1.0 GB/s, decode 1.5 GB/s,
            100 us latency          f32: 1.5 / 2.0 GB/s; 30 us overhead per side
gpu / tpu   25 GB/s, 15 us          400 GB/s each way, 10 us overhead per side
==========  ======================  ===========================================

The CPU defaults describe the deployment zipccl targets (hosts joined by a
slow network: DESIGN.md's 1 Gbit/s reference link), not the virtual devices of
a single process, whose "link" is a memcpy: calibrate there and ``auto``
stays raw.

Decisions are static per trace: after changing the profile, trace again (a new
``jax.jit``, or ``jax.clear_caches()``) for it to take effect.

Introspection
-------------
Each decision is logged at DEBUG level on the ``zipccl_jax.strategy`` logger::

  zipccl all_to_all site=a2a@model.py:12: compressed (est 1.230 ms vs raw 1.610 ms; ratio 0.70, bw 0.125 GB/s)

and kept in a log: :func:`decisions` (site -> :class:`Decision`) and
:func:`explain` (a table, or one site's reasoning).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import math
import os
import statistics
import threading
import time
from typing import Iterable

import numpy as np

__all__ = [
    "Profile", "LinkModel", "CodecModel", "SiteObservation", "Decision",
    "calibrate", "decide", "explain", "decisions", "reset_decisions",
    "get_profile", "set_profile", "use_profile", "load_profile", "observe",
    "DEFAULT_LINKS", "DEFAULT_CODEC",
]

_LOG = logging.getLogger("zipccl_jax.strategy")

PROFILE_VERSION = 1
HEADER_BYTES = 32
_PER_BLOCK_BYTES = 64      # padded_capacity's per-64K-element slack
_BLOCK_ELEMS = 65536

_DTYPE_NAMES = ("bfloat16", "float16", "float32")

# --------------------------------------------------------------------------- #
# Models
# --------------------------------------------------------------------------- #


@dataclasses.dataclass
class LinkModel:
  """``time(sent_bytes) = latency_s + sent_bytes / bandwidth_Bps`` for one collective.

  ``sent_bytes`` counts the bytes one device sends (the model of
  :func:`zipccl_jax.hlo_wire_bytes`), so ``bandwidth_Bps`` is a per-device rate.
  """
  latency_s: float
  bandwidth_Bps: float

  def time(self, sent_bytes: float) -> float:
    return self.latency_s + float(sent_bytes) / self.bandwidth_Bps


@dataclasses.dataclass
class CodecModel:
  """Per-device codec speed: ``t = overhead + bytes / throughput`` per side.

  Bytes are the raw (uncompressed) bytes encoded or decoded. The overheads
  cover the per-call fixed costs of the coded path (FFI launch, header check,
  branch).
  """
  encode_Bps: float
  decode_Bps: float
  encode_overhead_s: float = 0.0
  decode_overhead_s: float = 0.0

  def encode_time(self, nbytes: float) -> float:
    return self.encode_overhead_s + float(nbytes) / self.encode_Bps

  def decode_time(self, nbytes: float) -> float:
    return self.decode_overhead_s + float(nbytes) / self.decode_Bps


@dataclasses.dataclass
class SiteObservation:
  """Frame sizes observed at one call site (see :func:`observe`)."""
  op: str
  dtype: str
  chunk_elems: int
  max_frame_bytes: int
  frames: int = 0
  total_frame_bytes: int = 0

  @property
  def raw_chunk_bytes(self) -> int:
    return int(self.chunk_elems) * np.dtype(_np_dtype(self.dtype)).itemsize

  @property
  def max_ratio(self) -> float:
    return self.max_frame_bytes / max(1, self.raw_chunk_bytes)

  @property
  def mean_ratio(self) -> float:
    if not self.frames:
      return self.max_ratio
    return self.total_frame_bytes / (self.frames * max(1, self.raw_chunk_bytes))

  def merge(self, other: "SiteObservation") -> "SiteObservation":
    if (other.dtype, other.chunk_elems) != (self.dtype, self.chunk_elems):
      # a site traced with another shape: keep the larger ratio, scaled to our chunk
      mine, theirs = self.max_ratio, other.max_ratio
      if theirs <= mine:
        return self
      return dataclasses.replace(other)
    return SiteObservation(self.op, self.dtype, self.chunk_elems,
                           max(self.max_frame_bytes, other.max_frame_bytes),
                           self.frames + other.frames,
                           self.total_frame_bytes + other.total_frame_bytes)


# Documented defaults (no profile, or a profile without the entry).
DEFAULT_LINKS: dict[str, LinkModel] = {
    "cpu": LinkModel(latency_s=100e-6, bandwidth_Bps=0.125e9),
    "gpu": LinkModel(latency_s=15e-6, bandwidth_Bps=25e9),
    "tpu": LinkModel(latency_s=15e-6, bandwidth_Bps=25e9),
}
DEFAULT_CODEC: dict[str, dict[str, CodecModel]] = {
    "cpu": {
        "bfloat16": CodecModel(1.0e9, 1.5e9, 30e-6, 30e-6),
        "float16": CodecModel(1.0e9, 1.5e9, 30e-6, 30e-6),
        "float32": CodecModel(1.5e9, 2.0e9, 30e-6, 30e-6),
    },
    "gpu": {d: CodecModel(400e9, 400e9, 10e-6, 10e-6) for d in _DTYPE_NAMES},
    "tpu": {d: CodecModel(400e9, 400e9, 10e-6, 10e-6) for d in _DTYPE_NAMES},
}


def _default_capacity_ratio() -> dict:
  from zipccl_jax.collectives import EXPECTED_RATIO
  return {role: {np.dtype(dt).name: float(r) for dt, r in tab.items()}
          for role, tab in EXPECTED_RATIO.items()}


# Mean coded size / raw size (what the ragged transport moves), from the
# measurements quoted in padded_capacity's docstring.
_DEFAULT_EXPECTED_RATIO = {
    "activation": {"bfloat16": 0.67, "float16": 0.85, "float32": 0.835},
    "gradient": {"bfloat16": 0.70, "float16": 0.86, "float32": 0.845},
}


def _np_dtype(name):
  import ml_dtypes
  if str(name) == "bfloat16":
    return np.dtype(ml_dtypes.bfloat16)
  return np.dtype(name)


def _platform_key(p: str | None) -> str:
  p = (p or "cpu").lower()
  if p in ("gpu", "cuda", "rocm"):
    return "gpu"
  return p


def _current_platform() -> str:
  import jax
  try:
    return _platform_key(jax.default_backend())
  except Exception:  # pragma: no cover
    return "cpu"


def _axis_key(axis_name) -> str:
  if isinstance(axis_name, (tuple, list)):
    return ",".join(str(a) for a in axis_name)
  return str(axis_name)


# --------------------------------------------------------------------------- #
# Profile
# --------------------------------------------------------------------------- #


@dataclasses.dataclass
class Profile:
  """Everything the cost model knows; JSON round-trippable (:meth:`save`/:meth:`load`).

  Attributes:
    links: ``{axis_key: {collective: LinkModel}}``. ``axis_key`` is the mesh
      axis name (``"a,b"`` for a tuple of axes) or ``"*"`` (any axis);
      ``collective`` is ``"all_to_all"``, ``"all_gather"``, ``"ppermute"``,
      ``"psum"`` or ``"*"`` (any). Missing entries fall back to ``"*"``, then
      to :data:`DEFAULT_LINKS` for the platform.
    codec: ``{platform: {dtype name: CodecModel}}`` (platform ``"cpu"``,
      ``"gpu"``, ``"tpu"``); missing entries fall back to float16 <->
      bfloat16, then to :data:`DEFAULT_CODEC`.
    capacity_ratio: ``{role: {dtype name: ratio}}`` for the padded capacity
      (``padded_capacity(..., ratio=)``); defaults to ``EXPECTED_RATIO``.
    expected_ratio: ``{role: {dtype name: ratio}}``, the mean coded size over
      raw size (wire bytes of the ragged transport).
    sites: ``{site name: SiteObservation}``, per-call-site frame sizes.
    margin: safety margin on observed capacities.
    min_gain: compress only if the estimate beats raw by this fraction.
    fallback_risk: expected fraction of calls taking the raw fallback; adds
      ``fallback_risk * t_raw`` to the compressed estimate.
    platform: the platform the measurements were taken on (informative).
    meta: free-form notes (mesh, sizes, raw timings); not part of
      :meth:`fingerprint`.
  """
  links: dict = dataclasses.field(default_factory=dict)
  codec: dict = dataclasses.field(default_factory=dict)
  capacity_ratio: dict = dataclasses.field(default_factory=_default_capacity_ratio)
  expected_ratio: dict = dataclasses.field(
      default_factory=lambda: copy.deepcopy(_DEFAULT_EXPECTED_RATIO))
  sites: dict = dataclasses.field(default_factory=dict)
  margin: float = 0.02
  min_gain: float = 0.02
  fallback_risk: float = 0.0
  platform: str | None = None
  meta: dict = dataclasses.field(default_factory=dict)

  # ---- lookups ----------------------------------------------------------- #
  def link(self, axis_name, collective: str, platform: str | None = None) -> tuple[LinkModel, str]:
    """The link model for ``collective`` over ``axis_name``, and where it came from."""
    key = _axis_key(axis_name) if axis_name is not None else None
    for ak in ((key, "*") if key is not None else ("*",)):
      tab = self.links.get(ak)
      if not tab:
        continue
      for ck in (collective, "*"):
        if ck in tab:
          return tab[ck], f"profile[{ak}][{ck}]"
    plat = _platform_key(platform)
    return DEFAULT_LINKS.get(plat, DEFAULT_LINKS["cpu"]), f"default[{plat}]"

  def codec_model(self, dtype, platform: str | None = None) -> tuple[CodecModel, str]:
    plat = _platform_key(platform)
    name = np.dtype(_np_dtype(np.dtype(dtype).name)).name
    alias = {"float16": "bfloat16", "bfloat16": "float16"}.get(name)
    tab = self.codec.get(plat, {})
    for n in (name, alias):
      if n is not None and n in tab:
        return tab[n], f"profile[{plat}][{n}]"
    dflt = DEFAULT_CODEC.get(plat, DEFAULT_CODEC["cpu"])
    return dflt[name], f"default[{plat}]"

  def ratio(self, table: str, role: str, dtype) -> float:
    name = np.dtype(dtype).name
    tab = getattr(self, table)
    r = tab.get(role, {}).get(name)
    if r is None:
      r = (_default_capacity_ratio() if table == "capacity_ratio"
           else _DEFAULT_EXPECTED_RATIO)[role][name]
    return float(r)

  # ---- serialisation ----------------------------------------------------- #
  def to_dict(self) -> dict:
    return {
        "version": PROFILE_VERSION,
        "platform": self.platform,
        "links": {ak: {ck: dataclasses.asdict(m) for ck, m in tab.items()}
                  for ak, tab in self.links.items()},
        "codec": {p: {d: dataclasses.asdict(m) for d, m in tab.items()}
                  for p, tab in self.codec.items()},
        "capacity_ratio": copy.deepcopy(self.capacity_ratio),
        "expected_ratio": copy.deepcopy(self.expected_ratio),
        "sites": {s: dataclasses.asdict(o) for s, o in self.sites.items()},
        "margin": self.margin,
        "min_gain": self.min_gain,
        "fallback_risk": self.fallback_risk,
        "meta": copy.deepcopy(self.meta),
    }

  @classmethod
  def from_dict(cls, d: dict) -> "Profile":
    v = d.get("version", PROFILE_VERSION)
    if v != PROFILE_VERSION:
      raise ValueError(f"zipccl_jax: profile version {v} is not supported (expected "
                       f"{PROFILE_VERSION})")
    p = cls()
    p.platform = d.get("platform")
    p.links = {ak: {ck: LinkModel(**m) for ck, m in tab.items()}
               for ak, tab in d.get("links", {}).items()}
    p.codec = {pl: {dt: CodecModel(**m) for dt, m in tab.items()}
               for pl, tab in d.get("codec", {}).items()}
    for table in ("capacity_ratio", "expected_ratio"):
      if table in d:
        merged = getattr(p, table)
        for role, tab in d[table].items():
          merged.setdefault(role, {}).update({k: float(v) for k, v in tab.items()})
    p.sites = {s: SiteObservation(**o) for s, o in d.get("sites", {}).items()}
    p.margin = float(d.get("margin", p.margin))
    p.min_gain = float(d.get("min_gain", p.min_gain))
    p.fallback_risk = float(d.get("fallback_risk", p.fallback_risk))
    p.meta = dict(d.get("meta", {}))
    p.validate()
    return p

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=1, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "Profile":
    return cls.from_dict(json.loads(text))

  def save(self, path) -> None:
    """Writes the profile as JSON (atomically: a temporary file, then rename)."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
      f.write(self.to_json())
      f.write("\n")
    os.replace(tmp, path)

  @classmethod
  def load(cls, path) -> "Profile":
    with open(os.fspath(path)) as f:
      return cls.from_json(f.read())

  def fingerprint(self) -> str:
    """A short hash of everything that can change a decision (not ``meta``)."""
    d = self.to_dict()
    d.pop("meta", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

  def copy(self) -> "Profile":
    return Profile.from_dict(self.to_dict())

  def validate(self) -> None:
    for ak, tab in self.links.items():
      for ck, m in tab.items():
        if not (m.bandwidth_Bps > 0 and m.latency_s >= 0 and math.isfinite(m.bandwidth_Bps)):
          raise ValueError(f"zipccl_jax: profile link [{ak}][{ck}] is not sane: {m}")
    for pl, tab in self.codec.items():
      for dt, m in tab.items():
        if not (m.encode_Bps > 0 and m.decode_Bps > 0 and m.encode_overhead_s >= 0
                and m.decode_overhead_s >= 0):
          raise ValueError(f"zipccl_jax: profile codec [{pl}][{dt}] is not sane: {m}")
    if not (0 <= self.margin < 1 and self.min_gain >= 0 and 0 <= self.fallback_risk <= 1):
      raise ValueError("zipccl_jax: profile margin/min_gain/fallback_risk out of range")


# --------------------------------------------------------------------------- #
# The active profile
# --------------------------------------------------------------------------- #

_STATE_LOCK = threading.RLock()
_ACTIVE: Profile | None = None
_ENV_LOADED = False


def get_profile() -> Profile:
  """The active profile: the one set last, else ``$ZIPCCL_PROFILE``, else the defaults.

  The returned object is the active one (mutating it changes later decisions).
  """
  global _ACTIVE, _ENV_LOADED
  with _STATE_LOCK:
    if _ACTIVE is None and not _ENV_LOADED:
      _ENV_LOADED = True
      path = os.environ.get("ZIPCCL_PROFILE")
      if path:
        _ACTIVE = Profile.load(path)
        _LOG.info("zipccl_jax: loaded profile %s (%s)", path, _ACTIVE.fingerprint())
    if _ACTIVE is None:
      _ACTIVE = Profile()
    return _ACTIVE


def set_profile(profile: Profile | str | os.PathLike | None) -> Profile | None:
  """Makes ``profile`` (a Profile or a JSON path; None: defaults) active; returns the previous one.

  Functions already traced keep their decisions; trace again to apply it.
  """
  global _ACTIVE, _ENV_LOADED
  if profile is not None and not isinstance(profile, Profile):
    profile = Profile.load(profile)
  with _STATE_LOCK:
    prev = _ACTIVE
    _ACTIVE = profile
    _ENV_LOADED = True
  return prev


def load_profile(path) -> Profile:
  """Loads a JSON profile and makes it active."""
  p = Profile.load(path)
  set_profile(p)
  return p


@contextlib.contextmanager
def use_profile(profile: Profile | str | os.PathLike | None):
  """``with use_profile(p): ...`` traces the body's collectives with ``p``."""
  global _ACTIVE
  if profile is not None and not isinstance(profile, Profile):
    profile = Profile.load(profile)
  with _STATE_LOCK:
    prev = _ACTIVE
    _ACTIVE = profile if profile is not None else Profile()
  try:
    yield _ACTIVE
  finally:
    with _STATE_LOCK:
      _ACTIVE = prev


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

  @property
  def ratio(self) -> float:
    return self.wire_bytes / self.raw_bytes if self.raw_bytes else 1.0

  def summary(self) -> str:
    what = "compressed" if self.compress else "raw"
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


def explain(site: str | None = None) -> str:
  """Why each call site went raw or compressed.

  ``explain()`` is a table of every decision logged; ``explain(site)`` the
  full reasoning for one site (KeyError if it was never traced).
  """
  ds = decisions()
  if site is not None:
    d = ds[site]
    lines = [d.summary()]
    for f in dataclasses.fields(d):
      v = getattr(d, f.name)
      if isinstance(v, float):
        v = f"{v:.6g}"
      lines.append(f"  {f.name:17s} {v}")
    return "\n".join(lines)
  hdr = (f"{'site':40s} {'op':12s} {'dtype':8s} {'chunk B':>9s} {'n':>3s} {'choice':10s} "
         f"{'cap B':>9s} {'est ms':>8s} {'raw ms':>8s} {'ratio':>5s} reason")
  rows = [hdr]
  for s, d in sorted(ds.items()):
    raw_chunk = d.chunk_elems * np.dtype(_np_dtype(d.dtype)).itemsize
    rows.append(f"{s[:40]:40s} {d.op:12s} {d.dtype:8s} {raw_chunk:9d} {d.axis_size:3d} "
                f"{'compressed' if d.compress else 'raw':10s} {d.capacity:9d} "
                f"{d.est_compressed_s * 1e3:8.3f} {d.est_raw_s * 1e3:8.3f} {d.ratio:5.2f} "
                f"{d.reason}")
  return "\n".join(rows)


def _sent(kind: str, operand_bytes: float, n: int) -> float:
  if kind == "ppermute":
    return operand_bytes
  if n <= 1:
    return 0.0
  if kind == "all_to_all":
    return operand_bytes * (n - 1) / n
  if kind == "all_gather":
    return operand_bytes * (n - 1)
  if kind == "psum":
    return 2 * operand_bytes * (n - 1) / n
  raise ValueError(kind)


# op -> (phases [(link collective, chunks in the operand, coded)], encode chunks, decode chunks)
def _structure(op: str, n: int):
  if op in ("all_to_all", "psum_scatter"):
    return [("all_to_all", n)], n, n
  if op == "all_gather":
    return [("all_gather", 1)], 1, n
  if op == "psum":
    return [("all_to_all", n), ("all_gather", 1)], n + 1, 2 * n
  if op == "ppermute":
    return [("ppermute", 1)], 1, 1
  raise ValueError(f"zipccl_jax: unknown collective {op!r}")


def _round8(v: float) -> int:
  return int(-(-int(math.ceil(v)) // 8) * 8)


def _observed_capacity(profile: Profile, site: str | None, op: str, dt, m: int):
  if site is None:
    return None
  obs = [profile.sites.get(s) for s in ((site, site + "/gather") if op == "psum" else (site,))]
  obs = [o for o in obs if o is not None]
  if not obs:
    return None
  from zipccl_jax.collectives import padded_capacity, _max_encoded_bytes
  best = 0
  for o in obs:
    if o.dtype == dt.name and int(o.chunk_elems) == m:
      c = _round8(o.max_frame_bytes * (1 + profile.margin))
    else:  # observed with another shape: reuse its worst ratio
      c = padded_capacity(m, dt, ratio=o.max_ratio * (1 + profile.margin))
    best = max(best, c)
  return int(min(max(best, HEADER_BYTES), _max_encoded_bytes(m, dt)))


def decide(op: str, dtype, chunk_elems: int, *, axis_size: int, axis_name=None,
           site: str | None = None, role: str = "activation", capacity=None,
           transport: str = "auto", compress="auto", profile: Profile | None = None,
           platform: str | None = None, log: bool = True) -> Decision:
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
  """
  from zipccl_jax import collectives as zc
  prof = profile if profile is not None else get_profile()
  plat = _platform_key(platform) if platform is not None else _current_platform()
  dt = np.dtype(dtype)
  n = int(axis_size)
  m = int(chunk_elems)
  phases, enc_chunks, dec_chunks = _structure(op, n)
  raw_chunk = m * dt.itemsize
  axis = _axis_key(axis_name) if axis_name is not None else None
  algorithm = {"psum_scatter": "a2a-sum", "psum": "a2a-sum+gather"}.get(op, "direct")

  links = [prof.link(axis_name, coll, plat)[0] for coll, _ in phases]
  raw_bytes = sum(_sent(coll, k * raw_chunk, n) for coll, k in phases)
  t_raw = sum(lk.time(_sent(coll, k * raw_chunk, n)) for lk, (coll, k) in zip(links, phases))
  bw = links[0].bandwidth_Bps
  lat = links[0].latency_s

  def out(compress_, cap, transport_, t_c, wire, src, reason):
    d = Decision(op=op, site=site, dtype=dt.name, chunk_elems=m, axis_size=n, axis=axis,
                 role=role, compress=bool(compress_), capacity=int(cap if compress_ else 0),
                 transport=transport_, algorithm=algorithm, est_raw_s=float(t_raw),
                 est_compressed_s=float(t_c), raw_bytes=int(raw_bytes), wire_bytes=int(wire),
                 bandwidth_Bps=float(bw), latency_s=float(lat), capacity_source=src,
                 reason=reason, profile=prof.fingerprint(), mode=str(compress))
    if log:
      if site is not None:
        with _DECISIONS_LOCK:
          _DECISIONS[site] = d
      if _LOG.isEnabledFor(logging.DEBUG):
        _LOG.debug("%s", d.summary())
    return d

  if dt not in zc.CODED_DTYPES:
    return out(False, 0, transport, math.inf, raw_bytes, "-", f"dtype {dt.name} not coded")
  if m == 0:
    return out(False, 0, transport, math.inf, raw_bytes, "-", "empty")

  # capacity
  if capacity is not None and not (isinstance(capacity, str) and capacity == "gradient"):
    cap = zc._resolve_capacity(capacity, m, dt, role)
    src = "explicit"
  else:
    cap = None
    if compress == "auto":
      cap = _observed_capacity(prof, site, op, dt, m)
      src = "observed"
    if cap is None:
      if compress == "auto":
        cap = zc.padded_capacity(m, dt, ratio=prof.ratio("capacity_ratio", role, dt))
        src = f"profile ratio {prof.ratio('capacity_ratio', role, dt):.3g} ({role})"
      else:
        cap = zc.padded_capacity(m, dt, kind=role)
        src = f"default ratio ({role})"

  # compressed estimate, per transport
  codec, _ = prof.codec_model(dt, plat)
  n_coded = len(phases)
  t_codec = (enc_chunks * raw_chunk / codec.encode_Bps + dec_chunks * raw_chunk / codec.decode_Bps
             + n_coded * (codec.encode_overhead_s + codec.decode_overhead_s))
  exp_frame = min(cap, HEADER_BYTES + math.ceil(prof.ratio("expected_ratio", role, dt) * raw_chunk)
                  + _PER_BLOCK_BYTES * -(-m // _BLOCK_ELEMS))

  def coded_time(tr: str):
    t, wire = t_codec, 0.0
    for i, (lk, (coll, k)) in enumerate(zip(links, phases)):
      ragged = tr == "ragged" and not (op == "psum" and i == 1)  # psum phase 2 stays padded
      chunk = exp_frame if ragged else cap
      s = _sent(coll, k * chunk, n)
      wire += s
      t += lk.time(s)
      if ragged:
        t += lk.latency_s  # the int32 size exchange
    if op == "ppermute":  # the 4-byte overflow flag psum
      t += prof.link(axis_name, "psum", plat)[0].latency_s
    t += prof.fallback_risk * t_raw
    return t, wire

  if transport == "auto" and plat != "cpu":
    cands = {tr: coded_time(tr) for tr in ("padded", "ragged")}
    tr_best = min(cands, key=lambda k: (cands[k][0], k))
  elif transport == "auto":
    cands = {"auto": coded_time("padded")}  # platform_dependent lowers padded on CPU
    tr_best = "auto"
  else:
    cands = {transport: coded_time(transport)}
    tr_best = transport
  t_c, wire = cands[tr_best]

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


def crossover_bandwidth(op: str, dtype, chunk_elems: int, *, axis_size: int,
                        role: str = "activation", profile: Profile | None = None,
                        platform: str = "cpu", capacity=None) -> float:
  """The link bandwidth (bytes/s) below which ``decide`` compresses (padded transport).

  Assumes one latency ``L`` for every collective of the call (the profile's
  ``"*"`` link latency). Returns ``inf`` if compression always pays, 0 if never.
  """
  prof = profile if profile is not None else get_profile()
  d = decide(op, dtype, chunk_elems, axis_size=axis_size, role=role, compress=True,
             capacity=capacity, profile=prof, platform=platform, log=False)
  lk, _ = prof.link(None, "*", platform)
  phases, _, _ = _structure(op, axis_size)
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
# Observed frame sizes (per-call-site capacities)
# --------------------------------------------------------------------------- #

_OBSERVER: dict | None = None
_OBSERVER_LOCK = threading.Lock()


def _observing() -> bool:
  return _OBSERVER is not None


def _observe_callback(site: str, op: str, dtype_name: str, chunk_elems: int):
  """A host callback that folds a (frames,) nbytes array into the observer."""
  target = _OBSERVER

  def cb(nbytes):
    nb = np.asarray(nbytes).astype(np.int64).reshape(-1)
    if nb.size == 0:
      return
    o = SiteObservation(op, dtype_name, int(chunk_elems), int(nb.max()), int(nb.size),
                        int(nb.sum()))
    with _OBSERVER_LOCK:
      if target is None:
        return
      prev = target.get(site)
      target[site] = o if prev is None else prev.merge(o)

  return cb


def _merge_sites(into: dict, new: dict) -> None:
  for s in sorted(new):
    o = new[s]
    into[s] = o if s not in into else into[s].merge(o)


def _allgather_json(obj) -> list:
  """Every process's JSON-able ``obj``, in process order (a collective over all processes)."""
  import jax
  if jax.process_count() == 1:
    return [obj]
  from jax.experimental import multihost_utils
  raw = np.frombuffer(json.dumps(obj, sort_keys=True).encode(), dtype=np.uint8)
  lens = np.asarray(multihost_utils.process_allgather(np.array([raw.size], np.int32)))
  width = int(lens.max())
  buf = np.zeros((width,), np.uint8)
  buf[:raw.size] = raw
  allb = np.asarray(multihost_utils.process_allgather(buf)).reshape(-1, width)
  return [json.loads(bytes(allb[i, :int(lens.reshape(-1)[i])]).decode())
          for i in range(allb.shape[0])]


@contextlib.contextmanager
def observe(profile: Profile | None = None, *, agree: bool = True):
  """Records the frame sizes of every coded-dtype call site traced inside the block.

  Functions traced inside the ``with`` block encode each message once more
  (at full capacity, whatever the plan) and report the frame sizes to the
  host; run them on representative data (eagerly, or a few jitted steps),
  still inside the block. On exit the maximum frame size per call site is
  stored in ``profile.sites`` (default: the active profile), merged across
  processes when ``agree`` (a collective: every process must leave the block
  together), so all ranks derive the same capacities. Then trace again
  (a new ``jax.jit`` or ``jax.clear_caches()``): ``compress="auto"`` uses
  ``round_up_8(max_frame * (1 + profile.margin))`` for those sites.
  """
  global _OBSERVER
  import jax
  prof = profile if profile is not None else get_profile()
  with _OBSERVER_LOCK:
    if _OBSERVER is not None:
      raise RuntimeError("zipccl_jax: observe() blocks cannot nest")
    _OBSERVER = {}
    mine = _OBSERVER
  try:
    yield prof
  finally:
    try:
      jax.effects_barrier()
    finally:
      with _OBSERVER_LOCK:
        _OBSERVER = None
  local = {s: dataclasses.asdict(o) for s, o in mine.items()}
  gathered = _allgather_json(local) if agree else [local]
  merged: dict = {}
  for d in gathered:
    _merge_sites(merged, {s: SiteObservation(**o) for s, o in d.items()})
  _merge_sites(prof.sites, merged)


# --------------------------------------------------------------------------- #
# Calibration
# --------------------------------------------------------------------------- #


_MIN_FIT_TIME_S = 1e-6  # net times below this (after the null program's) are not resolved: floor them


def _fit(xs: Iterable[float], ts: Iterable[float]) -> tuple[float, float]:
  """Least squares ``t = a + x / b`` -> (a >= 0, b > 0).

  Net times can come out at zero or below when the work is lost in the noise
  of the null program's time (a fast codec on small sizes, a loaded host);
  they are floored at ``_MIN_FIT_TIME_S`` so the bandwidth stays finite.
  """
  xs = np.asarray(list(xs), np.float64)
  ts = np.maximum(np.asarray(list(ts), np.float64), _MIN_FIT_TIME_S)
  if xs.size < 2 or np.ptp(xs) == 0:
    raise ValueError("zipccl_jax: calibration needs at least two different sizes")
  slope, icpt = np.polyfit(xs, ts, 1)
  if not slope > 0:  # noise swamped the size dependence: all of it is throughput
    slope = float(ts.max() / xs.max())
    icpt = 0.0
  if icpt < 0:  # no negative latencies: refit through the origin
    icpt = 0.0
    slope = float(np.dot(xs, ts) / np.dot(xs, xs))
  return float(icpt), float(1.0 / slope)


def _time_all(jobs: list, reps: int, warmup: int, barrier=None) -> dict[str, float]:
  """Median seconds per job ``(name, fn, args)``; jobs are interleaved rep by rep.

  ``barrier()`` (untimed) runs before every timed call, so that processes start
  together, as they do inside a real collective step.
  """
  import jax
  for _, f, args in jobs:
    for _ in range(max(1, warmup)):
      jax.block_until_ready(f(*args))
  ts: dict[str, list] = {name: [] for name, _, _ in jobs}
  for _ in range(reps):
    for name, f, args in jobs:
      if barrier is not None:
        barrier()
      t0 = time.perf_counter()
      jax.block_until_ready(f(*args))
      ts[name].append(time.perf_counter() - t0)
  return {k: float(statistics.median(v)) for k, v in ts.items()}


def _in_situ(prof: Profile, plat: str, axis_name, n: int, dname: str, raw_sent: int, role: str,
             sample_np, smap, put, reps: int, warmup: int, barrier, base: float) -> dict:
  """Scales ``prof.codec[plat]`` to the codec cost measured inside a compressed all_to_all."""
  from zipccl_jax import collectives as zc
  dt = _np_dtype(dname)
  m = max(1, int(raw_sent) // dt.itemsize // max(1, n - 1))
  if sample_np is not None:
    rows = np.resize(sample_np.reshape(-1), n * m).reshape(n, m).astype(dt)
    cap = int(zc._max_encoded_bytes(m, dt))
  else:
    rows = (np.random.default_rng(1).standard_normal((n, m), np.float32) * 0.02).astype(dt)
    cap = int(zc.padded_capacity(m, dt, ratio=prof.ratio("capacity_ratio", role, dt)))
  site = "zipccl_jax.calibrate/in_situ"
  f = smap(lambda v: zc.all_to_all(v, axis_name, 0, 0, tiled=True, compress=True, capacity=cap,
                                   transport="padded", name=site))
  t_local = _time_all([("c", f, (put(rows),))], reps, warmup, barrier)["c"]
  with _DECISIONS_LOCK:
    _DECISIONS.pop(site, None)
  with zc._STATS_LOCK:
    zc._STATS.pop(site, None)
  t_c = max(v["t"] for v in _allgather_json({"t": t_local})) - base
  lk, _ = prof.link(axis_name, "all_to_all", plat)
  raw_b = n * m * dt.itemsize
  k_meas = t_c - lk.time(_sent("all_to_all", n * cap, n))
  cm, _ = prof.codec_model(dt, plat)
  k_iso = cm.encode_time(raw_b) + cm.decode_time(raw_b)
  factor = float(min(16.0, max(0.25, k_meas / k_iso))) if k_iso > 0 else 1.0
  prof.codec[plat] = {d: CodecModel(c.encode_Bps / factor, c.decode_Bps / factor,
                                    c.encode_overhead_s * factor, c.decode_overhead_s * factor)
                      for d, c in prof.codec.get(plat, {}).items()}
  return {"dtype": dt.name, "chunk_elems": m, "capacity": cap, "compressed_a2a_s": t_c,
          "codec_measured_s": k_meas, "codec_isolated_s": k_iso, "factor": factor}


def calibrate(mesh, axis_name, *, profile: Profile | None = None, link: bool = True,
              codec: bool = True, collectives: Iterable[str] = ("all_to_all", "all_gather"),
              link_bytes: tuple = (256 << 10, 4 << 20), codec_bytes: tuple = (64 << 10, 1 << 20),
              dtypes: Iterable[str] = ("bfloat16", "float32"), sample=None,
              role: str = "activation", in_situ: bool = True, reps: int = 7, warmup: int = 1,
              save=None, activate: bool = True) -> Profile:
  """Measures the link over ``axis_name`` of ``mesh`` and the codec; returns a Profile.

  Link: for each collective in ``collectives`` ("all_to_all", "all_gather",
  "ppermute", "psum"), a jitted ``shard_map`` over ``mesh`` runs the
  ``jax.lax`` collective on uint8 messages of which each device sends about
  ``link_bytes`` (two or more sizes). The median time over ``reps`` (all
  measurements interleaved), minus that of an empty ``shard_map``
  (dispatch), is fitted to ``latency + sent_bytes / bandwidth`` (least
  squares). The first
  collective's fit is also the axis's ``"*"`` entry and, if the profile has
  none, the ``"*"`` (any axis) entry.

  Codec: per dtype, every device encodes (then, separately, decodes)
  ``axis_size`` frames totalling about ``codec_bytes`` raw bytes at once, as a
  coded all_to_all does (so devices sharing cores slow each other down as in
  a real call); the fit gives throughput and per-call overhead per side.
  Data: Gaussian (std 0.02), or ``sample`` (resized; its dtype replaces
  ``dtypes``), whose mean coded ratio then also goes to
  ``profile.expected_ratio[role]``.

  In situ (``in_situ``, when both the link over all_to_all and the codec are
  measured): a compressed ``zipccl_jax.all_to_all`` whose raw size matches the
  largest ``link_bytes`` is timed too. Its time minus the link model's time for
  its wire bytes is the codec's real cost inside a collective step, where all
  devices code at once and compete with the transport for cores; every
  codec model of the platform is scaled by (that cost / the isolated
  estimate), clamped to [1/4, 16]. ``meta["calibration"]["in_situ"]`` keeps
  the figures.

  Choose ``link_bytes`` to span the messages of the program: the fit is linear,
  and small messages on shaped or congested links are not (bursts, windows).

  Multi-process: every process runs the same measurements at the same time
  (this is a collective), then all use the slowest process's time for every
  measurement, so every rank computes the same profile (equal
  :meth:`Profile.fingerprint`) and makes the same decisions.

  Args:
    mesh: a ``jax.sharding.Mesh``.
    axis_name: a mesh axis name (or tuple of names).
    profile: the profile to update, in a copy (default: the active one).
    link, codec: what to measure.
    save: a path; process 0 writes the JSON there.
    activate: make the result the active profile (:func:`set_profile`).
  """
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.sharding import NamedSharding, PartitionSpec as P
  from zipccl_jax import codec as zcodec
  from zipccl_jax import collectives as zc

  prof = (profile if profile is not None else get_profile()).copy()
  axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
  for a in axes:
    if a not in mesh.axis_names:
      raise ValueError(f"zipccl_jax.calibrate: mesh has no axis {a!r} (axes {mesh.axis_names})")
  n = int(math.prod(mesh.shape[a] for a in axes))
  all_axes = tuple(mesh.axis_names)
  ndev = int(mesh.devices.size)
  plat = _platform_key(mesh.devices.flat[0].platform)
  spec = P(all_axes)
  sharding = NamedSharding(mesh, spec)
  akey = _axis_key(axis_name)
  collectives = tuple(collectives)
  dtypes = tuple(dtypes)

  def smap(body):
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec,
                                 check_vma=False))

  def put(local_rows: np.ndarray):
    """A global array whose block on every device is ``local_rows``."""
    glob_shape = (ndev * local_rows.shape[0],) + local_rows.shape[1:]
    full = np.broadcast_to(local_rows[None], (ndev,) + local_rows.shape).reshape(glob_shape)
    return jax.make_array_from_callback(glob_shape, sharding, lambda idx: full[idx])

  jobs: list = []                  # (name, fn, args)
  sizes: dict[str, float] = {}     # name -> bytes (x of the fit)
  ratio_obs: dict[str, float] = {}

  # Dispatch of an (almost) empty program, subtracted from every measurement.
  jobs.append(("null", smap(lambda v: v + jnp.uint8(1)), (put(np.zeros((1, 64), np.uint8)),)))
  if link:
    ring = [(i, (i + 1) % n) for i in range(n)]
    for coll in collectives:
      for S in link_bytes:
        if coll == "all_to_all":
          per = max(1, -(-int(S) // max(1, n - 1)))   # bytes per destination
          x = put(np.zeros((n, per), np.uint8))
          f = smap(lambda c: lax.all_to_all(c, axis_name, 0, 0, tiled=True))
          sent = _sent("all_to_all", n * per, n)
        elif coll == "all_gather":
          per = max(1, -(-int(S) // max(1, n - 1)))
          x = put(np.zeros((1, per), np.uint8))
          f = smap(lambda c: lax.all_gather(c, axis_name, tiled=True)[:1])
          sent = _sent("all_gather", per, n)
        elif coll == "ppermute":
          x = put(np.zeros((1, int(S)), np.uint8))
          f = smap(lambda c: lax.ppermute(c, axis_name, ring))
          sent = float(S)
        elif coll == "psum":
          per = max(1, -(-int(S) * n // max(1, 2 * (n - 1)) // 4))
          x = put(np.zeros((1, per), np.float32))
          f = smap(lambda c: lax.psum(c, axis_name))
          sent = _sent("psum", 4 * per, n)
        else:
          raise ValueError(f"zipccl_jax.calibrate: unknown collective {coll!r}")
        name = f"link/{coll}/{S}"
        jobs.append((name, f, (x,)))
        sizes[name] = float(sent)

  if codec:
    rng = np.random.default_rng(0)
    sample_np = None
    if sample is not None:
      sample_np = np.asarray(sample)
      dtypes = (sample_np.dtype.name,)
    for dname in dtypes:
      dt = _np_dtype(dname)
      for S in codec_bytes:
        m = max(1, int(S) // dt.itemsize // n)
        if sample_np is not None:
          rows = np.resize(sample_np.reshape(-1), n * m).reshape(n, m).astype(dt)
        else:
          rows = (rng.standard_normal((n, m), np.float32) * 0.02).astype(dt)
        x = put(rows)
        # the coded path's own pieces: encode + overflow poisoning on the sender;
        # overflow check, branch and decode on the receiver (at a capacity that fits)
        cap = int(zcodec.max_encoded_bytes(m, dt))

        def enc_side(v, cap=cap):
          payload, nbytes, _ = zc._encode_rows(v, cap)
          return payload, nbytes[:, None]

        def dec_side(p, cap=cap, m=m, dt=dt):
          fb = zc._any_overflow(p, cap)
          return zc._cond_bits(fb, lambda: jnp.zeros((p.shape[0], m), dt),
                               lambda: zc._decode_guarded(p, fb, m, dt))

        enc = smap(enc_side)
        dec = smap(dec_side)
        payload, nbytes = enc(x)
        jobs.append((f"enc/{dname}/{S}", enc, (x,)))
        jobs.append((f"dec/{dname}/{S}", dec, (payload,)))
        sizes[f"enc/{dname}/{S}"] = sizes[f"dec/{dname}/{S}"] = float(n * m * dt.itemsize)
        if sample_np is not None:
          nb = np.asarray(nbytes.addressable_data(0)).reshape(-1).astype(np.float64)
          ratio_obs[dt.name] = float(nb.sum()) / (nb.size * m * dt.itemsize)

  barrier = None
  if jax.process_count() > 1:
    # First cross-process collective: a modest all_to_all (PLATFORM.md), then a tiny psum barrier.
    warm = smap(lambda v: lax.all_to_all(v, all_axes, 0, 0, tiled=True))
    jax.block_until_ready(warm(put(np.zeros((ndev, 4096), np.uint8))))
    bar_fn = smap(lambda v: lax.psum(v, all_axes))
    bar_x = put(np.ones((1, 1), np.float32))

    def barrier():
      jax.block_until_ready(bar_fn(bar_x))
  timings = _time_all(jobs, reps, warmup, barrier)
  # agree: every process uses the slowest process's time for every measurement
  names = sorted(timings)
  allv = _allgather_json({"t": [timings[k] for k in names], "r": ratio_obs, "names": names})
  if any(v["names"] != names for v in allv):
    raise RuntimeError("zipccl_jax.calibrate: processes measured different things")
  t = {k: max(v["t"][i] for v in allv) for i, k in enumerate(names)}
  base = t["null"]

  def net(k):
    return max(0.0, t[k] - base)

  if link:
    tab = dict(prof.links.get(akey, {}))
    for i, coll in enumerate(collectives):
      ks = [f"link/{coll}/{S}" for S in link_bytes]
      lat, bw = _fit([sizes[k] for k in ks], [net(k) for k in ks])
      tab[coll] = LinkModel(lat, bw)
      if i == 0:
        tab["*"] = LinkModel(lat, bw)
    prof.links[akey] = tab
    if "*" not in prof.links:
      prof.links["*"] = {"*": tab["*"]}
  if codec:
    ctab = dict(prof.codec.get(plat, {}))
    for dname in dtypes:
      dname = _np_dtype(dname).name
      ke = [f"enc/{dname}/{S}" for S in codec_bytes]
      kd = [f"dec/{dname}/{S}" for S in codec_bytes]
      eo, ebw = _fit([sizes[k] for k in ke], [net(k) for k in ke])
      do, dbw = _fit([sizes[k] for k in kd], [net(k) for k in kd])
      ctab[dname] = CodecModel(ebw, dbw, eo, do)
      if sample_np is not None:
        rs = [v["r"][dname] for v in allv if dname in v["r"]]
        if rs:
          prof.expected_ratio.setdefault(role, {})[dname] = float(max(rs))
    prof.codec[plat] = ctab

  in_situ_info = None
  if codec and link and in_situ and n > 1 and "all_to_all" in collectives:
    in_situ_info = _in_situ(prof, plat, axis_name, n, dtypes[0], max(link_bytes), role,
                            sample_np, smap, put, reps, warmup, barrier, base)
  prof.platform = plat
  prof.meta = dict(prof.meta)
  prof.meta["calibration"] = {
      "mesh": {str(k): int(v) for k, v in mesh.shape.items()}, "axis": akey, "axis_size": n,
      "processes": int(jax.process_count()), "devices": ndev, "platform": plat,
      "reps": reps, "dispatch_s": base,
      "net_s": {k: net(k) for k in names if k != "null"},
      "bytes": {k: sizes[k] for k in names if k in sizes}, "in_situ": in_situ_info}
  prof.validate()
  if save is not None and jax.process_index() == 0:
    prof.save(save)
  if activate:
    set_profile(prof)
  return prof
