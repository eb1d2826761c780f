"""zipccl_jax.strategy: the cost model, profiles, calibration, observed capacities, agreement across ranks.

Decision tests use synthetic profiles and check the choice against the crossover computed here from the
model's formula (independently of strategy.crossover_bandwidth). Calibration runs on the 8 virtual CPU
devices (tests/conftest.py) with small sizes; the multi-process test (tests/mp_launch.py) shows that every
rank makes the same decisions from a loaded profile and from a profile calibrated across processes.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zj
import zipccl_jax as zc  # the public API (stats, capacities, collectives)
from zipccl_jax import accounting, capacity
from zipccl_jax import strategy as st
from zipccl_jax.strategy import calibration, profile as pf
from zipccl_jax.strategy.codec_cost import DEFAULT_CODEC, CodecModel
from zipccl_jax.strategy.links import DEFAULT_LINKS, LinkModel

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
HERE = Path(__file__).resolve().parent

needs8 = pytest.mark.skipif(jax.device_count() < 8,
                            reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")


def synthetic(bw=1e9, lat=50e-6, enc=2e9, dec=4e9, eo=20e-6, do=20e-6, min_gain=0.02, **kw):
  p = pf.Profile(links={"*": {"*": LinkModel(lat, bw)}},
                 codec={"cpu": {d: CodecModel(enc, dec, eo, do)
                                for d in ("bfloat16", "float16", "float32")}},
                 min_gain=min_gain, **kw)
  p.validate()
  return p


def model_crossover(op, dtype, m, n, p: pf.Profile):
  """The bandwidth below which compressing pays, from the documented formula (padded transport)."""
  dt = np.dtype(dtype)
  role = "gradient" if op in ("psum_scatter", "psum") else "activation"
  raw = m * dt.itemsize
  C = zc.padded_capacity(m, dt, ratio=p.capacity_ratio[role][dt.name])
  lk = p.links["*"]["*"]
  cm = p.codec["cpu"][dt.name]
  over = cm.encode_overhead_s + cm.decode_overhead_s
  if op in ("all_to_all", "psum_scatter"):
    b_raw, b_wire = (n - 1) * raw, (n - 1) * C
    k = (n - 1) * raw / cm.encode_Bps + (n - 1) * raw / cm.decode_Bps + over  # own row not coded
    l_raw = l_c = lk.latency_s
  elif op == "all_gather":
    b_raw, b_wire = (n - 1) * raw, (n - 1) * C
    k = raw / cm.encode_Bps + (n - 1) * raw / cm.decode_Bps + over
    l_raw = l_c = lk.latency_s
  elif op == "psum":
    b_raw, b_wire = 2 * (n - 1) * raw, 2 * (n - 1) * C
    k = n * raw / cm.encode_Bps + (2 * n - 1) * raw / cm.decode_Bps + 2 * over  # gather: every row
    l_raw = l_c = 2 * lk.latency_s
  elif op == "ppermute":
    b_raw, b_wire = raw, C
    k = raw / cm.encode_Bps + raw / cm.decode_Bps + over
    l_raw, l_c = lk.latency_s, 2 * lk.latency_s  # + the overflow-flag psum
  g = p.min_gain
  return (b_raw - (1 + g) * b_wire) / ((1 + g) * (l_c + k) - l_raw)


def with_bw(p: pf.Profile, bw: float) -> pf.Profile:
  q = p.copy()
  q.links["*"]["*"] = LinkModel(q.links["*"]["*"].latency_s, bw)
  return q


# ------------------------------------------------------------------------------------------- decisions

def test_raw_on_fast_links_compressed_on_slow_ones():
  m, n = 1 << 18, 8  # 512 KiB bf16 chunks
  for op in ("all_to_all", "all_gather", "psum_scatter", "psum", "ppermute"):
    role = "gradient" if op in ("psum_scatter", "psum") else "activation"
    fast = st.decide(op, BF16, m, axis_size=n, role=role, profile=synthetic(bw=100e9),
                     platform="cpu", log=False)
    slow = st.decide(op, BF16, m, axis_size=n, role=role, profile=synthetic(bw=0.1e9),
                     platform="cpu", log=False)
    assert not fast.compress and fast.capacity == 0, fast
    assert slow.compress and 0 < slow.capacity < m * 2, slow
    assert slow.est_compressed_s * 1.02 < slow.est_raw_s
    assert fast.est_compressed_s * 1.02 >= fast.est_raw_s
    assert slow.transport == "auto"  # CPU: padded through platform_dependent


@pytest.mark.parametrize("op", ["all_to_all", "all_gather", "psum_scatter", "psum", "ppermute"])
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
def test_crossover_where_the_model_says(op, dtype):
  m, n = 1 << 16, 8
  base = synthetic()
  bw_star = model_crossover(op, dtype, m, n, base)
  assert 1e6 < bw_star < 1e12, bw_star
  role = "gradient" if op in ("psum_scatter", "psum") else "activation"
  assert st.crossover_bandwidth(op, dtype, m, axis_size=n, role=role, profile=base) == \
      pytest.approx(bw_star, rel=1e-9)
  below = st.decide(op, dtype, m, axis_size=n, role=role, profile=with_bw(base, bw_star * 0.99),
                    platform="cpu", log=False)
  above = st.decide(op, dtype, m, axis_size=n, role=role, profile=with_bw(base, bw_star * 1.01),
                    platform="cpu", log=False)
  assert below.compress and not above.compress, (bw_star, below, above)
  # at the crossover itself the two estimates (with the min_gain margin) meet
  at = st.decide(op, dtype, m, axis_size=n, role=role, profile=with_bw(base, bw_star),
                 platform="cpu", log=False)
  assert at.est_compressed_s * (1 + base.min_gain) == pytest.approx(at.est_raw_s, rel=1e-9)


def test_crossover_moves_with_codec_speed_and_size():
  n = 8
  slow_codec = synthetic(enc=0.5e9, dec=0.5e9)
  fast_codec = synthetic(enc=50e9, dec=50e9)
  a = model_crossover("all_to_all", BF16, 1 << 16, n, slow_codec)
  b = model_crossover("all_to_all", BF16, 1 << 16, n, fast_codec)
  assert b > 10 * a  # a faster codec pays on faster links
  # small messages: the fixed codec overhead dominates, so the crossover drops
  assert model_crossover("all_to_all", BF16, 1 << 10, n, synthetic()) < \
      model_crossover("all_to_all", BF16, 1 << 18, n, synthetic())


def test_raw_when_compression_cannot_pay():
  slow = synthetic(bw=1e6)
  assert st.decide("all_to_all", np.int32, 4096, axis_size=8, profile=slow, log=False).reason \
      == "dtype int32 not coded"
  assert not st.decide("all_to_all", BF16, 4096, axis_size=1, profile=slow, log=False).compress
  tiny = st.decide("all_to_all", BF16, 16, axis_size=8, profile=slow, log=False)
  assert not tiny.compress and tiny.reason == "capacity saves nothing"
  assert not st.decide("all_to_all", BF16, 0, axis_size=8, profile=slow, log=False).compress
  # explicit capacity is respected; True/False are reported as given
  d = st.decide("all_to_all", BF16, 4096, axis_size=8, profile=slow, capacity=4096, log=False)
  assert d.compress and d.capacity == 4096 and d.capacity_source == "explicit"
  assert st.decide("all_to_all", BF16, 4096, axis_size=8, profile=synthetic(bw=1e12),
                   compress=True, log=False).compress
  assert not st.decide("all_to_all", BF16, 4096, axis_size=8, profile=slow, compress=False,
                       log=False).compress


def test_fallback_risk_and_min_gain_push_towards_raw():
  m, n = 1 << 16, 8
  base = synthetic()
  bw = model_crossover("all_to_all", BF16, m, n, base) * 0.9
  assert st.decide("all_to_all", BF16, m, axis_size=n, profile=with_bw(base, bw), log=False).compress
  risky = with_bw(base, bw)
  risky.fallback_risk = 0.5
  assert not st.decide("all_to_all", BF16, m, axis_size=n, profile=risky, log=False).compress
  picky = with_bw(base, bw)
  picky.min_gain = 0.5
  assert not st.decide("all_to_all", BF16, m, axis_size=n, profile=picky, log=False).compress


def test_gpu_transport_ragged_or_padded():
  m, n = 1 << 20, 8
  gpu = pf.Profile(links={"*": {"*": LinkModel(10e-6, 1e9)}},
                   codec={"gpu": {"bfloat16": CodecModel(400e9, 400e9, 5e-6, 5e-6)}})
  d = st.decide("all_to_all", BF16, m, axis_size=n, profile=gpu, platform="gpu", log=False)
  assert d.compress and d.transport == "ragged"  # moves the expected size, not the capacity
  assert d.wire_bytes < (n - 1) * d.capacity
  # huge latency, small message: one more size exchange costs more than the padding saves
  lat = pf.Profile(links={"*": {"*": LinkModel(5e-3, 1e9)}},
                   codec={"gpu": {"bfloat16": CodecModel(400e9, 400e9, 5e-6, 5e-6)}},
                   min_gain=0.0)
  d = st.decide("all_to_all", BF16, 1 << 17, axis_size=n, profile=lat, platform="gpu", log=False)
  assert d.compress and d.transport == "padded", d
  # an explicit transport is kept
  d = st.decide("all_to_all", BF16, m, axis_size=n, profile=gpu, platform="gpu",
                transport="padded", log=False)
  assert d.transport == "padded"


def test_lookup_fallbacks_and_documented_defaults():
  p = pf.Profile()
  lk, src = p.link("i", "all_to_all", "cpu")
  assert lk == DEFAULT_LINKS["cpu"] and src == "default[cpu]"
  assert DEFAULT_LINKS["cpu"].bandwidth_Bps == 0.125e9  # 1 Gbit/s, as documented
  p.links = {"*": {"*": LinkModel(1e-4, 1e9)}, "a": {"all_gather": LinkModel(2e-4, 2e9)}}
  assert p.link("a", "all_gather", "cpu")[0].bandwidth_Bps == 2e9
  assert p.link("a", "all_to_all", "cpu")[0].bandwidth_Bps == 1e9   # axis has no "*": any axis
  assert p.link(("a", "b"), "psum", "cpu")[0].bandwidth_Bps == 1e9
  p.codec = {"cpu": {"bfloat16": CodecModel(1e9, 2e9)}}
  assert p.codec_model(np.float16, "cpu")[0].decode_Bps == 2e9       # f16 uses bf16's numbers
  assert p.codec_model(np.float32, "cpu")[0] == DEFAULT_CODEC["cpu"]["float32"]
  assert p.ratio("capacity_ratio", "gradient", BF16) == capacity.EXPECTED_RATIO["gradient"][BF16]


def test_fit_stays_finite_when_net_times_vanish():
  """Calibration subtracts the null program's time; on a fast codec or a loaded host every net time can be 0
  (it once raised ZeroDivisionError). Floored, the fit gives a finite, positive bandwidth and no latency."""
  for ts in ([0.0, 0.0], [-1e-5, 0.0], [0.0, -3e-4], [2e-5, 1e-5]):
    lat, bw = calibration._fit([16 << 10, 64 << 10], ts)
    assert lat >= 0 and 0 < bw < math.inf, (ts, lat, bw)
  lat, bw = calibration._fit([1e3, 2e3, 4e3], [1e-3 + 1e3 / 1e8, 1e-3 + 2e3 / 1e8, 1e-3 + 4e3 / 1e8])
  assert math.isclose(lat, 1e-3, rel_tol=1e-6) and math.isclose(bw, 1e8, rel_tol=1e-6)


def test_observed_capacity_is_used_with_margin():
  p = synthetic(bw=1e6)
  m = 1 << 14
  p.sites["s"] = pf.SiteObservation("all_to_all", "bfloat16", m, max_frame_bytes=20000,
                                    frames=8, total_frame_bytes=150000)
  d = st.decide("all_to_all", BF16, m, axis_size=8, site="s", profile=p, log=False)
  assert d.capacity == -(-math.ceil(20000 * 1.02) // 8) * 8 and d.capacity_source == "observed"
  # another shape at the same site: its worst ratio scaled to the new chunk
  d2 = st.decide("all_to_all", BF16, 2 * m, axis_size=8, site="s", profile=p, log=False)
  assert d2.capacity == zc.padded_capacity(2 * m, BF16, ratio=20000 / (2 * m) * 1.02)
  # compress=True keeps the library's default capacity
  d3 = st.decide("all_to_all", BF16, m, axis_size=8, site="s", profile=p, compress=True, log=False)
  assert d3.capacity == zc.padded_capacity(m, BF16)


# ------------------------------------------------------------------------------------------ profiles

def test_json_round_trip(tmp_path):
  p = synthetic(bw=3e8, lat=123e-6, fallback_risk=0.01, platform="cpu")
  p.links["x"] = {"*": LinkModel(1e-4, 2e8), "all_gather": LinkModel(2e-4, 5e8)}
  p.codec["gpu"] = {"bfloat16": CodecModel(4e11, 3e11, 1e-5, 2e-5)}
  p.expected_ratio["activation"]["bfloat16"] = 0.66
  p.sites["a2a@model.py:3"] = pf.SiteObservation("all_to_all", "bfloat16", 4096, 5600, 64, 350000)
  p.meta["note"] = "synthetic"
  path = tmp_path / "profile.json"
  p.save(path)
  q = pf.Profile.load(path)
  assert q.to_dict() == p.to_dict()
  assert q.fingerprint() == p.fingerprint()
  assert json.loads(path.read_text())["version"] == pf.PROFILE_VERSION
  for bw in (1e6, 1e9, 1e11):
    a = st.decide("all_to_all", BF16, 4096, axis_size=8, axis_name="x", site="a2a@model.py:3",
                  profile=with_bw(p, bw), log=False)
    b = st.decide("all_to_all", BF16, 4096, axis_size=8, axis_name="x", site="a2a@model.py:3",
                  profile=with_bw(q, bw), log=False)
    assert a == b
  # meta is not part of the fingerprint; everything that decides is
  q.meta["note"] = "other"
  assert q.fingerprint() == p.fingerprint()
  q.min_gain = 0.1
  assert q.fingerprint() != p.fingerprint()


def test_profile_to_dict_is_a_copy():
  """fingerprint() shares the profile's containers (it runs on every decision); to_dict() must not."""
  p = pf.Profile(links={"x": {"*": LinkModel(1e-4, 1e8)}}, meta={"m": [1]})
  p.sites["s"] = pf.SiteObservation("all_to_all", "bfloat16", 4096, 5600, 1, 5600)
  fp = p.fingerprint()
  d = p.to_dict()
  d["links"]["x"]["*"]["bandwidth_Bps"] = 1.0
  d["sites"]["s"]["max_frame_bytes"] = 1
  d["capacity_ratio"]["activation"]["bfloat16"] = 0.5
  d["expected_ratio"]["gradient"]["float32"] = 0.5
  d["meta"]["m"].append(2)
  assert p.fingerprint() == fp and p.meta == {"m": [1]} and p.sites["s"].max_frame_bytes == 5600
  assert p.to_dict() != d


def test_profile_validation_and_versions():
  with pytest.raises(ValueError, match="version"):
    pf.Profile.from_dict({"version": 99})
  with pytest.raises(ValueError, match="not sane"):
    pf.Profile.from_dict({"links": {"*": {"*": {"latency_s": 0.0, "bandwidth_Bps": -1.0}}}})
  # a malformed one is a ValueError naming the entry, never an AttributeError or a TypeError
  malformed = {"a list": ([1, 2], "JSON object"), "links a number": ({"links": 5}, "not a profile"),
               "a link a list": ({"links": {"x": {"*": [1]}}}, r"link \[x\]\[\*\] is a JSON object"),
               "a link short": ({"links": {"x": {"*": {"latency_s": 1}}}}, r"link \[x\]\[\*\].*bandwidth_Bps"),
               "a codec unknown field": ({"codec": {"cpu": {"bfloat16": {"encode_Bps": 1, "x": 2}}}},
                                         r"codec \[cpu\]\[bfloat16\]"),
               "sites a list": ({"sites": [1]}, "not a profile")}
  for name, (d, why) in malformed.items():
    with pytest.raises(ValueError, match=why):
      pf.Profile.from_dict(d)
  # a partial profile fills in the documented defaults
  p = pf.Profile.from_dict({"links": {"*": {"*": {"latency_s": 1e-4, "bandwidth_Bps": 1e9}}}})
  assert p.capacity_ratio["activation"]["bfloat16"] == capacity.EXPECTED_RATIO["activation"][BF16]


def test_active_profile_env_and_context(tmp_path, monkeypatch):
  path = tmp_path / "p.json"
  synthetic(bw=7e8).save(path)
  prev = pf.set_profile(None)
  try:
    monkeypatch.setattr(pf, "_ENV_LOADED", False)
    monkeypatch.setattr(pf, "_ACTIVE", None)
    monkeypatch.setenv("ZIPCCL_PROFILE", str(path))
    assert pf.get_profile().links["*"]["*"].bandwidth_Bps == 7e8
    with pf.use_profile(synthetic(bw=1e3)) as p:
      assert pf.get_profile() is p
    assert pf.get_profile().links["*"]["*"].bandwidth_Bps == 7e8
  finally:
    pf.set_profile(prev)


# ------------------------------------------------------------------------------ inside the collectives

def _mesh():
  return jax.make_mesh((8,), ("i",))


def _put(mesh, a):
  return jax.device_put(a, NamedSharding(mesh, P("i")))


def _gauss(shape, seed=0):
  return (np.random.default_rng(seed).standard_normal(shape) * 0.02).astype(BF16)


@needs8
def test_auto_follows_the_profile_inside_shard_map(caplog):
  mesh = _mesh()
  x = _put(mesh, _gauss((8 * 8, 2048)))

  def run(profile, compress="auto"):
    def body(v):
      return (zj.all_to_all(v, "i", 0, 0, tiled=True, compress=compress, name="t/a2a"),
              zj.psum(v, "i", compress=compress, name="t/ps"))
    with pf.use_profile(profile):
      return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))(x)

  st.reset_decisions()
  with caplog.at_level(logging.DEBUG, logger="zipccl_jax.strategy"):
    slow = run(synthetic(bw=1e6))
  ds = st.decisions()
  assert all(ds[s].compress for s in ("t/a2a", "t/ps")), zj.explain()
  assert any("zipccl all_to_all site=t/a2a: compressed (est" in r.getMessage()
             for r in caplog.records)
  assert zc.stats()["t/a2a"].compressed
  fast = run(synthetic(bw=1e13))
  ds = st.decisions()
  assert not any(ds[s].compress for s in ("t/a2a", "t/ps")), zj.explain()
  assert not zc.stats()["t/a2a"].compressed
  want = jax.jit(jax.shard_map(lambda v: lax.all_to_all(v, "i", 0, 0, tiled=True), mesh=mesh,
                               in_specs=P("i"), out_specs=P("i")))(x)
  exact = run(synthetic(), compress=False)
  for got in (slow, fast):
    assert np.array_equal(np.asarray(got[0]).view(np.uint16), np.asarray(want).view(np.uint16))
    # the reduction: the same fixed-order sum whatever the decision
    assert np.array_equal(np.asarray(got[1]).view(np.uint16), np.asarray(exact[1]).view(np.uint16))
  text = zj.explain()
  assert "t/a2a" in text and "raw" in text
  assert "est_raw_s" in zj.explain("t/a2a")


@needs8
def test_observe_then_retrace_uses_observed_capacity_and_gradients():
  mesh = _mesh()
  xs = _gauss((8 * 8, 2048), seed=1)
  x = _put(mesh, xs)
  prof = synthetic(bw=1e6)

  def loss(v):
    y = jax.shard_map(lambda u: zj.all_to_all(u, "i", 0, 0, tiled=True, name="o/a2a"), mesh=mesh,
                      in_specs=P("i"), out_specs=P("i"))(v)
    return (y.astype(np.float32) ** 2).sum()

  with pf.use_profile(prof):
    with zj.observe() as seen:
      assert seen is prof
      jax.block_until_ready(jax.jit(jax.grad(loss))(x))
    obs = prof.sites["o/a2a"]
    assert "o/a2a/bwd" in prof.sites and prof.sites["o/a2a/bwd"].op == "all_to_all"
    # the largest frame any device coded at this site
    _, nb = jax.jit(zj.codec.encode_frames)(xs)  # each device's block is its (8, 2048) rows
    assert obs.max_frame_bytes == int(np.max(np.asarray(nb)))
    assert obs.frames == 64 and obs.chunk_elems == 2048
    st.reset_decisions()
    g = jax.jit(jax.grad(loss))(x)  # a new trace: decided with the observed capacities
    d = st.decisions()["o/a2a"]
    assert d.compress and d.capacity_source == "observed"
    assert d.capacity == -(-math.ceil(obs.max_frame_bytes * (1 + prof.margin)) // 8) * 8
    assert d.capacity < zc.padded_capacity(2048, BF16)
    assert st.decisions()["o/a2a/bwd"].capacity_source == "observed"
  assert np.array_equal(np.asarray(g), 2 * xs.astype(np.float32))


@needs8
def test_compress_true_with_observed_capacity_forward_and_backward():
  """capacity="observed" gives compress=True the observed per-site capacities (forward and /bwd), and the
  library default where nothing was observed; the results stay bit-exact."""
  mesh = _mesh()
  xs = _gauss((8 * 8, 2048), seed=2)
  x = _put(mesh, xs)
  prof = synthetic(bw=1e6)

  def loss(v, name):
    y = jax.shard_map(lambda u: zj.all_to_all(u, "i", 0, 0, tiled=True, compress=True, capacity="observed",
                                               name=name), mesh=mesh, in_specs=P("i"), out_specs=P("i"))(v)
    return (y.astype(np.float32) ** 2).sum()

  with pf.use_profile(prof):
    with zj.observe():
      jax.block_until_ready(jax.jit(jax.grad(loss), static_argnums=1)(x, "obs/a2a"))
    zc.reset_stats()
    g = jax.jit(jax.grad(loss), static_argnums=1)(x, "obs/a2a")
    g_new = jax.jit(jax.grad(loss), static_argnums=1)(x, "obs/never-seen")
    s = zc.stats()
  for site in ("obs/a2a", "obs/a2a/bwd"):
    want = -(-math.ceil(prof.sites[site].max_frame_bytes * (1 + prof.margin)) // 8) * 8
    assert s[site].compressed and s[site].capacity == want, (site, s[site])
    assert "observed capacity" in s[site].reason
  assert s["obs/a2a"].capacity < zc.padded_capacity(2048, BF16)
  assert s["obs/never-seen"].capacity == zc.padded_capacity(2048, BF16)
  assert s["obs/never-seen/bwd"].capacity == zc.padded_capacity(2048, BF16, kind="gradient")
  assert "nothing observed" in s["obs/never-seen"].reason
  for got in (g, g_new):
    want = (2 * xs.astype(np.float32)).astype(BF16)  # exact: doubling a bfloat16
    assert np.array_equal(np.asarray(got).view(np.uint16), want.view(np.uint16))
  with pytest.raises(TypeError, match="capacity must be an int, a float, 'observed' or None"):
    jax.shard_map(lambda u: zj.all_to_all(u, "i", 0, 0, tiled=True, compress=True, capacity="observd"),
                  mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x)


@needs8
def test_calibrate_on_virtual_devices(tmp_path):
  mesh = _mesh()
  prev = pf.get_profile()
  path = tmp_path / "cal.json"
  prof = zj.calibrate(mesh, "i", link_bytes=(16 << 10, 256 << 10), codec_bytes=(32 << 10, 256 << 10),
                      dtypes=("bfloat16",), reps=3, save=path, activate=False)
  assert pf.get_profile() is prev
  assert prof.platform == "cpu"
  for coll in ("*", "all_to_all", "all_gather"):
    lk = prof.links["i"][coll]
    assert 1e6 < lk.bandwidth_Bps < 1e13 and 0 <= lk.latency_s < 0.1, (coll, lk)
  assert prof.links["*"]["*"] == prof.links["i"]["*"]
  cm = prof.codec["cpu"]["bfloat16"]
  assert 1e6 < cm.encode_Bps < 1e12 and 1e6 < cm.decode_Bps < 1e12, cm
  assert 0 <= cm.encode_overhead_s < 0.1 and 0 <= cm.decode_overhead_s < 0.1
  cal = prof.meta["calibration"]
  # the mixed slot exchange's passes, timed beside the codec over the same rows: measured, or said why not
  note = cal["fits"]["codec/slot/bfloat16"]
  assert (cm.slot_Bps > 0) == (not note.startswith("unmeasurable")), (note, cm)
  assert {f"slot/bfloat16/{b}" for b in (32 << 10, 256 << 10)} <= set(cal["net_s"])
  assert cal["axis_size"] == 8 and cal["processes"] == 1 and cal["devices"] == 8
  # one process: each repetition's slowest process is that process, so its median is the median fitted
  assert cal["slowest_median_s"] == cal["slowest_rep_s"]
  for k, net in cal["net_s"].items():
    if net > 0:
      assert cal["slowest_rep_s"][k] == pytest.approx(net + cal["dispatch_s"], rel=1e-9), k
  # in situ: the codec's cost inside a compressed all_to_all rescales the isolated measurement
  ins = cal["in_situ"]
  assert ins["compressed_a2a_s"] > 0 and 0.25 <= ins["factor"] <= 16, ins
  assert "zipccl_jax.calibrate/in_situ" not in zc.stats()
  assert pf.Profile.load(path).to_dict() == prof.to_dict()
  # a sample's measured ratio becomes the expected ratio of its role
  prof2 = zj.calibrate(mesh, "i", link=False, codec_bytes=(16 << 10, 64 << 10),
                       sample=_gauss((4096,)), reps=2, activate=False)
  assert 0.6 < prof2.expected_ratio["activation"]["bfloat16"] < 0.72
  assert "i" not in prof2.links or prof2.links["i"] == prev.links.get("i")


# ------------------------------------------------------------------------------------- multi-process

def test_every_rank_decides_the_same(tmp_path):
  from mp_launch import launch, results
  p = synthetic(bw=5e7, lat=80e-6)
  p.sites["mp/a2a"] = pf.SiteObservation("all_to_all", "bfloat16", 8192, 11000, 16, 170000)
  path = tmp_path / "profile.json"
  p.save(path)
  a, b = results(launch(HERE / "strategy_mp_worker.py", 2, 2, ["--profile", str(path)], timeout=240))
  assert a["loaded_fingerprint"] == b["loaded_fingerprint"] == p.fingerprint()
  assert a["loaded"] == b["loaded"]
  assert a["loaded"]["mp/a2a"]["compress"] and a["loaded"]["mp/a2a"]["capacity_source"] == "observed"
  assert {k: v["compress"] for k, v in a["loaded"].items()} == {
      "mp/a2a": True, "mp/ag": True, "mp/rs": True, "mp/ps": True, "mp/int": False}
  # calibrated on each rank, then agreed: the same profile and decisions everywhere
  assert a["calibrated_fingerprint"] == b["calibrated_fingerprint"]
  assert a["calibrated"] == b["calibrated"]
  assert a["processes"] == b["processes"] == 2
  # fitted: the median of each repetition's slowest process, the same on both ranks (net_s is it less
  # the null program's, floored at 0), and never below the slowest process's median, recorded beside it
  cal = a["calibration"]
  assert cal == b["calibration"] and set(cal["slowest_rep_s"]) == set(cal["net_s"]) | {"null"}
  assert cal["dispatch_s"] == cal["slowest_rep_s"]["null"]
  for k, net in cal["net_s"].items():
    assert cal["slowest_median_s"][k] <= cal["slowest_rep_s"][k], (k, cal)
    if net > 0:
      assert cal["slowest_rep_s"][k] == pytest.approx(net + cal["dispatch_s"], rel=1e-9), k
  # observed on different data per rank, merged: the same capacities everywhere
  assert a["observed"] == b["observed"] and a["observed"]["mp/obs"]["frames"] == 4 * 4
  assert a["results_ok"] and b["results_ok"]
