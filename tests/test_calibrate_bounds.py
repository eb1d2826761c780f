"""calibrate() never returns a nonsense model: robust, bounded fits, "unmeasurable" otherwise, and per level."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import zipccl_jax
from zipccl_jax.strategy import calibration
from zipccl_jax.strategy.calibration import fit_bounded
from zipccl_jax.strategy.codec_cost import CodecModel
from zipccl_jax.strategy.links import LinkModel


def test_fit_bounded_fits_clean_data_exactly():
  lk, note = fit_bounded([1e5, 4e6], [1e-3 + 1e5 / 1e8, 1e-3 + 4e6 / 1e8], noise_s=1e-5)
  assert note == "fit" and np.isclose(lk.latency_s, 1e-3) and np.isclose(lk.bandwidth_Bps, 1e8)


def test_fit_bounded_does_not_fit_a_slope_to_noise():
  """The failure of issue 18: two medians a hair apart gave 1/slope = 3.1e27 B/s. Within the spread of the
  repetitions, the size dependence is not measured: the throughput bound x_max / t(x_max) is used."""
  lk, note = fit_bounded([256 << 10, 4 << 20], [2.0e-3, 2.0e-3 + 1e-12], noise_s=2e-4)
  assert note.startswith("throughput bound") and lk.latency_s == 0.0
  assert np.isclose(lk.bandwidth_Bps, (4 << 20) / (2.0e-3 + 1e-12))


@pytest.mark.parametrize("xs,ts,what", [
    ([1e9, 1e10], [1e-6, 1e-6], "bandwidth"),          # 10 GB in a microsecond: lost in the timer
    ([1e3, 2e3], [0.5, 0.5 + 2e-3], "bandwidth"),       # a 0.5 MB/s link (1 MB/s sat on the bound itself)
    ([1e6, 2e6], [0.3, 0.31], "latency"),               # 0.29 s per call: a stall, not a latency
])
def test_fit_bounded_reports_unmeasurable_outside_bounds(xs, ts, what):
  lk, note = fit_bounded(xs, ts, noise_s=1e-6)
  assert lk is None and note.startswith(f"unmeasurable: {what}"), note


def test_out_of_bounds_names_every_bad_model():
  p = zipccl_jax.Profile()
  p.links = {"a": {"*": LinkModel(1e-4, 1e8), "psum": LinkModel(0.5, 1e8)}, "*": {"*": LinkModel(0.0, 3e27)}}
  p.codec = {"cpu": {"bfloat16": CodecModel(1e9, 1e9), "float32": CodecModel(1e3, 1e9)}}
  assert [v.split(" = ")[0] for v in calibration.out_of_bounds(p)] == [
      "link[a][psum]", "link[*][*]", "codec[cpu][float32]"]
  p.links, p.codec = {"a": {"*": LinkModel(1e-4, 1e8)}}, {"cpu": {"bfloat16": CodecModel(1e9, 1e9)}}
  assert calibration.out_of_bounds(p) == []


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices")
def test_calibrate_measures_each_level_of_a_tuple():
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("host", "local"))
  prof = zipccl_jax.calibrate(mesh, ("host", "local"), profile=zipccl_jax.Profile(), activate=False, reps=3,
                              link_bytes=(16 << 10, 256 << 10), codec_bytes=(32 << 10, 256 << 10),
                              dtypes=("bfloat16",), in_situ=False)
  cal = prof.meta["calibration"]
  assert cal["levels"] == ["host", "local"]
  fits = cal["fits"]
  for ak in ("host,local", "host", "local"):
    for coll in ("all_to_all", "all_gather"):
      note = fits[f"link[{ak}]/{coll}"]
      assert note == "fit" or note.startswith(("throughput bound", "unmeasurable")), note
      assert (coll in prof.links.get(ak, {})) == (not note.startswith("unmeasurable"))
  # each op's hierarchical program over the tuple, raw and with the slow phase coded, and its flat compressed one
  ops = ("all_gather", "psum_scatter", "all_to_all")
  for key in [f"hierarchical_{op}{c}" for op in ops for c in ("", "_slow_coded")] + [f"flat_{op}_coded" for op in ops]:
    note = fits[f"link[host,local]/{key}"]
    assert note == "fit" or note.startswith(("throughput bound", "unmeasurable")), note
    assert (key in prof.links["host,local"]) == (not note.startswith("unmeasurable"))
  tup = prof.links["host,local"]
  assert "*" not in tup or tup["*"] in [tup.get(c) for c in ("all_to_all", "all_gather")]  # "*": a flat link
  assert not any("zipccl.calibrate" in s for s in zipccl_jax.decisions())       # its programs leave no log
  assert calibration.out_of_bounds(prof) == []


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices")
@pytest.mark.parametrize("times,applied", [
    ([1e-3, 1e-3, 5e-3, 9e-3, 9e-3], False),   # a codec cost of 5 ms inside an 8 ms spread: noise, not a factor
    ([0.0] * 5, False),                         # the link model takes all the time: the codec cost is not seen
    ([1e-3] * 5, True),                         # 1 ms, no spread: measured, so the codec models are scaled
    # the testbed's at 1 Gbit/s: ~16.6 ms whose 7 repetitions spread ~16.5 ms (IQR); its median is known to
    # ~5.8 ms, so the cost is measured (twice the IQR, the rule before, refused it)
    ([5e-3, 8e-3, 12e-3, 16.6e-3, 24e-3, 29e-3, 30e-3], True),
])
def test_in_situ_scales_the_codec_only_when_measured(monkeypatch, times, applied):
  """A codec cost within twice its median's standard error (or below zero) is noise: scaling every codec
  model by it (up to 16x, or 4x faster) would fit noise, so the isolated models stay."""
  mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
  prof = zipccl_jax.Profile()
  prof.links["x"] = {"*": LinkModel(0.0, 1e13)}  # the link's share: nanoseconds
  iso = CodecModel(1e9, 1.5e9, 30e-6, 30e-6)
  prof.codec["cpu"] = {"bfloat16": iso}
  monkeypatch.setattr(calibration, "_time_all", lambda jobs, reps, warmup, barrier=None, group=None: {"c": list(times)})
  info = calibration._in_situ(prof, calibration._Harness(mesh, "x"), "bfloat16", 64 << 10, "activation", None,
                              reps=len(times), warmup=1, barrier=None, base=0.0)
  assert info["applied"] is applied, info
  got = prof.codec["cpu"]["bfloat16"]
  if applied:
    assert info["factor"] > 1 and got.encode_Bps == iso.encode_Bps / info["factor"]
    assert prof.codec_in_situ == {"cpu": info["factor"]}  # kept, for the fast level's isolated codec
    assert prof.isolated_codec().codec["cpu"]["bfloat16"].encode_Bps == pytest.approx(iso.encode_Bps)
  else:
    assert info["factor"] == 1.0 and got == iso and prof.codec_in_situ == {}, info


def test_time_all_times_each_group_side_by_side():
  """The programs plan compares for one op at one size (its flat and hierarchical programs over the tuple),
  with each level's link of that collective at that size, are warmed up and timed together, interleaved, in an
  order shuffled every repetition (the same on every process: seeded with the repetition); other ops at that
  size, a level's links at other sizes and the codec are groups of their own, one group after another."""
  order = []
  jobs = [(name, (lambda name=name: order.append(name)), ()) for name in
          ("link/all_gather/1024", "link[host]/all_gather/1024", "link/hierarchical_all_gather/1024",
           "link/all_to_all/1024", "link/hierarchical_all_gather_slow_coded/1024", "link[host]/all_gather/4096",
           "enc/bfloat16/64", "link/flat_all_gather_coded/1024", "link[local]/all_gather/1024",
           "link/hierarchical_all_to_all_slow_coded/1024")]
  reps = 6
  ts = calibration._time_all(jobs, reps=reps, warmup=1, group=calibration._job_group)
  assert all(len(v) == reps for v in ts.values())
  ag = ["link/all_gather/1024", "link[host]/all_gather/1024", "link/hierarchical_all_gather/1024",
        "link/hierarchical_all_gather_slow_coded/1024", "link/flat_all_gather_coded/1024",
        "link[local]/all_gather/1024"]
  a2a = ["link/all_to_all/1024", "link/hierarchical_all_to_all_slow_coded/1024"]
  host, enc = "link[host]/all_gather/4096", "enc/bfloat16/64"
  timed = order[len(ag):len(ag) + reps * len(ag)]
  assert order[:len(ag)] == ag                                          # warm-up, in order
  reps_ag = [timed[i * len(ag):(i + 1) * len(ag)] for i in range(reps)]
  assert all(sorted(r) == sorted(ag) for r in reps_ag)                  # every repetition runs each once
  assert len({tuple(r) for r in reps_ag}) > 1                           # ... not always in the same order
  after = {r[r.index(ag[2]) - 1] for r in reps_ag if r.index(ag[2]) > 0}
  assert len(after) > 1                                                 # no fixed predecessor
  rest = order[len(ag) * (reps + 1):]
  k = len(a2a) * (reps + 1)
  assert sorted(rest[:k]) == sorted(a2a * (reps + 1))
  assert rest[k:] == [host] * (reps + 1) + [enc] * (reps + 1)


def test_paired_keeps_the_ratio_measured_side_by_side():
  """A hierarchical program's repetitions become the flat median times each repetition's ratio to the flat
  program timed beside it, so its median is the flat median times the median paired ratio: here load that
  slowed both programs in the last three repetitions, and the hierarchical one alone in two others, left the
  independent medians ranking the hierarchical program 33% slower; side by side it was 5% faster in five of
  seven repetitions."""
  flat = [10.0, 10.0, 10.0, 10.0, 14.0, 14.0, 14.0]
  hier = [9.5, 9.5, 13.3, 13.3, 13.3, 13.3, 13.3]
  ts = {"link/all_gather/4096": flat, "link/hierarchical_all_gather_slow_coded/4096": hier,
        "link/hierarchical_psum_scatter/4096": [3.0, 1.0, 2.0], "link[host]/all_gather/4096": [5.0]}
  assert np.median(hier) > 1.3 * np.median(flat)
  out = calibration._paired(ts)
  got = out["link/hierarchical_all_gather_slow_coded/4096"]
  assert got == pytest.approx([np.median(flat) * h / f for h, f in zip(hier, flat)])
  assert np.median(got) == pytest.approx(0.95 * np.median(flat))
  # no flat program of the op beside it, or not a hierarchical job: as measured
  for k in ("link/hierarchical_psum_scatter/4096", "link[host]/all_gather/4096", "link/all_gather/4096"):
    assert out[k] == ts[k]

def test_agree_fits_the_median_of_each_repetitions_slowest_process(monkeypatch):
  """Two processes whose slow repetitions alternate: each one's median is 10 ms, but every repetition
  ends with whichever process ran 14 ms in it, so a call costs 14 ms in most; that is the median fitted
  (and recorded as `slowest_rep_s`), with the slowest process's median recorded beside it. Every process
  gets the same figures, and the largest spread."""
  mine = {"link/all_gather/1024": [0.010, 0.014, 0.010, 0.014, 0.010],
          "null": [0.001, 0.001, 0.001, 0.001, 0.001]}
  other = {"link/all_gather/1024": [0.014, 0.010, 0.014, 0.010, 0.010],
           "null": [0.001, 0.002, 0.001, 0.001, 0.001]}

  def gathered(me):
    names = sorted(other)
    return {"t": [float(np.median(other[k])) for k in names], "q": [calibration._iqr(other[k]) for k in names],
            "r": {}, "names": names, "reps": [other[k] for k in names]}

  monkeypatch.setattr(calibration, "allgather_json", lambda me: [me, gathered(me)])
  t, q, allv = calibration._agree(mine, {})
  assert t == calibration._slowest_rep(allv)
  assert t["link/all_gather/1024"] == pytest.approx(0.014) and t["null"] == pytest.approx(0.001)
  assert calibration._slowest_median(allv)["link/all_gather/1024"] == pytest.approx(0.010)
  assert q["link/all_gather/1024"] == pytest.approx(0.004)
  # processes that measured different things refuse to agree
  monkeypatch.setattr(calibration, "allgather_json", lambda me: [me, dict(gathered(me), names=["null"])])
  with pytest.raises(RuntimeError, match="measured different things"):
    calibration._agree(mine, {})
