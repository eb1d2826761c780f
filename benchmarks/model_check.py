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
  benchmarks/model_record.py scores this column over every stored run of today's decision.
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


def run_records(name: str) -> list[dict]:
    """The records of stored run `name` (in RESULTS)."""
    return json.loads((RESULTS / name).read_text())


def by_variant(recs: list[dict], op: str) -> dict:
    """A run's records of `op`, by variant."""
    return {r["variant"]: r for r in recs if r["collective"] == op}


def cost_model():
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


def call_role(payload: str, op: str) -> str:
    return "gradient" if "grad" in payload or op in ("psum_scatter", "psum") else "activation"


def rel_err(pred: float, meas: float) -> float:
    return pred / meas - 1.0


def _variant(pred: dict, name: str) -> float:
    return next(v["time_s"] for v in pred["variants"] if v["name"] == name)


def flat_case(prof, coll: str, payload: str, dtype: str, nbytes: int, capacity: int, nproc: int) -> dict:
    """One case of the flat sweep (`nproc` processes, one device each), predicted from `prof`, the profile
    calibrate measured at that rate on those processes (its link per device for the case's collective, its
    codec): zipccl's raw and compressed programs at the run's capacity, their ratio, and `auto`'s choice
    (without observed capacities). `benchmarks/collectives.py` records it beside each measurement."""
    zm = cost_model()
    link = prof.link("x", "all_gather" if coll == "all_gather" else "all_to_all", "cpu")[0]
    top = zm.Topology(nproc, 1, link, platform="cpu", base=prof)
    p = zm.predict_call(top, zm.Call(payload, coll, int(nbytes), dtype, call_role(payload, coll),
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
        nbytes = math.prod(rec["shape_per_rank"]) * np.dtype(dtype_of(rec["dtype"])).itemsize
        held_out = rec.get("model_profile") is not None  # runs since the held-out calibration
        p = flat_case(Profile.from_dict(rec["model_profile" if held_out else "profile"]), rec["collective"],
                      rec["payload"], rec["dtype"], nbytes, rec["frame_capacity"], rec["n_processes"])
        meas = rec["compressed_s"] / rec["best_raw_s"]
        rows.append({"case": f"{rec['collective']}:{rec['payload']}", "rate_gbit": rec["rate_gbit"],
                     "link_MBps": rec["link_MBps"], "pred_ratio": p["compressed_over_raw"],
                     "meas_ratio": meas, "ratio_err": rel_err(p["compressed_over_raw"], meas),
                     "pred_compressed_s": p["compressed_s"], "meas_compressed_s": rec["compressed_s"],
                     "pred_raw_s": p["raw_s"], "meas_raw_s": rec["best_raw_s"],
                     "auto_choice": p["auto_choice"], "meas_auto_choice": rec.get("auto_choice"),
                     "held_out": held_out, "recorded_in_run": rec.get("model")})
    return rows


def dtype_of(name):
    from zipccl_jax.strategy.profile import np_dtype
    return np_dtype(name)


def two_levels(prof, run: Path = PROFILE_RUN, ops=OPS, held_fn=None) -> list[dict]:
    """Every variant of a 2 x 4 run (`run`, of `ops`): the anchored and the links-only prediction against the
    median. Links only reads the run's held-out profile where it has one (calibrated at sizes no case has),
    through `held_fn` (its summary -> another summary) where given."""
    zm = cost_model()
    from zipccl_jax.strategy import levels as two_level
    recs = json.loads(run.read_text())
    rows = []
    for op in ops:
        by = by_variant(recs, op)
        held = by["auto"].get("model_profile")  # one per run, or measured before each case (--held-out-per-case)
        top = links_topology(run_profile(held_fn(held) if held_fn else held) if held else prof, recs)
        r0 = by["flat_raw"]
        dt = np.dtype(dtype_of(r0["dtype"]))
        elems = math.prod(r0["global_shape"]) // 8
        role = call_role(r0["payload"], op)
        lp = two_level.choose(op, dt, elems, ("host", "local"), ("host", "local"), (2, 4), "auto", role,
                              profile=prof, platform="cpu", fixed_order=FIXED_ORDER)
        anchored = dict(lp.candidates)
        links = zm.predict_call(top, zm.Call(r0["payload"], op, elems * dt.itemsize, dt.name, role),
                                fixed_order=FIXED_ORDER)
        alone = links_only_times(links)
        for variant, name in MESH_VARIANTS.items():
            meas = by[variant]["median_s"]
            rows.append({"collective": op, "variant": name, "meas_s": meas,
                         "anchored_s": anchored[name], "anchored_err": rel_err(anchored[name], meas),
                         "links_s": alone[name], "links_err": rel_err(alone[name], meas)})
        rows.append({"collective": op, "variant": "auto", "meas_choice": by["auto"]["chosen"],
                     "anchored_choice": lp.candidates[0][0],
                     "links_choice": links["auto_choice"]})
    return rows


def links_only_times(links: dict) -> dict:
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
    `per_host` devices share; the fastest of three from `..._slot_rows_whole_once_repeat11` on,
    `_netns.best_probe`) times `stream_fill`. The host level's calibrated collectives exchange one
    message per device pair, four pairs at once, and fill less of the link; a flat ring's edge is one
    pipelined stream (gloo's allgather keeps two half-chunks in flight on one connection), a flat
    all_to_all sixteen messages a direction."""
    host = dict(prof.links["host"])
    probe = next((r.get("link_MBps") for r in recs if r["variant"] == "auto"), None)
    if probe:
        host["stream"] = _link(host["all_gather"].latency_s, stream_fill() * probe * 1e6 / per_host)
    return host


def links_topology(prof, recs: list[dict]):
    """The 2 x 4 testbed as links only costs it from `prof`: each level per collective, as calibrated, the host
    level's stream from the run's probe (`_host_level`), no measured two-level program."""
    return cost_model().Topology(2, 4, _host_level(prof, recs), dict(prof.links["local"]), platform="cpu",
                                 base=_without_programs(prof))


def _without_programs(prof):
    """`prof` with only the per-level links and the codec (no measured two-level programs)."""
    p = prof.copy()
    p.links = {k: v for k, v in p.links.items() if k in ("host", "local")}
    return p


def training_step(prof) -> list[dict]:
    """The MoE step per rate: compute (the uncompressed run's CPU time) plus the step's calls."""
    zm = cost_model()
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
                     "raw_err": rel_err(raw, mu), "pred_compressed_s": comp, "meas_compressed_s": mc,
                     "compressed_err": rel_err(comp, mc), "pred_speedup": raw / comp,
                     "meas_speedup": mu / mc, "speedup_err": rel_err(raw / comp, mu / mc)})
    return rows


def capture(example_json: str) -> list[dict]:
    """The calls of one training step from an example's `--json` (its per-call-site statistics: every
    site runs once per step and device)."""
    sites = json.loads(Path(example_json).read_text())["call_sites"]
    return [{"name": s["name"], "op": s["op"],
             "nbytes": math.prod(s["shape"]) * np.dtype(dtype_of(s["dtype"])).itemsize,
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
    zm = cost_model()
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


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def markdown(flat, mesh, step) -> str:
    rates = sorted({r["rate_gbit"] for r in flat}, key=lambda v: math.inf if v is None else v)
    label = {r: f"{r:g} Gbit/s" if r is not None else "unshaped" for r in rates}
    out = ["| case (compressed / raw: predicted / measured, error) | " + " | ".join(label[r] for r in rates)
           + " |", "|---|" + "---|" * len(rates)]
    for case in dict.fromkeys(r["case"] for r in flat):
        by = {r["rate_gbit"]: r for r in flat if r["case"] == case}
        out.append(f"| {case} | " + " | ".join(
            f"{by[r]['pred_ratio']:.3f} / {by[r]['meas_ratio']:.3f} ({pct(by[r]['ratio_err'])})"
            for r in rates) + " |")
    out += ["", "| collective | variant | measured ms | anchored ms (error) | links only ms (error) |",
            "|---|---|---|---|---|"]
    for r in mesh:
        if r["variant"] == "auto":
            out.append(f"| {r['collective']} | auto chose | {r['meas_choice']} | {r['anchored_choice']} | "
                       f"{r['links_choice']} |")
            continue
        out.append(f"| {r['collective']} | {r['variant']} | {r['meas_s'] * 1e3:.1f} | "
                   f"{r['anchored_s'] * 1e3:.1f} ({pct(r['anchored_err'])}) | "
                   f"{r['links_s'] * 1e3:.1f} ({pct(r['links_err'])}) |")
    out += ["", "| rate | compute ms | raw step ms: predicted / measured | compressed step ms: predicted / "
            "measured | speedup: predicted / measured (error) |", "|---|---|---|---|---|"]
    for r in step:
        out.append(f"| {r['rate_gbit']:g} Gbit/s | {r['compute_s'] * 1e3:.0f} | {r['pred_raw_s'] * 1e3:.0f} / "
                   f"{r['meas_raw_s'] * 1e3:.0f} ({pct(r['raw_err'])}) | {r['pred_compressed_s'] * 1e3:.0f}"
                   f" / {r['meas_compressed_s'] * 1e3:.0f} ({pct(r['compressed_err'])}) | "
                   f"{r['pred_speedup']:.3f} / {r['meas_speedup']:.3f} ({pct(r['speedup_err'])}) |")
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
    zm = cost_model()
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
    misses = "; ".join(f"{r['collective']} {r['variant']} {pct(r['links_err'])}" for r in out)
    return (f"links only: {len(timed) - len(out)} of {len(timed)} variants within {bound:.0%} of their medians"
            + (f" (not: {misses})" if out else ""))


# The bytes a device sends at which the 2 x 4 runs' held-out calibration times each link and program
# (benchmarks/collectives.py, `HELD_OUT_LINK_BYTES`): none is a case's own (the cases send 3.5-4.6 MB per device
# and call), so every prediction interpolates, as one for a program nobody measured would. Five sizes, about 2.5x
# apart: with three (128 KiB, 1 MiB, 8 MiB) a two-level phase between 1 and 8 MiB read a line whose 1 MiB end sat
# on a ~3 ms floor (the local all_gather: 3.85 ms at both 128 KiB and 1 MiB), and the 2 x 4 run's links-only
# all_gather phases read 1-1.3 ms above the in-sample calibration's curve.
HELD_OUT_SIZES = (128 << 10, 384 << 10, 1 << 20, 5 << 19, 8 << 20)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write every row here")
    p.add_argument("--scale", action="store_true", help="the README's table of predictions at scale")
    p.add_argument("--two-levels", metavar="RUN_JSON", type=Path, default=PROFILE_RUN,
                   help=f"the 2 x 4 run of the two-level table (its own profiles; default {PROFILE_RUN.name})")
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
    if a.json:
        Path(a.json).write_text(json.dumps({"flat_sweep": flat, "two_levels": mesh, "training_step": step},
                                           indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
