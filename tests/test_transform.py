"""`zipccl_jax.compress_collectives` (issue 28) on code written the way other people write it: plain
`jax.lax` collectives, called by attribute and by names imported at module load, inside a `shard_map`
that also holds a `custom_vjp` (whose backward rule has its own collective), a `scan`, a `remat`, a
`cond`, a `jit` and a `while_loop`. Transformed, it must give the untransformed function's bits, forward
and under `grad` in both orders, show zipccl's custom calls in the compiled HLO and move fewer bytes.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.lax import all_to_all as imported_all_to_all  # a name bound at import, before any transform
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zj

N = 8
AXIS = "x"
BF16 = np.dtype(ml_dtypes.bfloat16)
RING = [(i, (i + 1) % N) for i in range(N)]


def _mesh():
  return Mesh(np.array(jax.devices("cpu")[:N]), (AXIS,))


def _bits(x):
  x = np.asarray(x)
  return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


@jax.custom_vjp
def _gather_rows(v):  # a custom_vjp whose backward rule runs a collective of its own
  return lax.all_gather(v, AXIS, tiled=True)


def _gather_rows_fwd(v):
  return _gather_rows(v), None


def _gather_rows_bwd(_, ct):
  return (lax.psum_scatter(ct, AXIS, tiled=True),)


_gather_rows.defvjp(_gather_rows_fwd, _gather_rows_bwd)


def _layer(w, x):
  """Per device: w (d, d) float32, x (N * t, d) bfloat16 -> (N * t, d) bfloat16."""
  h = imported_all_to_all(x, AXIS, 0, 0, tiled=True)  # dispatch, by an imported name
  h = (h.astype(jnp.float32) @ w).astype(x.dtype)

  def step(carry, row):  # scan: one ring step per row block
    nxt = lax.ppermute(carry, AXIS, RING)
    return nxt, jnp.tanh(row + nxt)

  _, h = lax.scan(step, h[:4], h.reshape(-1, 4, h.shape[1]))
  h = h.reshape(x.shape)
  h = jax.checkpoint(lambda u: u * lax.pmean(jnp.mean(u.astype(jnp.float32)), AXIS).astype(u.dtype))(h)
  g = _gather_rows(h[: x.shape[0] // N])  # custom_vjp: all_gather forward, psum_scatter backward
  h = h + g[: h.shape[0]].astype(h.dtype)
  h = lax.cond(jnp.sum(h.astype(jnp.float32)) > 0, lambda u: lax.ppermute(u, AXIS, RING[::-1]),
               lambda u: -u, h)
  h = jax.jit(lambda u: lax.all_to_all(u, AXIS, 0, 0, tiled=True))(h)  # combine, by attribute
  return lax.fori_loop(0, 2, lambda _, u: lax.ppermute(u, AXIS, RING), h)  # static bounds: a scan


def _model(mesh):
  return jax.shard_map(_layer, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=P(AXIS))


def _inputs(mesh, seed=0):
  rng = np.random.default_rng(seed)
  d = 256
  w = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
  x = (rng.standard_normal((N * N * 16, d)) * 0.5).astype(BF16)
  return (jax.device_put(w, NamedSharding(mesh, P())), jax.device_put(x, NamedSharding(mesh, P(AXIS))))


def _loss(f):
  def loss(w, x):
    y = f(w, x).astype(jnp.float32)
    return jnp.sum(y * jnp.sin(jnp.arange(y.size, dtype=jnp.float32)).reshape(y.shape))
  return loss


@pytest.fixture(scope="module")
def model():
  mesh = _mesh()
  return mesh, _model(mesh), _inputs(mesh)


def test_forward_bits_and_hlo(model):
  mesh, f, (w, x) = model
  plain = jax.jit(f)
  ours = jax.jit(zj.compress_collectives(f, compress=True))
  np.testing.assert_array_equal(_bits(ours(w, x)), _bits(plain(w, x)))
  hlo_ours = ours.lower(w, x).compile().as_text()
  hlo_plain = plain.lower(w, x).compile().as_text()
  assert "zipccl_encode" in hlo_ours and "zipccl_decode" in hlo_ours
  assert "zipccl_encode" not in hlo_plain
  # Against the same program with compress=False, which moves the BF16 bits as they are: jax.lax's own
  # program is no yardstick on CPU, where XLA moves BF16 collectives as F32 (compress=False scores 0.5
  # against it).
  raw_program = jax.jit(zj.compress_collectives(f, compress=False)).lower(w, x).compile().as_text()
  assert "zipccl_encode" not in raw_program and "f32[" not in "".join(
      r["shape"] for r in zj.hlo_collectives(raw_program) if r["result_bytes"] > 4)
  wire = zj.hlo_wire_bytes(hlo_ours)
  raw = zj.hlo_wire_bytes(raw_program)
  print(f"compress=True / compress=False wire bytes: {wire} / {raw} = {wire / raw:.3f}")
  assert wire <= 0.8 * raw, (wire, raw)


@pytest.mark.parametrize("order", ["grad_of_transformed", "transformed_grad"])
def test_grad_bits_both_orders(model, order):
  mesh, f, (w, x) = model
  want = jax.jit(jax.grad(_loss(f), argnums=(0, 1)))(w, x)
  if order == "grad_of_transformed":
    g = jax.grad(_loss(zj.compress_collectives(f, compress=True)), argnums=(0, 1))
  else:
    g = zj.compress_collectives(jax.grad(_loss(f), argnums=(0, 1)), compress=True)
  got = jax.jit(g)(w, x)
  for a, b in zip(got, want):
    np.testing.assert_array_equal(_bits(a), _bits(b))
  hlo = jax.jit(g).lower(w, x).compile().as_text()
  # the custom_vjp's backward psum_scatter is coded too: more encodes than the forward pass alone has
  assert hlo.count("zipccl_encode") > jax.jit(zj.compress_collectives(f, compress=True)).lower(
      w, x).compile().as_text().count("zipccl_encode")


def test_backward_rule_traced_after_return_is_compressed(model):
  """jax.grad outside: the custom_vjp's bwd is traced after the transformed function returned; it
  runs zipccl's psum_scatter all the same (a call site named after this file's bwd line)."""
  mesh, f, (w, x) = model
  zj.reset_stats()
  jax.jit(jax.grad(_loss(zj.compress_collectives(f, compress=True)), argnums=1)).lower(w, x)
  sites = zj.stats()
  bwd_line = _gather_rows_bwd.__code__.co_firstlineno + 1
  assert f"psum_scatter@test_transform.py:{bwd_line}" in sites, sorted(sites)
  assert sites[f"psum_scatter@test_transform.py:{bwd_line}"].compressed


def test_call_sites_name_the_original_lines(model):
  mesh, f, (w, x) = model
  zj.reset_stats()
  jax.jit(zj.compress_collectives(f, compress=True)).lower(w, x)
  ops = {name.split("@")[0] for name in zj.stats()}
  assert {"all_to_all", "ppermute", "all_gather", "psum"} <= ops, ops
  assert all(name.split("@")[1].startswith("test_transform.py:") for name in zj.stats())
  assert "test_transform.py" in zj.explain()


def test_vmap_and_jit_compose(model):
  mesh, f, (w, x) = model
  xs = jnp.stack([x, -x])
  plain = jax.jit(jax.vmap(f, in_axes=(None, 0)))(w, xs)
  ours = jax.jit(jax.vmap(zj.compress_collectives(f, compress=True), in_axes=(None, 0)))(w, xs)
  np.testing.assert_array_equal(_bits(ours), _bits(plain))
  ours2 = jax.jit(zj.compress_collectives(jax.vmap(f, in_axes=(None, 0)), compress=True))(w, xs)
  np.testing.assert_array_equal(_bits(ours2), _bits(plain))


def test_a_jitted_function_traced_before_is_traced_again(model):
  """The policy is in jax.jit's cache key: an inner jitted function traced without it is not reused."""
  mesh, f, (w, x) = model
  inner = jax.jit(f)
  inner(w, x)  # traced and cached without the policy
  hlo = jax.jit(zj.compress_collectives(lambda a, b: inner(a, b), compress=True)).lower(
      w, x).compile().as_text()
  assert "zipccl_encode" in hlo
  assert "zipccl_encode" not in jax.jit(lambda a, b: inner(a, b)).lower(w, x).compile().as_text()


def test_what_is_not_coded_stays_jax_lax():
  """Integers, axis_index_groups and compress=False: jaxprs identical to the untransformed ones."""
  mesh = _mesh()

  def body(i, v):
    a = lax.all_to_all(i, AXIS, 0, 0, tiled=True)
    b = lax.psum(i, AXIS)
    c = lax.all_gather(v, AXIS, axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]], tiled=True)
    return a, b, c

  f = jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=(P(AXIS), P(), P(AXIS)),
                    check_vma=False)
  i = jnp.arange(N * N, dtype=jnp.int32)
  v = jnp.ones((N * 4,), jnp.bfloat16)
  want = str(jax.make_jaxpr(f)(i, v))
  assert str(jax.make_jaxpr(zj.compress_collectives(f, compress=True))(i, v)) == want
  ours = jax.jit(zj.compress_collectives(f, compress=True))(i, v)
  for a, b in zip(ours, jax.jit(f)(i, v)):
    np.testing.assert_array_equal(_bits(a), _bits(b))


def test_while_loop_forward():
  """A while_loop's body (forward only: jax cannot reverse-differentiate one) is traced under the policy."""
  mesh = _mesh()

  def body(v):
    def step(c):
      return c[0] + 1, lax.ppermute(c[1], AXIS, RING)
    return lax.while_loop(lambda c: c[0] < 3, step, (0, v))[1]  # the same trip count everywhere

  f = jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS), check_vma=False)
  x = jnp.asarray((np.random.default_rng(1).standard_normal((N * 512,)) * 0.1).astype(BF16))
  ours = jax.jit(zj.compress_collectives(f, compress=True))
  assert "zipccl_encode" in ours.lower(x).compile().as_text()
  np.testing.assert_array_equal(_bits(ours(x)), _bits(jax.jit(f)(x)))


@pytest.mark.parametrize("check_vma", [False, True])
def test_psum_of_a_pytree(check_vma):
  """One jax.lax.psum of a pytree binds once per leaf (psum_p has one result in jax 0.10); each leaf
  comes back as an array, with jax.lax's structure and bits, and its own call site."""
  mesh = _mesh()
  rng = np.random.default_rng(2)
  a = jnp.asarray((rng.standard_normal((N * 64, 32)) * 0.1).astype(np.float32))
  b = jnp.asarray((rng.standard_normal((N * 16,)) * 0.1).astype(BF16))

  def body(a, b):
    return lax.psum({"a": a, "b": b}, AXIS)

  f = jax.shard_map(body, mesh=mesh, in_specs=(P(AXIS), P(AXIS)), out_specs=P(), check_vma=check_vma)
  zj.reset_stats()
  got = jax.jit(zj.compress_collectives(f, compress=True))(a, b)
  want = jax.jit(f)(a, b)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for k in ("a", "b"):
    np.testing.assert_array_equal(_bits(got[k]), _bits(want[k]))
  line = body.__code__.co_firstlineno + 1
  assert {f"psum@test_transform.py:{line}", f"psum@test_transform.py:{line}[1]"} <= set(zj.stats())


def test_compress_false_runs_the_raw_path(model):
  mesh, f, (w, x) = model
  hlo = jax.jit(zj.compress_collectives(f, compress=False)).lower(w, x).compile().as_text()
  assert "zipccl_encode" not in hlo
  np.testing.assert_array_equal(_bits(jax.jit(zj.compress_collectives(f, compress=False))(w, x)),
                                _bits(jax.jit(f)(w, x)))


def test_decorator_forms_and_errors():
  @zj.compress_collectives
  def a(v):
    return v + 1

  @zj.compress_collectives(compress=True, capacity=0.9)
  def b(v):
    return v * 2

  assert a(1) == 2 and b(2) == 4 and a.__name__ == "a"
  with pytest.raises(ValueError, match="compress must be True, False or 'auto'"):
    zj.compress_collectives(a, compress="yes")
  with pytest.raises(ValueError, match="transport"):
    zj.compress_collectives(a, transport="fast")
  with pytest.raises(TypeError, match="fn must be callable"):
    zj.compress_collectives(3)
  with pytest.raises(TypeError, match="capacity"):
    zj.compress_collectives(a, capacity={"x": 1})


def _ring_attention_module():
  """ringattention/ringattention_jax.py, loaded from the installed package by path: the package's
  __init__ reads jax.lib.xla_bridge, which jax 0.10 removed; the layer's own module is untouched."""
  import importlib.util
  spec = importlib.util.find_spec("ringattention")
  if spec is None:  # the [test] extra installs it
    pytest.fail("ringattention is not installed: pip install '.[test]'")
  path = next(iter(spec.submodule_search_locations)) + "/ringattention_jax.py"
  mod_spec = importlib.util.spec_from_file_location("ringattention_jax", path)
  mod = importlib.util.module_from_spec(mod_spec)
  mod_spec.loader.exec_module(mod)
  return mod


def test_ring_attention_from_pypi_unchanged():
  """Someone else's layer: `ringattention` (PyPI) -- a custom_vjp whose forward and backward scans
  pass K and V around the ring with jax.lax.ppermute -- transformed without editing it."""
  ra = _ring_attention_module()
  mesh = _mesh()
  rng = np.random.default_rng(3)
  b, t, h, d = 1, N * 32, 2, 32
  q, k, v = (jnp.asarray((rng.standard_normal((b, t, h, d)) * 0.3).astype(np.float32)) for _ in range(3))
  kw = dict(causal_block_size=None, query_chunk_size=16, key_chunk_size=16, deterministic=True,
            dropout_rng=None, attn_pdrop=0.0, dtype=jnp.float32, policy=jax.checkpoint_policies.nothing_saveable,
            precision=None, prevent_cse=True)

  def attn(q, k, v):
    return ra.ring_attention(q, k, v, None, None, None, AXIS, False, kw)

  spec = P(None, AXIS)
  f = jax.shard_map(attn, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)
  loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v) * jnp.cos(jnp.arange(t, dtype=jnp.float32))[:, None, None])
  ours = zj.compress_collectives(f, compress=True)
  np.testing.assert_array_equal(_bits(jax.jit(ours)(q, k, v)), _bits(jax.jit(f)(q, k, v)))
  got = jax.jit(jax.grad(loss(ours), argnums=(0, 1, 2)))(q, k, v)
  want = jax.jit(jax.grad(loss(f), argnums=(0, 1, 2)))(q, k, v)
  for a, w in zip(got, want):
    np.testing.assert_array_equal(_bits(a), _bits(w))
  hlo = jax.jit(jax.grad(loss(ours), argnums=(0, 1, 2))).lower(q, k, v).compile().as_text()
  assert hlo.count("zipccl_encode") >= 2  # the forward scan's and the backward scan's ppermutes


def test_psum_without_vma_checks_gives_an_array():
  """jax.lax.psum binds psum_p (one result, once per leaf) when shard_map does not check varying axes:
  the rewritten bind returns the array, not a one-element list, forward and under grad, with the
  documented sum's bits (compress=False: the same order uncoded)."""
  mesh = _mesh()
  x = jax.device_put((np.random.default_rng(3).standard_normal((N * 4, 256)) * 0.5).astype(BF16),
                     NamedSharding(mesh, P(AXIS)))
  f = jax.shard_map(lambda v: lax.psum(v, AXIS), mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS),
                    check_vma=False)
  ours = jax.jit(zj.compress_collectives(f, compress=True))(x)
  raw = jax.jit(zj.compress_collectives(f, compress=False))(x)
  assert isinstance(ours, jax.Array) and ours.shape == x.shape
  assert np.array_equal(_bits(ours), _bits(raw))

  def loss(g):
    return lambda v: jnp.sum(g(v).astype(jnp.float32) ** 2)
  got = jax.jit(jax.grad(loss(zj.compress_collectives(f, compress=True))))(x)
  want = jax.jit(jax.grad(loss(zj.compress_collectives(f, compress=False))))(x)
  assert got.shape == x.shape and np.array_equal(_bits(got), _bits(want))
