#!/usr/bin/env python
"""psum's two algorithms on 8 virtual CPU devices of one process: "gather-sum" (one all-gather, then
every rank sums) against "a2a-sum+gather" (reduce-scatter, then all-gather), raw and compressed, for a
small and a large message.

    python benchmarks/psum_algorithms.py --reps 15 --json benchmarks/results/psum_algorithms.json

Here the "link" is a memcpy between devices of one process, so the latency per collective (the devices'
rendezvous) is what a small message pays; a large one pays the bytes (gather-sum moves n - 1 messages
per device, reduce-scatter + all-gather about 2). Each repetition times every variant back to back
(order rotated), up to `--iters` calls each (about 0.1 s); the report is the median per call with its IQR and, per size,
gather-sum over a2a-sum+gather as a ratio of medians with [p25-p75] of the per-repetition ratios
(`_stats`). Every variant's result is checked bit for bit against the first one's.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

_FLAG = "--xla_force_host_platform_device_count"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}=8".strip()

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import _stats  # noqa: E402
import zipccl_jax  # noqa: E402

ALGS = ("a2a-sum+gather", "gather-sum")


def _variant(mesh, alg, compress):
    def body(v):
        with zipccl_jax.use_algorithm(psum=alg):
            return zipccl_jax.psum(v[0], "i", compress=compress)[None]
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))


def _calls_for(f, x, max_iters, target_s=0.1):
    """Calls per timing: about `target_s` of work, at most `max_iters`, at least one."""
    jax.block_until_ready(f(x))
    t0 = time.perf_counter()
    jax.block_until_ready(f(x))
    return max(1, min(max_iters, round(target_s / max(time.perf_counter() - t0, 1e-9))))


def _time(f, x, iters):
    t0 = time.perf_counter()
    for _ in range(iters):
        y = f(x)
    jax.block_until_ready(y)
    return (time.perf_counter() - t0) / iters


def run_size(mesh, elems, reps, iters):
    n = mesh.size
    rng = np.random.default_rng(elems)
    x = (rng.standard_normal((n, elems), np.float32) * 0.02).astype(ml_dtypes.bfloat16)
    xs = jax.device_put(x, NamedSharding(mesh, P("i")))
    names = [(a, c) for a in ALGS for c in (False, True)]
    fns = {v: _variant(mesh, *v) for v in names}
    outs = {v: np.asarray(f(xs)).view(np.uint16) for v, f in fns.items()}
    bit_identical = all(np.array_equal(o, outs[names[0]]) for o in outs.values())
    calls = {v: _calls_for(fns[v], xs, iters) for v in names}
    times = {v: [] for v in names}
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for v in order:
            times[v].append(_time(fns[v], xs, calls[v]))
    rec = {"elems_per_device": elems, "bytes_per_device": elems * 2, "bit_identical": bit_identical,
           "calls_per_timing": {f"{a} {'compressed' if c else 'raw'}": calls[(a, c)] for a, c in names},
           "variants": {f"{a} {'compressed' if c else 'raw'}": _stats.summary(times[(a, c)])
                        for a, c in names},
           "times_s": {f"{a} {'compressed' if c else 'raw'}": times[(a, c)] for a, c in names},
           "ratios": {("compressed" if c else "raw"): _stats.paired_ratio(times[("gather-sum", c)],
                                                                           times[("a2a-sum+gather", c)])
                      for c in (False, True)}}
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256,1048576", help="bfloat16 elements per device, comma-separated")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--iters", type=int, default=20,
                    help="at most this many calls per timing (fewer for slow variants: ~0.1 s each)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    mesh = jax.make_mesh((8,), ("i",))
    load0 = _stats.machine_load()
    recs = [run_size(mesh, int(s), args.reps, args.iters) for s in args.sizes.split(",")]
    out = {"command": " ".join(["python", "benchmarks/psum_algorithms.py"] + (argv or sys.argv[1:])),
           "load_before": load0, "load_after": _stats.machine_load(), "records": recs}
    for r in recs:
        print(f"{r['bytes_per_device']:>9} B/device  bit_identical={r['bit_identical']}")
        for name, s in r["variants"].items():
            print(f"    {name:28s} {s['median_s'] * 1e6:10.1f} us  (IQR {s['spread_s'] * 1e6:.1f})")
        for mode, pr in r["ratios"].items():
            print(f"    gather-sum / a2a-sum+gather, {mode:10s} {pr['ratio']:.3f} "
                  f"[{pr['ratio_p25']:.3f}-{pr['ratio_p75']:.3f}]")
    print(f"load {load0['loadavg_1min']:.1f} -> {out['load_after']['loadavg_1min']:.1f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all(r["bit_identical"] for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
