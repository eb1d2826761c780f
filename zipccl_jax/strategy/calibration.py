"""Measures a `Profile`: the link per collective, the codec per dtype, and the codec in situ.

See :func:`calibrate`.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Iterable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from zipccl_jax import _exchange, _mixed, accounting, codec, strategy
from zipccl_jax import collectives as zc
from zipccl_jax._shard import lax_ppermute
from zipccl_jax.accounting import sent_bytes
from zipccl_jax.capacity import padded_capacity
from zipccl_jax.collectives import all_to_all
from zipccl_jax.observation import allgather_json
from zipccl_jax.strategy import levels as two_level
from zipccl_jax.strategy.codec_cost import CodecModel
from zipccl_jax.strategy.levels import hierarchical_key
from zipccl_jax.strategy.links import LinkModel
from zipccl_jax.strategy.profile import (Profile, axis_key, get_profile, np_dtype, platform_key,
                                         set_profile)

__all__ = ["calibrate", "fit_bounded", "monotone_points"]

_MIN_FIT_TIME_S = 1e-6  # net times below this (after the null program's) are not resolved: floor them
# What a fit may return (bytes/s and seconds): a 1 MB/s link or codec is broken, a 10 TB/s one is a
# measurement lost in noise, and a per-call latency over 0.1 s is a stall. Outside: "unmeasurable".
BANDWIDTH_BOUNDS_BPS = (1e6, 1e13)
LATENCY_BOUNDS_S = (0.0, 0.1)


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


def fit_bounded(xs, ts, noise_s: float = 0.0) -> tuple[LinkModel | None, str]:
  """A robust ``t = latency + x / bandwidth`` fit, or ``(None, reason)`` when it is unmeasurable.

  `ts` are median net times (s) at sizes `xs` (bytes); `noise_s` the spread of those medians (the
  largest interquartile range of the repetitions). When the time difference between the largest
  and smallest size is within the noise (a loaded host, a link too fast to resolve), the size
  dependence is not measured: the model is the throughput bound ``bandwidth = x_max / t(x_max)``
  (all time counted as transfer: a lower bound, never an extrapolation from noise), latency 0.
  A result outside BANDWIDTH_BOUNDS_BPS or LATENCY_BOUNDS_S is reported unmeasurable.
  """
  xs = np.asarray(list(xs), np.float64)
  ts = np.maximum(np.asarray(list(ts), np.float64), _MIN_FIT_TIME_S)
  if xs.size < 2 or np.ptp(xs) == 0:
    raise ValueError("zipccl_jax: calibration needs at least two different sizes")
  hi, lo = int(np.argmax(xs)), int(np.argmin(xs))
  note = "fit"
  if ts[hi] - ts[lo] > 2 * noise_s + _MIN_FIT_TIME_S:
    lat, bw = _fit(xs, ts)
  else:
    lat, bw, note = 0.0, float(xs[hi] / ts[hi]), "throughput bound (size dependence within noise)"
  if not (BANDWIDTH_BOUNDS_BPS[0] <= bw <= BANDWIDTH_BOUNDS_BPS[1]):
    return None, f"unmeasurable: bandwidth {bw:.3g} B/s outside {BANDWIDTH_BOUNDS_BPS} ({note})"
  if not (LATENCY_BOUNDS_S[0] <= lat <= LATENCY_BOUNDS_S[1]):
    return None, f"unmeasurable: latency {lat:.3g} s outside {LATENCY_BOUNDS_S} ({note})"
  return LinkModel(lat, bw, monotone_points(xs, ts)), note


def monotone_points(xs, ts) -> tuple:
  """The measured ``(size, time)`` medians as a LinkModel's points: sizes ascending (equal sizes
  averaged), times made non-decreasing by pooling adjacent violators (a larger message never
  costs less: a dip is noise, and the pooled value is the least-squares non-decreasing fit)."""
  by_size: dict[float, list] = {}
  for x, t in zip(np.asarray(xs, np.float64).tolist(), np.asarray(ts, np.float64).tolist()):
    by_size.setdefault(x, []).append(t)
  blocks = []                          # [sum of times, count, sizes], each block one pooled value
  for x in sorted(by_size):
    blocks.append([float(np.mean(by_size[x])), 1, [x]])
    while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
      t, c, sz = blocks.pop()
      blocks[-1][0] += t
      blocks[-1][1] += c
      blocks[-1][2] += sz
  return tuple((x, t / c) for t, c, sz in blocks for x in sz)


def _in_bounds(c: CodecModel) -> bool:
  lo, hi = BANDWIDTH_BOUNDS_BPS
  return (all(lo <= b <= hi for b in (c.encode_Bps, c.decode_Bps))
          and all(LATENCY_BOUNDS_S[0] <= o <= LATENCY_BOUNDS_S[1]
                  for o in (c.encode_overhead_s, c.decode_overhead_s)))


def out_of_bounds(prof: Profile) -> list[str]:
  """Every link and codec model of `prof` outside BANDWIDTH_BOUNDS_BPS / LATENCY_BOUNDS_S, named
  (what calibrate() must never return; benchmarks/calibrate_stress.py counts them under load)."""
  (lo, hi), (llo, lhi) = BANDWIDTH_BOUNDS_BPS, LATENCY_BOUNDS_S
  bad = [f"link[{ak}][{coll}] = {lk}" for ak, tab in prof.links.items() for coll, lk in tab.items()
         if not (lo <= lk.bandwidth_Bps <= hi and llo <= lk.latency_s <= lhi)]
  return bad + [f"codec[{plat}][{d}] = {c}" for plat, tab in prof.codec.items()
                for d, c in tab.items() if not _in_bounds(c)]


def rep_order(items: list, rep: int) -> list:
  """`items` in repetition `rep`'s order: a permutation drawn from a generator seeded with `rep`,
  the same on every process (they must run the same collectives in the same order). Shuffled,
  so that no item always runs after the same one (a rotation keeps every predecessor but one)."""
  return [items[i] for i in np.random.default_rng(rep).permutation(len(items))]


def _time_all(jobs: list, reps: int, warmup: int, barrier=None, group=None) -> dict[str, list]:
  """Seconds of every repetition per job ``(name, fn, args)``; jobs are interleaved rep by rep.

  ``barrier()`` (untimed) runs before every timed call, so that processes start
  together, as they do inside a real collective step. ``group(name)``: jobs of one group are
  warmed up and timed together, interleaved, one group after another (the programs a decision
  compares, measured side by side among few others, as a step runs them). Within a group the
  order is shuffled every repetition (`rep_order`).
  """
  groups: dict = {}
  for job in jobs:
    groups.setdefault(group(job[0]) if group else None, []).append(job)
  ts: dict[str, list] = {name: [] for name, _, _ in jobs}
  for members in groups.values():
    for _, f, args in members:
      for _ in range(max(1, warmup)):
        jax.block_until_ready(f(*args))
    for rep in range(reps):
      for name, f, args in rep_order(members, rep):
        if barrier is not None:
          barrier()
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts[name].append(time.perf_counter() - t0)
  return ts


def _link_parts(name: str):
  """("link", collective or program key, size) of a tuple's link job, else None."""
  parts = name.split("/")
  return tuple(parts) if len(parts) == 3 and parts[0] == "link" else None


def _op_of(key: str) -> str:
  """The collective a link job's key measures: ``hierarchical_all_gather_slow_coded``,
  ``hierarchical_psum_scatter_fixed_order`` and ``flat_all_gather_coded`` -> the op."""
  if key.startswith("hierarchical_"):
    return key[len("hierarchical_"):].removesuffix("_fixed_order").removesuffix("_slow_coded")
  if key.startswith("flat_") and key.endswith("_coded"):
    return key[len("flat_"):-len("_coded")]
  return key


def _job_group(name: str) -> str:
  """The flat and hierarchical programs of one op over the tuple at one size form a group (what
  `plan` compares for a call of that op and size), and each level's link of that collective at
  that size joins it; the codec is a group of its own.

  A level's links are timed beside the programs whose phases they cost, not among the level's other
  links: on the 2 x 4 CPU testbed the local level's all_gather, timed in a group of the local level's
  links alone (every collective and size shuffled together), cost 1.4-1.9 ms more a call at every
  size than beside the programs (the programs themselves 0.2-1.0 ms more at the smallest sizes), and
  all_gather's two-level programs composed from those links came to 16% over calibrate's timing of
  the very program (benchmarks/README.md, "calibrate times each level beside the programs")."""
  parts = _link_parts(name)
  if parts is not None:
    return f"link@{parts[2]}/{_op_of(parts[1])}"
  parts = name.split("/")
  return f"link@{parts[2]}/{parts[1]}" if parts[0].startswith("link[") else parts[0]


def _paired(ts: dict) -> dict:
  """The repetitions of the programs over a tuple as ratios to the flat raw collective beside them.

  A program's job (``link/hierarchical_<op>[_slow_coded]/<size>``, ``link/flat_<op>_coded/<size>``)
  whose flat raw ``link/<op>/<size>`` was timed in the same group, repetition by repetition, gets
  ``median(flat) * t_r / flat_r``: its median is the flat median times the median paired ratio.
  Drift over the group (load, the link's state) moves both programs of a repetition alike; the
  paired ratio cancels it, where two independent medians can each land several percent off (2 x 4
  testbed, all_gather at 3.5 MiB: the runs put hierarchical compressed 0-15% ahead of flat raw,
  calibrate's independent medians anywhere from 14% ahead to 4% behind). `plan` ranks the flat
  and hierarchical estimates of a call; this keeps their ratio as measured side by side. Other
  jobs are unchanged.
  """
  out = dict(ts)
  for name, v in ts.items():
    parts = _link_parts(name)
    if parts is None or _op_of(parts[1]) == parts[1]:
      continue
    ref = ts.get(f"link/{_op_of(parts[1])}/{parts[2]}")
    if not ref or len(ref) != len(v) or min(ref) <= 0:
      continue
    med = statistics.median(ref)
    out[name] = [med * t / r for t, r in zip(v, ref)]
  return out


class _Harness:
  """Runs per-device programs on every device of `mesh` (the collectives over `axis_name`)."""

  def __init__(self, mesh, axis_name):
    axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    for a in axes:
      if a not in mesh.axis_names:
        raise ValueError(f"zipccl_jax.calibrate: mesh has no axis {a!r} (axes {mesh.axis_names})")
    self.mesh, self.axis_name = mesh, axis_name
    self.n = int(math.prod(mesh.shape[a] for a in axes))
    self.all_axes = tuple(mesh.axis_names)
    self.ndev = int(mesh.devices.size)
    self.plat = platform_key(mesh.devices.flat[0].platform)
    self.spec = P(self.all_axes)
    self.sharding = NamedSharding(mesh, self.spec)
    self.akey = axis_key(axis_name)

  def smap(self, body):
    return jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=self.spec, out_specs=self.spec,
                                 check_vma=False))

  def put(self, local_rows: np.ndarray):
    """A global array whose block on every device is ``local_rows``."""
    glob_shape = (self.ndev * local_rows.shape[0],) + local_rows.shape[1:]
    full = np.broadcast_to(local_rows[None], (self.ndev,) + local_rows.shape).reshape(glob_shape)
    return jax.make_array_from_callback(glob_shape, self.sharding, lambda idx: full[idx])

  def barrier(self):
    """An untimed barrier across processes (None with one process)."""
    if jax.process_count() == 1:
      return None
    # First cross-process collective: a modest all_to_all, then a tiny psum barrier.
    warm = self.smap(lambda v: lax.all_to_all(v, self.all_axes, 0, 0, tiled=True))
    jax.block_until_ready(warm(self.put(np.zeros((self.ndev, 4096), np.uint8))))
    bar_fn = self.smap(lambda v: lax.psum(v, self.all_axes))
    bar_x = self.put(np.ones((1, 1), np.float32))
    return lambda: jax.block_until_ready(bar_fn(bar_x))


def _link_job(h: _Harness, coll: str, size: int):
  """(program, operand, bytes one device sends) of the jax.lax collective `coll` at `size` bytes."""
  n, axis_name = h.n, h.axis_name
  if coll == "all_to_all":
    per = max(1, -(-int(size) // max(1, n - 1)))   # bytes per destination
    f = h.smap(lambda c: lax.all_to_all(c, axis_name, 0, 0, tiled=True))
    return f, h.put(np.zeros((n, per), np.uint8)), sent_bytes("all_to_all", float(n * per), n)
  if coll == "all_gather":
    per = max(1, -(-int(size) // max(1, n - 1)))
    # the whole result, as a program uses it: keeping a slice of it adds a copy of one row per device
    # (2 x 4 CPU testbed, local level, 8.4 MB sent, medians of 3 runs: 16.3-17.1 ms sliced, 14.4-15.3
    # whole; `python benchmarks/link_patterns.py --local-forms`, results/local_forms_2x4*.json)
    f = h.smap(lambda c: lax.all_gather(c, axis_name, tiled=True))
    return f, h.put(np.zeros((1, per), np.uint8)), sent_bytes("all_gather", float(per), n)
  if coll == "ppermute":
    ring = [(i, (i + 1) % n) for i in range(n)]
    f = h.smap(lambda c: lax_ppermute(c, axis_name, ring))  # any tuple order, on every jax
    return f, h.put(np.zeros((1, int(size)), np.uint8)), float(size)
  if coll == "psum":
    per = max(1, -(-int(size) * n // max(1, 2 * (n - 1)) // 4))
    f = h.smap(lambda c: lax.psum(c, axis_name))
    return f, h.put(np.zeros((1, per), np.float32)), sent_bytes("psum", float(4 * per), n)
  raise ValueError(f"zipccl_jax.calibrate: unknown collective {coll!r}")


_HIER_SITE = "zipccl.calibrate.hierarchical"


def _tuple_job(h: _Harness, op: str, size: int, slow_coded: bool = False, algorithm="hierarchical",
               fixed_order: bool = False):
  """(program, operand, bytes one device sends in the *flat* raw collective) of one of `op`'s
  programs over the tuple (`_tuple_programs`): by default its hierarchical program (the first axis
  as the slow level, as use_algorithm takes it), what the phases, their copies and sums cost as
  they run. Both phases raw, on zeros of `two_level.PROGRAM_DTYPE` (bfloat16); or
  (`slow_coded`) the slow phase compressed at the default capacity, on near-Gaussian values of it
  (codec speed depends on the data: zeros code in a fraction of the time). With `algorithm`
  "flat" (and `slow_coded`): the flat compressed program over the tuple, on the same data."""
  n, axes = h.n, h.axis_name
  dt = two_level.PROGRAM_DTYPE
  per = max(1, -(-int(size) // (dt.itemsize * max(1, n - 1))))   # elements per destination
  # the whole result, as a caller uses it: a slice of it would let XLA drop the phases' copies
  c = bool(slow_coded)
  body = {"all_gather": lambda v: zc.all_gather(v, axes, tiled=True, compress=c, name=_HIER_SITE),
          "all_to_all": lambda v: zc.all_to_all(v, axes, 0, 0, tiled=True, compress=c,
                                                 name=_HIER_SITE),
          "psum_scatter": lambda v: zc.psum_scatter(v, axes, tiled=True, compress=c,
                                                     fixed_order=fixed_order, name=_HIER_SITE)}[op]
  levels = {str(a): c and i == 0 for i, a in enumerate(axes)} if algorithm != "flat" else None

  def f(v):
    with two_level.use_algorithm(algorithm, levels):
      return body(v)

  shape = {"all_gather": (per,), "all_to_all": (n, per), "psum_scatter": (n * per,)}[op]
  sent = float((n - 1) * per * dt.itemsize)   # the flat raw collective's bytes (sent_bytes)
  x = (np.zeros(shape, dt) if not c else
       (np.random.default_rng(0).standard_normal(shape, np.float32) * 0.02).astype(dt))
  return h.smap(f), h.put(x), sent


# The programs over a tuple of axes calibrate times per op and size: key -> (slow_coded, algorithm,
# fixed_order); psum_scatter's hierarchical programs both ways (`hierarchical_key`).
def _tuple_programs(op: str) -> dict:
  orders = (False, True) if op == "psum_scatter" else (False,)
  return {**{hierarchical_key(op, coded, fo): (coded, "hierarchical", fo)
             for fo in orders for coded in (False, True)},
          two_level.flat_coded_key(op): (True, "flat", False)}


def _tuple_jobs(h: _Harness, link_bytes, jobs: list, sizes: dict) -> None:
  for op in two_level.PROGRAM_OPS:
    for key, (coded, algorithm, fixed_order) in _tuple_programs(op).items():
      for size in link_bytes:
        f, x, sent = _tuple_job(h, op, size, coded, algorithm, fixed_order)
        name = f"link/{key}/{size}"
        jobs.append((name, f, (x,)))
        sizes[name] = sent


def _forget_hier_sites(axes) -> None:
  for suffix in [" [levels]"] + [f"/{a}" for a in axes] + [""]:
    strategy.forget_decision(_HIER_SITE + suffix)


def _link_jobs(h: _Harness, collectives, link_bytes, jobs: list, sizes: dict,
               prefix: str = "link") -> None:
  for coll in collectives:
    for size in link_bytes:
      f, x, sent = _link_job(h, coll, size)
      name = f"{prefix}/{coll}/{size}"
      jobs.append((name, f, (x,)))
      sizes[name] = float(sent)


def _codec_programs(h: _Harness, m: int, dt):
  """The coded path's own pieces at a capacity that fits: encode + overflow poisoning on the
  sender; overflow check, branch and decode on the receiver."""
  cap = int(codec.max_encoded_bytes(m, dt))

  def enc_side(v):
    payload, nbytes, _ = _exchange.encode_rows(v, cap)
    return payload, nbytes[:, None]

  def dec_side(p):
    fb = codec.any_overflow(p, cap)
    return _exchange.cond_bits(fb, lambda: jnp.zeros((p.shape[0], m), dt),
                               lambda: _exchange.decode_guarded(p, fb, m, dt))

  return h.smap(enc_side), h.smap(dec_side)


def _codec_jobs(h: _Harness, dtypes, codec_bytes, sample_np, jobs: list, sizes: dict, prof: Profile,
                role: str) -> dict:
  """Appends encode/decode jobs per dtype and size, and the mixed slot exchange's passes over the same
  rows at the capacity its exchange would use (`_mixed.slot_passes`); returns the sample's coded
  ratio per dtype."""
  rng = np.random.default_rng(0)
  ratio_obs: dict[str, float] = {}
  for dname in dtypes:
    dt = np_dtype(dname)
    for size in codec_bytes:
      m = max(1, int(size) // dt.itemsize // h.n)
      if sample_np is not None:
        rows = np.resize(sample_np.reshape(-1), h.n * m).reshape(h.n, m).astype(dt)
      else:
        rows = (rng.standard_normal((h.n, m), np.float32) * 0.02).astype(dt)
      x = h.put(rows)
      enc, dec = _codec_programs(h, m, dt)
      payload, nbytes = enc(x)
      cap = int(padded_capacity(m, dt, ratio=prof.ratio("capacity_ratio", role, dt)))
      jobs.append((f"enc/{dname}/{size}", enc, (x,)))
      jobs.append((f"dec/{dname}/{size}", dec, (payload,)))
      jobs.append((f"slot/{dname}/{size}", h.smap(lambda v, c=cap: _mixed.slot_passes(v, c)), (x,)))
      for what in ("enc", "dec", "slot"):
        sizes[f"{what}/{dname}/{size}"] = float(h.n * m * dt.itemsize)
      if sample_np is not None:
        nb = np.asarray(nbytes.addressable_data(0)).reshape(-1).astype(np.float64)
        ratio_obs[dt.name] = float(nb.sum()) / (nb.size * m * dt.itemsize)
  return ratio_obs


def _iqr(v) -> float:
  q75, q25 = np.percentile(np.asarray(v, np.float64), [75, 25])
  return float(q75 - q25)


def _median_se(v) -> float:
  """The standard error of the median of the repetitions `v` (s): sqrt(pi / 2) sigma / sqrt(n),
  sigma from the interquartile range (IQR / 1.349 for a normal spread). A median of n repetitions
  is known to about this, not to the spread of one repetition."""
  return float(math.sqrt(math.pi / 2) * _iqr(v) / 1.349 / math.sqrt(max(1, len(v))))


def _agree(timings: dict, ratio_obs: dict):
  """Every process uses, for every measurement, the median over repetitions of the slowest process's
  time in each (`_slowest_rep`), and the largest spread (the interquartile range of one process's
  repetitions): (medians, spreads, gathered)."""
  names = sorted(timings)
  allv = allgather_json({"t": [float(statistics.median(timings[k])) for k in names],
                         "q": [_iqr(timings[k]) for k in names], "r": ratio_obs, "names": names,
                         "reps": [[float(x) for x in timings[k]] for k in names]})
  if any(v["names"] != names for v in allv):
    raise RuntimeError("zipccl_jax.calibrate: processes measured different things")
  return (_slowest_rep(allv), {k: max(v["q"][i] for v in allv) for i, k in enumerate(names)}, allv)


def _slowest_median(allv: list) -> dict:
  """Per measurement, the slowest process's median over its repetitions (seconds): what calibrate
  fitted before it fitted `_slowest_rep`, recorded for comparison. Never above `_slowest_rep`."""
  return {k: max(v["t"][i] for v in allv) for i, k in enumerate(allv[0]["names"])}


def _slowest_rep(allv: list) -> dict:
  """Per measurement, the median over repetitions of the slowest process's time in each (seconds).

  What calibrate fits: a collective ends when its last process does, so this is what a call costs,
  and what a benchmark that times the slowest process per call measures (`benchmarks/_twolevel.py`).
  It is never below the slowest process's median (`_slowest_median`), which calibrate fitted until
  the 2 x 4 testbed showed links-only predictions a few percent under the cases' medians (eight
  runs: 156 of 160 variants within 15%, mean error -2.9%). Eight runs calibrated on this statistic
  put 160 of 160 within 15%, mean error +1.2% (benchmarks/README.md, "calibrate fits each
  repetition's slowest process"). One process: the median of its repetitions, as before."""
  out = {}
  for i, k in enumerate(allv[0]["names"]):
    reps = min(len(v["reps"][i]) for v in allv)
    out[k] = float(statistics.median(max(v["reps"][i][r] for v in allv) for r in range(reps)))
  return out


def _fit_links(prof: Profile, akey: str, collectives, link_bytes, sizes: dict, net, noise,
               notes: dict, prefix: str = "link", star: bool = True) -> None:
  """Link models of `akey` per collective; the first measurable one is also its "*" (and, if the
  profile has none, the "*" axis's) when `star`. Unmeasurable fits leave the profile's entry as
  it was."""
  tab = dict(prof.links.get(akey, {}))
  first = None
  for coll in collectives:
    ks = [f"{prefix}/{coll}/{size}" for size in link_bytes]
    lk, note = fit_bounded([sizes[k] for k in ks], [net(k) for k in ks], max(noise[k] for k in ks))
    notes[f"link[{akey}]/{coll}"] = note
    if lk is not None:
      tab[coll] = lk
      first = first or lk
  if first is not None and star:
    tab["*"] = first
  if tab:
    prof.links[akey] = tab
  if "*" not in prof.links and "*" in tab:
    prof.links["*"] = {"*": tab["*"]}


def _fit_codec(prof: Profile, plat: str, dtypes, codec_bytes, sizes: dict, net, noise, notes,
               role: str, ratios) -> None:
  """Codec models per dtype (an unmeasurable side keeps the profile's model of that dtype);
  `ratios` (gathered sample ratios, or None) -> expected_ratio."""
  ctab = dict(prof.codec.get(plat, {}))
  for dname in dtypes:
    dname = np_dtype(dname).name
    side = {}
    for what in ("enc", "dec", "slot"):
      ks = [f"{what}/{dname}/{size}" for size in codec_bytes]
      side[what], notes[f"codec/{what}/{dname}"] = fit_bounded(
          [sizes[k] for k in ks], [net(k) for k in ks], max(noise[k] for k in ks))
    if side["enc"] is not None and side["dec"] is not None:
      e, d, sl = side["enc"], side["dec"], side["slot"]  # slot passes not resolved: not measured (0)
      ctab[dname] = CodecModel(e.bandwidth_Bps, d.bandwidth_Bps, e.latency_s, d.latency_s,
                               sl.bandwidth_Bps if sl else 0.0, sl.latency_s if sl else 0.0)
    if ratios is not None:
      rs = [v["r"][dname] for v in ratios if dname in v["r"]]
      if rs:
        prof.expected_ratio.setdefault(role, {})[dname] = float(max(rs))
  prof.codec[plat] = ctab


def _in_situ(prof: Profile, h: _Harness, dname: str, raw_sent: int, role: str, sample_np,
             reps: int, warmup: int, barrier, base: float) -> dict:
  """Scales ``prof.codec[plat]`` to the codec cost measured inside a compressed all_to_all."""
  n, axis_name, plat = h.n, h.axis_name, h.plat
  dt = np_dtype(dname)
  m = max(1, int(raw_sent) // dt.itemsize // max(1, n - 1))
  if sample_np is not None:
    rows = np.resize(sample_np.reshape(-1), n * m).reshape(n, m).astype(dt)
    cap = int(codec.max_encoded_bytes(m, dt))
  else:
    rows = (np.random.default_rng(1).standard_normal((n, m), np.float32) * 0.02).astype(dt)
    cap = int(padded_capacity(m, dt, ratio=prof.ratio("capacity_ratio", role, dt)))
  site = "zipccl_jax.calibrate/in_situ"
  f = h.smap(lambda v: all_to_all(v, axis_name, 0, 0, tiled=True, compress=True, capacity=cap,
                                  transport="padded", name=site))
  ts = _time_all([("c", f, (h.put(rows),))], reps, warmup, barrier)["c"]
  strategy.forget_decision(site)
  accounting.forget_site(site)
  allv = allgather_json({"t": float(statistics.median(ts)), "q": _iqr(ts), "se": _median_se(ts)})
  t_c = max(v["t"] for v in allv) - base
  noise = max(v["se"] for v in allv)
  lk, _ = prof.link(axis_name, "all_to_all", plat)
  raw_b = n * m * dt.itemsize
  k_meas = t_c - lk.time(sent_bytes("all_to_all", float(n * cap), n))
  cm, _ = prof.codec_model(dt, plat)
  k_iso = cm.encode_time(raw_b) + cm.decode_time(raw_b)
  # A codec cost within twice its median's standard error (or below zero, the link model taking all
  # the time) is not measured, and scaling every codec model by it would fit noise. (Twice the IQR
  # of single repetitions, the rule before, refused the 2 x 4 testbed's codec at 1 Gbit/s: 16.6 ms
  # in a 139 ms all_to_all whose 7 repetitions spread 16.9 ms; the isolated estimate, 33.3 ms, then
  # made the links-only model of every coded variant 10-20% slow, benchmarks/README.md.)
  resolved = k_iso > 0 and k_meas > 2 * noise + _MIN_FIT_TIME_S
  factor = float(min(16.0, max(0.25, k_meas / k_iso))) if resolved else 1.0
  scaled = {d: c.scaled(factor) for d, c in prof.codec.get(plat, {}).items()}
  applied = resolved and all(_in_bounds(c) for c in scaled.values())  # else isolated models stay
  if applied:  # the factor is kept, for the phases no slow link binds (Profile.isolated_codec)
    prof.codec[plat] = scaled
    prof.codec_in_situ = {**prof.codec_in_situ, plat: factor}
  return {"dtype": dt.name, "chunk_elems": m, "capacity": cap, "compressed_a2a_s": t_c,
          "spread_s": max(v["q"] for v in allv), "median_se_s": noise,
          "codec_measured_s": k_meas, "codec_isolated_s": k_iso,
          "factor": factor, "applied": applied,
          "note": ("scaled" if applied else "out of bounds" if resolved
                   else "codec cost within twice its median's standard error")}


def calibrate(mesh, axis_name, *, profile: Profile | None = None, link: bool = True,
              codec: bool = True, collectives: Iterable[str] = ("all_to_all", "all_gather"),
              link_bytes: tuple = (256 << 10, 4 << 20), codec_bytes: tuple = (64 << 10, 1 << 20),
              dtypes: Iterable[str] = ("bfloat16", "float32"), sample=None,
              role: str = "activation", in_situ: bool = True, reps: int = 7, warmup: int = 1,
              levels: bool = True, save=None, activate: bool = True) -> Profile:
  """Measures the link over ``axis_name`` of ``mesh`` and the codec; returns a Profile.

  Link: for each collective in ``collectives`` ("all_to_all", "all_gather",
  "ppermute", "psum"), a jitted ``shard_map`` over ``mesh`` runs the
  ``jax.lax`` collective on uint8 messages of which each device sends about
  ``link_bytes`` (two or more sizes). The median time over ``reps`` (the
  measurements interleaved within groups, in shuffled order: one collective
  at one size, flat, over each level and, for an op with programs, those
  programs over the tuple; the codec; see `_job_group`), minus that of an empty ``shard_map``
  (dispatch), is fitted to ``latency + sent_bytes / bandwidth`` (least
  squares), and the medians themselves are kept as the model's ``points``
  (:class:`LinkModel`: interpolated between measured sizes, the fitted slope
  past the largest; :func:`monotone_points`). The first
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
  estimate), clamped to [1/4, 16] (and the factor kept as
  ``profile.codec_in_situ``: a phase on a fast level costs the isolated
  models, `Profile.isolated_codec`), unless that cost is within twice the
  standard error of its median (from the repetitions' interquartile range) or
  the scaled models leave the bounds: then the isolated models stay.
  ``meta["calibration"]["in_situ"]`` keeps the figures (``applied``, ``note``).

  Choose ``link_bytes`` to span the messages of the program, and include the
  sizes of its large collectives (the bytes one device sends in the flat raw
  collective, ``zipccl_jax.accounting.sent_bytes``): the model is exact at
  measured sizes and linear between them, and time per byte is not constant
  (small messages on shaped or congested links: bursts, windows; a message that
  outgrows a cache or a socket buffer). Each size adds one timed program per
  collective, level and hierarchical variant.

  Levels (``levels``, for a tuple of axes such as ``("host", "local")``): each axis's link is
  measured too, by the same collectives over that axis alone (every device at once, so a
  per-device rate under the load of its peers), interleaved with the rest; the profile then has
  a link model per level, which is what lets :mod:`zipccl_jax.hierarchical` decompose
  collectives over the tuple. Each op's hierarchical program over the tuple is timed too, with
  both phases raw and with the slow phase coded (``links["slow,fast"]["hierarchical_<op>"]`` and
  ``["hierarchical_<op>_slow_coded"]``, against the flat raw bytes), and so is its flat compressed
  program (``["flat_<op>_coded"]``): the plan costs those variants from what they measured. Where
  the op's flat raw collective is measured too (``collectives``), each of those programs' median
  is the flat median times their median paired ratio, repetition by repetition (`_paired`): the
  plan ranks them against each other, and drift cancels in the ratio.

  Robustness: every measurement is repeated ``reps`` times, interleaved, and the median is fitted
  (:func:`fit_bounded`); a size dependence within the repetitions' spread gives a throughput
  bound instead of a slope fitted to noise, and a fit outside ``BANDWIDTH_BOUNDS_BPS`` /
  ``LATENCY_BOUNDS_S`` is left out of the profile (the previous or default model stays) and
  named in ``meta["calibration"]["fits"]`` as unmeasurable.

  Multi-process: every process runs the same measurements at the same time
  (this is a collective), then all use, for every measurement, the median over repetitions of
  the slowest process's time in each (what a collective costs: it ends with its last process), so
  every rank computes the same profile (equal :meth:`Profile.fingerprint`) and makes the same
  decisions. ``meta["calibration"]["slowest_rep_s"]`` records that statistic, unfitted (the
  null program's included), and ``["slowest_median_s"]`` the slowest process's median, which
  calibrate fitted before.

  Args:
    mesh: a ``jax.sharding.Mesh``.
    axis_name: a mesh axis name (or tuple of names).
    profile: the profile to update, in a copy (default: the active one).
    link, codec: what to measure.
    save: a path; process 0 writes the JSON there.
    activate: make the result the active profile (:func:`set_profile`).
  """
  prof = (profile if profile is not None else get_profile()).copy()
  h = _Harness(mesh, axis_name)
  collectives, dtypes = tuple(collectives), tuple(dtypes)
  sample_np = None if sample is None else np.asarray(sample)
  if sample_np is not None:
    dtypes = (sample_np.dtype.name,)
  jobs: list = []                  # (name, fn, args)
  sizes: dict[str, float] = {}     # name -> bytes (x of the fit)
  # Dispatch of an (almost) empty program, subtracted from every measurement.
  jobs.append(("null", h.smap(lambda v: v + jnp.uint8(1)), (h.put(np.zeros((1, 64), np.uint8)),)))
  axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
  level_h = [_Harness(mesh, a) for a in axes] if link and levels and len(axes) > 1 else []
  if link:
    _link_jobs(h, collectives, link_bytes, jobs, sizes)
    for lh in level_h:
      _link_jobs(lh, collectives, link_bytes, jobs, sizes, prefix=f"link[{lh.akey}]")
    if len(axes) == 2 and level_h:
      _tuple_jobs(h, link_bytes, jobs, sizes)
  ratio_obs = _codec_jobs(h, dtypes, codec_bytes, sample_np, jobs, sizes, prof, role) if codec else {}
  barrier = h.barrier()
  t, noise, allv = _agree(_paired(_time_all(jobs, reps, warmup, barrier, _job_group)),
                          ratio_obs)
  _forget_hier_sites(axes)
  base = t["null"]

  def net(k):
    return max(0.0, t[k] - base)

  notes: dict[str, str] = {}
  if link:
    _fit_links(prof, h.akey, collectives, link_bytes, sizes, net, noise, notes)
    for lh in level_h:
      _fit_links(prof, lh.akey, collectives, link_bytes, sizes, net, noise, notes,
                 prefix=f"link[{lh.akey}]")
    if len(axes) == 2 and level_h:
      _fit_links(prof, h.akey, [k for op in two_level.PROGRAM_OPS for k in _tuple_programs(op)],
                 link_bytes, sizes, net, noise, notes, star=False)
  if codec:
    _fit_codec(prof, h.plat, dtypes, codec_bytes, sizes, net, noise, notes, role,
               allv if sample_np is not None else None)
    prof.codec_in_situ = {k: v for k, v in prof.codec_in_situ.items() if k != h.plat}  # refitted
  in_situ_info = None
  if codec and link and in_situ and h.n > 1 and "all_to_all" in collectives:
    in_situ_info = _in_situ(prof, h, dtypes[0], max(link_bytes), role, sample_np, reps, warmup,
                            barrier, base)
  prof.platform = h.plat
  prof.meta = dict(prof.meta)
  prof.meta["calibration"] = {
      "mesh": {str(k): int(v) for k, v in mesh.shape.items()}, "axis": h.akey, "axis_size": h.n,
      "processes": int(jax.process_count()), "devices": h.ndev, "platform": h.plat,
      "reps": reps, "dispatch_s": base, "fits": notes,
      "levels": [lh.akey for lh in level_h],
      "spread_s": {k: noise[k] for k in sorted(t) if k != "null"},
      "net_s": {k: net(k) for k in sorted(t) if k != "null"},
      "bytes": {k: sizes[k] for k in sorted(t) if k in sizes}, "in_situ": in_situ_info,
      "slowest_rep_s": _slowest_rep(allv), "slowest_median_s": _slowest_median(allv)}
  prof.validate()
  if save is not None and jax.process_index() == 0:
    prof.save(save)
  if activate:
    set_profile(prof)
  return prof
