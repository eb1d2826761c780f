#!/usr/bin/env python
"""Cost per element of the two-level all_gather by shard size, on 8 virtual CPU devices of one process.

Why: `calibrate` fits a line through two message sizes (256 KB and 4 MB of flat raw bytes, i.e. shards of
about 37 KB and 585 KB on 2 x 4 devices), and on this machine the hierarchical all_gather's cost per element
steps up between a 512 KB shard (the `--mesh 2x4` benchmark's) and a 585 KB one, which puts calibrate's
estimate at 512 KB too high (benchmarks/README.md, "Hierarchical vs flat"). This times the same programs,
raw and with the slow phase coded, interleaved, at several shard sizes (no network, no root):

    python benchmarks/hier_all_gather_sizes.py --reps 25
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _stats  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=25)
    p.add_argument("--shards", default="262144,299008,299593,300032",
                   help="bfloat16 elements per device (262144 = 512 KB; 299593 = calibrate's 4 MB point)")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import zipccl_jax as zc
    from zipccl_jax.strategy import levels as two_level

    axes = ("host", "local")
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), axes)
    progs = {}
    for per in (int(s) for s in args.shards.split(",")):
        x = (np.random.default_rng(0).standard_normal((8 * per,), np.float32) * 0.02).astype(jnp.bfloat16)
        x = jax.device_put(x, NamedSharding(mesh, P(axes)))
        for coded in (False, True):
            def body(v, coded=coded):
                with two_level.use_algorithm("hierarchical", {"host": coded, "local": False}):
                    return zc.all_gather(v, axes, tiled=True, compress=coded, name="hier_ag_sizes")
            f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(axes), out_specs=P(axes)))
            jax.block_until_ready(f(x))
            progs[(per, coded)] = (f, x)
    times = {k: [] for k in progs}
    for _ in range(args.reps):  # interleaved: drift hits every program alike
        for k, (f, x) in progs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(x))
            times[k].append(time.perf_counter() - t0)
    print(f"{'shard elems':>11} {'slow phase':>10} {'median ms':>10} {'IQR ms':>7} {'ns/elem':>8}   (load {_stats.machine_load()['loadavg_1min']:.1f})")
    for (per, coded), ts in times.items():
        s = _stats.summary(ts)
        print(f"{per:>11} {'coded' if coded else 'raw':>10} {s['median_s'] * 1e3:>10.2f} {s['spread_s'] * 1e3:>7.2f} "
              f"{s['median_s'] * 1e9 / (7 * per):>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
