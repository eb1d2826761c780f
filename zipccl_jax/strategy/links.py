"""Links: the time of one collective against the bytes one device sends.

A :class:`LinkModel` is what :func:`zipccl_jax.calibrate` fits for one collective over one mesh axis
(``Profile.links``); :data:`DEFAULT_LINKS` apply where a profile has none. :func:`flat_links` composes a
cluster's two levels into the link of the flat collective over both (``zipccl_jax.model``).
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class LinkModel:
  """The time of one collective against ``sent_bytes``, the bytes one device sends (the model of
  :func:`zipccl_jax.hlo_wire_bytes`, so ``bandwidth_Bps`` is a per-device rate).

  Without ``points``: the line ``latency_s + sent_bytes / bandwidth_Bps``. With ``points``
  (what :func:`zipccl_jax.calibrate` measured: ``((sent bytes, seconds), ...)``, sizes ascending,
  times non-decreasing), the measurements themselves: linear interpolation between neighbouring
  points, from ``(0, latency_s)`` to the first point, and past the last one its time plus the
  fitted slope. A line through two sizes misses steps in between (a message that outgrows a cache
  or a socket buffer costs more per byte); interpolation is exact at every measured size.
  """
  latency_s: float
  bandwidth_Bps: float
  points: tuple = ()

  def __post_init__(self):
    self.points = tuple((float(x), float(t)) for x, t in self.points)  # JSON gives lists

  def time(self, sent_bytes: float) -> float:
    b = float(sent_bytes)
    pts = self.points
    if not pts:
      return self.latency_s + b / self.bandwidth_Bps
    x1, t1 = pts[-1]
    if b >= x1:
      return t1 + (b - x1) / self.bandwidth_Bps
    x0, t0 = 0.0, min(self.latency_s, pts[0][1])
    for x1, t1 in pts:
      if b <= x1:
        return t0 + (t1 - t0) * (b - x0) / (x1 - x0)
      x0, t0 = x1, t1
    raise AssertionError("unreachable: b < the last point's size")

  def check(self) -> str | None:
    """Why the model is not sane, or None."""
    if not (self.bandwidth_Bps > 0 and math.isfinite(self.bandwidth_Bps)
            and math.isfinite(self.latency_s) and self.latency_s >= 0):
      return "bandwidth must be finite and > 0, latency finite and >= 0"
    xs = [x for x, _ in self.points]
    ts = [t for _, t in self.points]
    if not all(math.isfinite(v) for v in xs + ts):
      return "points must be finite"
    if xs and (xs[0] <= 0 or any(b <= a for a, b in zip(xs, xs[1:]))):
      return "point sizes must be > 0 and strictly ascending"
    if ts and (ts[0] < 0 or any(b < a for a, b in zip(ts, ts[1:]))):
      return "point times must be >= 0 and non-decreasing"
    return None


# Documented defaults (no profile, or a profile without the entry).
DEFAULT_LINKS: dict[str, LinkModel] = {
    "cpu": LinkModel(latency_s=100e-6, bandwidth_Bps=0.125e9),
    "gpu": LinkModel(latency_s=15e-6, bandwidth_Bps=25e9),
    "tpu": LinkModel(latency_s=15e-6, bandwidth_Bps=25e9),
}


def axis_key(axis_name) -> str:
  if isinstance(axis_name, (tuple, list)):
    return ",".join(str(a) for a in axis_name)
  return str(axis_name)


def level_link(level, op: str) -> LinkModel:
  """The link of collective `op` on one level: `level` is a :class:`LinkModel` (every collective's)
  or ``{collective: LinkModel}`` with a ``"*"`` entry for the rest (a calibrated profile's
  ``links[level]``)."""
  return level.get(op, level["*"]) if isinstance(level, dict) else level


def stream_link(level, op: str) -> LinkModel:
  """The link a flat collective's crossings of `level` run at, per device: the level's ``"stream"``
  entry where it has one, else its `op` link (`level_link`).

  A level's collectives, timed over that level alone, need not move bytes the way a flat collective
  over several levels does. On the two-level CPU testbed (gloo over TCP), the host level's all_gather
  and all_to_all are four two-rank exchanges of one message per pair at once, which reach 0.71-0.84
  of the rate one TCP stream reaches through the shaped link; a flat ring's edge between hosts is
  one pipelined stream (gloo's allgather keeps two half-chunks in flight on one connection), and a
  flat all_to_all sends sixteen messages a direction: both reach 0.83-0.93 of it
  (``benchmarks/link_patterns.py``). A level given ``"stream"`` (the flat patterns' rate, per device)
  costs the flat ring's edge and the flat all_to_all's crossings with it."""
  if isinstance(level, dict) and "stream" in level:
    return level["stream"]
  return level_link(level, op)


def flat_links(H: int, L: int, inter, intra) -> dict:
  """Per collective, the flat collective over ("host", "local") as one link (the table of
  zipccl_jax.model's docstring). Each is its levels running at once (`_slowest`): lines give a
  line, measured links (``points``) give the composed curve at their measured sizes. `inter` and
  `intra` are each a level's link, or its links per collective (`level_link`): the flat
  all_to_all composes the levels' all_to_all links, the flat all_gather their all_gather links; a
  level's ``"stream"`` entry, where given, replaces both (`stream_link`)."""
  n = H * L
  # all_to_all: of n - 1 rows, n - L cross hosts and L - 1 stay; both at once
  cross, stay = (n - L) / (n - 1), (L - 1) / (n - 1)
  x, y = stream_link(inter, "all_to_all"), stream_link(intra, "all_to_all")
  a2a = _slowest(((x, cross), (y, stay)), max(x.latency_s, y.latency_s),
                 1.0 / max(cross / x.bandwidth_Bps, stay / y.bandwidth_Bps))
  # ring all_gather: every edge of the ring carries n - 1 shards, a host's edge out of it through
  # its L devices' links together (one ring per device's link, each a 1/L slice)
  x, y = stream_link(inter, "all_gather"), stream_link(intra, "all_gather")
  ag = _slowest(((x, 1.0 / L), (y, 1.0)), max(x.latency_s, y.latency_s),
                min(L * x.bandwidth_Bps, y.bandwidth_Bps))
  return {"all_to_all": a2a, "all_gather": ag, "*": a2a,  # ppermute's rounds and flag psums cross
          "ppermute": level_link(inter, "ppermute"), "psum": level_link(inter, "psum")}


def _slowest(parts, latency_s: float, bandwidth_Bps: float) -> LinkModel:
  """The link of `parts`, ``((link, share), ...)`` running at once: ``s`` sent bytes take
  ``max(link.time(share * s))``. Lines compose to the line (latency_s, bandwidth_Bps), the
  slowest part's slope. Where a part was measured (``points``: calibrate's times, which a line
  through two sizes misses), the composed link keeps points at each measured size of each part,
  scaled to the composed size: exact there, interpolated between, ``bandwidth_Bps`` past the
  last."""
  parts = [(link, share) for link, share in parts if share > 0]
  sizes = sorted({x / share for link, share in parts for x, _ in link.points})
  if not sizes:
    return LinkModel(latency_s, bandwidth_Bps)
  points = tuple((s, max(link.time(share * s) for link, share in parts)) for s in sizes)
  return LinkModel(latency_s, bandwidth_Bps, points)
