"""One rank of the multi-process strategy test (started by tests/mp_launch.py from tests/test_strategy.py).

Every rank loads the same profile, traces one jitted shard_map with several compress="auto" call sites and
reports its decisions; then calibrates across processes and reports the agreed profile's fingerprint and
the decisions it gives; then observes frame sizes (each process sees only its own devices' frames) and
reports the merged observations. It prints one line ``RESULT {json}``; the test compares the ranks.
"""
from __future__ import annotations

import argparse
import json
import sys

from mp_launch import report, start_worker


def main() -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--profile", required=True)
  a = start_worker(ap)

  import jax
  import ml_dtypes
  import numpy as np
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import zipccl_jax as zj
  from zipccl_jax import strategy as st
  from zipccl_jax.strategy import profile as pf

  bf16 = np.dtype(ml_dtypes.bfloat16)
  n = jax.device_count()
  mesh = jax.make_mesh((n,), ("i",))
  spec = P("i")
  sharding = NamedSharding(mesh, spec)

  def glob(x):
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

  def smap(body):
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))

  # First cross-process collective: a modest all_to_all.
  warm = smap(lambda v: lax.all_to_all(v, "i", 0, 0, tiled=True))
  jax.block_until_ready(warm(glob(np.zeros((n * 8, 4096), np.float32))))

  rng = np.random.default_rng(7)
  xs = (rng.standard_normal((n * n, 8192)) * 0.02).astype(bf16)   # (n, 8192) per device
  x = glob(xs)
  xi = glob(np.arange(n * n * 64, dtype=np.int32).reshape(n * n, 64))

  def body(v, vi):
    return (zj.all_to_all(v, "i", 0, 0, tiled=True, name="mp/a2a"),
            zj.all_gather(v, "i", tiled=True, name="mp/ag"),
            zj.psum_scatter(v, "i", tiled=True, name="mp/rs", fixed_order=True),
            zj.psum(v, "i", name="mp/ps", fixed_order=True),
            zj.all_to_all(vi, "i", 0, 0, tiled=True, name="mp/int"))

  def lax_body(v, vi):
    return (lax.all_to_all(v, "i", 0, 0, tiled=True), lax.all_gather(v, "i", tiled=True),
            zj.psum_scatter(v, "i", tiled=True, compress=False, fixed_order=True),
            zj.psum(v, "i", compress=False, fixed_order=True),
            lax.all_to_all(vi, "i", 0, 0, tiled=True))

  def trace_and_run():
    st.reset_decisions()
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, spec), out_specs=spec))
    out = f(x, xi)
    ds = {k: {"compress": d.compress, "capacity": d.capacity, "transport": d.transport,
              "capacity_source": d.capacity_source, "est_raw_s": d.est_raw_s,
              "est_compressed_s": d.est_compressed_s}
          for k, d in st.decisions().items()}
    return ds, out

  def same(a_, b_):
    ok = True
    for p_, q_ in zip(a_, b_):
      for s1, s2 in zip(p_.addressable_shards, q_.addressable_shards):
        u1, u2 = np.asarray(s1.data), np.asarray(s2.data)
        ok &= u1.shape == u2.shape and np.array_equal(u1.view(np.uint8), u2.view(np.uint8))
    return bool(ok)

  want = jax.jit(jax.shard_map(lax_body, mesh=mesh, in_specs=(spec, spec), out_specs=spec))(x, xi)

  # 1. a loaded profile
  loaded = pf.load_profile(a.profile)
  dec_loaded, out1 = trace_and_run()
  ok = same(out1, want)

  # 2. calibrated on every rank, agreed across processes
  cal = zj.calibrate(mesh, "i", link_bytes=(16 << 10, 128 << 10), codec_bytes=(16 << 10, 128 << 10),
                     dtypes=("bfloat16",), reps=2)
  dec_cal, out2 = trace_and_run()
  ok &= same(out2, want)

  # 3. observed sizes: each process sees its own devices' frames; merged on exit
  obs_prof = pf.Profile()
  with zj.observe(obs_prof):
    g = smap(lambda v: zj.all_to_all(v, "i", 0, 0, tiled=True, name="mp/obs"))
    jax.block_until_ready(g(glob(xs[:, :2048])))
  observed = {k: json.loads(json.dumps(o.__dict__)) for k, o in obs_prof.sites.items()}

  report({"rank": a.rank, "processes": jax.process_count(),
          "loaded_fingerprint": loaded.fingerprint(), "loaded": dec_loaded,
          "calibrated_fingerprint": cal.fingerprint(), "calibrated": dec_cal,
          "calibration": {k: cal.meta["calibration"][k] for k in ("net_s", "dispatch_s", "slowest_rep_s", "slowest_median_s")},
          "observed": observed, "results_ok": ok})
  jax.distributed.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main())  # an exception prints its traceback (the launcher shows stderr) and exits 1
