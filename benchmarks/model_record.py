"""The links-only prediction scored over every stored 2 x 4 run, and `compress="auto"`'s record on them.

    python benchmarks/model_record.py          # the record's table and its lines (~10 s); --json writes the rows

benchmarks/model_check.py predicts each configuration once, from one run (`--two-levels RUN`); this scores the
same predictions over every run of today's decision (`DECISION_RUNS`, each with the profile it calibrated) and
asks where the misses come from:

* **the record** (`record`): each timed variant's links-only error in every run, and how many are within 15%;
* **the program's own timing** (`held_out_programs`): the held-out calibration's timing of the very program,
  read at the case's size: how close the testbed lets any prediction come;
* **the composition** (`composed_vs_programs`, `composed_by_size`): links only's sum of phases against the
  same calibration's timing of the program, at the sizes it timed (no drift between the two);
* **a lead-in term** (`lead_in_whatif`): the record again with a credit off every two-level variant;
* **the mixed exchange** (`mixed_over_flat`): all_to_all's host-coded program against its flat coded one, as
  measured and as links only costs them, with and without the codec saving it no longer counts;
* **the picks** (`record_picks`): what running links only's fastest variant costs;
* **`auto`** (`auto_bar`, `ratio_drift`, `margin_whatif`): within 3% + 1.5 ms of the fastest variant, how far
  the ratio it decides on drifts, and what other margins on timed programs would have picked.

benchmarks/README.md quotes its output ("The record").
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

from model_check import (FIXED_ORDER, HELD_OUT_SIZES, MESH_VARIANTS, OPS, RESULTS, by_variant, call_role,
                         cost_model, dtype_of, links_only_times, links_topology, pct, rel_err, run_profile,
                         run_records, testbed_profile, two_levels)

# Every 2 x 4 all-ops run of today's decision (one decision per call: a call the plan keeps flat decides with the
# plan's flat estimates), oldest first: the record the links-only column is judged on (`record`). From
# per_case on, each calibrated again before each case (`--held-out-per-case`); from slot on, with the mixed
# slot exchange's passes (`CodecModel.slot_Bps`); slot_once and its repeats, the default command (one
# calibration) with them; slot_timed_*, the default command once `Profile.timed_gain` ranked calibrate's timed
# compressed programs at their time (the runs before it, MARGIN_ON_TIMED_RUNS, with the 2% margin of a modelled
# estimate: `RUNS_TIMED_GAIN`); slot_passes_*, the same once the coded reductions read their own row inside the
# sum and a coded fast phase reorders by row concatenation (benchmarks/coded_passes_ab.py); slot_rows_*, the same
# once all_gather's raw fast level gathers rows (no element-wise transpose); slot_rows_whole_*, the same once
# calibrate times a level's all_gather on its whole result (not the first row of it, a copy more);
# slot_rows_whole_bysize_*, the same once calibrate times each level's links beside the programs of their size;
# slot_rows_whole_slowrep*, the same once calibrate fits the median of each repetition's slowest process.
# Every run of that command is added here, whatever it shows.
MARGIN_ON_TIMED_RUNS = tuple(f"mesh_2x4_all_ops_avx2_{s}.json" for s in (
    "once", "once_repeat", "once_repeat2", "once_repeat3", "once_repeat4", "held_out_7", "per_case",
    "per_case_repeat", "per_case_repeat2", "slot", "slot_repeat", "slot_repeat2", "slot_repeat3", "slot_repeat4",
    "slot_repeat5", "slot_once", "slot_once_repeat", "slot_once_repeat2"))
DECISION_RUNS = MARGIN_ON_TIMED_RUNS + tuple(f"mesh_2x4_all_ops_avx2_{s}.json" for s in (
    "slot_timed_once", "slot_timed_once_repeat", "slot_timed_once_repeat2", "slot_passes_once",
    "slot_passes_once_repeat", "slot_passes_once_repeat2", "slot_rows_once", "slot_rows_once_repeat",
    "slot_rows_once_repeat2", "slot_rows_once_repeat3", "slot_rows_once_repeat4",
    "slot_rows_once_repeat5", "slot_rows_once_repeat6", "slot_rows_once_repeat7",
    "slot_rows_once_repeat8", "slot_rows_whole_once", "slot_rows_whole_once_repeat",
    "slot_rows_whole_once_repeat2", "slot_rows_whole_once_repeat3", "slot_rows_whole_once_repeat4",
    "slot_rows_whole_once_repeat5", "slot_rows_whole_once_repeat6", "slot_rows_whole_once_repeat7",
    "slot_rows_whole_once_repeat8", "slot_rows_whole_once_repeat9", "slot_rows_whole_once_repeat10",
    "slot_rows_whole_once_repeat11", "slot_rows_whole_once_repeat12", "slot_rows_whole_once_repeat13",
    "slot_rows_whole_once_repeat14", "slot_rows_whole_once_repeat15", "slot_rows_whole_once_repeat16",
    "slot_rows_whole_bysize_once", "slot_rows_whole_bysize_once_repeat1", "slot_rows_whole_bysize_once_repeat2",
    "slot_rows_whole_bysize_once_repeat3", "slot_rows_whole_bysize_once_repeat4",
    "slot_rows_whole_bysize_once_repeat5", "slot_rows_whole_bysize_once_repeat6",
    "slot_rows_whole_bysize_once_repeat7", "slot_rows_whole_slowrep", "slot_rows_whole_slowrep_repeat1",
    "slot_rows_whole_slowrep_repeat2", "slot_rows_whole_slowrep_repeat3", "slot_rows_whole_slowrep_repeat4",
    "slot_rows_whole_slowrep_repeat5", "slot_rows_whole_slowrep_repeat6", "slot_rows_whole_slowrep_repeat7"))
# The runs calibrated as `zipccl_jax.calibrate` is today: with the mixed slot exchange's passes timed beside the
# codec (`CodecModel.slot_Bps`); the runs before them cost that exchange without its passes
SLOT_RUNS = tuple(name for name in DECISION_RUNS if name.startswith("mesh_2x4_all_ops_avx2_slot"))
# The runs since all_gather's fast level stopped transposing its result (hierarchical._gather_fast): their
# programs are today's
ROWS_RUNS = tuple(name for name in DECISION_RUNS if "_slot_rows_" in name)
# The runs calibrated as `zipccl_jax.calibrate` is today: every measurement fitted at the median of each
# repetition's slowest process (calibration._slowest_rep); the runs before fitted the slowest process's median
SLOWREP_RUNS = tuple(name for name in ROWS_RUNS if "_slot_rows_whole_slowrep" in name)
# The runs before them with each level's link of a collective at a size timed in one group with the flat
# collective and the programs over the tuple at that size (calibration._job_group); the runs before those timed a
# level's links in a group of their own, every collective and size shuffled together
BYSIZE_RUNS = tuple(name for name in ROWS_RUNS if "_slot_rows_whole_bysize_" in name)
# The runs before them with calibrate's all_gather links timed on their whole result (calibration._link_job);
# the ROWS_RUNS before those kept the first row, a copy of one row more per device
WHOLE_RUNS = tuple(name for name in ROWS_RUNS
                   if "_slot_rows_whole_" in name and name not in BYSIZE_RUNS + SLOWREP_RUNS)
SLICED_RUNS = tuple(name for name in ROWS_RUNS if name not in WHOLE_RUNS + BYSIZE_RUNS + SLOWREP_RUNS)
SLICED = "the reorders went, before calibrate timed all_gather's whole result"
WHOLE = "calibrate times all_gather's whole result, before it timed the levels beside the programs"
BYSIZE = ("calibrate times each level's links beside the programs of their size, before it fitted each "
          "repetition's slowest process")
SLOWREP = "calibrate fits the median of each repetition's slowest process"
# The held-out size (bytes one device sends in the flat raw collective) nearest the cases' 3.5-4.6 MB
COMPOSED_AT = 5 << 19


def record(runs=DECISION_RUNS, held_fn=None) -> list[dict]:
    """Per timed variant of the 2 x 4 runs (`runs`, names in RESULTS): its links-only error in each run (from
    each run's held-out profile summary, through `held_fn` where given: `model_check.two_levels`)."""
    rows: dict = {}
    for name in runs:
        run = RESULTS / name
        for r in two_levels(testbed_profile(run), run=run, held_fn=held_fn):
            if r["variant"] != "auto":
                rows.setdefault((r["collective"], r["variant"]), []).append(r["links_err"])
    return [{"collective": c, "variant": v, "runs": list(runs), "links_errs": errs} for (c, v), errs in rows.items()]


def record_markdown(rows, bound: float = 0.15) -> str:
    """The links-only column over every run of `record`: each variant's errors (lowest, mean, highest) and in
    how many runs it is within `bound`."""
    n = len(rows[0]["runs"])
    out = [f"| collective | variant | links only, lowest / mean / highest error over {n} runs | runs within "
           f"{bound:.0%} |", "|---|---|---|---|"]
    for r in rows:
        e = r["links_errs"]
        out.append(f"| {r['collective']} | {r['variant']} | {pct(min(e))} / {pct(statistics.mean(e))} / "
                   f"{pct(max(e))} | {sum(abs(x) < bound for x in e)} of {n} |")
    return "\n".join(out)


def record_verdict(rows, bound: float = 0.15) -> str:
    """One line: of every variant in every run of `record`, how many are within `bound`, the runs with all of
    them within it, and each run's count (oldest first)."""
    runs = rows[0]["runs"]
    per_run = [sum(abs(r["links_errs"][i]) < bound for r in rows) for i in range(len(runs))]
    return (f"links only over {len(runs)} runs: {sum(per_run)} of {len(runs) * len(rows)} variants within "
            f"{bound:.0%} of their medians; every variant within it in {per_run.count(len(rows))} of {len(runs)} "
            f"runs (per run, oldest first: {', '.join(map(str, per_run))} of {len(rows)})")


# The variants of the 2 x 4 runs whose programs calibrate times over the tuple, each with its own curve in the
# held-out profile: variant -> (slow level coded, the flat program)
TIMED_PROGRAMS = {"hierarchical_raw": (False, False), "hierarchical_compressed": (True, False),
                  "flat_compressed": (True, True)}


def _program_key(op: str, variant: str) -> str:
    """The key of `variant`'s (of TIMED_PROGRAMS) program among a calibrated tuple's links."""
    from zipccl_jax.strategy import levels as two_level
    coded, flat = TIMED_PROGRAMS[variant]
    return two_level.flat_coded_key(op) if flat else two_level.hierarchical_key(op, coded, FIXED_ORDER)


def held_out_programs(runs=DECISION_RUNS, record_rows=None) -> list[dict]:
    """Per run, op of PAIRED_OPS and variant of TIMED_PROGRAMS: the held-out calibration's own timing of that
    very program (its curve over the held-out sizes, interpolated at the case's size, as `LinkModel` reads
    it) against the run's median, beside links only's error for the variant (`record_rows`, `record(runs)`'s
    rows, computed if not given). A direct measurement of the same program, minutes before its case and at
    other sizes: how close the testbed lets any prediction come."""
    from zipccl_jax.accounting import sent_bytes
    from zipccl_jax.strategy.links import LinkModel
    record_rows = record(runs) if record_rows is None else record_rows
    links = {(r["collective"], r["variant"]): dict(zip(r["runs"], r["links_errs"])) for r in record_rows}
    rows = []
    for name in runs:
        recs = run_records(name)
        for op in PAIRED_OPS:
            by = by_variant(recs, op)
            r0 = by["flat_raw"]
            nbytes = math.prod(r0["global_shape"]) // 8 * np.dtype(dtype_of(r0["dtype"])).itemsize
            tab = by["auto"]["model_profile"]["links"]["host,local"]
            for variant in TIMED_PROGRAMS:
                t = LinkModel(**tab[_program_key(op, variant)]).time(sent_bytes(op, nbytes, 8))
                rows.append({"run": name, "collective": op, "variant": MESH_VARIANTS[variant],
                             "program_err": rel_err(t, by[variant]["median_s"]),
                             "links_err": links[(op, MESH_VARIANTS[variant])][name]})
    return rows




def composed_vs_programs(runs=SLICED_RUNS, at: int = COMPOSED_AT) -> list[dict]:
    """Per run, op of PAIRED_OPS and variant of TIMED_PROGRAMS: links only's composition of the variant at the
    held-out size `at` against the same calibration's timing of that program there. One calibration, minutes
    before any case, so no drift between the two: what differs is the composition's own error (phases timed
    as programs of their own, summed)."""
    zm = cost_model()
    from zipccl_jax.accounting import sent_bytes
    rows = []
    for name in runs:
        recs = run_records(name)
        for op in PAIRED_OPS:
            by = by_variant(recs, op)
            held = by["auto"]["model_profile"]
            r0 = by["flat_raw"]
            dt = np.dtype(dtype_of(r0["dtype"]))
            elems = round(at / sent_bytes(op, float(dt.itemsize), 8))  # an operand whose flat raw sends `at`
            elems -= elems % 64  # a whole row per rank, as calibrate's programs have
            call = zm.Call(r0["payload"], op, elems * dt.itemsize, dt.name, call_role(r0["payload"], op))
            links = zm.predict_call(links_topology(run_profile(held), recs), call, fixed_order=FIXED_ORDER)
            alone = links_only_times(links)
            tab = held["links"]["host,local"]
            for variant in TIMED_PROGRAMS:
                # the point calibrate measured at `at` (its sizes round to whole elements per rank)
                x, t = min(tab[_program_key(op, variant)]["points"], key=lambda p: abs(p[0] - at))
                assert abs(x / at - 1) < 1e-3, (name, op, variant, x)
                rows.append({"run": name, "collective": op, "variant": MESH_VARIANTS[variant], "program_s": t,
                             "composed_err": rel_err(alone[MESH_VARIANTS[variant]], t)})
    return rows


def composed_verdict(rows, since: str = SLICED) -> str:
    """One line of `composed_vs_programs`: per op and variant, the mean and the spread (sd) of the composition's
    error against the program's own timing."""
    by: dict = {}
    for r in rows:
        by.setdefault((r["collective"], r["variant"]), []).append(r["composed_err"])
    parts = [f"{op} {v.replace('hierarchical ', '')} {pct(statistics.mean(e))} (sd {statistics.stdev(e):.1%})"
             for (op, v), e in by.items()]
    return (f"links only's composition against the same held-out calibration's timing of the program, at "
            f"{COMPOSED_AT / 1e6:.1f} MB, over the {len({r['run'] for r in rows})} runs since {since}: "
            + "; ".join(parts))


def composed_by_size(runs=SLICED_RUNS, sizes=HELD_OUT_SIZES) -> dict:
    """{(op, variant): [ms, one per size of `sizes`]}: per two-level program of TIMED_PROGRAMS, links only's
    composition less the program's own held-out timing (`composed_vs_programs`), in ms, averaged over `runs`, at
    each size the calibrations timed: whether the gap is a cost per program (flat over size) or grows with the
    bytes."""
    by: dict = {}
    for i, at in enumerate(sizes):
        for r in composed_vs_programs(runs, at):
            if r["variant"].startswith("hierarchical"):
                by.setdefault((r["collective"], r["variant"]), [[] for _ in sizes])[i].append(
                    r["composed_err"] * r["program_s"] * 1e3)
    return {k: [statistics.mean(g) for g in per_size] for k, per_size in by.items()}


def composed_by_size_verdict(gaps: dict, runs=SLICED_RUNS, sizes=HELD_OUT_SIZES,
                             since: str = SLICED) -> str:
    """One line of `composed_by_size`."""
    parts = [f"{op} {v.replace('hierarchical ', '')} " + "/".join(f"{m:+.1f}" for m in means)
             for (op, v), means in gaps.items()]
    return (f"links only's composition less the program's own timing, ms, mean over the {len(runs)} runs since "
            f"{since}, at {'/'.join(f'{at / 1e6:.2f}' for at in sizes)} MB: " + "; ".join(parts))


def lead_in_whatif(credits_ms=(0.0, 0.5, 0.9, 1.5), runs=DECISION_RUNS, bound: float = 0.15) -> list[dict]:
    """Per credit (ms): links only with that much taken off every two-level variant (one lead-in per phase after
    the first: the phase runs of benchmarks/link_patterns.py measured ~0.9 ms), and how many variants of `runs`
    then land within `bound`, in all and per op. The lead-in term links only does not have, scored."""
    timed = [r for name in runs for r in two_levels(testbed_profile(RESULTS / name), run=RESULTS / name)
             if r["variant"] != "auto"]
    out = []
    for c in credits_ms:
        within = {}
        for r in timed:
            t = r["links_s"] - (c * 1e-3 if r["variant"].startswith("hierarchical") else 0.0)
            within.setdefault(r["collective"], []).append(abs(rel_err(t, r["meas_s"])) < bound)
        out.append({"credit_ms": c, "within": sum(map(sum, within.values())), "of": len(timed),
                    "per_op": {op: sum(v) for op, v in within.items()}})
    return out


def lead_in_verdict(rows, bound: float = 0.15) -> str:
    """One line of `lead_in_whatif`."""
    return (f"links only with a lead-in credit per two-level variant, variants within {bound:.0%} over the record: "
            + "; ".join(f"{r['credit_ms']:g} ms {r['within']} of {r['of']} ("
                        + ", ".join(f"{op} {k}" for op, k in r["per_op"].items()) + ")" for r in rows))


MIXED = "hierarchical host:compressed local:raw"


def mixed_over_flat(runs=DECISION_RUNS) -> list[dict]:
    """Per run: all_to_all's mixed exchange (MIXED) less its flat coded exchange, in ms, as measured (the medians)
    and as links only costs them, and the codec time of the L - 1 rows it does not code (`saved_ms`, at the
    held-out calibration's in-situ rates), which links only took off it until it counted no saving where the
    codec hides behind the slow link (`levels._mixed_model`); with the mixed exchange's links-only error with
    and without that saving."""
    from zipccl_jax.strategy.levels import uncoded_rows_codec_s
    rows = []
    for name in runs:
        run = RESULTS / name
        recs = run_records(name)
        prof = testbed_profile(run)
        by = {r["variant"]: r for r in two_levels(prof, run=run, ops=("all_to_all",))}
        r0 = by_variant(recs, "all_to_all")["flat_raw"]
        dt = np.dtype(dtype_of(r0["dtype"]))
        summary = by_variant(recs, "all_to_all")["auto"].get("model_profile")
        held = run_profile(summary) if summary else prof  # as `two_levels` reads it
        cm = held.codec_model(dt, "cpu")[0]
        row_bytes = math.prod(r0["global_shape"]) // 64 * dt.itemsize  # one row of one device's operand
        saved = uncoded_rows_codec_s(cm, row_bytes, 4)  # the testbed's L = 4
        m, f = by[MIXED], by["flat compressed"]
        timed = [r for r in by.values() if r["variant"] != "auto"]
        with_saving = {r["variant"]: r["links_s"] - (saved if r is m else 0.0) for r in timed}
        rows.append({"run": name, "measured_ms": (m["meas_s"] - f["meas_s"]) * 1e3,
                     "links_ms": (m["links_s"] - f["links_s"]) * 1e3, "saved_ms": saved * 1e3,
                     "in_situ": held.codec_in_situ.get("cpu", 1.0), "links_err": m["links_err"],
                     "saving_err": rel_err(m["links_s"] - saved, m["meas_s"]),
                     "best": min(timed, key=lambda r: r["meas_s"])["variant"],
                     "pick": min(timed, key=lambda r: r["links_s"])["variant"],
                     "saving_pick": min(with_saving, key=with_saving.get)})
    return rows


def mixed_verdict(rows, recent: int = 16, bound: float = 0.15) -> str:
    """One line of `mixed_over_flat`: the gap over the `recent` newest runs, and the mixed exchange's links-only
    errors over all of `rows`, with and without the saving."""
    last = rows[-recent:]

    def span(k, rs):
        v = [r[k] for r in rs]
        return f"{min(v):+.1f} to {max(v):+.1f} ms (mean {statistics.mean(v):+.1f})"

    def errs(k):
        v = [r[k] for r in rows]
        return f"mean {pct(statistics.mean(v))}, {sum(abs(e) < bound for e in v)} of {len(v)} within {bound:.0%}"

    after = [dict(r, gap=r["links_ms"] - r["saved_ms"]) for r in last]
    right = lambda k: sum(r[k] == r["best"] for r in rows)  # noqa: E731
    mixed_wrong = sum(r["saving_pick"] == MIXED != r["best"] for r in rows)
    return (f"all_to_all's mixed exchange less its flat coded one, over the {len(last)} newest runs: measured "
            f"{span('measured_ms', last)}; links only {span('links_ms', last)}, with the uncoded rows' codec "
            f"saved {span('gap', after)}; in-situ codec factors {min(r['in_situ'] for r in rows):.2f}-"
            f"{max(r['in_situ'] for r in rows):.2f} over the {len(rows)} runs, where links only's error on the "
            f"mixed exchange is {errs('links_err')} (with the saving: {errs('saving_err')}), and its all_to_all pick "
            f"the measured fastest in {right('pick')} of {len(rows)} (with the saving: {right('saving_pick')}, "
            f"{mixed_wrong} of the others the mixed exchange)")


def errors_verdict(rows) -> str:
    """The mean and sd of `rows`' links-only errors (every variant in every run), in points."""
    errs = [100 * e for r in rows for e in r["links_errs"]]
    return f"mean error {statistics.mean(errs):+.1f}% (sd {statistics.stdev(errs):.1f} points)"


def slowest_levels(summary: dict) -> dict:
    """A held-out profile summary whose host and local links are fitted (`calibration.fit_bounded`) to its
    `slowest_rep_s`, the median of each repetition's slowest process, less that of the null program: the
    statistic a case's median is (a call ends with its last process), where calibrate keeps the slowest
    process's median of each measurement. The codec and the programs over the tuple stay as calibrated."""
    from zipccl_jax.strategy.calibration import fit_bounded
    out = json.loads(json.dumps(summary))
    slow, sizes = out["slowest_rep_s"], out["bytes"]
    for level in ("host", "local"):
        for coll in [c for c in out["links"][level] if c != "*"]:
            keys = sorted((k for k in slow if k.startswith(f"link[{level}]/{coll}/")), key=sizes.get)
            lk, _ = fit_bounded([sizes[k] for k in keys], [max(0.0, slow[k] - slow["null"]) for k in keys])
            if lk is not None:  # an unmeasurable fit keeps the calibrated link, as calibrate does
                out["links"][level][coll] = {"latency_s": lk.latency_s, "bandwidth_Bps": lk.bandwidth_Bps,
                                             "points": [list(p) for p in lk.points]}
        out["links"][level]["*"] = out["links"][level]["all_to_all"]  # calibrate's first collective
    return out


def slowest_verdict(runs=None, calibrated=None, bound: float = 0.15) -> str:
    """One line: links only over `runs` (BYSIZE_RUNS) with each level's links from `slowest_levels`, beside the
    record as calibrated (`calibrated`, `record(runs)`'s rows, computed if not given): the count within `bound`
    and the mean error."""
    runs = BYSIZE_RUNS if runs is None else runs
    calibrated = record(runs) if calibrated is None else calibrated

    def score(rows):
        errs = [e for r in rows for e in r["links_errs"]]
        return (f"{sum(abs(e) < bound for e in errs)} of {len(errs)} within {bound:.0%}, mean error "
                f"{pct(statistics.mean(errs))}")

    return (f"links only over the {len(runs)} runs since {BYSIZE}, each level's links fitted to the median of each "
            f"repetition's slowest process: {score(record(runs, slowest_levels))} (as calibrated: "
            f"{score(calibrated)})")


# The calibrated curves `level_curves` reads: each level's links, and all_gather's two-level raw program
CURVES = (("host", "all_gather"), ("host", "all_to_all"), ("local", "all_gather"), ("local", "all_to_all"),
          ("host,local", "hierarchical_all_gather"))


def level_curves(runs) -> dict:
    """{(level, link): [(mean ms, sd ms) per size of HELD_OUT_SIZES]}: the held-out calibrations' own points
    (net medians) of CURVES over `runs`, what links only composes and what it is compared with."""
    by: dict = {}
    for name in runs:
        links = by_variant(run_records(name), "all_gather")["auto"]["model_profile"]["links"]
        for level, link in CURVES:
            for i, (x, t) in enumerate(links[level][link]["points"]):
                assert abs(x / HELD_OUT_SIZES[i] - 1) < 0.01, (name, level, link, x)
                by.setdefault((level, link), [[] for _ in HELD_OUT_SIZES])[i].append(t * 1e3)
    return {k: [(statistics.mean(v), statistics.stdev(v)) for v in per] for k, per in by.items()}


def level_curves_verdict(runs, since: str) -> str:
    """One line of `level_curves`."""
    parts = [f"{level} {link} " + "/".join(f"{m:.1f} (sd {sd:.1f})" for m, sd in per)
             for (level, link), per in level_curves(runs).items()]
    return (f"the calibrated curves, ms, mean over the {len(runs)} runs since {since}, at "
            f"{'/'.join(f'{at / 1e6:.2f}' for at in HELD_OUT_SIZES)} MB: " + "; ".join(parts))


def held_out_verdict(rows, bound: float = 0.15) -> str:
    """One line of `held_out_programs`: how often the program's own held-out timing, and links only, are
    within `bound` of the run's median."""
    within = lambda k: sum(abs(r[k]) < bound for r in rows)  # noqa: E731
    return (f"the held-out calibration's own timing of the same programs (all_to_all, all_gather, psum_scatter: "
            f"two-level raw, host coded, flat compressed; interpolated at the case's size): {within('program_err')}"
            f" of {len(rows)} within {bound:.0%} of the medians; links only, on those variants: "
            f"{within('links_err')} of {len(rows)}")


def record_picks(runs=DECISION_RUNS) -> list[dict]:
    """Per run and op of `runs`: the variant links only ranks fastest, whether it is the one measured fastest,
    and its median over the fastest median (what following links only's ranking would have cost)."""
    picks = []
    for name in runs:
        run = RESULTS / name
        mesh = [r for r in two_levels(testbed_profile(run), run=run) if r["variant"] != "auto"]
        for op in dict.fromkeys(r["collective"] for r in mesh):
            timed = [r for r in mesh if r["collective"] == op]
            best, pick = min(timed, key=lambda r: r["meas_s"]), min(timed, key=lambda r: r["links_s"])
            picks.append({"run": name, "collective": op, "pick": pick["variant"], "best": best["variant"],
                          "over_best": pick["meas_s"] / best["meas_s"]})
    return picks


def picks_verdict(picks) -> str:
    """One line of `record_picks`: how often links only's fastest is the measured fastest, and the cost of
    running its pick (mean and largest of its median over the fastest)."""
    over = [p["over_best"] for p in picks]
    return (f"links only's fastest variant is the measured fastest in {sum(p['pick'] == p['best'] for p in picks)}"
            f" of {len(picks)} (run, op); its pick runs at {statistics.mean(over):.3f}x the fastest median on "
            f"average, {max(over):.3f}x at most")


# The two-level pair a near tie of the 2 x 4 runs is between: the slow level coded, against both levels raw
NEAR_TIE = ("hierarchical host:compressed local:raw", "hierarchical host:raw local:raw")
# The ops whose two-level programs calibrate times as one pair (psum runs psum_scatter's, then all_gather's)
PAIRED_OPS = ("all_to_all", "all_gather", "psum_scatter")


# The margin the runs of MARGIN_ON_TIMED_RUNS ranked a timed compressed program with: the profile's min_gain, as
# any compressed estimate (`Profile.timed_gain` came after them; its default is 0)
RUNS_TIMED_GAIN = 0.02


def decided_timed_gain(name: str) -> float:
    """The margin run `name` ranked calibrate's timed compressed programs with."""
    return RUNS_TIMED_GAIN if name in MARGIN_ON_TIMED_RUNS else 0.0


def _own_decision(recs: list[dict], op: str, timed_gain: float | None = None):
    """The LevelPlan of `op` in a 2 x 4 run (`recs`) from that op's own calibration (a run with
    `--held-out-per-case` calibrated before each case), as `auto` decides today or with `timed_gain` (the
    run's own decision: `decided_timed_gain`)."""
    from zipccl_jax.strategy import levels as two_level
    by = by_variant(recs, op)
    prof, r0 = run_profile(by["auto"]["profile"]), by["flat_raw"]
    if timed_gain is not None:
        prof.timed_gain = timed_gain
    dt = np.dtype(dtype_of(r0["dtype"]))
    return two_level.choose(op, dt, math.prod(r0["global_shape"]) // 8, ("host", "local"), ("host", "local"),
                            (2, 4), "auto", call_role(r0["payload"], op), profile=prof, platform="cpu",
                            fixed_order=FIXED_ORDER)


def ratio_drift(runs=DECISION_RUNS) -> list[dict]:
    """Per run and op of `PAIRED_OPS`, `NEAR_TIE`'s ratio (slow level coded over both raw) three ways: as
    calibrate ranked it at the case's size (the estimates `auto` decided with), as the median of calibrate's
    ratios at each of its sizes from 1 MB (three sizes, three times the repetitions), and as the run measured it
    (the two variants' medians). If calibrate's sampling limited the decision, the pooled ratio would land nearer."""
    rows = []
    for name in runs:
        recs = run_records(name)
        for op in PAIRED_OPS:
            by = by_variant(recs, op)
            est = dict(_own_decision(recs, op).candidates)
            net, order = by["auto"]["profile"]["net_s"], "_fixed_order" if op == "psum_scatter" and FIXED_ORDER else ""
            raw = {k.rsplit("/", 1)[1]: v for k, v in net.items() if k.startswith(f"link/hierarchical_{op}{order}/")}
            coded = f"link/hierarchical_{op}_slow_coded{order}/"
            pooled = statistics.median(net[coded + s] / t for s, t in raw.items() if int(s) >= 1 << 20)
            rows.append({"run": name, "collective": op, "calibrated": est[NEAR_TIE[0]] / est[NEAR_TIE[1]],
                         "pooled": pooled, "measured": by["hierarchical_compressed"]["median_s"]
                         / by["hierarchical_raw"]["median_s"]})
    return rows


def drift_verdict(rows) -> str:
    """One line of `ratio_drift`: the measured ratio less each calibrated one, mean and standard deviation."""
    def stats(k):
        d = [r["measured"] - r[k] for r in rows]
        return f"mean {statistics.mean(d):+.1%}, sd {statistics.stdev(d):.1%}"
    return (f"host coded / both raw, measured less calibrated over {len(rows)} (run, op): at the case's size "
            f"{stats('calibrated')}; pooled over calibrate's sizes from 1 MB {stats('pooled')}")


def _best_s(by: dict) -> float:
    """The fastest median among a run's timed variants of one op (`by`: variant -> record), jax.lax's call
    included, `auto`'s own timings of the programs it picked aside."""
    return min(r["median_s"] for v, r in by.items() if not v.endswith("auto"))


def auto_bar(runs=DECISION_RUNS) -> list[dict]:
    """Per run, op and `auto` variant (over the tuple; over one axis, where the run has it): its median, the
    fastest variant's (`_best_s`), and whether it is within 3% + 1.5 ms of it (the testbed's bar)."""
    rows = []
    for name in runs:
        recs = run_records(name)
        for op in OPS:
            by = by_variant(recs, op)
            best = _best_s(by)
            rows += [{"run": name, "collective": op, "variant": v, "median_s": by[v]["median_s"], "best_s": best,
                      "within": by[v]["median_s"] <= 1.03 * best + 1.5e-3}
                     for v in ("auto", "one_axis_auto") if v in by]
    return rows


def bar_verdict(rows) -> str:
    """One line of `auto_bar`: how many `auto` timings are within 3% + 1.5 ms, and how far over the others are."""
    out = [r for r in rows if not r["within"]]
    over = "; ".join(f"{r['run'].removeprefix('mesh_2x4_all_ops_avx2_').removesuffix('.json')} {r['collective']}"
                     f"{' over one axis' if r['variant'] == 'one_axis_auto' else ''} "
                     f"{(r['median_s'] - 1.03 * r['best_s'] - 1.5e-3) * 1e3:.2f} ms over" for r in out)
    return (f"auto within 3% + 1.5 ms of the fastest variant in {len(rows) - len(out)} of {len(rows)} (run, op, "
            f"tuple or one axis)" + (f"; outside: {over}" if out else ""))


def margin_whatif(gains=(RUNS_TIMED_GAIN, 0.01, 0.0), runs=DECISION_RUNS) -> list[dict]:
    """Per `timed_gain` in `gains`: the variant each run's own calibration picks for each op with that margin
    on its timed compressed programs (`_own_decision`; `RUNS_TIMED_GAIN`: the rule before), and that variant's
    median over the fastest timed variant's (`auto`'s own timing aside): how many exceed 3% + 1.5 ms, and the
    mean and largest ratio."""
    by_name = {v: k for k, v in MESH_VARIANTS.items()}
    picked: dict = {g: [] for g in gains}   # (the pick's median, the fastest median) per decision
    for name in runs:
        recs = run_records(name)
        for op in OPS:
            by = by_variant(recs, op)
            for g in gains:
                picked[g].append((by[by_name[_own_decision(recs, op, g).candidates[0][0]]]["median_s"], _best_s(by)))
    return [{"timed_gain": g, "decisions": len(tb), "misses": sum(t > 1.03 * b + 1.5e-3 for t, b in tb),
             "mean_over_best": statistics.mean(t / b for t, b in tb), "max_over_best": max(t / b for t, b in tb)}
            for g, tb in picked.items()]


def margin_verdict(rows) -> str:
    """One line of `margin_whatif`; the rule before and today's default (`Profile.timed_gain`) named."""
    from zipccl_jax.strategy.profile import Profile
    today = Profile.timed_gain
    return "; ".join(f"timed_gain {r['timed_gain']:g}{' (before)' if r['timed_gain'] == RUNS_TIMED_GAIN else ''}"
                     f"{' (today)' if r['timed_gain'] == today else ''}: "
                     f"{r['misses']} of {r['decisions']} over 3% + 1.5 ms, "
                     f"{r['mean_over_best']:.4f}x the fastest on average, {r['max_over_best']:.3f}x at most"
                     for r in rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the record's rows here")
    a = p.parse_args(argv)
    rows = record()
    print(record_markdown(rows) + "\n\n" + record_verdict(rows))
    print(picks_verdict(record_picks()))
    print("with the mixed slot's passes (SLOT_RUNS): " + record_verdict(record(SLOT_RUNS)))
    print("on the whole result, the levels in groups of their own (WHOLE_RUNS): "
          + record_verdict(record(WHOLE_RUNS)))
    bysize = record(BYSIZE_RUNS)
    print("the levels beside the programs, the slowest process's median fitted (BYSIZE_RUNS): "
          + record_verdict(bysize))
    print(held_out_verdict(held_out_programs(record_rows=rows)))
    print(composed_verdict(composed_vs_programs()))
    print(composed_by_size_verdict(composed_by_size()))
    print(composed_verdict(composed_vs_programs(WHOLE_RUNS), WHOLE))
    print(composed_by_size_verdict(composed_by_size(WHOLE_RUNS), WHOLE_RUNS, since=WHOLE))
    print(composed_verdict(composed_vs_programs(BYSIZE_RUNS), BYSIZE))
    print(composed_by_size_verdict(composed_by_size(BYSIZE_RUNS), BYSIZE_RUNS, since=BYSIZE))
    print(slowest_verdict(calibrated=bysize))
    print(lead_in_verdict(lead_in_whatif()))
    print(level_curves_verdict(WHOLE_RUNS, WHOLE))
    print(level_curves_verdict(BYSIZE_RUNS, BYSIZE))
    slowrep = record(SLOWREP_RUNS)
    print("calibrated as today (SLOWREP_RUNS): " + record_verdict(slowrep) + "; " + errors_verdict(slowrep)
          + " (BYSIZE_RUNS: " + errors_verdict(bysize) + ")")
    print(composed_verdict(composed_vs_programs(SLOWREP_RUNS), SLOWREP))
    print(composed_by_size_verdict(composed_by_size(SLOWREP_RUNS), SLOWREP_RUNS, since=SLOWREP))
    print(level_curves_verdict(SLOWREP_RUNS, SLOWREP))
    print(mixed_verdict(mixed_over_flat()))
    print(bar_verdict(auto_bar()))
    print(drift_verdict(ratio_drift()))
    print("the decisions with another margin on timed programs: " + margin_verdict(margin_whatif()))
    if a.json:
        Path(a.json).write_text(json.dumps({"record": rows, "auto": auto_bar()}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
