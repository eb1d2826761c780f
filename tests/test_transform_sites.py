"""`compress_collectives` on real code (issue 36): zipccl_jax's own raw paths are never rewritten,
whoever traces them and when; `stats()` / `explain()` describe the program that runs, also when JAX
reuses a cached trace; `compress=True` sends raw where a frame would not be smaller than raw.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import zipccl_jax as zj
from test_transform import AXIS, BF16, N, RING, _mesh  # the same mesh and data as the transform's tests
from zipccl_jax import accounting


def _smap(body):
  return jax.shard_map(body, mesh=_mesh(), in_specs=P(AXIS), out_specs=P(AXIS))


def _ragged(x):  # the repro: one row to every rank, landing at the sender's index
  return lax.ragged_all_to_all(x, jnp.zeros_like(x), jnp.arange(N, dtype=jnp.int32),
                               jnp.ones(N, jnp.int32), jnp.full(N, lax.axis_index(AXIS), jnp.int32),
                               jnp.ones(N, jnp.int32), axis_name=AXIS)


_BODIES = {
    "ragged_all_to_all": _ragged,
    "all_to_all": lambda x: lax.all_to_all(x, AXIS, 0, 0, tiled=True),
    "all_gather": lambda x: lax.all_gather(x, AXIS, tiled=True)[: x.shape[0]],
    "psum_scatter": lambda x: lax.psum_scatter(jnp.tile(x, (N, 1)), AXIS, tiled=True),
    "ppermute": lambda x: lax.ppermute(x, AXIS, RING),
}


def _x(rows=N * N, cols=512, seed=0):
  rng = np.random.default_rng(seed)
  return jnp.asarray((rng.standard_normal((rows, cols)) * 0.5).astype(BF16))


def _grad(f):
  return jax.grad(lambda v: jnp.sum(f(v).astype(jnp.float32) ** 2))


def _sites_and_encodes(fn, x):
  zj.reset_stats()
  traced = jax.jit(fn).trace(x)
  sites = sorted(zj.stats())
  return sites, traced.lower(lowering_platforms=("cuda",)).as_text().count("zipccl_encode")


@pytest.mark.parametrize("op", sorted(_BODIES))
def test_both_grad_orders_trace_the_same_sites_and_encodes(op):
  """compress_collectives(grad(f)) traces the transpose rules under the policy; grad(compress_collectives(f))
  after it returned. Both: the forward site and its /bwd, nothing named after another line, and the same
  number of zipccl_encode custom calls in the CUDA lowering (a raw path rewritten into a compressed
  exchange added one: 3 against 2 for the issue's ragged repro)."""
  f = _smap(_BODIES[op])
  x = _x(cols=64) if op == "ragged_all_to_all" else _x()
  outer = _sites_and_encodes(zj.compress_collectives(_grad(f), compress=True), x)
  inner = _sites_and_encodes(_grad(zj.compress_collectives(f, compress=True)), x)
  assert outer == inner, (outer, inner)
  sites, encodes = outer
  assert len(sites) == 2 and sites[1] == sites[0] + "/bwd", sites
  assert encodes == 2, encodes


def test_a_collective_of_ours_keeps_its_own_options_inside_the_transform():
  """zipccl_jax.all_to_all(compress=False) called inside compress_collectives(compress=True): its raw path
  is ours and stays raw, forward and transposed (the transpose is traced later, under the policy)."""
  f = _smap(lambda v: zj.all_to_all(v, AXIS, 0, 0, tiled=True, compress=False, name="mine"))
  x = _x()
  for fn in (zj.compress_collectives(f, compress=True), zj.compress_collectives(_grad(f), compress=True)):
    sites, encodes = _sites_and_encodes(fn, x)
    assert encodes == 0 and set(sites) <= {"mine", "mine/bwd"}, (sites, encodes)


def test_a_jitted_function_lowered_under_the_policy_binds_nothing_twice():
  """Called eagerly inside the transformed function, a jitted function is traced, lowered and compiled
  while the policy is on: linear_call's lowering evaluates its callee's jaxpr again, and the raw paths there
  stay raw (no extra call site; the result has jax.lax's bits)."""
  body = _BODIES["all_to_all"]
  x = _x()
  zj.reset_stats()
  jax.jit(zj.compress_collectives(_smap(body), compress=True)).lower(x)
  want = sorted(zj.stats())
  zj.reset_stats()
  got = zj.compress_collectives(jax.jit(_smap(body)), compress=True)(x)
  assert sorted(zj.stats()) == want
  np.testing.assert_array_equal(np.asarray(got).view(np.uint16),
                                np.asarray(jax.jit(_smap(body))(x)).view(np.uint16))


def test_a_programs_sites_survive_reset_and_jax_caches_and_xla_dce():
  """After reset_stats(), a cached step is neither traced nor lowered again (no code of ours runs): the
  program itself names its sites (stats(program), explain(program=...)), the same as the first time; a
  collective whose result is unused (traced, so in stats(), but dropped by jax's DCE before lowering, or
  by XLA) is not among the program's sites."""
  def body(x):
    lax.all_gather(x[:8], AXIS, tiled=True)  # result unused: XLA drops it
    return lax.all_to_all(x, AXIS, 0, 0, tiled=True)

  step = jax.jit(zj.compress_collectives(_smap(body), compress=True))
  x = _x()
  zj.reset_stats()
  first = step.lower(x)
  traced_sites = sorted(zj.stats())
  compiled = first.compile()
  kept = sorted(zj.stats(compiled))
  assert len(traced_sites) == 2 and len(kept) == 1 and kept[0].startswith("all_to_all@"), (traced_sites, kept)
  table = zj.explain(program=compiled)
  zj.reset_stats()
  again = step.lower(x)  # cached: nothing of ours runs
  assert zj.stats() == {}
  assert sorted(zj.stats(again)) == sorted(zj.stats(step.trace(x))) == sorted(zj.stats(first)) == kept
  assert sorted(zj.stats(again.compile())) == kept and zj.explain(program=again.compile()) == table
  assert zj.stats(compiled)[kept[0]].compressed and kept[0] in table
  with pytest.raises(KeyError, match=r"no decision for site 'nowhere'; the sites decided: 'all_to_all@"):
    zj.explain("nowhere", program=compiled)
  zj.reset_stats()
  zj.strategy.reset_decisions()
  with pytest.raises(KeyError, match="nothing was decided since the last reset"):
    zj.explain("nowhere")


def test_compress_true_sends_small_messages_raw_and_says_so():
  """A frame that would not be smaller than the raw chunk: the site goes raw (no encode), explain() says
  why; a byte-count capacity is obeyed as given."""
  small = _smap(lambda x: lax.all_gather(x[:2, :64], AXIS, tiled=True)[: x.shape[0]].repeat(1, 0))
  x = _x()
  zj.reset_stats()
  text = jax.jit(zj.compress_collectives(small, compress=True)).lower(x).compile().as_text()
  (name, st), = zj.stats().items()
  assert not st.compressed and st.wire_bytes == st.raw_bytes and "zipccl_encode" not in text, st
  assert "would not be smaller than the raw chunk" in zj.explain(name)
  forced = _smap(lambda x: zj.all_gather(x[:2, :64], AXIS, tiled=True, compress=True, capacity=512))
  assert "zipccl_encode" in jax.jit(forced).lower(x).compile().as_text()


def test_explain_says_why_auto_codes_nothing_on_cpu():
  from zipccl_jax import strategy
  strategy.reset_decisions()
  jax.jit(zj.compress_collectives(_smap(_BODIES["all_to_all"]))).lower(_x())
  assert "note: compress='auto' coded nothing" in zj.explain() and "compress=True" in zj.explain()
