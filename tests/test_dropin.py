"""zipccl_jax as a drop-in for jax.lax's collectives (issue 16): one focused test per cause.

Wherever jax.lax's collectives work, ours must work too, with the same bits: data movement bit-identical to
jax.lax, reductions bit-identical to compress=False (the documented fixed-order float32 sum). The causes
these tests pin down were found by running JAX's own collective tests with ours swapped in
(tests/jax_suite/run.py).
"""
from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zj

pytestmark = pytest.mark.skipif(jax.device_count() < 8,
                                reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")

N = 8
PERM = tuple((j, (j + 1) % N) for j in range(N))
OPS = ("all_to_all", "all_gather", "psum_scatter", "psum", "ppermute")
MOVES = ("all_to_all", "ppermute")  # whose transposes move data too: jax.lax's bits even in grad


def bits(a):
  a = np.asarray(a)
  return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_bits(got, want, what=""):
  for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
    g, w = np.asarray(g), np.asarray(w)
    assert g.shape == w.shape and g.dtype == w.dtype, (what, g.shape, w.shape, g.dtype, w.dtype)
    bad = int(np.sum(bits(g) != bits(w)))
    assert bad == 0, f"{what}: {bad} of {g.size} elements differ in their bits"


@functools.lru_cache(None)
def mesh8():
  return jax.make_mesh((N,), ("i",))


def put(a, mesh=None):
  mesh = mesh or mesh8()
  return jax.device_put(a, NamedSharding(mesh, P(mesh.axis_names[0])))


def gaussian(shape, seed=0, dtype=np.float32):
  return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def collective(op, mod, **kw):
  """The per-device body `a -> op(a)` with `mod` (jax.lax or zipccl_jax) and keyword options `kw`."""
  f = getattr(mod, op)
  if op == "all_to_all":
    return lambda a: f(a, "i", 0, 0, tiled=True, **kw)
  if op == "all_gather":
    return lambda a: f(a, "i", tiled=True, **kw)
  if op == "psum_scatter":
    return lambda a: f(a, "i", scatter_dimension=0, tiled=True, **kw)
  if op == "psum":
    return lambda a: f(a, "i", **kw)
  return lambda a: f(a, "i", PERM, **kw)


def smap(body):
  return jax.jit(jax.shard_map(body, mesh=mesh8(), in_specs=P("i"), out_specs=P("i")))


def ours(op, compress=True):
  return smap(collective(op, zj, compress=compress))


def reference(op, *, grad=False):
  """jax.lax for data movement; compress=False (the documented order) where a reduction is involved."""
  if op in MOVES or (op == "all_gather" and not grad):
    return smap(collective(op, lax))
  return ours(op, compress=False)


X = gaussian((N * 16, 64), 1)
T = gaussian((N * 16, 64), 2)
XL = gaussian((N * 16, 512), 3)


# --------------------------------------------------------------------------------------------------------- #
# forward-mode autodiff: jvp, linearize, Hessian-vector products, all compressed
# --------------------------------------------------------------------------------------------------------- #

@pytest.mark.parametrize("op", OPS)
def test_jvp_gives_reference_bits(op):
  x, t = put(X), put(T)
  got = jax.jvp(ours(op), (x,), (t,))
  want = jax.jvp(reference(op), (x,), (t,))
  assert_bits(got, want, f"jvp {op}")


@pytest.mark.parametrize("op", OPS)
def test_linearize_gives_reference_bits(op):
  x, t = put(X), put(T)
  y, f_jvp = jax.linearize(ours(op), x)
  y_ref, f_jvp_ref = jax.linearize(reference(op), x)
  assert_bits((y, f_jvp(t)), (y_ref, f_jvp_ref(t)), f"linearize {op}")


@pytest.mark.parametrize("op", OPS)
def test_hessian_vector_product_gives_reference_bits(op):
  def hvp(f):
    loss = lambda x: jnp.sum(jnp.sin(f(x)) ** 2)
    return jax.jit(lambda x, v: jax.jvp(jax.grad(loss), (x,), (v,))[1])

  x, v = put(X), put(T)
  assert_bits(hvp(ours(op))(x, v), hvp(reference(op, grad=True))(x, v), f"hvp {op}")


@pytest.mark.parametrize("op", OPS)
def test_grad_of_grad_gives_reference_bits(op):
  def gg(f):
    loss = lambda x: jnp.sum(jnp.sin(f(x)) ** 2)
    return jax.jit(jax.grad(lambda x: jnp.sum(jax.grad(loss)(x) ** 2)))

  x = put(X)
  assert_bits(gg(ours(op))(x), gg(reference(op, grad=True))(x), f"grad of grad {op}")


def test_linear_transpose_is_the_compressed_transpose():
  x = put(X)
  got = jax.linear_transpose(ours("all_to_all"), x)(x)
  want = jax.linear_transpose(reference("all_to_all"), x)(x)
  assert_bits(got, want, "linear_transpose all_to_all")


# --------------------------------------------------------------------------------------------------------- #
# axes bound by jax.vmap(..., axis_name=): no wire, exactly jax.lax
# --------------------------------------------------------------------------------------------------------- #

VMAP_BODIES = {
    "all_to_all": lambda m, **kw: lambda x: m.all_to_all(x, "i", 0, 0, **kw),
    "all_gather": lambda m, **kw: lambda x: m.all_gather(x, "i", **kw),
    "psum": lambda m, **kw: lambda x: m.psum(x, "i", **kw),
    "ppermute": lambda m, **kw: lambda x: m.ppermute(x, "i", PERM, **kw),
}


@pytest.mark.parametrize("compress", ["auto", True])
@pytest.mark.parametrize("op", sorted(VMAP_BODIES))
def test_vmap_axis_name_is_jax_lax(op, compress):
  x = gaussian((N, N, 3), 3)
  got = jax.vmap(VMAP_BODIES[op](zj, compress=compress), axis_name="i")(x)
  want = jax.vmap(VMAP_BODIES[op](lax), axis_name="i")(x)
  assert_bits(got, want, f"vmap {op}")


def test_vmap_axis_name_under_grad_and_two_names():
  x = gaussian((2, N, N), 4)
  f = lambda m: lambda x: jnp.sum(jnp.sin(m.psum(x, ("j", "i"))))
  got = jax.vmap(jax.vmap(jax.grad(f(zj)), axis_name="i"), axis_name="j")(x)
  want = jax.vmap(jax.vmap(jax.grad(f(lax)), axis_name="i"), axis_name="j")(x)
  assert_bits(got, want, "vmap(vmap(grad(psum)))")


# --------------------------------------------------------------------------------------------------------- #
# axis_index_groups inside shard_map
# --------------------------------------------------------------------------------------------------------- #

GROUPS = {"halves": [[0, 1, 2, 3], [4, 5, 6, 7]], "interleaved": [[0, 2, 4, 6], [1, 3, 5, 7]]}


def grouped(op, mod, groups, **kw):
  f = getattr(mod, op)
  if op == "all_to_all":
    return smap(lambda a: f(a, "i", 0, 0, axis_index_groups=groups, tiled=True, **kw))
  if op == "all_gather":
    return smap(lambda a: f(a, "i", axis_index_groups=groups, tiled=True, **kw))
  return smap(lambda a: f(a, "i", scatter_dimension=0, axis_index_groups=groups, tiled=True, **kw))


@pytest.mark.parametrize("compress", ["auto", True])
@pytest.mark.parametrize("groups", sorted(GROUPS))
@pytest.mark.parametrize("op", ["all_to_all", "all_gather"])
def test_axis_index_groups_data_movement_is_jax_lax(op, groups, compress):
  x = put(gaussian((N * 8, 32), 6))
  g = GROUPS[groups]
  assert_bits(grouped(op, zj, g, compress=compress)(x), grouped(op, lax, g)(x), f"{op} {groups}")


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("groups", sorted(GROUPS))
def test_axis_index_groups_psum_scatter_is_documented_order(groups, compress):
  g = GROUPS[groups]
  x = gaussian((N * 8, 32), 7)
  got = np.asarray(grouped("psum_scatter", zj, g, compress=compress)(put(x)))
  blocks = x.reshape(N, 8, 32)
  want = np.empty((N, 2, 32), np.float32)
  for members in g:
    acc = blocks[members[0]].astype(np.float32)
    for r in members[1:]:  # ascending position in the group, float32, one rounding (a no-op here)
      acc = acc + blocks[r].astype(np.float32)
    for pos, r in enumerate(members):
      want[r] = acc[2 * pos:2 * pos + 2]
  assert_bits(got, want.reshape(N * 2, 32), f"psum_scatter {groups}")


def test_axis_index_groups_psum_raises_like_jax_lax():
  x = put(gaussian((N, 4), 8))
  g = GROUPS["halves"]
  with pytest.raises(NotImplementedError):
    smap(lambda a: lax.psum(a, "i", axis_index_groups=g))(x)
  with pytest.raises(NotImplementedError):
    smap(lambda a: zj.psum(a, "i", axis_index_groups=g, compress=True))(x)


# --------------------------------------------------------------------------------------------------------- #
# runtime statistics must not change what a program may do
# --------------------------------------------------------------------------------------------------------- #

@contextlib.contextmanager
def runtime_stats():
  prev = zj.set_runtime_stats(True)
  try:
    yield
  finally:
    zj.set_runtime_stats(prev)


def _loss(mod, **kw):
  f = smap(collective("all_to_all", mod, **kw))
  return lambda x: jnp.sum(jnp.sin(f(x)) ** 2)


def test_runtime_stats_under_remat():
  x = put(X)
  want = jax.jit(jax.grad(jax.checkpoint(_loss(zj, compress=True))))(x)
  with runtime_stats():
    got = jax.jit(jax.grad(jax.checkpoint(_loss(zj, compress=True, name="dropin/remat"))))(x)
  assert_bits(got, want, "remat")
  assert zj.stats()["dropin/remat"].calls > 0


def test_runtime_stats_with_enable_checks():
  x = put(X)
  with runtime_stats(), jax.enable_checks(True):
    got = jax.jit(jax.grad(_loss(zj, compress=True, name="dropin/checks")))(x)
  assert_bits(got, jax.jit(jax.grad(_loss(zj, compress=True)))(x), "enable_checks")


def test_runtime_stats_inside_custom_jvp():
  inner = _loss(zj, compress=True, name="dropin/custom_jvp")

  @jax.custom_jvp
  def f(x):
    return inner(x)

  @f.defjvp
  def f_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return f(x), jnp.sum(jax.grad(inner)(x) * t)

  x = put(X)
  with runtime_stats():
    got = jax.jit(jax.grad(f))(x)
  assert_bits(got, jax.jit(jax.grad(_loss(zj, compress=True)))(x), "custom_jvp")


def test_runtime_stats_in_partially_automatic_shard_map():
  mesh = jax.make_mesh((4, 2), ("i", "j"), axis_types=(AxisType.Auto, AxisType.Auto))
  x = jax.device_put(gaussian((N * 4, 16), 9), NamedSharding(mesh, P("i", "j")))

  def f(mod, **kw):
    body = lambda a: mod.all_gather(a, "i", tiled=True, **kw)
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                                 axis_names={"i"}))

  with runtime_stats():
    got = f(zj, compress=True, name="dropin/partial_auto")(x)
  assert_bits(got, f(lax)(x), "partial-auto shard_map")


# --------------------------------------------------------------------------------------------------------- #
# the newer shard_map types: reduced / unreduced
# --------------------------------------------------------------------------------------------------------- #

def _explicit_mesh():
  return jax.make_mesh((N,), ("i",), axis_types=(AxisType.Explicit,))


@pytest.mark.parametrize("mod", [lax, zj], ids=["lax", "zipccl"])
def test_psum_scatter_of_unreduced_input(mod):
  mesh = _explicit_mesh()
  x = jax.device_put(gaussian((N * 8, 4), 10), NamedSharding(mesh, P("i")))
  # a varying value declared unreduced (partial sums) by pcast: shard_map itself casts it implicitly only
  # before jax 0.11
  partial = jax.shard_map(lambda a: lax.pcast(a, "i", to="unreduced"), mesh=mesh, in_specs=P("i"),
                          out_specs=P(unreduced={"i"}))

  def rs(a):
    out = mod.psum_scatter(a, "i", tiled=True)
    assert out.aval.mat.varying == {"i"} and out.aval.mat.unreduced == frozenset()
    return out

  f = jax.jit(lambda x: jax.shard_map(rs, mesh=mesh, in_specs=P(unreduced={"i"}),
                                      out_specs=P("i"))(partial(x)))
  got = f(x)
  blocks = np.asarray(x).reshape(N, 8, 4)
  acc = blocks[0].astype(np.float32)
  for r in range(1, N):
    acc = acc + blocks[r]
  if mod is zj:  # the documented order; jax.lax's is XLA's
    assert_bits(got, acc, "psum_scatter(unreduced)")
  else:
    np.testing.assert_allclose(np.asarray(got), acc, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mod", [lax, zj], ids=["lax", "zipccl"])
def test_all_gather_to_reduced(mod):
  mesh = _explicit_mesh()
  x = jax.device_put(gaussian((N * 2, 4), 11), NamedSharding(mesh, P("i")))

  def ag(a):
    out = mod.all_gather(a, "i", tiled=True, to="reduced")
    assert out.aval.mat.reduced == {"i"} and out.aval.mat.varying == frozenset()
    return out

  f = jax.jit(jax.shard_map(ag, mesh=mesh, in_specs=P("i"), out_specs=P(None, reduced={"i"})))
  assert_bits(f(x), np.asarray(x), "all_gather(to='reduced')")


# --------------------------------------------------------------------------------------------------------- #
# symbolic shapes and jax.export
# --------------------------------------------------------------------------------------------------------- #

def test_symbolic_shapes_go_raw_through_jax_lax():
  """A symbolic shape runs jax.lax's collective as called: the exported module gives its bits, and where
  jax.lax's own export fails to run (jax 0.11+: all_gather and psum_scatter with a symbolic dimension,
  "Error refining shapes"), ours fails alike."""
  (b,) = jax.export.symbolic_shape("b")
  spec = jax.ShapeDtypeStruct((N * N * b, 16), jnp.float32,
                              sharding=NamedSharding(mesh8(), P("i")))
  x = put(gaussian((N * N * 3, 16), 12))

  def run(f):
    try:
      return jax.export.export(f)(spec).call(x), None
    except Exception as e:  # jax's error, whatever its type
      return None, e

  for op in OPS:
    got, err = run(ours(op, compress="auto"))
    want, lax_err = run(smap(collective(op, lax)))
    assert (err is None) == (lax_err is None), (op, err, lax_err)
    if lax_err is not None:
      assert type(err) is type(lax_err) and str(err).splitlines()[0] == str(lax_err).splitlines()[0], op
      continue
    assert_bits(got, reference(op)(x), f"export symbolic {op}")
    if op in MOVES or op == "all_gather":
      assert_bits(got, want, f"export symbolic {op} vs jax.lax")


@pytest.mark.parametrize("op", OPS)
def test_export_of_compressed_code_round_trips(op):
  f = ours(op, compress=True)
  x = put(XL)  # chunks of 1024 elements: X's 128-element all_to_all chunks would not shrink, so they go raw
  exp = jax.export.export(f, disabled_checks=zj.export_disabled_checks())(x)
  assert any(t in exp.mlir_module() for t in ("zipccl_encode", "zipccl_decode"))
  again = jax.export.deserialize(exp.serialize())
  assert_bits(again.call(x), f(x), f"export {op}")


def test_export_without_the_disabled_checks_names_the_targets():
  with pytest.raises(ValueError, match="zipccl_encode"):
    jax.export.export(ours("all_gather"))(put(X))


# --------------------------------------------------------------------------------------------------------- #
# smaller differences
# --------------------------------------------------------------------------------------------------------- #

@pytest.mark.parametrize("op", OPS)
def test_unbound_axis_raises_like_jax_lax(op):
  with pytest.raises(NameError) as want:
    jax.jit(collective(op, lax))(jnp.zeros((N, 4)))
  with pytest.raises(NameError) as got:
    jax.jit(collective(op, zj))(jnp.zeros((N, 4)))
  assert str(got.value).splitlines()[0] == str(want.value).splitlines()[0]
  assert "unbound axis name" in str(got.value)


@pytest.mark.parametrize("perm", [[(0, 0)], []])
@pytest.mark.parametrize("compress", ["auto", True])
def test_ppermute_on_an_axis_of_size_one(perm, compress):
  mesh = jax.make_mesh((1, N), ("a", "i"))
  spec = P(("a", "i"))
  x = jax.device_put(gaussian((N * 2, 4), 13), NamedSharding(mesh, spec))

  def f(mod, **kw):
    return jax.jit(jax.shard_map(lambda a: mod.ppermute(a, "a", perm, **kw), mesh=mesh,
                                 in_specs=spec, out_specs=spec))

  assert_bits(f(zj, compress=compress)(x), f(lax)(x), f"ppermute size-1 {perm}")


def test_ppermute_on_an_axis_of_size_one_traces_what_jax_lax_traces():
  mesh = jax.make_mesh((1, N), ("a", "i"))
  spec = P(("a", "i"))
  x = jax.device_put(gaussian((N * 2, 4), 13), NamedSharding(mesh, spec))
  perm = ((1, 0), (0, 1))  # out of range for a size-1 axis: jax.lax traces it (roofline_test does)
  for mod in (lax, zj):
    jax.jit(jax.shard_map(lambda a: mod.ppermute(a, "a", perm), mesh=mesh, in_specs=spec,
                          out_specs=spec)).trace(x)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.uint8])
def test_compress_true_sends_other_dtypes_through_jax_lax(dtype):
  x = put((np.arange(N * N * 3) % 5).reshape(N * N, 3).astype(dtype))
  for op in ("all_to_all", "all_gather", "ppermute"):
    assert_bits(ours(op, compress=True)(x), reference(op)(x), f"{op} {np.dtype(dtype).name}")


@pytest.mark.parametrize("compress", [False, True])
def test_pmean_is_the_documented_sum_over_n(compress):
  x = gaussian((N * 4, 8), 14)
  got = smap(lambda a: zj.pmean(a, "i", compress=compress))(put(x))
  blocks = x.reshape(N, 4, 8)
  acc = blocks[0].astype(np.float32)
  for r in range(1, N):
    acc = acc + blocks[r]
  assert_bits(got, np.tile(acc / np.float32(N), (N, 1)), "pmean")


@pytest.mark.parametrize("tiled", [False, True])
def test_all_gather_invariant_is_all_gather_to_invarying(tiled):
  x = put(gaussian((N * 2, 4), 15))

  def f(body):
    return jax.jit(jax.shard_map(body, mesh=mesh8(), in_specs=P("i"), out_specs=P()))

  got = f(lambda a: zj.all_gather_invariant(a, "i", axis=0, tiled=tiled, compress=True))(x)
  want = f(lambda a: lax.all_gather(a, "i", axis=0, tiled=tiled, to="invarying"))(x)
  assert_bits(got, want, "all_gather_invariant")


def test_use_defaults_sets_compress_and_capacity_once():
  x = put(X)
  with zj.use_defaults(compress=True, capacity=0.9):
    smap(lambda a: zj.all_gather(a, "i", tiled=True, name="dropin/defaults_on"))(x)
    with zj.use_defaults(compress=False):
      smap(lambda a: zj.all_gather(a, "i", tiled=True, name="dropin/defaults_off"))(x)
  smap(lambda a: zj.all_gather(a, "i", tiled=True, compress=True, name="dropin/after"))(x)
  s = zj.stats()
  on, off, after = s["dropin/defaults_on"], s["dropin/defaults_off"], s["dropin/after"]
  assert on.compressed and not off.compressed and after.compressed
  assert on.capacity == zj.padded_capacity(X.size // N, np.float32, ratio=0.9)
  assert after.capacity == zj.padded_capacity(X.size // N, np.float32)
