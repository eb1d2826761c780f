#!/usr/bin/env python
"""calibrate() under load: every fitted model stays in bounds, or is reported unmeasurable.

Starts `--busy` busy-looping processes (default 2) that load the machine, then runs
``zipccl_jax.calibrate`` `--runs` times at the default sizes and `--runs` times at small sizes on 8 virtual
CPU devices (one process, mesh axis "i", as tests/test_strategy.py does; `--mesh 2x4` for the two-level
("host", "local") form). Every link model in the profile must have a bandwidth in
calibration.BANDWIDTH_BOUNDS_BPS and a latency in calibration.LATENCY_BOUNDS_S, every codec model the same;
fits that were not measurable are counted (they leave the previous or default model in place).

        python benchmarks/calibrate_stress.py --runs 10 --json benchmarks/results/calibrate_stress.json
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

SMALL = dict(link_bytes=(16 << 10, 256 << 10), codec_bytes=(32 << 10, 256 << 10))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10, help="calibrations per size set")
    p.add_argument("--busy", type=int, default=2, help="busy-looping processes loading the machine")
    p.add_argument("--mesh", default=None, help="HxL: calibrate ('host', 'local') instead of the 1-D axis 'i'")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import jax
    import numpy as np
    from jax.sharding import Mesh

    import zipccl_jax
    from zipccl_jax.strategy import calibration

    if args.mesh:
        h, l = (int(t) for t in args.mesh.split("x"))
        mesh, axes = Mesh(np.array(jax.devices()[:h * l]).reshape(h, l), ("host", "local")), ("host", "local")
    else:
        mesh, axes = Mesh(np.array(jax.devices()[:8]), ("i",)), "i"
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
                    for _ in range(args.busy)]
    runs = []
    try:
        time.sleep(1.0)
        for sizes_name, kw in (("default", {}), ("small", SMALL)):
            for i in range(args.runs):
                t0 = time.perf_counter()
                prof = zipccl_jax.calibrate(mesh, axes, profile=zipccl_jax.Profile(), activate=False, **kw)
                bad = calibration.out_of_bounds(prof)
                fits = prof.meta["calibration"]["fits"]
                runs.append({"sizes": sizes_name, "run": i, "seconds": time.perf_counter() - t0,
                                          "loadavg_1min": os.getloadavg()[0], "violations": bad,
                                          "unmeasurable": {k: v for k, v in fits.items() if v.startswith("unmeasurable")},
                                          "throughput_bounds": sorted(k for k, v in fits.items() if v.startswith("throughput")),
                                          "links": {ak: {c: [lk.latency_s, lk.bandwidth_Bps] for c, lk in tab.items()}
                                                              for ak, tab in prof.links.items()}})
                print(f"{sizes_name} run {i}: {runs[-1]['seconds']:.1f} s, load {runs[-1]['loadavg_1min']:.1f}, "
                            f"{len(bad)} out of bounds, {len(runs[-1]['unmeasurable'])} unmeasurable, "
                            f"{len(runs[-1]['throughput_bounds'])} throughput bounds", flush=True)
    finally:
        for b in busy:
            os.killpg(b.pid, signal.SIGKILL)
            b.wait()
    ok = sum(not r["violations"] for r in runs)
    print(f"{ok} of {len(runs)} calibrations had every model in bounds "
                f"(bandwidth {calibration.BANDWIDTH_BOUNDS_BPS} B/s, latency {calibration.LATENCY_BOUNDS_S} s), "
                f"{args.busy} busy processes")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"mesh": args.mesh or "8", "busy": args.busy, "runs": runs}, indent=1))
    return 0 if ok == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
