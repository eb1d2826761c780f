"""Coded collectives inside ``axis_index_groups`` (`_exchange.in_groups`): all_to_all, all_gather and
psum_scatter code a grouped call as they code a whole axis, n being the group's size and a rank's
index its position in its group.

On 8 virtual CPU devices, with one rank's rows incompressible (random bit patterns: its group falls
back, the other group codes), every transport gives jax.lax's bits (data movement, compared on bit
patterns) or the fixed-order sum's (psum_scatter), the coded exchange carries the groups, and each
group takes its own branch of the fallback.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import zipccl_jax as zj

N = 8
BF16 = ml_dtypes.bfloat16
pytestmark = pytest.mark.skipif(jax.device_count() < N, reason="needs 8 devices")
GROUPS = {"halves": [[0, 1, 2, 3], [4, 5, 6, 7]], "interleaved": [[0, 2, 4, 6], [1, 3, 5, 7]]}
NOISY = 1  # the rank whose rows do not compress (its group falls back on the padded transport)


def _data(seed=0):
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal((N * 8, 4096)) * 0.02).astype(BF16).view(np.uint16)
  x[8 * NOISY:8 * NOISY + 8] = rng.integers(0, 2**16, (8, 4096), dtype=np.uint16)
  return x.view(BF16)


def _run(fn, x):
  mesh = jax.make_mesh((N,), ("i",))
  xs = jax.device_put(x, NamedSharding(mesh, P("i")))
  return np.asarray(jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=P("i")))(xs))


def _on_bits(f):  # jax.lax on bit patterns: XLA:CPU may rewrite a 16-bit NaN's payload in a float copy
  return lambda v: lax.bitcast_convert_type(f(lax.bitcast_convert_type(v, jnp.uint16)), v.dtype)


def _ops(g, transport):
  """op -> (zipccl, coded; the reference: jax.lax on bits, or the fixed-order raw sum)."""
  return {
      "all_to_all": (
          lambda v: zj.all_to_all(v, "i", 0, 0, tiled=True, axis_index_groups=g, compress=True,
                                  transport=transport),
          _on_bits(lambda u: lax.all_to_all(u, "i", 0, 0, tiled=True, axis_index_groups=g))),
      "all_gather": (
          lambda v: zj.all_gather(v, "i", tiled=True, axis_index_groups=g, compress=True,
                                  transport=transport),
          _on_bits(lambda u: lax.all_gather(u, "i", tiled=True, axis_index_groups=g))),
      "psum_scatter": (
          lambda v: zj.psum_scatter(v, "i", tiled=True, axis_index_groups=g, compress=True,
                                    transport=transport),
          lambda v: zj.psum_scatter(v, "i", tiled=True, axis_index_groups=g, compress=False,
                                    fixed_order=True)),
  }


def _bits(a):
  return np.asarray(a).view(np.uint16)


@pytest.mark.parametrize("transport", ["padded", "ragged"])
@pytest.mark.parametrize("groups", sorted(GROUPS))
@pytest.mark.parametrize("op", ["all_to_all", "all_gather", "psum_scatter"])
def test_grouped_call_is_coded_and_bit_exact(op, groups, transport):
  x = _data()
  coded, ref = _ops(GROUPS[groups], transport)[op]
  zj.reset_stats()
  got = _run(coded, x)
  (s,) = zj.stats().values()
  assert s.compressed and s.axis_size == 4 and s.wire_bytes < s.raw_bytes, s
  assert np.array_equal(_bits(got), _bits(_run(ref, x))), f"{op} {groups} {transport}"


def test_each_group_takes_its_own_fallback():
  """Padded: the noisy rank's group falls back (its 4 ranks), the other codes; no rendezvous waits
  for a branch the other group does not take."""
  x = _data(1)
  coded, ref = _ops(GROUPS["interleaved"], "padded")["psum_scatter"]
  prev = zj.set_runtime_stats(True)
  try:
    zj.reset_stats()
    got = _run(coded, x)
    jax.effects_barrier()
    (s,) = zj.stats().values()
  finally:
    zj.set_runtime_stats(prev)
  assert (s.calls, s.fallbacks) == (N, 4)
  assert np.array_equal(_bits(got), _bits(_run(ref, x)))


def test_the_coded_exchange_carries_the_groups():
  g = GROUPS["interleaved"]
  coded, _ = _ops(g, "padded")["psum_scatter"]
  mesh = jax.make_mesh((N,), ("i",))
  spec = jax.ShapeDtypeStruct((N * 8, 4096), BF16, sharding=NamedSharding(mesh, P("i")))
  text = jax.jit(jax.shard_map(coded, mesh=mesh, in_specs=P("i"), out_specs=P("i"))).lower(spec).as_text()
  assert "zipccl_encode" in text
  groups = re.findall(r"stablehlo\.all_to_all.*?replica_groups = dense<(\[\[.*?\]\])>", text)
  assert groups and set(groups) == {"[[0, 2, 4, 6], [1, 3, 5, 7]]"}, groups


@pytest.mark.parametrize("op", ["all_to_all", "all_gather", "psum_scatter"])
def test_jax_lowers_the_grouped_ragged_exchange_for_cuda(op):
  """The GPU path is jax's own ragged_all_to_all (CPU runs an emulation): jax's CUDA lowering takes
  our grouped call, and every ragged exchange in it carries the groups."""
  g = GROUPS["interleaved"]
  coded, _ = _ops(g, "ragged")[op]
  mesh = jax.make_mesh((N,), ("i",))
  spec = jax.ShapeDtypeStruct((N * 8, 4096), BF16, sharding=NamedSharding(mesh, P("i")))
  f = jax.jit(jax.shard_map(coded, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
  text = f.trace(spec).lower(lowering_platforms=("cuda",)).as_text()
  ragged = [line for line in text.splitlines() if "ragged_all_to_all" in line and "replica_groups" in line]
  assert ragged and all("[[0, 2, 4, 6], [1, 3, 5, 7]]" in line for line in ragged), ragged


def test_grad_of_a_grouped_all_gather_is_the_coded_grouped_psum_scatter():
  g = GROUPS["halves"]
  x = _data(2)[:, :512].astype(np.float32)
  w = np.random.default_rng(3).standard_normal((N * 4 * 8, 512)).astype(np.float32)

  def loss(mod, **kw):
    def f(v, w):
      return jnp.sum(mod.all_gather(v, "i", tiled=True, axis_index_groups=g, **kw) * w)
    return lambda v, w: jax.grad(f)(v, w)

  mesh = jax.make_mesh((N,), ("i",))
  put = lambda a: jax.device_put(a, NamedSharding(mesh, P("i")))
  run = lambda f: np.asarray(jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("i"), P("i")),
                                                   out_specs=P("i")))(put(x), put(w)))
  zj.reset_stats()
  got = run(loss(zj, compress=True))
  assert any(s.op == "psum_scatter" and s.compressed for s in zj.stats().values())
  with zj.use_defaults(fixed_order=True):
    want = run(loss(zj, compress=False))
  assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("op", ["all_to_all", "all_gather", "psum_scatter"])
def test_vmap_of_a_grouped_call_is_jax_lax_s(op):
  """Under jax.vmap a grouped call stays jax.lax's: the coded exchanges need grouped all_to_alls, which
  jax cannot batch (jax.lax.all_to_all with groups raises NotImplementedError under vmap, so ours does
  too); all_gather and psum_scatter give jax.lax's bits, as before grouped calls were coded."""
  g = GROUPS["interleaved"]
  x = np.stack([_data(4)[:, :1024], _data(5)[:, :1024]]).astype(np.float32)   # (2, N * 8, 1024)
  mesh = jax.make_mesh((N,), ("i",))
  spec = P(None, "i")
  run = lambda f: np.asarray(jax.jit(jax.shard_map(jax.vmap(f), mesh=mesh, in_specs=spec,
                                                   out_specs=spec))(
      jax.device_put(x, NamedSharding(mesh, spec))))
  kw = dict(tiled=True, axis_index_groups=g)
  ours = {"all_to_all": lambda r: zj.all_to_all(r, "i", 0, 0, compress=True, **kw),
          "all_gather": lambda r: zj.all_gather(r, "i", compress=True, **kw),
          "psum_scatter": lambda r: zj.psum_scatter(r, "i", compress=True, **kw)}[op]
  theirs = {"all_to_all": lambda r: lax.all_to_all(r, "i", 0, 0, **kw),
            "all_gather": lambda r: lax.all_gather(r, "i", **kw),
            "psum_scatter": lambda r: lax.psum_scatter(r, "i", **kw)}[op]
  if op == "all_to_all":
    for f in (theirs, ours):
      with pytest.raises(NotImplementedError):
        run(f)
    return
  assert np.array_equal(run(ours).view(np.uint32), run(theirs).view(np.uint32))
