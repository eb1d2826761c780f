"""The cost model at scale (`zipccl_jax.model`) against every configuration this repository measured.

    python benchmarks/model_check.py                       # markdown tables; --json writes the rows
    python benchmarks/model_check.py --capture RUN.json    # a training step's calls from an example's --json

Each prediction goes through `zipccl_jax.model` (a `Topology`, then `predict_call`: the functions
`compress="auto"` decides with), from a profile calibrated on this machine: the one
`zipccl_jax.calibrate` measured in a 2 x 4 run (`PROFILE_RUN`, `STEP_PROFILE_RUN`, its `auto` record; codec
per device and a link per level), and the link rate each run measured (`link_MBps`); the flat sweep
uses a profile calibrated in its own run. Nothing here is fitted to the timings it is compared with, and
no prediction reads a measurement of its own call: the runs calibrate the profile the model uses at sizes
no case sends (`model_profile`, `collectives.HELD_OUT_LINK_BYTES`; older runs, without it, at the cases'
sizes too).

* **Flat sweep** (`FLAT_RUN`, 4 processes behind one shaped loopback, 5 rates): each rate's prediction
  from the held-out profile calibrate measured at that rate in the same run (stored in every record, and
  the prediction beside it: `flat_case`, which `benchmarks/collectives.py` calls). Predicted: zipccl's raw
  program and the compressed one at the run's capacity; measured: their medians.
* **Two levels** (`PROFILE_RUN`, 2 hosts x 4 devices at 1 Gbit/s): every variant, two ways. *Anchored*:
  the run's own profile, whose measured programs the plan costs with (what `auto` decided with in that
  run). *Links only*: a `Topology` of the held-out calibration's per-level links, each level per
  collective (its all_to_all and its all_gather, as calibrate measured them), the host level's stream (what
  a flat collective's crossings reach: the run's link probe, one TCP stream between the hosts, times
  `stream_fill`, the flat patterns' share of it in benchmarks/link_patterns.py's runs), and its codec, as at
  scale, where no program has been measured. A run with `--held-out-per-case` measured that
  calibration again just before each case, and each op reads its own.
* **Training step** (`train_step_4p.json`, the MoE example on 4 processes): the step's collectives
  (`STEP_WORKLOAD`, captured from the example with `--capture`) plus its compute, taken as the
  uncompressed run's CPU time per step (process 0, median; the codec is then the model's).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
FLAT_RUN = RESULTS / "collectives_heldout_se_rule.json"
# Every two-level variant of the four ops, in one run of today's programs (`collectives.py --mesh 2x4 --cases
# all_to_all:moe_dispatch,all_gather:params_moe_experts,psum_scatter:grads_moe_experts,psum:grads_moe_experts`;
# the runs before it, mesh_2x4_heldout.json and mesh_2x4_psum.json, timed older programs or one op)
PROFILE_RUN = RESULTS / "mesh_2x4_all_ops.json"
# Every 2 x 4 all-ops run of today's decision (one decision per call: a call the plan keeps flat decides with the
# plan's flat estimates), oldest first: the record the links-only column is judged on (`record`). From
# per_case on, each calibrated again before each case (`--held-out-per-case`); from slot on, with the mixed
# slot exchange's passes (`CodecModel.slot_Bps`); slot_once and its repeats, the default command (one
# calibration) with them; slot_timed_*, the default command once `Profile.timed_gain` ranked calibrate's timed
# compressed programs at their time (the runs before it, MARGIN_ON_TIMED_RUNS, with the 2% margin of a modelled
# estimate: `RUNS_TIMED_GAIN`); slot_passes_*, the same once the coded reductions read their own row inside the
# sum and a coded fast phase reorders by row concatenation (benchmarks/coded_passes_ab.py); slot_rows_*, the same
# once all_gather's raw fast level gathers rows (no element-wise transpose). Every run of that command is added
# here, whatever it shows.
MARGIN_ON_TIMED_RUNS = tuple(f"mesh_2x4_all_ops_avx2_{s}.json" for s in (
    "once", "once_repeat", "once_repeat2", "once_repeat3", "once_repeat4", "held_out_7", "per_case",
    "per_case_repeat", "per_case_repeat2", "slot", "slot_repeat", "slot_repeat2", "slot_repeat3", "slot_repeat4",
    "slot_repeat5", "slot_once", "slot_once_repeat", "slot_once_repeat2"))
DECISION_RUNS = MARGIN_ON_TIMED_RUNS + tuple(f"mesh_2x4_all_ops_avx2_{s}.json" for s in (
    "slot_timed_once", "slot_timed_once_repeat", "slot_timed_once_repeat2", "slot_passes_once",
    "slot_passes_once_repeat", "slot_passes_once_repeat2", "slot_rows_once", "slot_rows_once_repeat",
    "slot_rows_once_repeat2", "slot_rows_once_repeat3", "slot_rows_once_repeat4",
    "slot_rows_once_repeat5", "slot_rows_once_repeat6"))
# The runs calibrated as `zipccl_jax.calibrate` is today: with the mixed slot exchange's passes timed beside the
# codec (`CodecModel.slot_Bps`); the runs before them cost that exchange without its passes
SLOT_RUNS = tuple(name for name in DECISION_RUNS if name.startswith("mesh_2x4_all_ops_avx2_slot"))
# The profile the training step is predicted from: the 2 x 4 run of the machine and code the step ran on
# (train_step_4p.json predates the held-out calibration; its compute and timings come from that run).
STEP_PROFILE_RUN = RESULTS / "mesh_2x4_session7.json"
STEP_RUN = RESULTS / "train_step_4p.json"
# The loopback rate per shaped rate of the machine and session the step ran on (its run measured none)
STEP_LINK_RUN = RESULTS / "collectives_heldout.json"
STEP_WORKLOAD = RESULTS / "workload_moe_flax_1x4.json"
# The runs above measured zipccl's raw programs as they were then: the reductions' fixed-order
# all-to-all and sum (today `fixed_order=True`; raw is now jax.lax's call), and the hierarchical
# program with both levels raw, which `auto` considers only with fixed_order. So they are predicted
# with fixed_order=True: the programs they ran.
FIXED_ORDER = True
# a variant of the two-level run -> its name among the model's variants
MESH_VARIANTS = {"flat_raw": "flat raw", "flat_compressed": "flat compressed",
                 "hierarchical_raw": "hierarchical host:raw local:raw",
                 "hierarchical_compressed": "hierarchical host:compressed local:raw",
                 "hierarchical_all_compressed": "hierarchical host:compressed local:compressed"}


# The ops of the 2 x 4 all-ops runs, in the order they ran
OPS = ("all_to_all", "all_gather", "psum_scatter", "psum")


def _records(name: str) -> list[dict]:
    """The records of stored run `name` (in RESULTS)."""
    return json.loads((RESULTS / name).read_text())


def _by_variant(recs: list[dict], op: str) -> dict:
    """A run's records of `op`, by variant."""
    return {r["variant"]: r for r in recs if r["collective"] == op}


def _zs():
    """zipccl_jax.model, imported when first needed: benchmarks/collectives.py imports this file in its
    workers before they set XLA_FLAGS, and importing zipccl_jax imports jax."""
    import zipccl_jax.model as zm  # the installed package, as every benchmark
    return zm


def _link(latency_s: float, bandwidth_Bps: float):
    from zipccl_jax.strategy.links import LinkModel
    return LinkModel(latency_s, bandwidth_Bps)


def run_profile(summary: dict):
    """The Profile of a 2 x 4 run's profile summary (`_twolevel._profile_summary`). Runs recorded
    before profiles kept `codec_in_situ` have its factor in their calibration's `in_situ` figures."""
    from zipccl_jax import Profile
    prof = Profile.from_dict(summary)
    ins = summary.get("in_situ") or {}
    if "codec_in_situ" not in summary and ins.get("applied"):
        prof.codec_in_situ = {"cpu": float(ins["factor"])}
    return prof


def testbed_profile(run: Path = PROFILE_RUN):
    """The profile calibrate measured in a 2 x 4 run at 1 Gbit/s (its `auto` record's)."""
    auto = next(r for r in json.loads(run.read_text()) if r["variant"] == "auto")
    return run_profile(auto["profile"])


def _role(payload: str, op: str) -> str:
    return "gradient" if "grad" in payload or op in ("psum_scatter", "psum") else "activation"


def _err(pred: float, meas: float) -> float:
    return pred / meas - 1.0


def _variant(pred: dict, name: str) -> float:
    return next(v["time_s"] for v in pred["variants"] if v["name"] == name)


def flat_case(prof, coll: str, payload: str, dtype: str, nbytes: int, capacity: int, nproc: int) -> dict:
    """One case of the flat sweep (`nproc` processes, one device each), predicted from `prof`, the profile
    calibrate measured at that rate on those processes (its link per device for the case's collective, its
    codec): zipccl's raw and compressed programs at the run's capacity, their ratio, and `auto`'s choice
    (without observed capacities). `benchmarks/collectives.py` records it beside each measurement."""
    zm = _zs()
    link = prof.link("x", "all_gather" if coll == "all_gather" else "all_to_all", "cpu")[0]
    top = zm.Topology(nproc, 1, link, platform="cpu", base=prof)
    p = zm.predict_call(top, zm.Call(payload, coll, int(nbytes), dtype, _role(payload, coll),
                                     capacity=int(capacity)), fixed_order=FIXED_ORDER)
    comp = _variant(p, "flat compressed K=1")
    return {"raw_s": p["zipccl_raw_time_s"], "compressed_s": comp,
            "compressed_over_raw": comp / p["zipccl_raw_time_s"], "auto_choice": p["auto_choice"]}


def flat_sweep() -> list[dict]:
    """Every case of the flat sweep at every rate: compressed / raw, predicted (from the profile calibrated
    at that rate in the same run) and measured (medians)."""
    from zipccl_jax import Profile
    rows = []
    for rec in json.loads(FLAT_RUN.read_text()):
        nbytes = math.prod(rec["shape_per_rank"]) * np.dtype(_np_dtype(rec["dtype"])).itemsize
        held_out = rec.get("model_profile") is not None  # runs since the held-out calibration
        p = flat_case(Profile.from_dict(rec["model_profile" if held_out else "profile"]), rec["collective"],
                      rec["payload"], rec["dtype"], nbytes, rec["frame_capacity"], rec["n_processes"])
        meas = rec["compressed_s"] / rec["best_raw_s"]
        rows.append({"case": f"{rec['collective']}:{rec['payload']}", "rate_gbit": rec["rate_gbit"],
                     "link_MBps": rec["link_MBps"], "pred_ratio": p["compressed_over_raw"],
                     "meas_ratio": meas, "ratio_err": _err(p["compressed_over_raw"], meas),
                     "pred_compressed_s": p["compressed_s"], "meas_compressed_s": rec["compressed_s"],
                     "pred_raw_s": p["raw_s"], "meas_raw_s": rec["best_raw_s"],
                     "auto_choice": p["auto_choice"], "meas_auto_choice": rec.get("auto_choice"),
                     "held_out": held_out, "recorded_in_run": rec.get("model")})
    return rows


def _np_dtype(name):
    from zipccl_jax.strategy.profile import np_dtype
    return np_dtype(name)


def two_levels(prof, run: Path = PROFILE_RUN, ops=OPS) -> list[dict]:
    """Every variant of a 2 x 4 run (`run`, of `ops`): the anchored and the links-only prediction against the
    median. Links only reads the run's held-out profile where it has one (calibrated at sizes no case has)."""
    zm = _zs()
    from zipccl_jax.strategy import levels as two_level
    recs = json.loads(run.read_text())
    rows = []
    for op in ops:
        by = _by_variant(recs, op)
        held = by["auto"].get("model_profile")  # one per run, or measured before each case (--held-out-per-case)
        top = _links_topology(run_profile(held) if held else prof, recs)
        r0 = by["flat_raw"]
        dt = np.dtype(_np_dtype(r0["dtype"]))
        elems = math.prod(r0["global_shape"]) // 8
        role = _role(r0["payload"], op)
        lp = two_level.choose(op, dt, elems, ("host", "local"), ("host", "local"), (2, 4), "auto", role,
                                 profile=prof, platform="cpu", fixed_order=FIXED_ORDER)
        anchored = dict(lp.candidates)
        links = zm.predict_call(top, zm.Call(r0["payload"], op, elems * dt.itemsize, dt.name, role),
                                fixed_order=FIXED_ORDER)
        alone = _links_only_times(links)
        for variant, name in MESH_VARIANTS.items():
            meas = by[variant]["median_s"]
            rows.append({"collective": op, "variant": name, "meas_s": meas,
                         "anchored_s": anchored[name], "anchored_err": _err(anchored[name], meas),
                         "links_s": alone[name], "links_err": _err(alone[name], meas)})
        rows.append({"collective": op, "variant": "auto", "meas_choice": by["auto"]["chosen"],
                     "anchored_choice": lp.candidates[0][0],
                     "links_choice": links["auto_choice"]})
    return rows


def _links_only_times(links: dict) -> dict:
    """{variant name of MESH_VARIANTS: seconds} of a `predict_call` result: flat raw is zipccl's (the runs'
    fixed order), flat compressed its one-piece program."""
    alone = {v["name"]: v["time_s"] for v in links["variants"]}
    alone["flat raw"] = links["zipccl_raw_time_s"]
    alone["flat compressed"] = alone["flat compressed K=1"]
    return alone


# The patterns of benchmarks/link_patterns.py that a flat collective's crossings make: gloo's ring (one
# pipelined stream from host to host) and the flat all_to_all (sixteen messages a direction), at the sizes
# (MiB a direction) that the 2 x 4 cases send across
FLAT_PATTERNS = ("flat ring all_gather", "flat all_to_all")
FILL_MIB = (4, 16)


@functools.cache
def stream_fill() -> float:
    """The fraction of the link probe's rate (one TCP stream of 16 MiB) that a flat collective's crossings
    reach on the 2 x 4 testbed: over the link_patterns runs whose probe held (before and after within 5%:
    not the run under load), the mean of each flat pattern's rate at FILL_MIB over that run's mean probe.
    Measured in runs of their own by `benchmarks/link_patterns.py`; no 2 x 4 run it is compared with."""
    fills = []
    for path in sorted(RESULTS.glob("link_patterns_2x4*.json")):
        pat = json.loads(path.read_text())
        before, after = pat["probe_MBps_before"], pat["probe_MBps_after"]
        if abs(after / before - 1) > 0.05:
            continue
        fills += [r["MBps_per_direction"] / ((before + after) / 2) for r in pat["records"]
                  if r["pattern"] in FLAT_PATTERNS and r["MiB_per_direction"] in FILL_MIB]
    return statistics.mean(fills)


def _host_level(prof, recs: list[dict], per_host: int = 4) -> dict:
    """The host level's links per collective, as calibrated, and its stream (`links.stream_link`): what a
    flat collective's crossings reach, the run's link probe (one TCP stream from host to host, which a host's
    `per_host` devices share) times `stream_fill`. The host level's calibrated collectives exchange one
    message per device pair, four pairs at once, and fill less of the link; a flat ring's edge is one
    pipelined stream (gloo's allgather keeps two half-chunks in flight on one connection), a flat
    all_to_all sixteen messages a direction."""
    host = dict(prof.links["host"])
    probe = next((r.get("link_MBps") for r in recs if r["variant"] == "auto"), None)
    if probe:
        host["stream"] = _link(host["all_gather"].latency_s, stream_fill() * probe * 1e6 / per_host)
    return host


def _links_topology(prof, recs: list[dict]):
    """The 2 x 4 testbed as links only costs it from `prof`: each level per collective, as calibrated, the host
    level's stream from the run's probe (`_host_level`), no measured two-level program."""
    return _zs().Topology(2, 4, _host_level(prof, recs), dict(prof.links["local"]), platform="cpu",
                          base=_without_programs(prof))


def _without_programs(prof):
    """`prof` with only the per-level links and the codec (no measured two-level programs)."""
    p = prof.copy()
    p.links = {k: v for k, v in p.links.items() if k in ("host", "local")}
    return p


def training_step(prof) -> list[dict]:
    """The MoE step per rate: compute (the uncompressed run's CPU time) plus the step's calls."""
    zm = _zs()
    runs = json.loads(STEP_RUN.read_text())["runs"]
    calls = [zm.Call(**c) for c in json.loads(STEP_WORKLOAD.read_text())]
    flat = {r["rate_gbit"]: r["link_MBps"] for r in json.loads(STEP_LINK_RUN.read_text())}  # TCP, measured
    lat = prof.link("host", "*", "cpu")[0].latency_s
    rows = []
    for rate in sorted({r["rate_gbit"] for r in runs if r["rate_gbit"] is not None}):
        by = {r["variant"]: r for r in runs if r["rate_gbit"] == rate}
        compute = statistics.median(c for run in by["uncompressed"]["run_step_cpu_s"] for c in run[1:])
        mbps = flat[rate]  # that session's loopback TCP at this rate (the step's run measured none)
        top = zm.Topology(4, 1, _link(lat, mbps * 1e6), platform="cpu", shared_link=True, base=prof)
        preds = [zm.predict_call(top, c, fixed_order=FIXED_ORDER) for c in calls]
        raw = compute + sum(c.calls * p["zipccl_raw_time_s"] for c, p in zip(calls, preds))
        comp = compute + sum(c.calls * _variant(p, "flat compressed K=1") for c, p in zip(calls, preds))
        mu, mc = by["uncompressed"]["step_time_s"], by["compressed"]["step_time_s"]
        rows.append({"rate_gbit": rate, "compute_s": compute, "pred_raw_s": raw, "meas_raw_s": mu,
                     "raw_err": _err(raw, mu), "pred_compressed_s": comp, "meas_compressed_s": mc,
                     "compressed_err": _err(comp, mc), "pred_speedup": raw / comp,
                     "meas_speedup": mu / mc, "speedup_err": _err(raw / comp, mu / mc)})
    return rows


def capture(example_json: str) -> list[dict]:
    """The calls of one training step from an example's `--json` (its per-call-site statistics: every
    site runs once per step and device)."""
    sites = json.loads(Path(example_json).read_text())["call_sites"]
    return [{"name": s["name"], "op": s["op"],
             "nbytes": math.prod(s["shape"]) * np.dtype(_np_dtype(s["dtype"])).itemsize,
             "dtype": s["dtype"], "role": "gradient" if s["name"].endswith("/bwd") or
             s["op"] == "psum_scatter" else "activation", "calls": 1,
             "capacity": int(s["capacity"]) if s["compressed"] else None} for s in sites]


# "What to expect at scale" (README): hosts of 8 GPUs, NVLink at the rate one H100 sends (450 GB/s a
# direction), the codec the GPU kit measured on an H200 in a jitted step (strategy.codec_cost.DEFAULT_CODEC["gpu"])
SCALE_GPUS = (8, 64, 512)
SCALE_GBIT = (100, 200, 400)
SCALE_WORKLOADS = (("moe_dispatch", 64 << 20, "MoE dispatch, 64 MiB per GPU per all_to_all"),
                   ("fsdp", 256 << 20, "dense FSDP, 256 MiB of bf16 parameters per layer"),
                   ("ddp", 256 << 20, "data parallelism, psum of 256 MiB of bf16 gradients per layer"))
SCALE_FLAGS = "--per-host 8 --intra 450GB/s --device gpu"


def at_scale() -> list[dict]:
    """The step's predicted speedup (compress="auto" over jax.lax) per workload, scale and link rate,
    with what `auto` runs for each call and the crossover per call."""
    zm = _zs()
    from zipccl_jax.strategy.profile import Profile
    rows = []
    for name, nbytes, label in SCALE_WORKLOADS:
        for gpus in SCALE_GPUS:
            for gbit in SCALE_GBIT:
                top = zm.Topology(max(1, gpus // 8), min(8, gpus), _link(15e-6, gbit * 1e9 / 8),
                                  _link(5e-6, 450e9), platform="gpu", base=Profile())
                calls = zm.workload(name, nbytes, top.devices)
                res = zm.predict_step(top, calls, crossovers=gpus > 8)
                step = {v["name"]: v for v in res["step"]["variants"]}
                rows.append({"workload": name, "label": label, "gpus": gpus, "gbit": gbit,
                             "speedup": step["auto"]["speedup_vs_raw"],
                             "choices": {c["name"]: c["auto_choice"] for c in res["calls"]},
                             "crossover_gbit": {c["name"]: c.get("crossover_inter_Gbit_s")
                                                for c in res["calls"]}})
    return rows


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def markdown(flat, mesh, step) -> str:
    rates = sorted({r["rate_gbit"] for r in flat}, key=lambda v: math.inf if v is None else v)
    label = {r: f"{r:g} Gbit/s" if r is not None else "unshaped" for r in rates}
    out = ["| case (compressed / raw: predicted / measured, error) | " + " | ".join(label[r] for r in rates)
           + " |", "|---|" + "---|" * len(rates)]
    for case in dict.fromkeys(r["case"] for r in flat):
        by = {r["rate_gbit"]: r for r in flat if r["case"] == case}
        out.append(f"| {case} | " + " | ".join(
            f"{by[r]['pred_ratio']:.3f} / {by[r]['meas_ratio']:.3f} ({_pct(by[r]['ratio_err'])})"
            for r in rates) + " |")
    out += ["", "| collective | variant | measured ms | anchored ms (error) | links only ms (error) |",
            "|---|---|---|---|---|"]
    for r in mesh:
        if r["variant"] == "auto":
            out.append(f"| {r['collective']} | auto chose | {r['meas_choice']} | {r['anchored_choice']} | "
                       f"{r['links_choice']} |")
            continue
        out.append(f"| {r['collective']} | {r['variant']} | {r['meas_s'] * 1e3:.1f} | "
                   f"{r['anchored_s'] * 1e3:.1f} ({_pct(r['anchored_err'])}) | "
                   f"{r['links_s'] * 1e3:.1f} ({_pct(r['links_err'])}) |")
    out += ["", "| rate | compute ms | raw step ms: predicted / measured | compressed step ms: predicted / "
            "measured | speedup: predicted / measured (error) |", "|---|---|---|---|---|"]
    for r in step:
        out.append(f"| {r['rate_gbit']:g} Gbit/s | {r['compute_s'] * 1e3:.0f} | {r['pred_raw_s'] * 1e3:.0f} / "
                   f"{r['meas_raw_s'] * 1e3:.0f} ({_pct(r['raw_err'])}) | {r['pred_compressed_s'] * 1e3:.0f}"
                   f" / {r['meas_compressed_s'] * 1e3:.0f} ({_pct(r['compressed_err'])}) | "
                   f"{r['pred_speedup']:.3f} / {r['meas_speedup']:.3f} ({_pct(r['speedup_err'])}) |")
    return "\n".join(out)


def _short(choice: str) -> str:
    """A variant's name as the scale table writes it."""
    if choice.startswith("raw fixed-order"):
        return "zipccl fixed-order raw"
    if choice.startswith("flat compressed"):
        return "flat " + choice.split()[-1]
    if choice.startswith("hierarchical"):
        host, local = (w.split(":")[1] for w in choice.split()[1:])
        return {("compressed", "raw"): "hier. host coded", ("raw", "raw"): "hier. raw",
                ("compressed", "compressed"): "hier. both coded", ("raw", "compressed"): "hier. local coded"
                }[(host, local)]
    return choice


def _grouped(per_call: dict, fmt) -> str:
    """`fmt` of each call's value, calls with the same text named together (one text: just it)."""
    groups = {}
    for call, v in per_call.items():
        groups.setdefault(fmt(v), []).append(call.split(" (")[0])
    if len(groups) == 1:
        return next(iter(groups))
    return "; ".join(f"{', '.join(dict.fromkeys(calls))}: {text}" for text, calls in groups.items())


def scale_markdown(rows) -> str:
    """Per workload and scale: the step's speedup and what `auto` runs per call, at each rate; then
    the crossover of each call (the inter rate per GPU below which `auto` compresses)."""
    out = ["| workload | GPUs | " + " | ".join(f"{g} Gb/s per GPU" for g in SCALE_GBIT)
           + " | auto compresses below |", "|---|---|" + "---|" * (len(SCALE_GBIT) + 1)]
    for name, _, label in SCALE_WORKLOADS:
        for gpus in SCALE_GPUS:
            cells = []
            for gbit in SCALE_GBIT:
                r = next(r for r in rows if (r["workload"], r["gpus"], r["gbit"]) == (name, gpus, gbit))
                cells.append(f"**{r['speedup']:.2f}x** ({_grouped(r['choices'], _short)})")
            x = r["crossover_gbit"]  # the last rate's: a crossover does not depend on the rate
            cross = (_grouped(x, lambda v: "never" if v is None else f"{v:.0f} Gb/s") if gpus > 8
                     else "n/a (one host: NVLink only)")
            out.append(f"| {label} | {gpus} | " + " | ".join(cells) + f" | {cross} |")
    return "\n".join(out)


HIER_GPUS = (16, 64, 128, 512)
HIER_GBIT = (25, 100, 400)


def hierarchical_all_to_all(nbytes: int = 64 << 20) -> list[dict]:
    """MoE dispatch (`nbytes` per GPU) at each scale and rate: the best flat compressed variant's time
    over the best hierarchical one's (> 1: hierarchical wins), and what `auto` runs."""
    zm = _zs()
    from zipccl_jax.strategy.profile import Profile
    rows = []
    for gpus in HIER_GPUS:
        for gbit in HIER_GBIT:
            top = zm.Topology(gpus // 8, 8, _link(15e-6, gbit * 1e9 / 8), _link(5e-6, 450e9),
                              platform="gpu", base=Profile())
            p = zm.predict_call(top, zm.Call("dispatch", "all_to_all", nbytes))
            best = {kind: min(v["time_s"] for v in p["variants"] if v["name"].startswith(kind))
                    for kind in ("flat", "hierarchical")}
            rows.append({"gpus": gpus, "gbit": gbit, "flat_over_hierarchical":
                         best["flat"] / best["hierarchical"], "auto_choice": p["auto_choice"]})
    return rows


def hierarchical_markdown(rows) -> str:
    out = ["| GPUs | " + " | ".join(f"{g} Gb/s per GPU" for g in HIER_GBIT) + " |",
           "|---|" + "---|" * len(HIER_GBIT)]
    for gpus in HIER_GPUS:
        cells = [next(r for r in rows if (r["gpus"], r["gbit"]) == (gpus, g)) for g in HIER_GBIT]
        out.append(f"| {gpus} | " + " | ".join(
            f"{c['flat_over_hierarchical']:.2f} ({_short(c['auto_choice'])})" for c in cells) + " |")
    return "\n".join(out)


def links_verdict(mesh, bound: float = 0.15) -> str:
    """One line: how many timed variants the links-only column puts within `bound` of their medians, and the
    ones it does not (issue 35's bar is 15% on every variant of the 2 x 4 run)."""
    timed = [r for r in mesh if r["variant"] != "auto"]
    out = [r for r in timed if abs(r["links_err"]) >= bound]
    misses = "; ".join(f"{r['collective']} {r['variant']} {_pct(r['links_err'])}" for r in out)
    return (f"links only: {len(timed) - len(out)} of {len(timed)} variants within {bound:.0%} of their medians"
            + (f" (not: {misses})" if out else ""))


def record(runs=DECISION_RUNS) -> list[dict]:
    """Per timed variant of the 2 x 4 runs (`runs`, names in RESULTS): its links-only error in each run."""
    rows: dict = {}
    for name in runs:
        run = RESULTS / name
        for r in two_levels(testbed_profile(run), run=run):
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
        out.append(f"| {r['collective']} | {r['variant']} | {_pct(min(e))} / {_pct(statistics.mean(e))} / "
                   f"{_pct(max(e))} | {sum(abs(x) < bound for x in e)} of {n} |")
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
        recs = _records(name)
        for op in PAIRED_OPS:
            by = _by_variant(recs, op)
            r0 = by["flat_raw"]
            nbytes = math.prod(r0["global_shape"]) // 8 * np.dtype(_np_dtype(r0["dtype"])).itemsize
            tab = by["auto"]["model_profile"]["links"]["host,local"]
            for variant in TIMED_PROGRAMS:
                t = LinkModel(**tab[_program_key(op, variant)]).time(sent_bytes(op, nbytes, 8))
                rows.append({"run": name, "collective": op, "variant": MESH_VARIANTS[variant],
                             "program_err": _err(t, by[variant]["median_s"]),
                             "links_err": links[(op, MESH_VARIANTS[variant])][name]})
    return rows


# The runs since all_gather's fast level stopped transposing its result (hierarchical._gather_fast): their
# programs are today's
ROWS_RUNS = tuple(name for name in DECISION_RUNS if "_slot_rows_" in name)
# The bytes a device sends at which the 2 x 4 runs' held-out calibration times each link and program
# (benchmarks/collectives.py, `HELD_OUT_LINK_BYTES`): none is a case's own (the cases send 3.5-4.6 MB per device
# and call), so every prediction interpolates, as one for a program nobody measured would. Five sizes, about 2.5x
# apart: with three (128 KiB, 1 MiB, 8 MiB) a two-level phase between 1 and 8 MiB read a line whose 1 MiB end sat
# on a ~3 ms floor (the local all_gather: 3.85 ms at both 128 KiB and 1 MiB), and the 2 x 4 run's links-only
# all_gather phases read 1-1.3 ms above the in-sample calibration's curve.
HELD_OUT_SIZES = (128 << 10, 384 << 10, 1 << 20, 5 << 19, 8 << 20)
# The held-out size (bytes one device sends in the flat raw collective) nearest the cases' 3.5-4.6 MB
COMPOSED_AT = 5 << 19


def composed_vs_programs(runs=ROWS_RUNS, at: int = COMPOSED_AT) -> list[dict]:
    """Per run, op of PAIRED_OPS and variant of TIMED_PROGRAMS: links only's composition of the variant at the
    held-out size `at` against the same calibration's timing of that program there. One calibration, minutes
    before any case, so no drift between the two: what differs is the composition's own error (phases timed
    as programs of their own, summed)."""
    zm = _zs()
    from zipccl_jax.accounting import sent_bytes
    rows = []
    for name in runs:
        recs = _records(name)
        for op in PAIRED_OPS:
            by = _by_variant(recs, op)
            held = by["auto"]["model_profile"]
            r0 = by["flat_raw"]
            dt = np.dtype(_np_dtype(r0["dtype"]))
            elems = round(at / sent_bytes(op, float(dt.itemsize), 8))  # an operand whose flat raw sends `at`
            elems -= elems % 64  # a whole row per rank, as calibrate's programs have
            links = zm.predict_call(_links_topology(run_profile(held), recs),
                                    zm.Call(r0["payload"], op, elems * dt.itemsize, dt.name, _role(r0["payload"], op)),
                                    fixed_order=FIXED_ORDER)
            alone = _links_only_times(links)
            tab = held["links"]["host,local"]
            for variant in TIMED_PROGRAMS:
                # the point calibrate measured at `at` (its sizes round to whole elements per rank)
                x, t = min(tab[_program_key(op, variant)]["points"], key=lambda p: abs(p[0] - at))
                assert abs(x / at - 1) < 1e-3, (name, op, variant, x)
                rows.append({"run": name, "collective": op, "variant": MESH_VARIANTS[variant], "program_s": t,
                             "composed_err": _err(alone[MESH_VARIANTS[variant]], t)})
    return rows


def composed_verdict(rows) -> str:
    """One line of `composed_vs_programs`: per op and variant, the mean and the spread (sd) of the composition's
    error against the program's own timing."""
    by: dict = {}
    for r in rows:
        by.setdefault((r["collective"], r["variant"]), []).append(r["composed_err"])
    parts = [f"{op} {v.replace('hierarchical ', '')} {_pct(statistics.mean(e))} (sd {statistics.stdev(e):.1%})"
             for (op, v), e in by.items()]
    return (f"links only's composition against the same held-out calibration's timing of the program, at "
            f"{COMPOSED_AT / 1e6:.1f} MB, over the {len({r['run'] for r in rows})} runs since the reorders went: "
            + "; ".join(parts))


def composed_by_size(runs=ROWS_RUNS, sizes=HELD_OUT_SIZES) -> dict:
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


def composed_by_size_verdict(gaps: dict, runs=ROWS_RUNS, sizes=HELD_OUT_SIZES) -> str:
    """One line of `composed_by_size`."""
    parts = [f"{op} {v.replace('hierarchical ', '')} " + "/".join(f"{m:+.1f}" for m in means)
             for (op, v), means in gaps.items()]
    return (f"links only's composition less the program's own timing, ms, mean over the {len(runs)} runs since the "
            f"reorders went, at {'/'.join(f'{at / 1e6:.2f}' for at in sizes)} MB: " + "; ".join(parts))


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
    by = _by_variant(recs, op)
    prof, r0 = run_profile(by["auto"]["profile"]), by["flat_raw"]
    if timed_gain is not None:
        prof.timed_gain = timed_gain
    dt = np.dtype(_np_dtype(r0["dtype"]))
    return two_level.choose(op, dt, math.prod(r0["global_shape"]) // 8, ("host", "local"), ("host", "local"),
                            (2, 4), "auto", _role(r0["payload"], op), profile=prof, platform="cpu",
                            fixed_order=FIXED_ORDER)


def ratio_drift(runs=DECISION_RUNS) -> list[dict]:
    """Per run and op of `PAIRED_OPS`, `NEAR_TIE`'s ratio (slow level coded over both raw) three ways: as
    calibrate ranked it at the case's size (the estimates `auto` decided with), as the median of calibrate's
    ratios at each of its sizes from 1 MB (three sizes, three times the repetitions), and as the run measured it
    (the two variants' medians). If calibrate's sampling limited the decision, the pooled ratio would land nearer."""
    rows = []
    for name in runs:
        recs = _records(name)
        for op in PAIRED_OPS:
            by = _by_variant(recs, op)
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
        recs = _records(name)
        for op in OPS:
            by = _by_variant(recs, op)
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
        recs = _records(name)
        for op in OPS:
            by = _by_variant(recs, op)
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
                     f"{' (today)' if r['timed_gain'] == today else ''}: {r['misses']} of {r['decisions']} over 3% + 1.5 ms, "
                     f"{r['mean_over_best']:.4f}x the fastest on average, {r['max_over_best']:.3f}x at most"
                     for r in rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write every row here")
    p.add_argument("--scale", action="store_true", help="the README's table of predictions at scale")
    p.add_argument("--two-levels", metavar="RUN_JSON", type=Path, default=PROFILE_RUN,
                   help=f"the 2 x 4 run of the two-level table (its own profiles; default {PROFILE_RUN.name})")
    p.add_argument("--record", action="store_true",
                   help=f"also the links-only column over every run of DECISION_RUNS ({len(DECISION_RUNS)} runs)")
    p.add_argument("--capture", metavar="EXAMPLE_JSON",
                   help=f"write the step's calls of an example run's --json to {STEP_WORKLOAD.name}")
    a = p.parse_args(argv)
    if a.capture:
        STEP_WORKLOAD.write_text(json.dumps(capture(a.capture), indent=1) + "\n")
        print(f"wrote {STEP_WORKLOAD}")
        return 0
    if a.scale:
        rows, hier = at_scale(), hierarchical_all_to_all()
        print(scale_markdown(rows) + "\n\n" + hierarchical_markdown(hier))
        if a.json:
            Path(a.json).write_text(json.dumps({"at_scale": rows, "hierarchical_all_to_all": hier},
                                               indent=1) + "\n")
        return 0
    mesh = two_levels(testbed_profile(a.two_levels), run=a.two_levels)
    flat, step = flat_sweep(), training_step(testbed_profile(STEP_PROFILE_RUN))
    print(markdown(flat, mesh, step))
    print("\n" + links_verdict(mesh))
    if a.record:
        rows = record()
        print("\n" + record_markdown(rows) + "\n\n" + record_verdict(rows))
        print(picks_verdict(record_picks()))
        print("calibrated as today (SLOT_RUNS): " + record_verdict(record(SLOT_RUNS)))
        print(held_out_verdict(held_out_programs(record_rows=rows)))
        print(composed_verdict(composed_vs_programs()))
        print(composed_by_size_verdict(composed_by_size()))
        print(bar_verdict(auto_bar()))
        print(drift_verdict(ratio_drift()))
        print("the decisions with another margin on timed programs: " + margin_verdict(margin_whatif()))
    if a.json:
        Path(a.json).write_text(json.dumps({"flat_sweep": flat, "two_levels": mesh, "training_step": step},
                                           indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
