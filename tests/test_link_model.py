"""LinkModel's measured points (zipccl_jax/strategy/links.py): interpolation, validation, JSON, calibrate's pooled
medians, and the plan that a line through two far sizes got wrong (issue 18: `auto` ran flat raw at 1.11-1.14x
the best variant because the hierarchical all_gather's cost per byte steps up between calibrate's two sizes)."""
from __future__ import annotations

import itertools

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import zipccl_jax
from zipccl_jax.strategy import levels as two_level, programs
from zipccl_jax.strategy.calibration import fit_bounded, monotone_points
from zipccl_jax.strategy.codec_cost import CodecModel
from zipccl_jax.strategy.decision import decide
from zipccl_jax.strategy.links import LinkModel, flat_links
from zipccl_jax.strategy.profile import Profile

STEP = LinkModel(1e-3, 1e8, ((1e5, 3e-3), (1e6, 12e-3), (2e6, 30e-3)))


@pytest.mark.parametrize("sent,want", [
    (0.0, 1e-3),                      # zero bytes: the latency
    (5e4, 2e-3),                      # halfway from (0, latency) to the first point
    (1e5, 3e-3), (1e6, 12e-3), (2e6, 30e-3),   # every measured size: its time, exactly
    (5.5e5, 7.5e-3), (1.5e6, 21e-3),  # between points: the chord, not the fitted line
    (3e6, 40e-3),                     # past the last point: its time plus the fitted slope (1e6 B at 1e8 B/s)
])
def test_time_interpolates_the_measured_points(sent, want):
  assert STEP.time(sent) == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_without_points_time_is_the_line():
  lk = LinkModel(1e-3, 1e8)
  assert lk.time(0) == 1e-3 and lk.time(2e6) == pytest.approx(1e-3 + 2e-2)


def test_a_first_point_below_the_latency_anchors_at_its_own_time():
  """The fitted intercept may lie above the smallest measured time; the curve never dips below zero bytes'."""
  lk = LinkModel(5e-3, 1e8, ((1e5, 2e-3), (1e6, 12e-3)))
  assert lk.time(0) == 2e-3 and lk.time(5e4) == 2e-3
  assert all(lk.time(a) <= lk.time(b) for a, b in itertools.pairwise(np.linspace(0, 3e6, 61)))


@pytest.mark.parametrize("points,why", [
    (((2e5, 1e-3), (1e5, 2e-3)), "strictly ascending"),
    (((1e5, 1e-3), (1e5, 2e-3)), "strictly ascending"),
    (((0.0, 1e-3), (1e5, 2e-3)), "strictly ascending"),
    (((1e5, 3e-3), (2e5, 2e-3)), "non-decreasing"),
    (((1e5, -1e-3), (2e5, 2e-3)), "non-decreasing"),
    (((1e5, float("nan")), (2e5, 2e-3)), "finite"),
])
def test_validate_refuses_points_no_measurement_gives(points, why):
  p = Profile()
  p.links = {"i": {"all_gather": LinkModel(0.0, 1e8, points)}}
  with pytest.raises(ValueError, match=rf"link \[i\]\[all_gather\] is not sane \(.*{why}"):
    p.validate()


def test_points_round_trip_and_leave_pointless_profiles_as_they_were():
  p = Profile()
  p.links = {"i": {"all_gather": STEP, "*": LinkModel(1e-4, 1e9)}}
  q = Profile.from_json(p.to_json())
  assert q.links == p.links and q.fingerprint() == p.fingerprint()
  assert "points" not in p.to_dict()["links"]["i"]["*"]   # the JSON of a profile without points is unchanged
  r = p.copy()
  r.links["i"]["all_gather"] = LinkModel(STEP.latency_s, STEP.bandwidth_Bps, STEP.points[:-1] + ((2e6, 31e-3),))
  assert r.fingerprint() != p.fingerprint()               # a point decides, so it is in the fingerprint


def test_flat_links_compose_the_measured_curves():
  """A flat collective over two measured levels runs them at once: at each level's measured size,
  scaled to the composed size, its time is the slower level's there (its curve, not its slope)."""
  H, L = 2, 4
  n = H * L
  intra = LinkModel(1e-4, 4e8, ((2e5, 1e-3), (4e6, 12e-3)))
  a2a = flat_links(H, L, STEP, intra)["all_to_all"]
  cross, stay = (n - L) / (n - 1), (L - 1) / (n - 1)
  sizes = sorted({x / cross for x, _ in STEP.points} | {x / stay for x, _ in intra.points})
  assert [x for x, _ in a2a.points] == pytest.approx(sizes)
  for s in sizes + [1.3e6, 5e6]:  # measured sizes exactly; the chord between them
    want = max(STEP.time(cross * s), intra.time(stay * s))
    if s in sizes:
      assert a2a.time(s) == pytest.approx(want, rel=1e-12)
    else:
      assert a2a.time(s) >= want * (1 - 1e-12)  # the chord of a convex-ish max lies above it
  ag = flat_links(H, L, STEP, intra)["all_gather"]  # the ring: a 1/L slice through each link
  for x, t in ag.points:
    assert t == pytest.approx(max(STEP.time(x / L), intra.time(x)), rel=1e-12)
  assert a2a.check() is None and ag.check() is None
  # two lines stay the line (zipccl_jax.model's table): no points
  lines = flat_links(H, L, LinkModel(1e-5, 5e10), LinkModel(5e-6, 9e11))
  assert lines["all_to_all"].points == () and lines["all_gather"].points == ()


def _in_situ_profile(factor: float) -> Profile:
  """A 2 x 4 profile whose cpu codec calibrate scaled by `factor` (in situ)."""
  p = Profile()
  p.codec["cpu"] = {"bfloat16": CodecModel(1.0e9, 1.5e9, 30e-6, 30e-6).scaled(factor)}
  p.codec_in_situ = {"cpu": factor}
  p.links = {"host": {"*": LinkModel(1e-4, 2.5e7)}, "local": {"*": LinkModel(1e-5, 5e8)}}
  return p


def test_codec_in_situ_round_trips_and_isolated_codec_divides_it_back_out():
  p = _in_situ_profile(0.5)
  q = Profile.from_json(p.to_json())
  assert q.codec_in_situ == {"cpu": 0.5} and q.fingerprint() == p.fingerprint()
  iso = p.isolated_codec()
  assert iso.codec["cpu"]["bfloat16"] == CodecModel(1.0e9, 1.5e9, 30e-6, 30e-6) and iso.codec_in_situ == {}
  assert p.codec_in_situ == {"cpu": 0.5}                   # a copy: the profile keeps its factor
  plain = Profile()
  assert plain.isolated_codec() is plain and "codec_in_situ" not in plain.to_dict()  # JSON unchanged
  r = p.copy()
  r.codec_in_situ = {}
  assert r.fingerprint() != p.fingerprint()                # the factor decides, so it is in the fingerprint
  bad = p.to_dict()
  bad["codec_in_situ"] = {"cpu": 0.0}
  with pytest.raises(ValueError, match=r"codec_in_situ\[cpu\] must be finite and > 0"):
    Profile.from_dict(bad)


@pytest.mark.parametrize("op", ["all_gather", "psum_scatter", "all_to_all"])
def test_the_fast_level_costs_the_codec_as_measured_alone(op):
  """A hierarchical variant's fast-level phase costs the isolated codec; its slow level and the flat
  program keep calibrate's in-situ models (the codec hides behind the slow link only)."""
  dt, m, sizes = np.dtype(ml_dtypes.bfloat16), 1 << 20, (2, 4)
  args = (op, dt, m, ("host", "local"), "host", "local", sizes, "activation")
  scaled = _in_situ_profile(0.5)
  model, flat, _ = two_level._models(*args, scaled, "cpu")
  alone, _, _ = two_level._models(*args, scaled.isolated_codec(), "cpu")
  unscaled = scaled.copy()
  unscaled.codec_in_situ = {}  # the same models, read as isolated everywhere
  same, flat_same, _ = two_level._models(*args, unscaled, "cpu")
  assert model[(False, True)] == pytest.approx(alone[(False, True)], rel=1e-12)   # fast: alone
  assert model[(False, True)] > same[(False, True)]                                # dearer than in situ
  # slow: in situ; all_to_all's slow-coded variant is the mixed exchange, which counts no saving for its
  # uncoded rows where the codec is hidden (test_the_mixed_exchange_saves_the_uncoded_rows_codec_only_where_it_binds)
  cm, row_bytes = scaled.codec_model(dt, "cpu")[0], m // 8 * dt.itemsize
  saving = (sizes[1] - 1) * (row_bytes / cm.encode_Bps + row_bytes / cm.decode_Bps) if op == "all_to_all" else 0.0
  assert model[(True, False)] == pytest.approx(same[(True, False)] + saving, rel=1e-12)
  assert model[(False, False)] == pytest.approx(same[(False, False)], rel=1e-12)
  if op == "all_gather":  # the flat program is a ring of 8, which decodes all at once: alone too
    _, flat_alone, _ = two_level._models(*args, scaled.isolated_codec(), "cpu")
    assert flat == flat_alone and flat[True] > flat_same[True] and flat[False] == flat_same[False]
  else:
    assert flat == flat_same


def test_a_ring_all_gather_costs_the_codec_as_measured_alone():
  """Calibrate's in-situ scale, measured inside a coded all_to_all whose devices finish one by one, applies to
  the phases shaped so: all_to_all, ppermute, an all_gather between two devices. An all_gather over more is a
  ring, whose devices all receive their last row in the same step and decode at once: the isolated codec."""
  dt = np.dtype(ml_dtypes.bfloat16)
  p = _in_situ_profile(0.5)
  scaled, alone = p.codec["cpu"]["bfloat16"], p.isolated_codec().codec["cpu"]["bfloat16"]
  codecs = {(op, n): p.phase_codecs(dt, "cpu", programs.structure(op, n), n)
            for op in ("all_to_all", "all_gather", "psum", "ppermute") for n in (2, 8)}
  assert codecs == {("all_to_all", 2): [scaled], ("all_to_all", 8): [scaled],
                    ("all_gather", 2): [scaled], ("all_gather", 8): [alone],
                    ("psum", 2): [scaled, scaled], ("psum", 8): [scaled, alone],  # its gather half: a ring
                    ("ppermute", 2): [scaled], ("ppermute", 8): [scaled]}

  def est(op, prof):
    return decide(op, dt, 1 << 18, axis_size=8, compress=True, profile=prof, platform="cpu",
                  log=False).est_compressed_s

  assert est("all_gather", p) == est("all_gather", p.isolated_codec()) > est("all_gather", _plain(p))
  assert est("all_to_all", p) == est("all_to_all", _plain(p)) < est("all_to_all", p.isolated_codec())


def _plain(p: Profile) -> Profile:
  """`p`'s codec models read as isolated everywhere (its in-situ factor forgotten)."""
  q = p.copy()
  q.codec_in_situ = {}
  return q


def test_monotone_points_pools_a_dip_and_averages_equal_sizes():
  assert monotone_points([4, 1, 2, 3], [5, 1, 3, 2]) == ((1, 1), (2, 2.5), (3, 2.5), (4, 5))
  assert monotone_points([1, 1, 2], [1, 3, 2.5]) == ((1, 2), (2, 2.5))
  xs, ts = [256 << 10, 3 << 20, 4 << 20], [3e-3, 20e-3, 30e-3]
  assert monotone_points(xs, ts) == tuple(zip(map(float, xs), ts))   # already monotone: unchanged


def test_fit_bounded_keeps_the_medians_as_points():
  xs, ts = [256 << 10, 3670016, 4 << 20], [3.2e-3, 19.3e-3, 27.7e-3]
  lk, note = fit_bounded(xs, ts, noise_s=1e-4)
  assert note == "fit" and lk.points == tuple(zip(map(float, xs), ts))
  assert [lk.time(x) for x in xs] == pytest.approx(ts, rel=1e-12)


H, L = 2, 4
AXES = ("host", "local")


def _all_gather_estimates(prof, shard_elems):
  """Every variant's estimate, the raw two-level program's included (a candidate with fixed_order)."""
  allowed = two_level._allowed("auto", "auto", None, "host", "local", fixed_order=True)
  with zipccl_jax.use_profile(prof):
    est, _ = two_level._candidates("all_gather", np.dtype(ml_dtypes.bfloat16), shard_elems, AXES, "host",
                                      "local", (H, L), "activation", allowed)
  return {k: v[0] for k, v in est.items()}


def test_plan_at_a_measured_size_sees_the_step_a_line_through_two_sizes_misses():
  """The 2 x 4 testbed's all_gather in figures: the hierarchical program's time per byte steps up between the
  benchmark's 512 KB shard (flat raw sends 3.5 MiB) and calibrate's largest size (4 MiB). Measured at both, the
  plan costs the call at its own size and runs the hierarchical program; with only calibrate's default sizes
  the line through them overestimates it and the plan runs flat raw."""
  shard = 256 << 10                                  # bfloat16 elements: 512 KiB
  sent = (H * L - 1) * shard * 2                     # 3.5 MiB
  small, big = 256 << 10, 4 << 20
  flat = LinkModel(2e-4, 1.2e8)                      # flat raw all_gather: ~30.8 ms at `sent`
  codec = CodecModel(2e8, 3e8, 1e-4, 1e-4)           # eight devices coding on two shared cores
  times = {"hierarchical_all_gather": {small: 2.2e-3, sent: 31.6e-3, big: 44.1e-3},
           "hierarchical_all_gather_slow_coded": {small: 2.5e-3, sent: 28.9e-3, big: 41.5e-3}}

  def profile(sizes):
    p = Profile()
    p.links = {"host": {"*": LinkModel(1e-4, 3e7)}, "local": {"*": LinkModel(1e-5, 2e8)},
               "host,local": {"*": flat, "all_gather": flat}}
    p.codec = {"cpu": {"bfloat16": codec}}
    for key, t in times.items():
      xs = sorted(sizes)
      lk, _ = fit_bounded(xs, [t[x] for x in xs])
      p.links["host,local"][key] = lk
    return p

  est = _all_gather_estimates(profile([small, sent, big]), shard)
  assert est["hierarchical host:compressed local:raw"] == pytest.approx(28.9e-3, rel=1e-9)
  assert est["hierarchical host:raw local:raw"] == pytest.approx(31.6e-3, rel=1e-9)
  assert min(est, key=est.get) == "hierarchical host:compressed local:raw"
  line = _all_gather_estimates(profile([small, big]), shard)
  assert line["hierarchical host:compressed local:raw"] > 1.1 * 28.9e-3
  assert min(line, key=line.get) == "flat raw"


def test_a_fixed_order_psum_scatter_is_costed_from_its_own_program():
  """psum_scatter's two-level programs differ by `fixed_order` (the raw level: jax.lax's reduce-scatter, or
  zipccl's all-to-all and ordered sum; on the 2 x 4 CPU testbed 97 against 37 ms), so calibrate keys them
  apart and the plan reads the one that will run: with the other's times it chose flat at 2.6x the best."""
  shard = 256 << 10
  slow_prog, fast_prog = LinkModel(0.0, 3.7e7), LinkModel(0.0, 1.1e8)
  p = Profile()
  p.links = {"host": {"*": LinkModel(1e-4, 3e7)}, "local": {"*": LinkModel(1e-5, 2e8)},
             "host,local": {"*": LinkModel(1e-4, 5e7), "all_gather": LinkModel(1e-4, 1.2e8),
                            two_level.hierarchical_key("psum_scatter"): slow_prog,
                            two_level.hierarchical_key("psum_scatter", True): slow_prog,
                            two_level.hierarchical_key("psum_scatter", False, True): fast_prog,
                            two_level.hierarchical_key("psum_scatter", True, True): fast_prog}}
  key = two_level.hierarchical_key
  assert key("psum_scatter", True, True) == "hierarchical_psum_scatter_slow_coded_fixed_order"
  assert key("all_gather", True, True) == "hierarchical_all_gather_slow_coded"  # one program either way
  sent = (H * L - 1) * shard * 2
  est = {}
  for fo in (False, True):
    allowed = two_level._allowed("auto", "auto", None, "host", "local", fixed_order=fo)
    with zipccl_jax.use_profile(p):
      e, _ = two_level._candidates("psum_scatter", np.dtype(ml_dtypes.bfloat16), H * L * shard, AXES, "host",
                                      "local", (H, L), "gradient", allowed, fixed_order=fo)
    est[fo] = {k: v[0] for k, v in e.items()}
  name = "hierarchical host:compressed local:raw"
  assert est[False][name] == pytest.approx(slow_prog.time(sent), rel=1e-9)
  assert est[True][name] == pytest.approx(fast_prog.time(sent), rel=1e-9)


@pytest.mark.skipif(jax.device_count() < H * L, reason="needs 8 devices")
def test_calibrate_keeps_every_size_it_measured():
  """On virtual devices: each link model's points are the pooled medians at the sizes calibrate ran, in the
  profile and in its saved JSON."""
  mesh = Mesh(np.array(jax.devices()[:H * L]).reshape(H, L), AXES)
  sizes = (16 << 10, 48 << 10, 128 << 10)
  prof = zipccl_jax.calibrate(mesh, AXES, link_bytes=sizes, codec=False, reps=3, activate=False,
                              profile=Profile())
  cal = prof.meta["calibration"]
  checked = 0
  for akey, prefix in (("host,local", "link"), ("host", "link[host]"), ("local", "link[local]")):
    for coll in ("all_to_all", "all_gather") + (
        tuple(two_level.hierarchical_key(op, c, fo) for op in two_level.PROGRAM_OPS for c in (False, True)
              for fo in (False, True))
        + tuple(two_level.flat_coded_key(op) for op in two_level.PROGRAM_OPS)
        if akey == "host,local" else ()):
      lk = prof.links[akey].get(coll)
      if lk is None:                                 # unmeasurable (named in the notes)
        assert cal["fits"][f"link[{akey}]/{coll}"].startswith("unmeasurable"), (akey, coll)
        continue
      ks = [f"{prefix}/{coll}/{s}" for s in sizes]
      xs = [cal["bytes"][k] for k in ks]
      ts = [max(cal["net_s"][k], 1e-6) for k in ks]
      assert lk.points == monotone_points(xs, ts), (akey, coll)
      assert len(lk.points) == len(sizes) and lk.check() is None
      checked += 1
  assert checked >= 6
  assert Profile.from_json(prof.to_json()).links == prof.links


def test_levels_per_collective_cost_each_collective_with_its_own_link():
  """A level given per collective (what calibrate measures per level): the level's all_gather costs its
  all_gather link, other collectives "*"; the flat all_gather composes the levels' all_gather links, the flat
  all_to_all their all_to_all links; a shared link divides each; a table without "*" is refused."""
  from zipccl_jax.model import Topology
  H, L = 2, 4
  a2a_h, ag_h = LinkModel(1e-4, 2e7), LinkModel(1e-4, 3e7)
  a2a_l, ag_l = LinkModel(1e-5, 3e8), LinkModel(1e-5, 5e8)
  inter = {"all_to_all": a2a_h, "all_gather": ag_h, "*": a2a_h}
  intra = {"all_to_all": a2a_l, "all_gather": ag_l, "*": a2a_l}
  p = Topology(H, L, inter, intra, platform="cpu").profile()
  assert p.link("host", "all_gather", "cpu")[0] == ag_h and p.link("local", "all_gather", "cpu")[0] == ag_l
  assert p.link("host", "ppermute", "cpu")[0] == a2a_h
  flat = p.links["host,local"]
  assert flat["all_gather"] == flat_links(H, L, ag_h, ag_l)["all_gather"]
  assert flat["all_to_all"] == flat_links(H, L, a2a_h, a2a_l)["all_to_all"]
  one = Topology(H, L, a2a_h, a2a_l, platform="cpu").profile()   # one link per level: every collective's
  assert one.link("local", "all_gather", "cpu")[0] == a2a_l
  shared = Topology(H, L, inter, intra, platform="cpu", shared_link="host").profile()
  assert shared.link("host", "all_gather", "cpu")[0].bandwidth_Bps == pytest.approx(3e7 / L)
  assert Topology(H, L, inter, intra).level_links() == (a2a_h, a2a_l)
  with pytest.raises(ValueError, match="inter per collective needs a '\\*' LinkModel"):
    Topology(H, L, {"all_gather": ag_h}, intra)


def test_a_levels_stream_entry_costs_the_flat_collectives_crossings_and_nothing_else():
  """A level's "stream" (the rate a flat collective's crossings reach on it, per device) is what the flat
  ring's edge and the flat all_to_all's crossings run at, in place of the level's all_gather and all_to_all
  links; the level's own collectives and the levels' programs keep theirs, and so does the fast level's
  share of the flat all_to_all. A shared link divides it like every entry (one stream through a host's
  link, which its L devices share)."""
  from zipccl_jax.model import Topology
  from zipccl_jax.strategy.links import stream_link
  H, L = 2, 4
  a2a_h, ag_h, stream_h = LinkModel(1e-4, 2e7), LinkModel(1e-4, 2.4e7), LinkModel(1e-4, 3e7)
  intra = {"all_to_all": LinkModel(1e-5, 3e8), "all_gather": LinkModel(1e-5, 5e8), "*": LinkModel(1e-5, 3e8)}
  with_stream = {"all_to_all": a2a_h, "all_gather": ag_h, "stream": stream_h, "*": a2a_h}
  without = {k: v for k, v in with_stream.items() if k != "stream"}
  assert stream_link(with_stream, "all_gather") == stream_link(with_stream, "all_to_all") == stream_h
  assert stream_link(without, "all_gather") == ag_h and stream_link(without, "all_to_all") == a2a_h
  assert stream_link(ag_h, "all_to_all") == ag_h  # one link for every collective
  p, q = (Topology(H, L, t, intra, platform="cpu").profile() for t in (with_stream, without))
  flat_p, flat_q = p.links["host,local"], q.links["host,local"]
  assert flat_p["all_gather"] == flat_links(H, L, stream_h, intra["all_gather"])["all_gather"]
  assert flat_p["all_to_all"] == flat_links(H, L, stream_h, intra["all_to_all"])["all_to_all"]
  s = 3.5e6  # a stream 1.25x (1.5x) faster crosses in 1/1.25 (1/1.5) of the time, where the host edge binds
  assert flat_q["all_gather"].time(s) / flat_p["all_gather"].time(s) == pytest.approx(1.25, rel=0.01)
  assert flat_q["all_to_all"].time(s) / flat_p["all_to_all"].time(s) == pytest.approx(1.5, rel=0.01)
  assert p.link("host", "all_gather", "cpu")[0] == ag_h  # the level's own collectives are still its own
  assert p.link("host", "all_to_all", "cpu")[0] == a2a_h
  assert flat_p["ppermute"] == flat_q["ppermute"] and flat_p["psum"] == flat_q["psum"]
  shared = Topology(H, L, with_stream, intra, platform="cpu", shared_link="host").profile()
  assert shared.links["host"]["stream"].bandwidth_Bps == pytest.approx(3e7 / L)
  assert Profile.from_json(p.to_json()).links == p.links


def test_the_slot_passes_are_measured_or_cost_nothing():
  """`CodecModel.slot_*`: unmeasured (0) costs nothing and leaves a profile's JSON and fingerprint as before
  the fields existed; measured, it round-trips, scales in situ like the codec, and refuses an insane value."""
  plain, measured = CodecModel(1e9, 1.5e9, 30e-6, 30e-6), CodecModel(1e9, 1.5e9, 30e-6, 30e-6, 4e8, 2e-5)
  assert plain.slot_time(1 << 20) == 0.0
  assert measured.slot_time(1 << 20) == pytest.approx(2e-5 + (1 << 20) / 4e8)
  assert measured.scaled(0.5).slot_time(1 << 20) == pytest.approx(0.5 * measured.slot_time(1 << 20))
  p = Profile()
  p.codec["cpu"] = {"bfloat16": plain}
  assert "slot_Bps" not in p.to_json()
  q = p.copy()
  q.codec["cpu"] = {"bfloat16": measured}
  assert Profile.from_json(q.to_json()).codec["cpu"]["bfloat16"] == measured
  assert q.fingerprint() != p.fingerprint()       # it changes the mixed exchange's cost, so a decision
  bad = q.to_dict()
  bad["codec"]["cpu"]["bfloat16"]["slot_Bps"] = -1.0
  with pytest.raises(ValueError, match=r"profile codec \[cpu\]\[bfloat16\] is not sane"):
    Profile.from_dict(bad).validate()


def test_the_mixed_exchange_costs_its_own_rows_slot_passes():
  """all_to_all host coded / local raw (`levels._mixed_model`) costs the passes over the own host's L rows
  at the profile's slot rate, and nothing more; the other variants do not move."""
  dt, m, sizes = np.dtype(ml_dtypes.bfloat16), 1 << 20, (2, 4)
  args = ("all_to_all", dt, m, ("host", "local"), "host", "local", sizes, "activation")
  p = _in_situ_profile(0.5)
  q = p.copy()
  c = q.codec["cpu"]["bfloat16"]
  q.codec["cpu"]["bfloat16"] = CodecModel(c.encode_Bps, c.decode_Bps, c.encode_overhead_s, c.decode_overhead_s,
                                          3e8, 1e-4)
  before, _, _ = two_level._models(*args, p, "cpu")
  after, _, _ = two_level._models(*args, q, "cpu")
  L, row_bytes = sizes[1], m // 8 * dt.itemsize
  assert after[(True, False)] - before[(True, False)] == pytest.approx(1e-4 + L * row_bytes / 3e8)
  assert {k: v for k, v in after.items() if k != (True, False)} == {
      k: v for k, v in before.items() if k != (True, False)}


@pytest.mark.parametrize("factor", [None, 1.0, 2.0, 0.5], ids=["isolated", "in-situ-1", "in-situ-2", "hidden"])
def test_the_mixed_exchange_saves_the_uncoded_rows_codec_only_where_it_binds(factor):
  """all_to_all host coded / local raw leaves the L - 1 other rows of its own host uncoded: `_mixed_model` takes
  their encode and decode off the flat coded exchange's time where the codec binds (no in-situ factor, or one
  of 1 or more), and nothing where calibrate measured it hidden behind the slow link (a factor under 1: coding
  fewer rows there saves no time a call waits for). The slow level's codec rates are the same in both
  profiles compared, so the raw variant and the slow phase of the one coding both levels do not move."""
  dt, m, sizes = np.dtype(ml_dtypes.bfloat16), 1 << 20, (2, 4)
  args = ("all_to_all", dt, m, ("host", "local"), "host", "local", sizes, "activation")
  p = _in_situ_profile(factor or 1.0)
  if factor is None:
    p.codec_in_situ = {}
  got, _, _ = two_level._models(*args, p, "cpu")
  cm = p.codec_model(dt, "cpu")[0]
  L, row_bytes = sizes[1], m // 8 * dt.itemsize
  saving = (L - 1) * (row_bytes / cm.encode_Bps + row_bytes / cm.decode_Bps)  # written out: the model's term
  assert two_level.uncoded_rows_codec_s(cm, row_bytes, L) == pytest.approx(saving, rel=1e-12)
  hidden = p.copy()
  hidden.codec_in_situ = {"cpu": 0.5}
  hidden.codec = p.codec  # the same rates, read as hidden
  without, _, _ = two_level._models(*args, hidden, "cpu")
  if factor is not None and factor < 1:
    assert got[(True, False)] == without[(True, False)]
  else:
    assert without[(True, False)] - got[(True, False)] == pytest.approx(saving, rel=1e-9)
    assert saving > 0
  assert got[(False, False)] == without[(False, False)]


def _tied_profile(timed_gain: float, coded_key: str) -> Profile:
  """A 2 x 4 profile whose flat raw all_gather of a 512 KiB shard takes 30 ms and whose program `coded_key`
  (calibrate's timing over the tuple) takes 29.7 ms: a near tie, 1% apart."""
  sent = (H * L - 1) * (256 << 10) * 2
  p = Profile(timed_gain=timed_gain)
  p.links = {"host": {"*": LinkModel(1e-4, 3e7)}, "local": {"*": LinkModel(1e-5, 2e8)},
             "host,local": {"*": LinkModel(0.0, sent / 30e-3), coded_key: LinkModel(0.0, sent / 29.7e-3)}}
  p.codec = {"cpu": {"bfloat16": CodecModel(2e8, 3e8, 1e-4, 1e-4)}}
  return p


@pytest.mark.parametrize("coded_key, pick", [("hierarchical_all_gather_slow_coded", "hierarchical host:compressed local:raw"),
                                             ("flat_all_gather_coded", "flat compressed")],
                         ids=["slow-level-coded", "flat-compressed"])
def test_a_timed_compressed_program_competes_at_its_time(coded_key, pick):
  """A compressed program calibrate timed over the tuple is ranked at its time (`Profile.timed_gain`, 0 by
  default): 1% ahead of raw, the plan runs it; with timed_gain 0.02 (the margin a modelled estimate needs) it
  stays raw. A flat plan hands its margin to the flat path, which decides as the plan ranked."""
  bf16 = np.dtype(ml_dtypes.bfloat16)

  def plan(gain):
    return two_level.choose("all_gather", bf16, 256 << 10, AXES, AXES, (H, L), "auto", "activation",
                            profile=_tied_profile(gain, coded_key), platform="cpu")

  today, margin = plan(0.0), plan(0.02)
  assert today.candidates[0] == (pick, pytest.approx(29.7e-3, rel=1e-9)), today.candidates
  assert margin.candidates[0] == ("flat raw", pytest.approx(30e-3, rel=1e-9)), margin.candidates
  assert "timed x (1+0)" in today.reason and "compressed x (1+0.02)" in today.reason
  assert two_level._timed("all_gather", bf16, AXES, "host", "local", _tied_profile(0.0, coded_key)) == {pick}
  assert two_level._timed("all_gather", np.dtype(np.float32), AXES, "host", "local",
                          _tied_profile(0.0, coded_key)) == set()   # timed on bfloat16 only
  if pick == "flat compressed":
    for gain, lp, compressed in ((0.0, today, True), (0.02, margin, False)):
      assert lp.algorithm == "flat" and lp.flat_estimates()[2] == gain
      d = decide("all_gather", bf16, 256 << 10, axis_size=H * L, axis_name=AXES, compress="auto",
                 profile=_tied_profile(gain, coded_key), platform="cpu", log=False,
                 flat_est=lp.flat_estimates())
      assert d.compress is compressed and f"x (1+{gain:g})" in d.reason, d.reason


def test_timed_gain_round_trips_and_is_absent_where_it_is_zero():
  p = Profile()
  assert "timed_gain" not in p.to_dict()
  q = Profile(timed_gain=0.02)
  assert Profile.from_dict(q.to_dict()).timed_gain == 0.02 and q.fingerprint() != p.fingerprint()
  with pytest.raises(ValueError, match="timed_gain"):
    Profile(timed_gain=-0.01).validate()
