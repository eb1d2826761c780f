"""Every collective under ``jax.config.update("jax_check_tracer_leaks", True)`` (issue 37).

Users turn the flag on when they debug. jax's own ``linear_call`` (0.12, since jax-ml/jax b4e876a49b)
closes its transpose thunk over the call's arguments, which the jaxpr keeps alive: a leaked trace for
every call. `_linear.linear` binds ``linear_call`` with a thunk that holds no traced value. Checked here
forward, under ``jax.grad`` (and grad of grad, jvp), ``jax.vmap`` and ``checkify``, raw and compressed,
with the results equal to the same calls without the flag. CI runs this file on jax 0.10.2, 0.11.2 and
0.12.0.1.
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zj

pytestmark = pytest.mark.skipif(jax.device_count() < 8,
                                reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")

N = 8
PERM = [(j, (j + 1) % N) for j in range(N)]
BODIES = {
    "all_to_all": lambda x, **kw: zj.all_to_all(x, "i", 0, 0, tiled=True, **kw),
    "all_gather": lambda x, **kw: zj.all_gather(x, "i", tiled=True, **kw),
    "psum_scatter": lambda x, **kw: zj.psum_scatter(x, "i", scatter_dimension=0, tiled=True, **kw),
    "psum": lambda x, **kw: zj.psum(x, "i", **kw),
    "pmean": lambda x, **kw: zj.pmean(x, "i", **kw),
    "ppermute": lambda x, **kw: zj.ppermute(x, "i", PERM, **kw),
    "all_gather_invariant": lambda x, **kw: zj.all_gather_invariant(x, "i", tiled=True, **kw),
}
# outputs that are not varying over "i" go out replicated (out_specs P())
INVARIANT = {"psum", "pmean", "all_gather_invariant"}


@contextlib.contextmanager
def leak_checks():
  prev = jax.config.jax_check_tracer_leaks
  jax.config.update("jax_check_tracer_leaks", True)
  try:
    yield
  finally:
    jax.config.update("jax_check_tracer_leaks", prev)


def mesh():
  return jax.make_mesh((N,), ("i",))


def put(a):
  return jax.device_put(a, NamedSharding(mesh(), P("i")))


def smap(body, out_spec=P("i")):
  return jax.jit(jax.shard_map(body, mesh=mesh(), in_specs=P("i"), out_specs=out_spec))


def x_of(seed=0, rows=N * 16):
  return put(np.random.default_rng(seed).standard_normal((rows, 32)).astype(np.float32))


def programs(op, compress):
  """name -> a jitted program of the collective: forward, grad, grad of grad, jvp, vmap, checkify."""
  body = lambda x: BODIES[op](x, compress=compress)
  spec = P() if op in INVARIANT else P("i")
  loss = lambda x: jnp.sum(jnp.sin(body(x)) ** 2)
  # the loss summed over "i" inside: one scalar, jax.grad's cotangent enters the collective's transpose
  total = lambda x: jax.lax.psum(loss(x), "i") if op not in INVARIANT else loss(x)
  checked = checkify.checkify(lambda x: (checkify.check(jnp.all(jnp.isfinite(x)), "finite"), body(x))[1])
  return {
      "forward": smap(body, spec),
      "grad": smap(jax.grad(total)),
      "grad_of_grad": smap(jax.grad(lambda x: jnp.sum(jax.grad(total)(x) ** 2))),
      "jvp": smap(lambda x: jax.jvp(body, (x,), (jnp.cos(x),))[1], spec),
      "vmap": smap(lambda x: jax.vmap(body)(x.reshape(2, -1, x.shape[-1])), P(None, *spec)),
      "checkify": smap(lambda x: checked(x)[1], spec),
  }


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize("op", sorted(BODIES))
def test_collective_passes_under_tracer_leak_checks(op, compress):
  x = x_of(hash(op) % 1000)
  want = {k: f(x) for k, f in programs(op, compress).items()}
  with leak_checks():
    got = {k: f(x) for k, f in programs(op, compress).items()}  # fresh functions: traced again
  for k in want:
    for g, w in zip(jax.tree.leaves(got[k]), jax.tree.leaves(want[k]), strict=True):
      assert np.array_equal(np.asarray(g), np.asarray(w), equal_nan=True), (op, compress, k)


def test_the_issue_repro_passes():
  """issue 37's report, as filed."""
  x = x_of(1)
  with leak_checks():
    f = smap(lambda v: zj.all_to_all(v, "i", 0, 0, tiled=True, compress=True))
    got = f(x)
  want = smap(lambda v: jax.lax.all_to_all(v, "i", 0, 0, tiled=True))(x)
  assert np.array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("compress", [True, False])
def test_ragged_all_to_all_passes_under_tracer_leak_checks(compress):
  rows = 4  # each rank sends `rows` rows to every rank, lands them at its own block
  operand = np.random.default_rng(5).standard_normal((N * N * rows, 8)).astype(np.float32)
  sizes = np.full((N, N), rows, np.int32)
  offs = np.tile(np.arange(N, dtype=np.int32) * rows, (N, 1))
  out_offs = np.tile(np.arange(N, dtype=np.int32)[:, None] * rows, (1, N))

  def body(a, io, ss, oo, rs):
    return zj.ragged_all_to_all(a, jnp.zeros_like(a), io[0], ss[0], oo[0], rs[0], axis_name="i",
                                compress=compress)

  def make():
    f = jax.shard_map(body, mesh=mesh(), in_specs=P("i"), out_specs=P("i"))
    g = jax.shard_map(jax.grad(lambda *a: jax.lax.psum(jnp.sum(body(*a) ** 2), "i")), mesh=mesh(),
                      in_specs=P("i"), out_specs=P("i"))
    return jax.jit(f), jax.jit(g)

  args = [put(operand), put(offs), put(sizes), put(out_offs), put(sizes)]
  want = [f(*args) for f in make()]
  with leak_checks():
    got = [f(*args) for f in make()]
  for g, w in zip(got, want):
    assert np.array_equal(np.asarray(g), np.asarray(w))
