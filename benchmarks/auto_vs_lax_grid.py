#!/usr/bin/env python
"""`compress="auto"` against `jax.lax` on a dense grid of GPU clusters, predicted by the cost model.

tests/test_auto_vs_lax.py holds `auto`'s predicted time to at most 1.01x jax.lax's on a small grid (4 host
counts, 3 rates, 3 sizes) that the suite can afford. This walks a denser one, off the test's points: hosts x 8
GPUs (NVLink 450 GB/s per GPU, one direction, 5 us), a link between hosts per GPU at each rate (10 us), every
op, dtype and role at each operand size per device, and the MoE and FSDP steps (`zipccl_jax.model.WORKLOADS`)
at each size. It prints the worst ratio of `auto` to `jax.lax` and how many calls and steps exceed 1.01x:

    python benchmarks/auto_vs_lax_grid.py --processes 2 --json benchmarks/results/auto_vs_lax_grid.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import time

GBIT = 1e9 / 8  # bytes/s of 1 Gbit/s
HOSTS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
RATES_GBIT = (25, 40, 50, 75, 100, 150, 200, 300, 400)
SIZES_MIB = (4, 6, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
DTYPES = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2")
ROLES = ("activation", "gradient")


def _cluster(args: tuple[int, float]) -> list[dict]:
    """Every call and step of one cluster (hosts, Gbit/s): [{case, auto_s, lax_s}]."""
    from zipccl_jax import model as zm
    from zipccl_jax.strategy.links import LinkModel
    hosts, gbit = args
    top = zm.Topology(hosts, 8, LinkModel(10e-6, gbit * GBIT), LinkModel(5e-6, 450e9), "gpu")
    rows = []
    for mib, op, dt, role in itertools.product(SIZES_MIB, zm.OPS, DTYPES, ROLES):
        r = zm.predict_call(top, zm.Call("c", op, mib << 20, dt, role))
        rows.append({"hosts": hosts, "gbit": gbit, "mib": mib, "what": f"{op} {dt} {role}",
                     "auto": r["auto_choice"], "auto_s": r["auto_time_s"], "lax_s": r["raw_time_s"]})
    for wl, mib in itertools.product(sorted(zm.WORKLOADS), SIZES_MIB):
        res = zm.predict_step(top, zm.workload(wl, mib << 20, top.devices), crossovers=False)
        st = {v["name"]: v["time_s"] for v in res["variants"]}
        rows.append({"hosts": hosts, "gbit": gbit, "mib": mib, "what": f"{wl} step", "auto": "per call",
                     "auto_s": st["auto"], "lax_s": st["raw"]})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--processes", type=int, default=1, help="clusters costed at once")
    p.add_argument("--json", help="write the summary and the 20 worst rows here")
    args = p.parse_args(argv)
    if args.processes < 1:
        p.error("--processes: at least 1")
    t0 = time.time()
    clusters = list(itertools.product(HOSTS, RATES_GBIT))
    with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
        rows = [r for part in pool.map(_cluster, clusters) for r in part]
    for r in rows:
        r["ratio"] = r["auto_s"] / r["lax_s"]
    worst = sorted(rows, key=lambda r: -r["ratio"])
    steps = [r for r in rows if r["what"].endswith("step")]
    summary = {"calls": len(rows) - len(steps), "steps": len(steps), "max_ratio": worst[0]["ratio"],
               "over_1.01": sum(r["ratio"] > 1.01 for r in rows),
               "auto_faster_than_lax": sum(r["ratio"] < 0.99 for r in rows), "seconds": round(time.time() - t0),
               "grid": {"hosts_x8": HOSTS, "gbit_per_gpu": RATES_GBIT, "mib_per_device": SIZES_MIB,
                        "dtypes": DTYPES, "roles": ROLES}}
    w = worst[0]
    print(f"{summary['calls']} calls and {summary['steps']} steps on {len(clusters)} clusters: auto / jax.lax at "
          f"most {w['ratio']:.4f} ({w['hosts']} x 8, {w['gbit']} Gbit/s, {w['mib']} MiB, {w['what']}: {w['auto']}); "
          f"{summary['over_1.01']} above 1.01; {summary['auto_faster_than_lax']} below 0.99 ({summary['seconds']} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "worst": worst[:20]}, f, indent=1)
    return 0 if summary["over_1.01"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
