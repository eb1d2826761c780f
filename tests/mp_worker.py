"""One rank of the multi-process collective test (started by tests/mp_launch.py).

Every rank builds the same global inputs from fixed seeds, places its local shards, runs every
zipccl_jax collective next to its jax.lax twin in one jitted shard_map over all devices of all processes,
and compares the shards it holds (`--transport` for the compressed ones): bit-identical for data movement, the documented fixed-order float32 sum
(and compress=True == compress=False) for reductions, the same inside axis_index_groups and over one
axis split into two levels (use_levels; psum too, without check_vma), jax.grad through all_to_all. It prints one line
``RESULT {json}`` and exits 0 when every check passed.
"""
from __future__ import annotations

import argparse
import sys

from mp_launch import report, start_worker


def main() -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--rows", type=int, default=8)
  ap.add_argument("--cols", type=int, default=1024)
  ap.add_argument("--transport", default="auto", choices=("auto", "padded", "ragged"))
  a = start_worker(ap)
  t = a.transport

  import jax
  import jax.numpy as jnp
  import ml_dtypes
  import numpy as np
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  import zipccl_jax as zj

  bf16 = np.dtype(ml_dtypes.bfloat16)
  n = jax.device_count()
  assert n == a.nproc * a.local_devices, (n, a.nproc, a.local_devices)
  mesh = jax.make_mesh((n,), ("i",))
  spec = P("i")
  sharding = NamedSharding(mesh, spec)
  R, M = a.rows, a.cols
  shape = (n * R, M)

  def glob(x):
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

  def smap(body, out_specs=spec):
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=out_specs))

  rng = np.random.default_rng(1234)
  gauss = (rng.standard_normal(shape) * 0.02).astype(bf16)
  sign = rng.integers(0, 2, shape, dtype=np.uint16) << 15
  expo = rng.integers(100, 141, shape, dtype=np.uint16) << 7
  mant = rng.integers(0, 128, shape, dtype=np.uint16)
  adversarial = (sign | expo | mant).view(bf16)
  weights = rng.standard_normal(shape).astype(np.float32)

  # First cross-process collective: a modest all_to_all (not a tiny psum_scatter).
  warm = smap(lambda v: lax.all_to_all(v, "i", 0, 0, tiled=True))
  jax.block_until_ready(warm(glob(np.zeros((n * 8, 4096), np.float32))))

  ring = [(i, (i + 1) % n) for i in range(n)]
  ops = {
      "all_to_all": (lambda v: zj.all_to_all(v, "i", 0, 0, tiled=True, compress=True, transport=t),
                     lambda v: lax.all_to_all(v, "i", 0, 0, tiled=True)),
      "all_gather": (lambda v: zj.all_gather(v, "i", tiled=True, compress=True, transport=t),
                     lambda v: lax.all_gather(v, "i", tiled=True)),
      "ppermute": (lambda v: zj.ppermute(v, "i", ring, compress=True, transport=t),
                   lambda v: lax.ppermute(v, "i", ring)),
      "psum_scatter": (lambda v: zj.psum_scatter(v, "i", tiled=True, compress=True, transport=t),
                       lambda v: zj.psum_scatter(v, "i", tiled=True, compress=False, fixed_order=True)),
      "psum": (lambda v: zj.psum(v, "i", compress=True, transport=t),
               lambda v: zj.psum(v, "i", compress=False, fixed_order=True)),
  }
  # axis_index_groups across processes (coded within each group), and one axis split into two levels
  # of n / 2 "hosts" x 2 (use_levels: the phases over the levels' groups), slow level coded
  groups = [list(range(0, n, 2)), list(range(1, n, 2))]

  def levels(fn, coded):
    def body(v):
      with zj.use_levels({"i": 2}), zj.use_algorithm("hierarchical", {"host": coded, "local": False}):
        return fn(v)
    return body

  ops |= {
      "grouped_all_gather": (
          lambda v: zj.all_gather(v, "i", tiled=True, axis_index_groups=groups, compress=True,
                                  transport=t),
          lambda v: lax.all_gather(v, "i", tiled=True, axis_index_groups=groups)),
      "grouped_psum_scatter": (
          lambda v: zj.psum_scatter(v, "i", tiled=True, axis_index_groups=groups, compress=True,
                                    transport=t),
          lambda v: zj.psum_scatter(v, "i", tiled=True, axis_index_groups=groups, compress=False,
                                    fixed_order=True)),
      "levels_psum_scatter": (
          levels(lambda v: zj.psum_scatter(v, "i", tiled=True, transport=t, fixed_order=True), True),
          levels(lambda v: zj.psum_scatter(v, "i", tiled=True, fixed_order=True), False)),
      # MoE dispatch over one axis across hosts: the mixed slots over "i" (hosts coded), and the
      # raw rounds (collective-permutes between hosts), each jax.lax's bits
      "levels_all_to_all": (
          levels(lambda v: zj.all_to_all(v, "i", 0, 0, tiled=True, transport=t), True),
          lambda v: lax.all_to_all(v, "i", 0, 0, tiled=True)),
      "levels_all_to_all_rounds": (
          levels(lambda v: zj.all_to_all(v, "i", 0, 0, tiled=True, transport=t), False),
          lambda v: lax.all_to_all(v, "i", 0, 0, tiled=True)),
  }
  names = list(ops)
  f = smap(lambda v: tuple((ops[k][0](v), ops[k][1](v)) for k in names))

  def ordered_sum(blocks):  # (n, ...) -> f32 sum in ascending rank order, rounded once
    acc = blocks[0].astype(np.float32)
    for r in range(1, blocks.shape[0]):
      acc = acc + blocks[r].astype(np.float32)
    return acc.astype(blocks.dtype)

  def bits(x):
    return np.asarray(x).view(np.uint16)

  def shards_equal(got, want):
    """Every local shard of `got` equals the same shard of `want` (a global array or numpy)."""
    def key(index):  # slices are unhashable before Python 3.12
      return tuple((sl.start, sl.stop, sl.step) for sl in index)

    wsh = ({key(s.index): s for s in want.addressable_shards} if hasattr(want, "addressable_shards")
           else None)
    for s in got.addressable_shards:
      g = bits(s.data)
      w = bits(wsh[key(s.index)].data) if wsh is not None else bits(np.asarray(want)[s.index])
      if g.shape != w.shape or not np.array_equal(g, w):
        return False
    return True

  checks = {}
  zj.reset_stats()
  for dname, data in (("gaussian", gauss), ("adversarial", adversarial)):
    res = f(glob(data))
    for k, (ours, twin) in zip(names, res):
      ref = "lax" if k in ("all_to_all", "all_gather", "ppermute", "grouped_all_gather",
                           "levels_all_to_all", "levels_all_to_all_rounds") else "raw"
      checks[f"{dname}/{k}/vs_{ref}"] = shards_equal(ours, twin)
      total = ordered_sum(data.reshape(n, R, M))  # (R, M)
      if k == "psum":  # every rank holds the whole sum
        checks[f"{dname}/{k}/documented"] = shards_equal(ours, np.tile(total, (n, 1)))
      if k == "psum_scatter":  # rank r holds rows r*R/n:(r+1)*R/n of the sum
        checks[f"{dname}/{k}/documented"] = shards_equal(ours, total)

  # psum over the axis split into levels, with check_vma off (with it, psum over one axis stays flat):
  # psum_scatter's phases then all_gather's, the "hosts" coded; the same bits as its raw program, and
  # the documented two-level order (per host the f32 sum of its 2 ranks, rounded; then over the hosts)
  lv_psum = jax.jit(jax.shard_map(
      lambda v: (levels(lambda u: zj.psum(u, "i", transport=t, fixed_order=True), True)(v),
                 levels(lambda u: zj.psum(u, "i", fixed_order=True), False)(v)),
      mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
  for dname, data in (("gaussian", gauss), ("adversarial", adversarial)):
    ours, twin = lv_psum(glob(data))
    hosts = data.reshape(n // 2, 2, R, M).astype(np.float32).sum(axis=1).astype(bf16)  # f32, rank order
    checks[f"{dname}/levels_psum/vs_raw"] = shards_equal(ours, twin)
    checks[f"{dname}/levels_psum/documented"] = shards_equal(ours, np.tile(ordered_sum(hosts), (n, 1)))

  # the grouped calls and the coded level's phase code (sites of 2 ranks: the groups, the "hosts")
  checks["groups_and_levels_coded"] = sum(
      s.compressed and s.axis_size == 2 for s in zj.stats().values()) >= 3

  # jax.grad through the compressed all_to_all (its transpose is the compressed all_to_all too)
  def loss(m, kw):
    def fn(v, w):
      y = jax.shard_map(lambda u: m.all_to_all(u, "i", 0, 0, tiled=True, **kw), mesh=mesh,
                        in_specs=spec, out_specs=spec)(v)
      return jnp.sum(y.astype(jnp.float32) * w)
    return fn

  x, w = glob(gauss), glob(weights)
  g_ours = jax.jit(jax.grad(loss(zj, {"compress": True, "transport": t})))(x, w)
  g_lax = jax.jit(jax.grad(loss(lax, {})))(x, w)
  checks["grad/all_to_all"] = shards_equal(g_ours, g_lax)

  ok = all(checks.values())
  report({"rank": a.rank, "devices": n, "platform": jax.devices()[0].platform, "ok": ok,
          "checks": checks})
  jax.distributed.shutdown()
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())  # an exception prints its traceback (the launcher shows stderr) and exits 1
