"""The profile: everything the cost model knows (links, codec, ratios, observed call sites), and the active one.

:func:`zipccl_jax.calibrate` measures a profile; :func:`set_profile`,
:func:`use_profile`, :func:`load_profile` and the ``ZIPCCL_PROFILE``
environment variable (a JSON path read at first use) make one active. With no
profile, these documented defaults apply (:data:`DEFAULT_LINKS`,
:data:`~zipccl_jax.strategy.codec_cost.DEFAULT_CODEC`, ratios from ``zipccl_jax.capacity.EXPECTED_RATIO``):

==========  ======================  ===========================================
platform    link (per device)       codec (per device)
==========  ======================  ===========================================
cpu         1 Gbit/s (0.125 GB/s),  bf16/f16: encode 1.0 GB/s, decode 1.5 GB/s,
            100 us latency          f32: 1.5 / 2.0 GB/s; float8: 0.4 / 0.5 GB/s;
                                    30 us overhead per side
gpu         25 GB/s, 15 us          measured on an H200, in a jitted step: bf16
                                    encode 125 GB/s, decode 100; f16 115 / 89;
                                    f32 155 / 87; float8 81 / 77 (scaled by the
                                    kernels' rates); 10 us overhead per side
tpu         25 GB/s, 15 us          400 GB/s each way, 10 us overhead per side
==========  ======================  ===========================================

The CPU defaults describe the deployment zipccl targets (hosts joined by a
slow network, a 1 Gbit/s reference link), not the virtual devices of
a single process, whose "link" is a memcpy: calibrate there and ``auto``
stays raw.
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
import threading

import ml_dtypes
import numpy as np

from zipccl_jax.capacity import EXPECTED_RATIO
from zipccl_jax.strategy.codec_cost import DEFAULT_CODEC, CodecModel
from zipccl_jax.strategy.links import DEFAULT_LINKS, LinkModel, axis_key

__all__ = ["Profile", "SiteObservation", "get_profile", "set_profile", "use_profile", "load_profile",
           "np_dtype", "platform_key", "current_platform"]


_LOG = logging.getLogger("zipccl_jax.strategy")
PROFILE_VERSION = 1


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
    return int(self.chunk_elems) * np.dtype(np_dtype(self.dtype)).itemsize

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
      # a site traced with another shape: keep the observation with the larger ratio
      # (observed_capacity scales a ratio to the chunk it is asked about)
      return self if other.max_ratio <= self.max_ratio else dataclasses.replace(other)
    return SiteObservation(self.op, self.dtype, self.chunk_elems,
                           max(self.max_frame_bytes, other.max_frame_bytes),
                           self.frames + other.frames,
                           self.total_frame_bytes + other.total_frame_bytes)


def _default_capacity_ratio() -> dict:
  return {role: {np.dtype(dt).name: float(r) for dt, r in tab.items()}
          for role, tab in EXPECTED_RATIO.items()}


# One-byte floats: dense amax-scaled Gaussian (benchmarks/codec_fp8.py: e4m3fn 1.21x, e5m2
# 1.44x); zero-heavy tensors code far smaller, so this errs towards raw.
_FP8_MEAN_RATIO = {"float8_e4m3fn": 0.83, "float8_e5m2": 0.70, "float8_e4m3fnuz": 0.83,
                   "float8_e5m2fnuz": 0.70, "float8_e4m3b11fnuz": 0.83, "float8_e4m3": 0.83,
                   "float8_e3m4": 0.90, "float8_e8m0fnu": 0.30}

# Mean coded size / raw size (what the ragged transport moves), from the
# measurements quoted in padded_capacity's docstring.
_DEFAULT_EXPECTED_RATIO = {
    "activation": {"bfloat16": 0.67, "float16": 0.85, "float32": 0.835, **_FP8_MEAN_RATIO},
    "gradient": {"bfloat16": 0.70, "float16": 0.86, "float32": 0.845, **_FP8_MEAN_RATIO},
}


def _fields(model) -> dict:
  """A model's fields (plain dataclasses of scalars) as a dict: dataclasses.asdict without its deep
  copies and field introspection (fingerprint() runs once per traced collective). A link model
  without points, and a codec model without a measured slot rate, serialise as before those fields
  existed (same JSON, same fingerprint)."""
  d = dict(vars(model))
  if d.get("points", None) == ():
    del d["points"]
  if d.get("slot_Bps", None) == 0.0 and d.get("slot_overhead_s", None) == 0.0:
    del d["slot_Bps"], d["slot_overhead_s"]
  return d


def np_dtype(name):
  """The numpy dtype of a dtype name ("bfloat16" included)."""
  if hasattr(ml_dtypes, str(name)):  # bfloat16 and the float8 family
    return np.dtype(getattr(ml_dtypes, str(name)))
  return np.dtype(name)


def platform_key(p: str | None) -> str:
  p = (p or "cpu").lower()
  if p in ("gpu", "cuda", "rocm"):
    return "gpu"
  return p


def current_platform() -> str:
  """`jax.default_backend()` as a profile platform key ("cpu", "gpu", "tpu")."""
  import jax  # jax's backend only when asked: profiles load without initialising it
  try:
    return platform_key(jax.default_backend())
  except Exception:  # pragma: no cover
    return "cpu"


# --------------------------------------------------------------------------- #
# Profile
# --------------------------------------------------------------------------- #


def _model(kind, fields, where: str):
  """``kind(**fields)`` of a profile entry, or ValueError naming `where` and what is wrong."""
  if not isinstance(fields, dict):
    raise ValueError(f"zipccl_jax: profile {where} is a JSON object, got {type(fields).__name__}")
  try:
    return kind(**fields)
  except TypeError as e:  # a missing or unknown field
    raise ValueError(f"zipccl_jax: profile {where}: {e}") from e


@dataclasses.dataclass
class Profile:
  """Everything the cost model knows; JSON round-trippable (:meth:`save`/:meth:`load`).

  Attributes:
    links: ``{axis_key: {collective: LinkModel}}``. ``axis_key`` is the mesh
      axis name (``"a,b"`` for a tuple of axes) or ``"*"`` (any axis);
      ``collective`` is ``"all_to_all"``, ``"all_gather"``, ``"ppermute"``,
      ``"psum"`` or ``"*"`` (any). Missing entries fall back to ``"*"``, then
      to :data:`DEFAULT_LINKS` for the platform. A level may also hold
      ``"stream"``, the rate a flat collective's crossings reach on it
      (:func:`~zipccl_jax.strategy.links.stream_link`).
    codec: ``{platform: {dtype name: CodecModel}}`` (platform ``"cpu"``,
      ``"gpu"``, ``"tpu"``); missing entries fall back to float16 <->
      bfloat16, then to :data:`DEFAULT_CODEC`.
    capacity_ratio: ``{role: {dtype name: ratio}}`` for the padded capacity
      (``padded_capacity(..., ratio=)``); defaults to ``EXPECTED_RATIO``.
    expected_ratio: ``{role: {dtype name: ratio}}``, the mean coded size over
      raw size (wire bytes of the ragged transport).
    sites: ``{site name: SiteObservation}``, per-call-site frame sizes.
    margin: safety margin on observed capacities.
    min_gain: compress only if the estimate beats raw by this fraction: a margin for the model's
      error in a compressed estimate (on the flat 4-process testbed, the MoE all_to_alls at
      10 Gbit/s ran compressed at 1.09-1.13x raw where the model had them ahead).
    timed_gain: the same margin for a compressed program :func:`zipccl_jax.calibrate` timed
      over a tuple of axes beside its raw program (a two-level plan's slow level coded, its flat
      compressed program), whose estimate is that timing, not a model. Default 0: on the 2 x 4
      testbed such a ratio moves between calibration and run by a few percent either way, a
      little in compression's favour on average, so a margin only kept near ties raw (the
      figures: benchmarks/README.md, "Near ties").
    fallback_risk: expected fraction of calls taking the raw fallback; adds
      ``fallback_risk * t_raw`` to the compressed estimate.
    codec_in_situ: ``{platform: factor}``, what :func:`zipccl_jax.calibrate` scaled that
      platform's codec models by (the codec's cost inside a collective over a slow link, where
      it runs while peers wait on the wire, over its cost measured alone). A phase on a level no
      slow link binds (a hierarchical program's fast level) costs the models as measured alone:
      :meth:`isolated_codec`.
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
  timed_gain: float = 0.0
  fallback_risk: float = 0.0
  platform: str | None = None
  meta: dict = dataclasses.field(default_factory=dict)
  codec_in_situ: dict = dataclasses.field(default_factory=dict)

  # ---- lookups ----------------------------------------------------------- #
  def link(self, axis_name, collective: str, platform: str | None = None) -> tuple[LinkModel, str]:
    """The link model for ``collective`` over ``axis_name``, and where it came from."""
    key = axis_key(axis_name) if axis_name is not None else None
    for ak in ((key, "*") if key is not None else ("*",)):
      tab = self.links.get(ak)
      if not tab:
        continue
      for ck in (collective, "*"):
        if ck in tab:
          return tab[ck], f"profile[{ak}][{ck}]"
    plat = platform_key(platform)
    return DEFAULT_LINKS.get(plat, DEFAULT_LINKS["cpu"]), f"default[{plat}]"

  def codec_model(self, dtype, platform: str | None = None, *,
                  isolated: bool = False) -> tuple[CodecModel, str]:
    """The codec model of `dtype` on `platform`, and where it came from; `isolated`: as measured alone
    (calibrate's in-situ scale divided back out, as :meth:`isolated_codec`)."""
    plat = platform_key(platform)
    name = np.dtype(np_dtype(np.dtype(dtype).name)).name
    alias = {"float16": "bfloat16", "bfloat16": "float16"}.get(name)
    tab = self.codec.get(plat, {})
    for n in (name, alias):
      if n is not None and n in tab:
        return (self._alone(plat, tab[n]) if isolated else tab[n]), f"profile[{plat}][{n}]"
    dflt = DEFAULT_CODEC.get(plat, DEFAULT_CODEC["cpu"])
    return dflt[name], f"default[{plat}]"

  def phase_codecs(self, dtype, platform, phases, n: int) -> list[CodecModel]:
    """The codec model of each coded phase of `phases` (`programs.structure`) over `n` devices.

    Calibrate's in-situ scale was measured inside a coded all_to_all, whose devices finish their
    exchanges one by one, so one device's codec runs while its peers still wait on the wire: it
    applies to the phases shaped so (all_to_all, ppermute, an all_gather between two devices). An
    all_gather over more than two is a ring, whose devices all receive their last row in the same
    step and then all decode at once with no wait left to fill: it costs the codec as measured
    alone, all devices at once. (2 x 4 CPU testbed, links only: the flat coded all_gather was 21-25%
    under its median with the in-situ codec on the AVX2 and AVX-512BW machines, and is within 11%
    without it; benchmarks/README.md.)"""
    return [self.codec_model(dtype, platform, isolated=coll == "all_gather" and n > 2)[0]
            for coll, *_ in phases]

  def isolated_codec(self) -> "Profile":
    """This profile with the codec models as measured alone (`codec_in_situ` divided back out);
    itself where no platform's models were scaled."""
    if not self.codec_in_situ:
      return self
    p = self.copy()
    for plat in self.codec_in_situ:
      p.codec[plat] = {d: self._alone(plat, c) for d, c in p.codec.get(plat, {}).items()}
    p.codec_in_situ = {}
    return p

  def _alone(self, plat: str, model: CodecModel) -> CodecModel:
    """`model`, a codec model of `plat` in this profile, as measured alone: calibrate's in-situ scale
    (`codec_in_situ`) divided back out."""
    f = self.codec_in_situ.get(plat)
    return model.scaled(1.0 / f) if f else model

  def ratio(self, table: str, role: str, dtype) -> float:
    name = np.dtype(dtype).name
    tab = getattr(self, table)
    r = tab.get(role, {}).get(name)
    if r is None:
      r = (_default_capacity_ratio() if table == "capacity_ratio"
           else _DEFAULT_EXPECTED_RATIO)[role][name]
    return float(r)

  # ---- serialisation ----------------------------------------------------- #
  def _decisive(self) -> dict:
    """Everything that can change a decision (all but ``meta``) as JSON data; the ratio tables are
    the profile's own dicts, not copies (fingerprint() runs on every collective's decision)."""
    return {
        "version": PROFILE_VERSION,
        "platform": self.platform,
        "links": {ak: {ck: _fields(m) for ck, m in tab.items()} for ak, tab in self.links.items()},
        "codec": {p: {d: _fields(m) for d, m in tab.items()} for p, tab in self.codec.items()},
        "capacity_ratio": self.capacity_ratio,
        "expected_ratio": self.expected_ratio,
        "sites": {s: _fields(o) for s, o in self.sites.items()},
        "margin": self.margin,
        "min_gain": self.min_gain,
        "fallback_risk": self.fallback_risk,
        # only where set, as below: a profile without it keeps its JSON and fingerprint
        **({"timed_gain": self.timed_gain} if self.timed_gain else {}),
        # only where set, so that the JSON and fingerprint of a profile without it are unchanged
        **({"codec_in_situ": dict(self.codec_in_situ)} if self.codec_in_situ else {}),
    }

  def to_dict(self) -> dict:
    d = self._decisive()
    for table in ("capacity_ratio", "expected_ratio"):
      d[table] = copy.deepcopy(d[table])
    d["meta"] = copy.deepcopy(self.meta)
    return d

  @classmethod
  def from_dict(cls, d: dict) -> "Profile":
    """The profile of `d` (`to_dict`'s form). ValueError, naming the entry, for anything else: a wrong
    version, a table that is not a mapping, a model with missing or unknown fields, an insane value."""
    if not isinstance(d, dict):
      raise ValueError(f"zipccl_jax: a profile is a JSON object, got {type(d).__name__}")
    v = d.get("version", PROFILE_VERSION)
    if v != PROFILE_VERSION:
      raise ValueError(f"zipccl_jax: profile version {v} is not supported (expected "
                       f"{PROFILE_VERSION})")
    try:
      return cls._parse(d)
    except (AttributeError, TypeError, KeyError) as e:  # a list or a number where a mapping goes
      raise ValueError(f"zipccl_jax: not a profile ({type(e).__name__}: {e})") from e

  @classmethod
  def _parse(cls, d: dict) -> "Profile":
    p = cls()
    p.platform = d.get("platform")
    p.links = {ak: {ck: _model(LinkModel, m, f"link [{ak}][{ck}]") for ck, m in tab.items()}
               for ak, tab in d.get("links", {}).items()}
    p.codec = {pl: {dt: _model(CodecModel, m, f"codec [{pl}][{dt}]") for dt, m in tab.items()}
               for pl, tab in d.get("codec", {}).items()}
    for table in ("capacity_ratio", "expected_ratio"):
      if table in d:
        merged = getattr(p, table)
        for role, tab in d[table].items():
          merged.setdefault(role, {}).update({k: float(v) for k, v in tab.items()})
    p.sites = {s: SiteObservation(**o) for s, o in d.get("sites", {}).items()}
    p.margin = float(d.get("margin", p.margin))
    p.min_gain = float(d.get("min_gain", p.min_gain))
    p.timed_gain = float(d.get("timed_gain", p.timed_gain))
    p.fallback_risk = float(d.get("fallback_risk", p.fallback_risk))
    p.meta = dict(d.get("meta", {}))
    p.codec_in_situ = {str(k): float(v) for k, v in d.get("codec_in_situ", {}).items()}
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
    return hashlib.sha256(json.dumps(self._decisive(), sort_keys=True).encode()).hexdigest()[:16]

  def copy(self) -> "Profile":
    return Profile.from_dict(self.to_dict())

  def validate(self) -> None:
    for plat, f in self.codec_in_situ.items():
      if not (math.isfinite(f) and f > 0):
        raise ValueError(f"zipccl_jax: profile codec_in_situ[{plat}] must be finite and > 0, "
                         f"got {f}")
    for ak, tab in self.links.items():
      for ck, m in tab.items():
        why = m.check()
        if why is not None:
          raise ValueError(f"zipccl_jax: profile link [{ak}][{ck}] is not sane ({why}): {m}")
    for pl, tab in self.codec.items():
      for dt, m in tab.items():
        if not (m.encode_Bps > 0 and m.decode_Bps > 0 and m.encode_overhead_s >= 0
                and m.decode_overhead_s >= 0 and 0 <= m.slot_Bps < math.inf
                and 0 <= m.slot_overhead_s < math.inf):
          raise ValueError(f"zipccl_jax: profile codec [{pl}][{dt}] is not sane: {m}")
    if not (0 <= self.margin < 1 and self.min_gain >= 0 and self.timed_gain >= 0
            and 0 <= self.fallback_risk <= 1):
      raise ValueError("zipccl_jax: profile margin/min_gain/timed_gain/fallback_risk out of range")


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
