"""The links-only prediction over every stored 2 x 4 run, and `compress="auto"`'s record on them
(benchmarks/model_record.py, on benchmarks/model_check.py's predictions): which runs the record holds, the
misses each analysis names, and the lines benchmarks/README.md quotes. The named sets below are the misses the
stored runs show; a new run that misses elsewhere fails here until its reason is written down.
"""
from __future__ import annotations

import importlib
import json
import pathlib
import re
import statistics
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
MC = importlib.import_module("model_check")     # benchmarks/model_check.py: the predictions
REC = importlib.import_module("model_record")   # benchmarks/model_record.py: scored over every run


ONE_DECISION_RUNS = REC.DECISION_RUNS
OPS = MC.OPS
# Where `auto` missed the bar, all within 3% + 3 ms (benchmarks/README.md says why): the held-out-grid run's
# all_gather, a near tie calibrate ranked raw (28.99 ms against 28.93 x 1.02 coded) that the run measured
# 28.1 against 26.9, and `auto` timed its program at 1.042 of that program's median (29.2 ms, 0.06 ms over);
# the fourth slot run's psum_scatter over one axis, a near tie calibrate ranked raw (two-level raw 38.63 ms
# against host-coded 38.14 x 1.02) that the run measured 42.3 against 39.5 (39.0 over one axis): it ran 42.7 ms,
# 1.0 ms over (the tuple's `auto`, 40.7 ms, is within)
# The (run, op) whose repetitions something else on the machine disturbed: the second slot_rows run's all_gather,
# every variant 20-32% slower than in the runs before and after it, the median of its variants' IQRs 13.0 ms
# against 2.0-5.2 in every other run (`test_one_case_was_disturbed`). Its `auto` is in BAR_MISSES (37.4 ms, 1.167
# of the best variant, running the host-coded program at 0.944 of that program's own median), and its flat raw
# in STREAM_MISSES
DISTURBED = {("mesh_2x4_all_ops_avx2_slot_rows_once_repeat.json", "all_gather")}
BAR_MISSES = ({("mesh_2x4_all_ops_avx2_held_out_7.json", "all_gather", v) for v in ("auto", "one_axis_auto")}
              | {("mesh_2x4_all_ops_avx2_slot_repeat3.json", "psum_scatter", "one_axis_auto")}
              | {run + ("auto",) for run in DISTURBED})
# The run whose link probe misread the link (`test_one_probe_misread`): the sixth slot_rows_whole run's one TCP
# stream read 88 MB/s, where every other run's read 107-121, and its flat collectives ran as in the others (their
# medians within 2% of the record's). Links only costs a flat collective's crossings at the probe, so it put this
# run's flat variants 24-40% over their medians; its two-level variants, which the calibrated host level costs,
# within 15%. The runs since take the fastest of three streams (`_netns.best_probe`)
MISREAD_PROBE = {"mesh_2x4_all_ops_avx2_slot_rows_whole_once_repeat5.json"}
# Where links only puts a flat raw collective 15% or more from its median: the disturbed case and the misread
# probe's all_to_all and all_gather, at the stream's fill with the latest day's link_patterns runs (0.930); at
# 0.894 also the last timed-gain run's all_gather (its link probe read 114 MB/s) and the sixth slot_rows run's
# (+16.0%), benchmarks/README.md
STREAM_MISSES = set(DISTURBED) | {(run, op) for run in MISREAD_PROBE for op in ("all_to_all", "all_gather")}
# Where links only puts the flat coded all_gather 15% or more from its median: the third repeat (load 4.2-5.6,
# the others 2.3-3.8), whose coded programs all ran slower than calibrated (benchmarks/README.md)
RING_MISSES = ({"mesh_2x4_all_ops_avx2_once_repeat3.json"} | {run for run, op in DISTURBED if op == "all_gather"}
               | MISREAD_PROBE)
# The runs whose codec binds where the in-situ scale still lands nearer the flat coded all_gather's median: the
# third and fifth slot_rows runs and the seventh with the levels timed beside the programs, whose all_gather
# programs all ran faster than links only puts them (the flat raw ring too), the codec as measured alone the
# further over; and the sixth fitting each repetition's slowest process, a near tie within 15% both ways (the
# codec alone +7.1%, in situ -5.8%)
IN_SITU_NEARER = ({f"mesh_2x4_all_ops_avx2_slot_rows_once_{r}.json" for r in ("repeat2", "repeat4")}
                  | {"mesh_2x4_all_ops_avx2_slot_rows_whole_bysize_once_repeat6.json",
                     "mesh_2x4_all_ops_avx2_slot_rows_whole_slowrep_repeat5.json"})
ALL_OPS_RUNS = ("mesh_2x4_all_ops.json", "mesh_2x4_all_ops_lone_flow.json", "mesh_2x4_all_ops_iqr_rule.json",
                "mesh_2x4_all_ops_dense.json", "mesh_2x4_all_ops_avx2.json") + ONE_DECISION_RUNS
# The runs with the AVX-512BW tier, on a CPU that binds at 1 Gbit/s, at 1 and 0.25 Gbit/s
BW_TIER_RUNS = ("mesh_2x4_all_ops_avx512bw.json", "mesh_2x4_all_ops_250mbit.json")
# The runs whose codec does not bind (a VBMI2 tier at 1 Gbit/s, the AVX-512BW tier at 0.25 Gbit/s): there the
# flat coded all_gather's codec hides behind the link, and calibrate's in-situ codec lands nearer its median
CODEC_HIDDEN_RUNS = {"mesh_2x4_all_ops.json", "mesh_2x4_all_ops_lone_flow.json", "mesh_2x4_all_ops_250mbit.json"}


@pytest.fixture(scope="module")
def record_rows():
  return REC.record()


def test_the_record_is_every_run_of_todays_decision(record_rows):
  """The record holds every stored `mesh_2x4_all_ops_avx2_*` run (a run of today's decision is
  added whatever it shows), each run's column is that run's two-level table, and its verdict counts what
  `links_verdict` says of each run on its own."""
  stored = {p.name for p in MC.RESULTS.glob("mesh_2x4_all_ops_avx2_*.json")}
  assert stored == set(REC.DECISION_RUNS), stored ^ set(REC.DECISION_RUNS)
  assert len(record_rows) == 20 and all(r["runs"] == list(REC.DECISION_RUNS) for r in record_rows)
  per_run = []
  for i, name in enumerate(REC.DECISION_RUNS):
    mesh = MC.two_levels(MC.testbed_profile(MC.RESULTS / name), run=MC.RESULTS / name)
    assert {(r["collective"], r["variant"]): r["links_err"] for r in mesh if r["variant"] != "auto"} == \
        {(r["collective"], r["variant"]): r["links_errs"][i] for r in record_rows}, name
    per_run.append(int(MC.links_verdict(mesh).split()[2]))  # "links only: K of 20 variants ..."
  n = len(per_run)
  assert REC.record_verdict(record_rows) == (
      f"links only over {n} runs: {sum(per_run)} of {20 * n} variants within 15% of their medians; every variant "
      f"within it in {per_run.count(20)} of {n} runs (per run, oldest first: {', '.join(map(str, per_run))} of 20)")
  table = REC.record_markdown(record_rows).splitlines()
  assert len(table) == 22 and table[2].startswith("| all_to_all | flat raw | ")
  picks = REC.record_picks()  # one per run and op; the fastest measured is never slower than a pick
  assert len(picks) == 4 * n and all(p["over_best"] >= 1 and (p["over_best"] == 1) == (p["pick"] == p["best"])
                                     for p in picks)


def test_the_flat_all_to_all_crosses_hosts_faster_than_the_host_levels():
  """Why links only puts the flat raw all_to_all over its median in most runs (benchmarks/README.md): it
  costs the host crossings with the host level's all_to_all link, four pairs of one message each, and the
  flat all_to_all's sixteen messages a direction cross faster (benchmarks/link_patterns.py), as the flat
  ring does."""
  for name in ("link_patterns_2x4_all_to_all.json", "link_patterns_2x4_all_to_all_reps21.json",
               "link_patterns_2x4_all_to_all_loaded.json"):
    pat = json.loads((MC.RESULTS / name).read_text())
    rate = {(r["pattern"], r["MiB_per_direction"]): r["MBps_per_direction"] for r in pat["records"]}
    for mib in (4, 16):
      assert rate[("flat all_to_all", mib)] > 1.05 * rate[("host all_to_all, 4 pairs", mib)], (name, mib)
      assert rate[("flat all_to_all", mib)] > 0.9 * rate[("flat ring all_gather", mib)], (name, mib)


def test_links_only_costs_flat_crossings_as_the_stream_they_are(monkeypatch):
  """A flat collective's crossings between hosts fill the link as one TCP stream does (gloo's ring all_gather:
  one pipelined stream; the flat all_to_all: sixteen messages a direction), where the host level's calibrated
  collectives, four pairs of one message each, fill less of it (benchmarks/link_patterns.py). Links only costs
  them at the run's link probe times `stream_fill`, the flat patterns' share of the probe in the link_patterns
  runs (0.93): the flat raw all_gather and all_to_all land within 15% of their medians in every 2 x 4 all-ops
  run but STREAM_MISSES (before: the host level's all_to_all link put the flat all_to_all at -5% to +23%, the
  probe alone the flat ring at -16% to +0.5%), and nearer them on mean |error| than either."""

  def errors():
    out = {}
    for name in ALL_OPS_RUNS + BW_TIER_RUNS:
      run = MC.RESULTS / name
      for r in MC.two_levels(MC.testbed_profile(run), run=run, ops=("all_to_all", "all_gather")):
        if r["variant"] == "flat raw":
          out[(name, r["collective"])] = r["links_err"]
    return out

  def mean_abs(errs):
    return sum(map(abs, errs.values())) / len(errs)

  stream = errors()
  assert {k for k, err in stream.items() if abs(err) >= 0.15} == STREAM_MISSES, stream
  fill = MC.stream_fill()
  assert 0.85 < fill < 0.95, fill
  assert f"times {fill:.3f}" in (REPO / "README.md").read_text()  # the figure the README quotes
  monkeypatch.setattr(MC, "stream_fill", lambda: 1.0)   # the probe's rate itself
  probe = errors()
  monkeypatch.setattr(MC, "_host_level", lambda prof, recs, per_host=4: dict(prof.links["host"]))
  levels = errors()   # the host level's own all_to_all and all_gather links
  assert mean_abs(stream) < min(mean_abs(probe), mean_abs(levels)), (stream, probe, levels)
  pat = json.loads((MC.RESULTS / "link_patterns_2x4.json").read_text())
  rate = {(r["pattern"], r["MiB_per_direction"]): r["MBps_per_direction"] for r in pat["records"]}
  for mib in MC.FILL_MIB:  # the flat all_to_all's patterns: test_the_flat_all_to_all_crosses_hosts_faster...
    assert rate[("flat ring all_gather", mib)] > 0.9 * min(pat["probe_MBps_before"], pat["probe_MBps_after"])
    assert rate[("host all_gather, 4 pairs", mib)] < 0.9 * rate[("flat ring all_gather", mib)]
    assert rate[("one pair ppermute", mib)] < rate[("host all_gather, 4 pairs", mib)]
  assert min(t["MBps_per_direction"] for t in pat["tcp_both_ways"]) > 0.9 * min(
      pat["probe_MBps_before"], pat["probe_MBps_after"])  # the link is not the cause: gloo's patterns are


def test_links_only_decodes_the_flat_ring_all_at_once(monkeypatch):
  """The flat coded all_gather is a ring: every device receives its last row in the same step and decodes its
  n - 1 rows at once, with no peer's wait to hide the codec, so its links-only cost has the codec as measured
  alone (`Profile.phase_codecs`), not calibrate's in-situ scale. In every 2 x 4 all-ops run whose codec binds
  but IN_SITU_NEARER and MISREAD_PROBE (its slow probe puts the ring over its median, and the in-situ scale's
  smaller codec term less far) that lands nearer its median than the in-situ scale does (6-30% under there) or
  ties it (within a point), nearer on mean |error| over all of them, and within 15% in all but RING_MISSES;
  where the codec hides behind the link (CODEC_HIDDEN_RUNS) the in-situ scale is nearer, by 7-12 points."""
  from zipccl_jax.strategy.profile import Profile

  def errors():
    out = {}
    for name in ALL_OPS_RUNS + BW_TIER_RUNS:
      run = MC.RESULTS / name
      rows = MC.two_levels(MC.testbed_profile(run), run=run, ops=("all_gather",))
      out[name] = next(r for r in rows if r["variant"] == "flat compressed")["links_err"]
    return out

  alone = errors()
  monkeypatch.setattr(Profile, "phase_codecs",
                      lambda self, dtype, platform, phases, n: [self.codec_model(dtype, platform)[0]] * len(phases))
  in_situ = errors()
  nearer = {name for name, err in alone.items() if abs(err) > abs(in_situ[name]) + 0.01}
  assert nearer == CODEC_HIDDEN_RUNS | IN_SITU_NEARER | MISREAD_PROBE, (alone, in_situ)
  assert sum(map(abs, alone.values())) < 0.5 * sum(map(abs, in_situ.values())), (alone, in_situ)
  assert {name for name, err in alone.items() if abs(err) >= 0.15} == RING_MISSES, alone


def test_one_case_was_disturbed():
  """DISTURBED is every (run, op) of the record whose variants' median IQR is more than twice the largest of
  that op in any other run: a case whose repetitions something outside the run spread."""
  spread = {}
  for name in REC.DECISION_RUNS:
    for op in OPS:
      spread[(name, op)] = statistics.median(r["spread_s"] for r in MC.run_records(name)
                                             if r["collective"] == op and r.get("spread_s") is not None)
  assert {k for k, q in spread.items()
          if q > 2 * max(v for o, v in spread.items() if o[1] == k[1] and o != k)} == DISTURBED, spread


def test_one_probe_misread():
  """MISREAD_PROBE is every run of the record whose link probe read under 85% of the record's median probe; in
  each, every op's flat raw collective ran within 5% of that op's median over the record: the link was as in
  the other runs, the probe was not."""
  recs = {name: MC.run_records(name) for name in REC.DECISION_RUNS}
  probe = {name: rs[0]["link_MBps"] for name, rs in recs.items()}
  typical = statistics.median(probe.values())
  assert {name for name, p in probe.items() if p < 0.85 * typical} == MISREAD_PROBE, probe
  flat = {(name, op): MC.by_variant(rs, op)["flat_raw"]["median_s"] for name, rs in recs.items() for op in OPS}
  for op in OPS:
    usual = statistics.median(t for (name, o), t in flat.items() if o == op)
    assert all(abs(flat[(name, op)] / usual - 1) < 0.05 for name in MISREAD_PROBE), (op, usual)


def test_auto_runs_within_3_percent_of_the_best_variant_once_decided():
  """The issue's testbed bar on the runs of today's decision: `auto` (tuple and one axis) within 3% (+1.5 ms)
  of the best measured variant of every op, jax.lax's call included, and a call the plan kept flat decided
  by the plan's own flat estimates, the same way as the plan ranked them (the run before, the AVX2 run,
  planned all_to_all flat raw, then its flat path coded it at 1.069x flat raw). The misses are BAR_MISSES,
  no others, and none by more than 3% + 3 ms outside the DISTURBED case."""
  rows = REC.auto_bar(ONE_DECISION_RUNS)
  assert {(r["run"], r["collective"]) for r in rows} == {(n, op) for n in ONE_DECISION_RUNS for op in OPS}
  missed = {(r["run"], r["collective"], r["variant"]) for r in rows if not r["within"]}
  assert all(r["median_s"] <= 1.03 * r["best_s"] + 3e-3 for r in rows if (r["run"], r["collective"]) not in DISTURBED)
  for name in ONE_DECISION_RUNS:
    recs = MC.run_records(name)
    for op in OPS:
      by = {r["variant"]: r for r in recs if r["collective"] == op}
      assert all(r["best_s"] <= by[v]["median_s"] for v in by if not v.endswith("auto")
                 for r in rows if (r["run"], r["collective"]) == (name, op))
      if by["auto"]["chosen"] == "flat":
        levels, flat = by["auto"]["plan"][:2]
        assert "two-level plan's flat estimates" in flat, flat
        assert (": compressed (" in levels) == (": compressed (" in flat), (levels, flat)
  assert missed == BAR_MISSES, missed
  assert REC.bar_verdict(rows).startswith(f"auto within 3% + 1.5 ms of the fastest variant in {len(rows) - len(BAR_MISSES)} of ")


def _chosen(lp) -> str:
  """A LevelPlan as the runs record `auto`'s choice (`strategy.levels._log`)."""
  return lp.algorithm if lp.algorithm == "flat" else \
      "hierarchical(" + ",".join(f"{a}:{'c' if c else 'r'}" for a, c in lp.compress.items()) + ")"


def test_each_ops_stored_calibration_decides_what_its_run_ran():
  """`model_record._own_decision`, which `ratio_drift` and `margin_whatif` build on, is the decision the run's
  `auto` made: every op of every run of today's decision, from the profile stored with it, at its margin; and
  the calibrated ratio `ratio_drift` reports is the one the run's plan printed."""
  for name in REC.DECISION_RUNS:
    recs = MC.run_records(name)
    for op in OPS:
      auto = next(r for r in recs if r["collective"] == op and r["variant"] == "auto")
      assert _chosen(REC._own_decision(recs, op, REC.decided_timed_gain(name))) == auto["chosen"], (name, op)
  for row in REC.ratio_drift():
    auto = next(r for r in MC.run_records(row["run"])
                if r["collective"] == row["collective"] and r["variant"] == "auto")
    printed = {k: float(v) for k, v in re.findall(r"(hierarchical host:\w+ local:\w+) ([\d.]+) ms", auto["plan"][0])}
    assert row["calibrated"] == pytest.approx(printed[REC.NEAR_TIE[0]] / printed[REC.NEAR_TIE[1]], abs=1e-4)


def test_today_decides_as_the_runs_did_but_near_ties_go_to_the_timed_program():
  """`margin_whatif` and today's rule (`Profile.timed_gain` 0): replayed from each run's stored calibration,
  today's decision is the run's own, except where a compressed program calibrate timed was ahead of the run's
  pick by less than the 2% margin the runs put on it; there it is that timed program. Each margin scores
  every op of every run."""
  changed = []
  for name in REC.DECISION_RUNS:
    recs = MC.run_records(name)
    for op in OPS:
      was, now = REC._own_decision(recs, op, REC.RUNS_TIMED_GAIN), REC._own_decision(recs, op)
      if _chosen(now) != _chosen(was):
        est = dict(now.candidates)
        assert est[now.candidates[0][0]] < est[was.candidates[0][0]] <= 1.02 * est[now.candidates[0][0]]
        assert now.candidates[0][0] in {"hierarchical host:compressed local:raw", "flat compressed"}
        changed.append((name, op))
  assert ("mesh_2x4_all_ops_avx2_slot_repeat3.json", "psum_scatter") in changed, changed
  rows = REC.margin_whatif()
  assert [r["timed_gain"] for r in rows] == [0.02, 0.01, 0.0]
  assert {r["decisions"] for r in rows} == {4 * len(REC.DECISION_RUNS)}
  assert all(1.0 <= r["mean_over_best"] <= r["max_over_best"] for r in rows)


def test_links_only_lands_within_15_percent_as_often_as_the_programs_own_held_out_timing(record_rows):
  """Each run's held-out calibration timed the very programs of three variants per op (two-level raw, host
  coded, flat compressed), at sizes no case sends: read at the case's size, that direct measurement is a floor
  for any prediction from the calibration. Before today's programs (ROWS_RUNS) links only's composition of
  per-level links and codec landed within 15% at least as often; since, it misses more, and until calibrate
  timed each level beside the programs (BYSIZE_RUNS) every variant it missed where the program's own timing did
  not was one of all_gather's two-level programs (the composition's own bias, benchmarks/README.md), outside the
  run whose probe misread (MISREAD_PROBE: its flat variants); since, none of all_gather's. What both miss is the
  testbed's drift between a calibration and its case."""
  rows = REC.held_out_programs(record_rows=record_rows)
  assert len(rows) == 3 * len(REC.PAIRED_OPS) * len(REC.DECISION_RUNS)
  assert all(r["program_err"] != 0 for r in rows)  # never the case's own measurement
  within = {k: sum(abs(r[k]) < 0.15 for r in rows) for k in ("program_err", "links_err")}
  before = [r for r in rows if r["run"] not in REC.ROWS_RUNS]
  assert sum(abs(r["links_err"]) < 0.15 for r in before) >= sum(abs(r["program_err"]) < 0.15 for r in before)
  own = [r for r in rows if r["run"] in REC.ROWS_RUNS and r["run"] not in MISREAD_PROBE
         and abs(r["links_err"]) >= 0.15 > abs(r["program_err"])]
  before = {(r["collective"], r["variant"]) for r in own if r["run"] not in REC.BYSIZE_RUNS}
  assert before and all(op == "all_gather" and v.startswith("hierarchical") for op, v in before), before
  # since calibrate times each level beside the programs: none of all_gather's, and what links only misses alone
  # is under the median (all_to_all's mixed exchange once, psum_scatter's two-level raw program once)
  since = [r for r in own if r["run"] in REC.BYSIZE_RUNS]
  assert all(r["collective"] != "all_gather" and r["links_err"] < 0 for r in since), since
  # since calibrate fits each repetition's slowest process: none
  assert not [r for r in own if r["run"] in REC.SLOWREP_RUNS]
  assert REC.held_out_verdict(rows).endswith(
      f"{within['program_err']} of {len(rows)} within 15% of the medians; links only, on those variants: "
      f"{within['links_err']} of {len(rows)}")
  for r in rows:  # each program's own curve, read at its case's size: never its variant's links-only time
    assert r["program_err"] != r["links_err"]


def test_the_composition_is_compared_with_its_own_calibrations_program():
  """`composed_vs_programs` reads, for each program, the time its run's held-out calibration measured at a size
  it timed (no interpolation), and composes links only from that same profile at that size: the two differ by
  the composition alone. Every run since the reorders, every op calibrate times as a pair and each program; the
  runs calibrated on all_gather's whole result (WHOLE_RUNS) apart from those before (SLICED_RUNS), and those whose
  calibration timed each level beside the programs of its size (BYSIZE_RUNS) apart from both, and those whose
  calibration fitted each repetition's slowest process (SLOWREP_RUNS) apart from all three."""
  assert set(REC.ROWS_RUNS) <= set(REC.DECISION_RUNS) and len(REC.SLICED_RUNS) >= 5
  assert REC.WHOLE_RUNS and REC.BYSIZE_RUNS and REC.SLOWREP_RUNS
  assert sorted(REC.SLICED_RUNS + REC.WHOLE_RUNS + REC.BYSIZE_RUNS + REC.SLOWREP_RUNS) == sorted(REC.ROWS_RUNS)
  rows = (REC.composed_vs_programs() + REC.composed_vs_programs(REC.WHOLE_RUNS)
          + REC.composed_vs_programs(REC.BYSIZE_RUNS) + REC.composed_vs_programs(REC.SLOWREP_RUNS))
  assert len(rows) == len(REC.ROWS_RUNS) * len(REC.PAIRED_OPS) * len(REC.TIMED_PROGRAMS)
  for r in rows:
    held = next(x for x in MC.run_records(r["run"]) if x["collective"] == r["collective"] and x["variant"] == "auto")
    curves = held["model_profile"]["links"]["host,local"].values()
    assert any(abs(x / REC.COMPOSED_AT - 1) < 1e-3 and t == r["program_s"] for c in curves for x, t in c["points"])
    assert r["composed_err"] != 0


def test_all_gathers_composition_lost_its_bias_beside_the_programs():
  """All_gather's two-level programs, composed from per-level links timed in the level's own group (WHOLE_RUNS),
  came to over 10% above the same calibration's timing of the program at COMPOSED_AT on average; composed from
  links timed beside the programs of their size (BYSIZE_RUNS), within 5% of it, and with a smaller spread."""
  def errs(runs):
    by: dict = {}
    for r in REC.composed_vs_programs(runs):
      if r["collective"] == "all_gather" and r["variant"].startswith("hierarchical"):
        by.setdefault(r["variant"], []).append(r["composed_err"])
    return by

  before, since = errs(REC.WHOLE_RUNS), errs(REC.BYSIZE_RUNS)
  assert set(before) == set(since) and len(since) == 2
  for v in since:
    assert statistics.mean(before[v]) > 0.10 and abs(statistics.mean(since[v])) < 0.05, (v, before[v], since[v])
    assert statistics.stdev(since[v]) < statistics.stdev(before[v]), v


def test_the_composition_by_size_is_the_same_gap_in_ms():
  """`composed_by_size` gives, per two-level program, `composed_vs_programs`' gap in ms at each held-out size: at
  COMPOSED_AT the mean of error x program time there; every stored run of today's programs timed every one of
  those sizes (no interpolation)."""
  import statistics
  assert REC.COMPOSED_AT in MC.HELD_OUT_SIZES
  gaps = REC.composed_by_size()
  k = MC.HELD_OUT_SIZES.index(REC.COMPOSED_AT)
  rows = [r for r in REC.composed_vs_programs() if r["variant"].startswith("hierarchical")]
  assert set(gaps) == {(r["collective"], r["variant"]) for r in rows}
  for key, per_size in gaps.items():
    assert len(per_size) == len(MC.HELD_OUT_SIZES)
    assert per_size[k] == pytest.approx(statistics.mean(
        r["composed_err"] * r["program_s"] * 1e3 for r in rows if (r["collective"], r["variant"]) == key))


def test_the_runs_since_fitted_each_repetitions_slowest_process():
  """Each held-out calibration of SLOWREP_RUNS fitted what it records as `slowest_rep_s` (`net_s` is it less the
  null program's, floored at 0) and keeps the slowest process's median beside it, never above it; each of
  BYSIZE_RUNS fitted a statistic below it somewhere (the slowest process's median)."""
  def held(name):
    return MC.by_variant(MC.run_records(name), "all_gather")["auto"]["model_profile"]

  for name in REC.SLOWREP_RUNS:
    h = held(name)
    slow, null = h["slowest_rep_s"], h["slowest_rep_s"]["null"]
    assert h["dispatch_s"] == null, name
    assert all(h["net_s"][k] == pytest.approx(max(0.0, slow[k] - null), abs=1e-12) for k in h["net_s"]), name
    assert all(h["slowest_median_s"][k] <= slow[k] for k in slow), name
  for name in REC.BYSIZE_RUNS:
    h = held(name)
    assert "slowest_median_s" not in h or h["slowest_median_s"] is None
    assert any(h["net_s"][k] + h["dispatch_s"] < h["slowest_rep_s"][k] - 1e-9 for k in h["net_s"]), name


def test_the_mixed_exchange_saves_no_hidden_codec_on_the_testbed(record_rows, monkeypatch):
  """Every run's calibration found the codec hidden behind the slow link (in-situ factor under 1), and in each of
  the sixteen newest runs the mixed exchange ran slower than the flat coded one, as links only now costs it
  (`levels._mixed_model`); with the uncoded rows' codec saved, links only put it under the flat one in most. Over
  the record, without the saving links only lands nearer the mixed exchange's medians, within 15% more often."""
  rows = REC.mixed_over_flat()
  assert len(rows) == len(REC.DECISION_RUNS) and all(r["in_situ"] < 1 for r in rows)
  newest = rows[-16:]
  assert all(r["measured_ms"] > 0 and r["links_ms"] > 0 for r in newest), newest
  assert sum(r["links_ms"] - r["saved_ms"] < 0 for r in newest) > len(newest) // 2
  record = {(r["collective"], r["variant"]): r["links_errs"] for r in record_rows}[("all_to_all", REC.MIXED)]
  assert [r["links_err"] for r in rows] == pytest.approx(record, rel=1e-12)
  # the saving replayed is the model's own: links only with the codec read as binding, on the newest run
  from zipccl_jax.strategy import levels as two_level
  monkeypatch.setattr(two_level, "codec_hidden", lambda prof, plat: False)
  run = MC.RESULTS / rows[-1]["run"]
  old = next(r for r in MC.two_levels(MC.testbed_profile(run), run=run, ops=("all_to_all",))
             if r["variant"] == REC.MIXED)
  assert old["links_err"] == pytest.approx(rows[-1]["saving_err"], rel=1e-9)
  monkeypatch.undo()
  within = lambda k: sum(abs(r[k]) < 0.15 for r in rows)  # noqa: E731
  assert within("links_err") > within("saving_err")
  assert statistics.mean(abs(r["links_err"]) for r in rows) < statistics.mean(abs(r["saving_err"]) for r in rows)
  # ... and its all_to_all pick is the measured fastest more often: the saving ranked the mixed exchange first
  right = lambda k: sum(r[k] == r["best"] for r in rows)  # noqa: E731
  assert right("pick") > right("saving_pick")


def test_the_slowest_repetition_replay_refits_only_the_levels():
  """`slowest_levels` refits a held-out profile's host and local links to `slowest_rep_s` less the null
  program's (the points calibrate's `monotone_points` makes of those times at the sizes it timed, not the kept
  medians'), and leaves the codec and the programs over the tuple as calibrated."""
  from zipccl_jax.strategy.calibration import monotone_points
  name = REC.BYSIZE_RUNS[0]
  held = MC.by_variant(MC.run_records(name), "all_gather")["auto"]["model_profile"]
  out = REC.slowest_levels(held)
  assert out["codec"] == held["codec"] and out["links"]["host,local"] == held["links"]["host,local"]
  slow, sizes = held["slowest_rep_s"], held["bytes"]
  for level in ("host", "local"):
    for coll in ("all_to_all", "all_gather"):
      keys = sorted((k for k in slow if k.startswith(f"link[{level}]/{coll}/")), key=sizes.get)
      want = monotone_points([sizes[k] for k in keys], [slow[k] - slow["null"] for k in keys])
      got = out["links"][level][coll]["points"]
      assert [tuple(p) for p in got] == list(want) and got != held["links"][level][coll]["points"]
    assert out["links"][level]["*"] == out["links"][level]["all_to_all"]


def test_a_lead_in_credit_is_scored_against_the_record(record_rows):
  """`lead_in_whatif` with no credit is the record itself (the same count, per op too), and a credit only ever
  moves the two-level variants: the flat ones keep their count whatever it is."""
  rows = REC.lead_in_whatif((0.0, 5.0))
  per_op: dict = {}
  for r in record_rows:
    per_op[r["collective"]] = per_op.get(r["collective"], 0) + sum(abs(e) < 0.15 for e in r["links_errs"])
  assert rows[0]["within"] == sum(per_op.values()) and rows[0]["per_op"] == per_op
  assert rows[0]["of"] == rows[1]["of"] == 20 * len(REC.DECISION_RUNS)
  flat = {op: sum(abs(e) < 0.15 for r in record_rows if r["collective"] == op and r["variant"].startswith("flat")
                  for e in r["links_errs"]) for op in per_op}
  assert all(rows[1]["per_op"][op] >= flat[op] for op in per_op)
  assert rows[1]["within"] != rows[0]["within"]  # 5 ms moves some two-level variant across the bound


def test_readme_quotes_the_record(record_rows):
  """benchmarks/README.md ("The record") quotes `python benchmarks/model_record.py` as it prints today."""
  text = (REPO / "benchmarks" / "README.md").read_text()
  quoted = [REC.record_markdown(record_rows), REC.record_verdict(record_rows),
            REC.picks_verdict(REC.record_picks()),
            "with the mixed slot's passes (SLOT_RUNS): " + REC.record_verdict(REC.record(REC.SLOT_RUNS)),
            "on the whole result, the levels in groups of their own (WHOLE_RUNS): "
            + REC.record_verdict(REC.record(REC.WHOLE_RUNS)),
            "the levels beside the programs, the slowest process's median fitted (BYSIZE_RUNS): "
            + REC.record_verdict(REC.record(REC.BYSIZE_RUNS)),
            REC.held_out_verdict(REC.held_out_programs(record_rows=record_rows)),
            REC.composed_verdict(REC.composed_vs_programs()),
            REC.composed_by_size_verdict(REC.composed_by_size()),
            REC.composed_verdict(REC.composed_vs_programs(REC.WHOLE_RUNS), REC.WHOLE),
            REC.composed_by_size_verdict(REC.composed_by_size(REC.WHOLE_RUNS), REC.WHOLE_RUNS, since=REC.WHOLE),
            REC.composed_verdict(REC.composed_vs_programs(REC.BYSIZE_RUNS), REC.BYSIZE),
            REC.composed_by_size_verdict(REC.composed_by_size(REC.BYSIZE_RUNS), REC.BYSIZE_RUNS, since=REC.BYSIZE),
            REC.slowest_verdict(),
            REC.lead_in_verdict(REC.lead_in_whatif()),
            REC.level_curves_verdict(REC.WHOLE_RUNS, REC.WHOLE),
            REC.level_curves_verdict(REC.BYSIZE_RUNS, REC.BYSIZE),
            "calibrated as today (SLOWREP_RUNS): " + REC.record_verdict(REC.record(REC.SLOWREP_RUNS)) + "; "
            + REC.errors_verdict(REC.record(REC.SLOWREP_RUNS))
            + " (BYSIZE_RUNS: " + REC.errors_verdict(REC.record(REC.BYSIZE_RUNS)) + ")",
            REC.composed_verdict(REC.composed_vs_programs(REC.SLOWREP_RUNS), REC.SLOWREP),
            REC.composed_by_size_verdict(REC.composed_by_size(REC.SLOWREP_RUNS), REC.SLOWREP_RUNS,
                                         since=REC.SLOWREP),
            REC.level_curves_verdict(REC.SLOWREP_RUNS, REC.SLOWREP),
            REC.mixed_verdict(REC.mixed_over_flat()),
            REC.bar_verdict(REC.auto_bar()),
            REC.drift_verdict(REC.ratio_drift()),
            "the decisions with another margin on timed programs: " + REC.margin_verdict(REC.margin_whatif())]
  for line in "\n".join(quoted).splitlines():
    assert line in text, f"benchmarks/README.md does not quote benchmarks/model_record.py's line:\n{line}"


def test_the_command_prints_the_record(capsys):
  assert REC.main([]) == 0
  out = capsys.readouterr().out
  assert out.startswith("| collective | variant | links only, lowest / mean / highest error over ")
  assert "auto within 3% + 1.5 ms of the fastest variant in " in out


SLOT_RUNS = REC.SLOT_RUNS


# The slot runs whose mixed exchange links only puts outside 15% even with its passes charged: a calibration
# that read the codec in situ at the factor's floor (0.25 of its cost alone), which costs that exchange's slow
# level (benchmarks/README.md, "Three runs after the passes went"), at -17.4%; and the run whose probe misread
# (MISREAD_PROBE), whose flat crossings it costs at the probe, at +22.6%. Since the exchange counts no codec
# saving for its uncoded rows where the codec hides behind the slow link (`levels._mixed_model`), the third
# slot run (-16.3% before) and the fifth run with the levels timed beside the programs (-15.1%) are within
MIXED_MISSES = {"mesh_2x4_all_ops_avx2_slot_passes_once_repeat2.json"} | MISREAD_PROBE


def test_links_only_charges_the_mixed_exchange_its_own_rows_passes(monkeypatch):
  """In the runs that measured it, links only costs all_to_all host coded / local raw with the passes over
  its own host's rows (into their slots and back), as calibrate timed them beside the codec: that program
  lands higher in every such run than without them (17.4% under to 22.6% over with them, 3.7% from its
  median on average; 19.1% under to 19.4% over without, 4.5%), within 15% but in MIXED_MISSES, nearer its
  medians overall, and no other variant moves."""
  from zipccl_jax.strategy.codec_cost import CodecModel as Codec

  def rows():
    out = {}
    for name in SLOT_RUNS:
      run = MC.RESULTS / name
      out.update({(name, r["collective"], r["variant"]): r["links_err"]
                  for r in MC.two_levels(MC.testbed_profile(run), run=run) if r["variant"] != "auto"})
    return out

  charged = rows()
  for name in REC.DECISION_RUNS:  # SLOT_RUNS are exactly the runs that timed the passes
    prof = MC.run_profile(next(r for r in json.loads((MC.RESULTS / name).read_text())
                                if r["variant"] == "auto")["model_profile"])
    assert (prof.codec["cpu"]["bfloat16"].slot_Bps > 0) == (name in SLOT_RUNS), name
  plain = MC.run_profile

  def unmeasured(summary):
    p = plain(summary)
    p.codec = {k: {d: Codec(c.encode_Bps, c.decode_Bps, c.encode_overhead_s, c.decode_overhead_s)
                   for d, c in tab.items()} for k, tab in p.codec.items()}
    return p

  monkeypatch.setattr(MC, "run_profile", unmeasured)
  free = rows()
  mixed = "hierarchical host:compressed local:raw"
  for key, err in charged.items():
    if key[1:] == ("all_to_all", mixed):
      assert (abs(err) < 0.15) != (key[0] in MIXED_MISSES) and err > free[key], (key, err, free[key])
    else:
      assert err == free[key], key
  ours = [k for k in charged if k[1:] == ("all_to_all", mixed)]
  assert len(ours) == len(SLOT_RUNS)
  assert sum(abs(charged[k]) for k in ours) < sum(abs(free[k]) for k in ours), [(charged[k], free[k]) for k in ours]
