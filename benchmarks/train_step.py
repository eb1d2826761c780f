#!/usr/bin/env python
"""MoE training step, compressed vs uncompressed, on a real rate-limited network.

Runs ``examples/moe_flax/train.py`` as N processes (one CPU device each, mesh 1xN: expert-parallel all_to_all
across all processes, FSDP over the same devices) under ``jax.distributed`` inside a private network namespace
whose loopback is shaped with ``tc tbf`` (see ``benchmarks/_netns.py``), once per variant and link rate:

* ``compressed``    zipccl_jax collectives, compress=True (the example's default);
* ``uncompressed``  zipccl_jax collectives, compress=False (same code path and reduction order: the losses must
                    be bit-identical to ``compressed``);
* ``lax``           plain jax.lax collectives (``--backend lax``), for reference.

The step time of a run is the median of its per-step times after the first (the example compiles ahead of
time; the first step is excluded anyway). The variants run interleaved: round r runs every variant once, in
alternating order (ABBA...), and each variant is reported as the median over rounds with its spread (the
interquartile range of the per-round medians, ``_stats.py``). The speedup is the ratio of the medians, with the
spread of the per-round ratios (round r's uncompressed over round r's compressed: they ran back to back). Every
run records the machine load (1/5/15-minute load averages): the machine is shared, so single runs are noisy.

    python benchmarks/train_step.py --rates 1,unshaped --json results/train_step.json
    python benchmarks/train_step.py --variants compressed,uncompressed,lax   # also plain jax.lax

Extra arguments after ``--`` go to the example (model size, batch, ...).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _netns  # noqa: E402
import _stats  # noqa: E402

EXAMPLE = REPO / "examples" / "moe_flax" / "train.py"
VARIANTS = {"compressed": [], "uncompressed": ["--no-compress"], "lax": ["--backend", "lax"]}
# A communication-bound configuration: 2 shared CPU cores compute ~100x slower than a GPU while the shaped link
# is ~400x slower than IB, so the model keeps compute per all_to_all byte small (d_ff 32, short sequences, many
# tokens). Override after --.
DEFAULT_MODEL = ["--d-model", "128", "--d-ff", "32", "--seq-len", "64", "--batch-per-device", "32",
                 "--layers", "2", "--experts", "8", "--heads", "4"]
PORT = 12355  # inside a fresh private namespace every port is free


def run_variant(ns, args, variant: str, tmp: Path, tag: str) -> dict:
    nproc = args.nproc
    out = tmp / f"{tag}.json"
    port = PORT if ns is not None else _netns.free_port()
    extra = args.example_args if args.example_args else DEFAULT_MODEL
    argvs = [[sys.executable, str(EXAMPLE), "--num-processes", str(nproc), "--process-id", str(i),
              "--coordinator", f"127.0.0.1:{port}", "--local-devices", "1", "--mesh", f"1x{nproc}",
              "--steps", str(args.steps), "--json", str(out), "--quiet", *VARIANTS[variant], *extra]
             for i in range(nproc)]
    logdir = tmp / tag
    logdir.mkdir()
    t0 = time.perf_counter()
    env = _netns.worker_env(preload=args.preload)
    with _netns.Workers(argvs, netns=ns, logdir=logdir, env=env, timeout_s=args.timeout, cwd=str(REPO)) as w:
        w.wait()
    res = json.loads(out.read_text())
    res["wall_s"] = time.perf_counter() - t0
    # the first step, and the example's --calibrate-steps (run under zipccl_jax.observe), are not timed
    steady = res.get("step_times_s", [])[1 + int(res.get("calibration_steps") or 0):]
    res["median_step_s"] = statistics.median(steady) if steady else res["step_time_s"]
    res["load"] = _stats.machine_load()  # the machine is shared: record how busy it was
    return res


def _record(rate, variant: str, runs: list[dict], args) -> dict:
    """One variant at one rate: the median over its interleaved rounds, their spread, load, losses."""
    first = runs[0]
    per_round = [r["median_step_s"] for r in runs]
    return {
        "rate_gbit": rate, "variant": variant,
        "step_time_s": statistics.median(per_round), "spread_s": _stats.spread(per_round),
        "round_step_s": per_round,
        "run_step_times_s": [r.get("step_times_s") for r in runs],
        # CPU time of process 0's threads per step: the codec's cost without the other ranks' load
        "run_step_cpu_s": [r.get("step_cpu_s") for r in runs],
        "hlo_sent_bytes_per_device_step": first.get("hlo_sent_bytes_per_device_step"),
        "load": [r["load"] for r in runs],
        "loadavg_1min": [r["load"]["loadavg_1min"] for r in runs],
        "losses_identical_across_rounds": all(r["loss_bits"] == first["loss_bits"] for r in runs),
        "losses": first["losses"], "loss_bits": first["loss_bits"], "raw_bytes": first["raw_bytes"],
        "wire_bytes": first["wire_bytes"], "fallbacks": first.get("fallbacks"),
        "bytes_source": first.get("bytes_source"), "tokens_per_step": first["tokens_per_step"],
        "params_sha256": first.get("params_sha256"), "mesh": first["mesh"],
        "processes": first["processes"], "config": first["config"],
        "example_args": args.example_args or DEFAULT_MODEL, "steps": args.steps,
        "allocator": args.allocator,
        **({"allocator_warning": _netns.GLIBC_WARNING} if args.allocator != "tcmalloc" else {}),
    }


def _summary(records: list[dict], rates) -> list[dict]:
    """Per rate: the speedup (ratio of medians, spread of the per-round ratios), bit identity, load."""
    summary = []
    for rate in rates:
        by = {r["variant"]: r for r in records if r["rate_gbit"] == rate}
        row = {"rate_gbit": rate}
        if "compressed" in by and "uncompressed" in by:
            c, u = by["compressed"], by["uncompressed"]
            pr = _stats.paired_ratio(u["round_step_s"], c["round_step_s"])
            row["speedup_vs_uncompressed"] = pr["ratio"]
            row["speedup_spread"] = pr["ratio_spread"]
            row["speedup_per_round"] = [a / b for a, b in zip(u["round_step_s"], c["round_step_s"])]
            row["losses_bit_identical"] = c["loss_bits"] == u["loss_bits"]
            row["params_identical"] = c.get("params_sha256") == u.get("params_sha256")
        if "compressed" in by and "lax" in by:
            row["speedup_vs_lax"] = by["lax"]["step_time_s"] / by["compressed"]["step_time_s"]
        if "compressed" in by and by["compressed"]["wire_bytes"]:
            row["wire_ratio"] = by["compressed"]["raw_bytes"] / by["compressed"]["wire_bytes"]
        loads = [x for r in by.values() for x in r["loadavg_1min"]]
        row["loadavg_1min_range"] = [min(loads), max(loads)]
        summary.append(row)
        print(f"{_netns.rate_label(rate):>9}: " + ", ".join(
            f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items() if k != "rate_gbit"))
    return summary


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    example_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, example_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="1", help="link rates in Gbit/s, 'unshaped' for no shaping")
    p.add_argument("--variants", default="compressed,uncompressed", help=f"subset of {list(VARIANTS)}")
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=8, help="training steps per run (the first is not timed)")
    p.add_argument("--rounds", type=int, default=3, help="runs per variant, alternating order (median kept)")
    p.add_argument("--timeout", type=float, default=600.0, help="limit per run, seconds")
    p.add_argument("--json", default=None)
    p.add_argument("--no-netns", action="store_true", help="unshaped host loopback, no root needed")
    p.add_argument("--keep-logs", action="store_true")
    p.add_argument("--allocator", default="auto", choices=_netns.ALLOCATORS,
                   help="malloc of the workers: tcmalloc (auto: if installed) or glibc (see _netns.py)")
    args = p.parse_args(argv)
    args.example_args = example_args
    args.allocator, args.preload = _netns.resolve_allocator(args.allocator, measuring=not args.no_netns)
    rates = _netns.parse_rates(args.rates)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    if args.no_netns and any(r is not None for r in rates):
        raise SystemExit("--no-netns runs on the unshaped host loopback; use --rates unshaped")

    records = []
    with _netns.run_dir("zccl_train_", args.keep_logs) as (tmp, held):
        ns = None if args.no_netns else held.enter_context(_netns.open_netns(_netns.NetNS))
        for rate in rates:
            if ns is not None:
                ns.set_rate(rate)
            runs: dict[str, list[dict]] = {v: [] for v in variants}
            for rnd in range(args.rounds):
                for v in (variants if rnd % 2 == 0 else variants[::-1]):
                    res = run_variant(ns, args, v, tmp, f"{_netns.rate_label(rate)}_{v}_{rnd}")
                    runs[v].append(res)
                    print(f"{_netns.rate_label(rate):>9} {v:<13} step {res['median_step_s'] * 1e3:8.1f} ms "
                          f"(first {res['first_step_s']:.1f} s) loss {res['losses'][-1]:.4f} "
                          f"wire/raw {res['wire_bytes'] / max(1, res['raw_bytes']):.3f} "
                          f"load {res['load']['loadavg_1min']:.1f}", flush=True)
            records += [_record(rate, v, runs[v], args) for v in variants]

    summary = _summary(records, rates)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"runs": records, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
