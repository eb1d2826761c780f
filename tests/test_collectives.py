"""zipccl_jax collectives on 8 virtual CPU devices (tests/conftest.py sets the device count).

Data-movement collectives (all_to_all, all_gather, ppermute) must be bit-identical to jax.lax (uint views,
np.array_equal); reductions (psum_scatter, psum) must equal the documented fixed-order float32 reduction
exactly, be bit-identical between compress=True and compress=False, and agree with jax.lax within rounding.
Each mesh compiles one function holding every collective (compiles dominate the run time on 2 cores) and
runs it on Gaussian, corpus and adversarial (random-bits, overflowing) data.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zj
import zipccl_jax as zc  # the public API (stats, capacities, collectives)
from zipccl_jax import _compat, accounting, capacity

BF16 = np.dtype(ml_dtypes.bfloat16)
DATA_DIR = Path(__file__).resolve().parent / "data"
R, M = 8, 1024  # per-device block (rows, cols); global arrays are (8 * R, M)

pytestmark = pytest.mark.skipif(jax.device_count() < 8,
                                reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")

# id -> (mesh shape, mesh axis names, collective axis_name)
MESHES = {
    "n8": ((8,), ("i",), "i"),
    "n8_2x4_a": ((2, 4), ("a", "b"), "a"),
    "n8_2x4_b": ((2, 4), ("a", "b"), "b"),
    "n8_4x2_a": ((4, 2), ("a", "b"), "a"),
    "n8_4x2_b": ((4, 2), ("a", "b"), "b"),
    "n8_2x4_ab": ((2, 4), ("a", "b"), ("a", "b")),
    # a tuple against the mesh's order: ppermute numbers its ranks in the mesh's order, the others in the
    # tuple's (a coded ppermute indexed its receivers by axis_index and failed to decode here)
    "n8_2x4_ba": ((2, 4), ("a", "b"), ("b", "a")),
}
DATASETS = ("gaussian", "corpus", "adversarial")
MOVE_OPS = ("all_to_all", "all_gather", "ppermute")
REDUCE_OPS = ("psum_scatter", "psum")


# --------------------------------------------------------------------------------------------------------- #
# data
# --------------------------------------------------------------------------------------------------------- #

def bits(a):
  a = np.asarray(a)
  return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_bits_equal(got, want, what=""):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype,
                                                               want.dtype)
  bad = int(np.sum(bits(got) != bits(want)))
  assert bad == 0, f"{what}: {bad} of {got.size} elements differ bitwise"


def _corpus_bf16(n: int) -> np.ndarray:
  """n BF16 values from the corpus slices in tests/data, or a corpus-like synthetic stand-in."""
  parts = []
  for f in sorted(DATA_DIR.glob("*.npy")):
    a = np.load(f)
    if "bf16" in f.name and a.dtype == np.uint16:
      parts.append(a.ravel().view(BF16))
    elif a.dtype == BF16:
      parts.append(a.ravel())
    elif a.dtype == np.float32 and "fp32" in f.name:
      parts.append(a.ravel().astype(BF16))
  if parts:
    # device-sized blocks taken from each slice in turn, so every mesh sees every kind of tensor
    blk = R * M
    parts = [np.resize(np.where(np.isfinite(a.astype(np.float32)), a, np.zeros_like(a)), n)
             for a in parts]
    nblk = -(-n // blk)
    flat = np.concatenate([parts[b % len(parts)][(b // len(parts)) * blk:(b // len(parts) + 1) * blk]
                           for b in range(nblk)])
    return flat[:n]
  # stand-in: near-Gaussian activations, heavy-tailed rows, 21% exact zeros (MoE capacity padding)
  rng = np.random.default_rng(7)
  x = rng.standard_normal(n) * 0.05
  x[: n // 4] *= rng.standard_t(3, n // 4)
  x[rng.random(n) < 0.21] = 0
  return x.astype(BF16)


@functools.lru_cache(None)
def dataset(kind: str, shape=(8 * R, M)) -> np.ndarray:
  n = math.prod(shape)
  rng = np.random.default_rng({"gaussian": 0, "corpus": 1, "adversarial": 2}[kind])
  if kind == "gaussian":
    x = (rng.standard_normal(n) * 0.02).astype(BF16)
  elif kind == "corpus":
    x = _corpus_bf16(n)
  else:
    # random sign and mantissa, exponents over 41 values: finite, incompressible below the capacity, and
    # sums stay finite (every collective overflows and falls back)
    sign = rng.integers(0, 2, n, dtype=np.uint16) << 15
    expo = rng.integers(100, 141, n, dtype=np.uint16) << 7
    mant = rng.integers(0, 128, n, dtype=np.uint16)
    x = (sign | expo | mant).view(BF16)
  return np.asarray(x).reshape(shape)


def nan_bits(shape=(8 * R, M)) -> np.ndarray:
  """Uniformly random 16-bit patterns, NaN payloads included."""
  rng = np.random.default_rng(3)
  return rng.integers(0, 2**16, size=shape, dtype=np.uint16).view(BF16)


# --------------------------------------------------------------------------------------------------------- #
# meshes and references
# --------------------------------------------------------------------------------------------------------- #

def _axes(axis):
  return axis if isinstance(axis, tuple) else (axis,)


@functools.lru_cache(None)
def mesh_of(mesh_id):
  shape, names, _ = MESHES[mesh_id]
  return jax.make_mesh(shape, names)


def put(mesh, a):
  return jax.device_put(a, NamedSharding(mesh, P(mesh.axis_names)))


def smap(mesh, body, out_specs=None, **kw):
  spec = P(mesh.axis_names)
  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec,
                               out_specs=spec if out_specs is None else out_specs, **kw))


def to_groups(glob, mesh_id):
  """Global (ndev*R', ...) -> (n, G, R', ...): member r (rank along the collective axis) of group g."""
  shape, names, axis = MESHES[mesh_id]
  bl = glob.reshape(shape + (-1,) + glob.shape[1:])
  idx = [names.index(a) for a in _axes(axis)]
  other = [i for i in range(len(names)) if i not in idx]
  nb = glob.ndim
  t = np.transpose(bl, idx + other + list(range(len(names), len(names) + nb)))
  n = math.prod(shape[i] for i in idx)
  return t.reshape((n, -1) + t.shape[len(names):])


def from_groups(g, mesh_id):
  """Inverse of to_groups."""
  shape, names, axis = MESHES[mesh_id]
  idx = [names.index(a) for a in _axes(axis)]
  other = [i for i in range(len(names)) if i not in idx]
  order = idx + other
  t = g.reshape(tuple(shape[i] for i in order) + g.shape[2:])
  inv = np.argsort(order + [])
  nb = g.ndim - 2
  t = np.transpose(t, list(inv) + list(range(len(names), len(names) + nb)))
  return t.reshape((-1,) + g.shape[3:])


def ordered_sum(g):
  """The documented reduction: float32 additions in ascending rank order, one rounding."""
  acc = g[0].astype(np.float32)
  for r in range(1, g.shape[0]):
    acc = acc + g[r].astype(np.float32)
  return acc.astype(g.dtype)


def ref_psum(glob, mesh_id):
  g = to_groups(glob, mesh_id)
  s = ordered_sum(g)
  return from_groups(np.broadcast_to(s, g.shape), mesh_id)


def ref_psum_scatter(glob, mesh_id):
  g = to_groups(glob, mesh_id)  # (n, G, R, M)
  n = g.shape[0]
  s = ordered_sum(g)  # (G, R, M)
  k = s.shape[1] // n
  out = np.stack([s[:, r * k:(r + 1) * k] for r in range(n)])  # (n, G, R/n, M)
  return from_groups(out, mesh_id)


def ref_all_to_all(glob, mesh_id):
  g = to_groups(glob, mesh_id)  # (n, G, R, M)
  n = g.shape[0]
  k = g.shape[2] // n
  out = np.stack([np.concatenate([g[s, :, r * k:(r + 1) * k] for s in range(n)], axis=1)
                  for r in range(n)])
  return from_groups(out, mesh_id)


# --------------------------------------------------------------------------------------------------------- #
# one compiled function per mesh: every collective, zipccl and jax.lax
# --------------------------------------------------------------------------------------------------------- #

def _ring(n):
  return [(i, (i + 1) % n) for i in range(n)]


def _bodies(axis, n, tag):
  ring = _ring(n)
  on = dict(compress=True)
  return {
      "all_to_all": (lambda v: zj.all_to_all(v, axis, 0, 0, tiled=True, **on, name=f"{tag}all_to_all"),
                     lambda v: lax.all_to_all(v, axis, 0, 0, tiled=True)),
      "all_gather": (lambda v: zj.all_gather(v, axis, tiled=True, **on, name=f"{tag}all_gather"),
                     lambda v: lax.all_gather(v, axis, tiled=True)),
      "ppermute": (lambda v: zj.ppermute(v, axis, ring, **on, name=f"{tag}ppermute"),
                   lambda v: lax.ppermute(v, axis, ring)),
      "psum_scatter": (lambda v: zj.psum_scatter(v, axis, tiled=True, **on, name=f"{tag}psum_scatter"),
                       lambda v: lax.psum_scatter(v, axis, tiled=True),
                       lambda v: zj.psum_scatter(v, axis, tiled=True, compress=False, fixed_order=True)),
      "psum": (lambda v: zj.psum(v, axis, **on, name=f"{tag}psum"),
               lambda v: lax.psum(v, axis),
               lambda v: zj.psum(v, axis, compress=False, fixed_order=True)),
  }





@functools.lru_cache(None)
def results(mesh_id):
  """{dataset: {op: tuple of global numpy outputs}} for one mesh, one compile.

  out["sites"] holds the call sites' statistics (capacity, axis size) for _check_paths. Runtime counters
  stay off here; test_runtime_stats_count_fallbacks covers them.
  """
  shape, names, axis = MESHES[mesh_id]
  mesh = mesh_of(mesh_id)
  n = math.prod(mesh.shape[a] for a in _axes(axis))
  tag = f"test:{mesh_id}:"
  bodies = _bodies(axis, n, tag)
  ops = list(bodies)

  def body(v):
    return tuple(tuple(f(v) for f in bodies[op]) for op in ops)

  # psum outputs are invariant over the collective axis; out_specs over all axes just tiles the copies
  f = smap(mesh, body)
  out = {}
  for kind in DATASETS:
    with _compat.ppermute_in_any_order():  # n8_2x4_ba: jax.lax.ppermute over a tuple out of the mesh's order
      res = f(put(mesh, dataset(kind)))
    out[kind] = {op: tuple(np.asarray(r) for r in rs) for op, rs in zip(ops, res)}
  out["sites"] = {k[len(tag):]: v for k, v in zc.stats().items() if k.startswith(tag)}
  out["decisions"] = {k[len(tag):]: v for k, v in zc.decisions().items() if k.startswith(tag)}
  return out


def _check_paths(mesh_id, op):
  """Gaussian chunks fit the call site's capacity (coded path), adversarial ones never do (fallback)."""
  site = results(mesh_id)["sites"][op]
  assert site.compressed and site.capacity > 0
  n = site.axis_size
  m = math.prod(site.shape) // (1 if op in ("all_gather", "ppermute") else n)
  if op == "psum":  # the frame of psum's algorithm: the message for gather-sum (the model's pick for n=2)
    m = results(mesh_id)["decisions"][op].chunk_elems
  for kind, fits in (("gaussian", True), ("adversarial", False)):
    chunks = dataset(kind).reshape(-1, m)
    _, nbytes = zj.codec.encode_frames(jnp.asarray(chunks), capacity=site.capacity)
    nbytes = np.asarray(nbytes)
    assert (nbytes <= site.capacity).all() if fits else (nbytes > site.capacity).all(), (
        mesh_id, op, kind, site.capacity, nbytes.min(), nbytes.max())


@pytest.mark.parametrize("mesh_id", list(MESHES))
@pytest.mark.parametrize("op", MOVE_OPS)
def test_data_movement_bit_identical(mesh_id, op):
  for kind in DATASETS:
    ours, ref = results(mesh_id)[kind][op]
    assert_bits_equal(ours, ref, f"{op} {mesh_id} {kind}")
  _check_paths(mesh_id, op)
  if op == "all_to_all":
    assert_bits_equal(results(mesh_id)["gaussian"][op][0], ref_all_to_all(dataset("gaussian"), mesh_id),
                      "all_to_all vs numpy")


@pytest.mark.parametrize("mesh_id", list(MESHES))
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduction_documented_order(mesh_id, op):
  ref_fn = ref_psum if op == "psum" else ref_psum_scatter
  for kind in DATASETS:
    ours, lax_out, raw = results(mesh_id)[kind][op]
    want = ref_fn(dataset(kind), mesh_id)
    assert_bits_equal(ours, want, f"{op} {mesh_id} {kind} vs documented reduction")
    assert_bits_equal(ours, raw, f"{op} {mesh_id} {kind}: compress=True vs compress=False")
    # jax.lax rounds as XLA likes: equal up to the rounding of the sum
    n = math.prod(mesh_of(mesh_id).shape[a] for a in _axes(MESHES[mesh_id][2]))
    tol = n * float(np.max(np.abs(dataset(kind).astype(np.float32)))) * 2.0**-8
    np.testing.assert_allclose(ours.astype(np.float32), lax_out.astype(np.float32), rtol=0, atol=tol)
  _check_paths(mesh_id, op)


@pytest.mark.parametrize("mesh_id", ["n8_2x4_a", "n8_4x2_b"])
def test_fallback_in_one_group_only(mesh_id):
  """Only the collective groups holding random bits fall back; the others stay coded. The collectives
  must still match up (ppermute's decision is global, the others' per group) and results stay exact."""
  shape, names, axis = MESHES[mesh_id]
  mesh = mesh_of(mesh_id)
  n = mesh.shape[axis]
  x = dataset("gaussian").copy().reshape(shape + (R, M))
  adv = dataset("adversarial").reshape(shape + (R, M))
  other = 1 - names.index(axis)
  idx = [slice(None)] * 2
  idx[other] = 0  # the first group along the other axis
  x[tuple(idx)] = adv[tuple(idx)]
  x = x.reshape(-1, M)
  bodies = _bodies(axis, n, f"group:{mesh_id}:")
  ops = list(bodies)
  f = smap(mesh, lambda v: tuple(tuple(fn(v) for fn in bodies[op][:2]) for op in ops))
  for op, (ours, ref) in zip(ops, f(put(mesh, x))):
    if op in MOVE_OPS:
      assert_bits_equal(ours, ref, f"{op} {mesh_id}")
    else:
      want = (ref_psum if op == "psum" else ref_psum_scatter)(x, mesh_id)
      assert_bits_equal(ours, want, f"{op} {mesh_id}")


# --------------------------------------------------------------------------------------------------------- #
# more signatures on n8 and the tuple-axis mesh: non-tiled forms, other axes, pytrees, partial perms
# --------------------------------------------------------------------------------------------------------- #

def _variant_bodies(axis, n):
  def a2a_untiled(m):
    def f(v):
      y = v.reshape(n, -1, M)  # split_axis 0 of size n
      y = m.all_to_all(y, axis, 0, 1, **kw(m))  # -> (R/n, n, M)
      return y.reshape(-1, M)
    return f

  def a2a_axis1(m):
    return lambda v: m.all_to_all(v, axis, 1, 0, tiled=True, **kw(m))  # (R, M) -> (R*n, M/n)

  def ag_untiled_axis1(m):
    return lambda v: m.all_gather(v, axis, axis=1, **kw(m)).reshape(R, -1)

  def rs_untiled_dim1(m):
    def f(v):
      y = m.psum_scatter(v.reshape(R, n, -1), axis, scatter_dimension=1, **kw(m))  # (R, M/n)
      return y
    return f

  def pp_partial(m):
    return lambda v: m.ppermute(v, axis, [(0, n - 1), (1, 0)], **kw(m))

  def pytree(m):
    def f(v):
      t = m.all_to_all({"a": v, "b": v[:, :256] * 2}, axis, 0, 0, tiled=True, **kw(m))
      return jnp.concatenate([t["a"], t["b"]], axis=1)
    return f

  def kw(m):
    return {"compress": True} if m is zj else {}

  return {"a2a_untiled": a2a_untiled, "a2a_axis1": a2a_axis1, "ag_untiled_axis1": ag_untiled_axis1,
          "rs_untiled_dim1": rs_untiled_dim1, "pp_partial": pp_partial, "pytree": pytree}


@pytest.mark.parametrize("transport", ["padded", "ragged"])
def test_ppermute_over_a_tuple_against_the_mesh_order(transport):
  """ppermute over ("b", "a") of an ("a", "b") mesh: its pairs number the ranks as the running jax.lax
  does (jax 0.10.2: in the mesh's order, unlike axis_index; jax 0.11+, where jax.lax allows the order:
  in the tuple's), so the coded path's receiver table and the ragged transport's send and receive sizes
  are indexed with that numbering. Partial perms (some ranks receive nothing), both transports, every bit."""
  mesh, axis = mesh_of("n8_2x4_ba"), ("b", "a")
  x = put(mesh, dataset("gaussian"))
  for perm in ([(0, 1), (1, 2)], [(5, 0), (0, 5), (2, 7)], [(i, (i + 3) % 8) for i in range(8)]):
    f = smap(mesh, lambda v: (zj.ppermute(v, axis, perm, compress=True, transport=transport),
                              lax.ppermute(v, axis, perm)))
    with _compat.ppermute_in_any_order():
      ours, ref = f(x)
    assert_bits_equal(ours, ref, f"{perm} {transport}")


def test_ppermute_out_of_the_mesh_order_fails_where_jax_lax_fails():
  """By default jax 0.11+ refuses ppermute over a tuple out of the mesh's order (0.10.2 accepts it): the
  drop-in accepts and refuses exactly what jax.lax does, and its error names the mesh's order."""
  mesh, axis = mesh_of("n8_2x4_ba"), ("b", "a")
  x = put(mesh, dataset("gaussian"))

  def error(m):
    try:
      jax.jit(smap(mesh, lambda v: m.ppermute(v, axis, _ring(8)))).lower(x)
    except (ValueError, RuntimeError) as e:
      return e
    return None

  ours, ref = error(zj), error(lax)
  assert (ours is None) == (ref is None) == (not _compat.ppermute_rejects_unsorted_tuple()), (ours, ref)
  if ours is not None:
    assert "not in the mesh's order ('a', 'b')" in str(ours) and "ppermute" in str(ref)


@pytest.mark.parametrize("mesh_id", ["n8", "n8_2x4_ab", "n8_2x4_ba"])
def test_variants_bit_identical(mesh_id):
  mesh = mesh_of(mesh_id)
  axis = MESHES[mesh_id][2]
  n = math.prod(mesh.shape[a] for a in _axes(axis))
  variants = _variant_bodies(axis, n)
  names = list(variants)

  def body(v):
    return tuple((variants[k](zj)(v), variants[k](lax)(v)) for k in names)

  f = smap(mesh, body)
  for kind in ("gaussian", "adversarial"):
    with _compat.ppermute_in_any_order():
      res = f(put(mesh, dataset(kind)))
    for k, (ours, ref) in zip(names, res):
      if k == "rs_untiled_dim1":
        np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(ref, np.float32),
                                   rtol=2**-7, atol=1e-6, err_msg=f"{k} {kind}")
      else:
        assert_bits_equal(ours, ref, f"{k} {mesh_id} {kind}")


def test_nan_payloads_survive():
  """Random 16-bit patterns (NaN payloads included) fall back to a raw path that moves bits, so they
  arrive intact (XLA:CPU's own BF16 all-to-all widens to F32 and may rewrite NaNs)."""
  mesh = mesh_of("n8")
  x = nan_bits()
  f = smap(mesh, lambda v: (zj.all_to_all(v, "i", 0, 0, tiled=True, compress=True),
                            zj.all_gather(v, "i", tiled=True, compress=True),
                            zj.all_to_all(v, "i", 0, 0, tiled=True, compress=False)))
  a2a, ag, a2a_raw = f(put(mesh, x))
  assert_bits_equal(a2a, ref_all_to_all(x, "n8"), "all_to_all")
  assert_bits_equal(a2a_raw, ref_all_to_all(x, "n8"), "all_to_all compress=False")
  assert_bits_equal(ag, np.tile(x, (8, 1)), "all_gather")


def test_float32_and_float16():
  mesh = mesh_of("n8")
  rng = np.random.default_rng(5)
  for dt in (np.float32, np.float16):
    x = (rng.standard_normal((8 * R, M)) * 0.02).astype(dt)
    f = smap(mesh, lambda v: (zj.all_to_all(v, "i", 0, 0, tiled=True, compress=True),
                              lax.all_to_all(v, "i", 0, 0, tiled=True),
                              zj.psum(v, "i", compress=True)))
    a, b, s = f(put(mesh, x))
    assert_bits_equal(a, b, np.dtype(dt).name)
    assert_bits_equal(s, ref_psum(x, "n8"), f"psum {np.dtype(dt).name}")


# --------------------------------------------------------------------------------------------------------- #
# gradients
# --------------------------------------------------------------------------------------------------------- #

def _grad_bodies(axis, n):
  ring = _ring(n)
  return {
      "all_to_all": lambda m, v, **k: m.all_to_all(v, axis, 0, 0, tiled=True, **k),
      "all_gather": lambda m, v, **k: m.all_gather(v, axis, tiled=True, **k),
      "ppermute": lambda m, v, **k: m.ppermute(v, axis, ring, **k),
      "psum_scatter": lambda m, v, **k: m.psum_scatter(v, axis, tiled=True, **k),
      "psum": lambda m, v, **k: m.psum(v, axis, **k),
  }


@pytest.mark.parametrize("mesh_id", ["n8", "n8_2x4_b"])
def test_grad_matches_lax(mesh_id):
  mesh = mesh_of(mesh_id)
  axis = MESHES[mesh_id][2]
  n = math.prod(mesh.shape[a] for a in _axes(axis))
  bodies = _grad_bodies(axis, n)
  spec = P(mesh.axis_names)
  rng = np.random.default_rng(11)
  x = put(mesh, dataset("gaussian"))

  def grads(v, w):
    out = []
    for op, b in bodies.items():
      for m, kw in ((zj, {"compress": True}), (lax, {})):
        def loss(v, b=b, m=m, kw=kw):
          y = jax.shard_map(lambda u: b(m, u, **kw), mesh=mesh, in_specs=spec,
                            out_specs=P() if op == "psum" and len(mesh.axis_names) == 1 else spec)(v)
          ww = w[: y.size].reshape(y.shape)
          return jnp.sum(y.astype(jnp.float32) * ww)
        out.append(jax.grad(loss)(v))
    return out

  wsize = 8 * R * M * 8
  w = jnp.asarray(rng.standard_normal(wsize).astype(np.float32))
  gs = jax.jit(grads)(x, w)
  for i, op in enumerate(bodies):
    ours, ref = np.asarray(gs[2 * i]), np.asarray(gs[2 * i + 1])
    if op == "all_gather":  # transpose is a reduction: documented order vs XLA's
      np.testing.assert_allclose(ours.astype(np.float32), ref.astype(np.float32), rtol=2**-7,
                                 atol=1e-3, err_msg=op)
    else:
      assert_bits_equal(ours, ref, f"grad {op} {mesh_id}")


def test_grad_all_gather_is_documented_psum_scatter():
  """The transpose of all_gather is zipccl's psum_scatter: bit-exact against the documented order."""
  mesh = mesh_of("n8")
  spec = P("i")
  rng = np.random.default_rng(12)
  w = rng.standard_normal((8 * 8 * R, M)).astype(np.float32).astype(BF16)

  def loss(v):
    y = jax.shard_map(lambda u: zj.all_gather(u, "i", tiled=True, compress=True), mesh=mesh,
                      in_specs=spec, out_specs=spec)(v)
    return jnp.sum(y * jnp.asarray(w))

  g = np.asarray(jax.jit(jax.grad(loss))(put(mesh, dataset("gaussian"))))
  # per device d the cotangent is w block d, (8R, M); psum_scatter gives rank r the ordered sum of
  # row block r over d
  wd = w.reshape(8, 8, R, M)  # (device d, chunk r, R, M)
  want = np.concatenate([ordered_sum(wd[:, r]) for r in range(8)])
  assert_bits_equal(g, want, "grad all_gather")


# --------------------------------------------------------------------------------------------------------- #
# wire bytes, ragged lowering, decisions, statistics, errors
# --------------------------------------------------------------------------------------------------------- #

WIRE_SHAPE = (8 * 8, 8192)  # per device (8, 8192) BF16 = 128 KiB


def _wire_case(op, axis="i", n=8):
  ring = _ring(n)
  return {
      "all_to_all": (lambda v: zj.all_to_all(v, axis, 0, 0, tiled=True, compress=True), "all-to-all"),
      "all_gather": (lambda v: zj.all_gather(v, axis, tiled=True, compress=True), "all-gather"),
      "ppermute": (lambda v: zj.ppermute(v, axis, ring, compress=True), "collective-permute"),
      "psum_scatter": (lambda v: zj.psum_scatter(v, axis, tiled=True, compress=True), "reduce-scatter"),
      "psum": (lambda v: zj.psum(v, axis, compress=True), "all-reduce"),
  }[op]


@pytest.mark.parametrize("op", MOVE_OPS + REDUCE_OPS)
def test_wire_bytes_from_compiled_hlo(op):
  """Bytes one device sends (compiled HLO, fallback branch excluded) <= 0.75x the logical BF16 bytes."""
  mesh = mesh_of("n8")
  x = put(mesh, dataset("corpus", WIRE_SHAPE))
  body, kind = _wire_case(op)
  text = smap(mesh, body).lower(x).compile().as_text()
  recs = zc.hlo_collectives(text)
  main = [r for r in recs if not r["fallback"]]
  assert main and any("u8[" in r["shape"] for r in main), recs
  assert any(r["fallback"] for r in recs), "raw fallback branch missing"
  wire = zc.hlo_wire_bytes(text)
  logical = accounting.sent_bytes(kind, WIRE_SHAPE[1] * 8 * 2, 8)  # the jax.lax op on the BF16 operand
  ratio = wire / logical
  print(f"{op}: wire {wire} B / logical {logical} B = {ratio:.4f}")
  assert ratio <= 0.75, (op, wire, logical, ratio)


def _lax_twin(op, axis="i", n=8):
  return {
      "all_to_all": lambda v: lax.all_to_all(v, axis, 0, 0, tiled=True),
      "all_gather": lambda v: lax.all_gather(v, axis, tiled=True),
      "ppermute": lambda v: lax.ppermute(v, axis, _ring(n)),
  }[op]


@pytest.mark.parametrize("op", MOVE_OPS + REDUCE_OPS)
def test_ragged_lowering_for_cuda(op):
  """On GPU the coded frames go through ragged-all-to-all (only nbytes move); XLA:CPU cannot run it, so
  only the CUDA lowering is checked."""
  mesh = mesh_of("n8")
  x = put(mesh, dataset("gaussian"))
  body, _ = _wire_case(op)
  prev = zc.set_runtime_stats(False)  # debug callbacks cannot be lowered for another platform
  try:
    lowered = smap(mesh, body).trace(x).lower(lowering_platforms=("cuda",))
  finally:
    zc.set_runtime_stats(prev)
  text = lowered.as_text(dialect="hlo")
  assert "ragged-all-to-all" in text
  cpu_text = smap(mesh, body).lower(x).as_text(dialect="hlo")
  assert "ragged-all-to-all" not in cpu_text


def test_auto_sends_small_and_integer_messages_raw():
  mesh = mesh_of("n8")
  zc.reset_stats()
  xi = put(mesh, np.arange(8 * R * M, dtype=np.int32).reshape(8 * R, M))
  xs = put(mesh, dataset("gaussian")[:, :64])  # 8 rows x 64 per device: 128-byte chunks
  xb = put(mesh, dataset("gaussian"))
  f = jax.jit(jax.shard_map(lambda a, b, c: (zj.all_to_all(a, "i", 0, 0, tiled=True, name="int"),
                                             zj.all_to_all(b, "i", 0, 0, tiled=True, name="tiny"),
                                             zj.all_gather(c, "i", tiled=True, name="big")),
                            mesh=mesh, in_specs=P("i"), out_specs=P("i")))
  a, b, c = f(xi, xs, xb)
  g = jax.jit(jax.shard_map(lambda a, b, c: (lax.all_to_all(a, "i", 0, 0, tiled=True),
                                             lax.all_to_all(b, "i", 0, 0, tiled=True),
                                             lax.all_gather(c, "i", tiled=True)),
                            mesh=mesh, in_specs=P("i"), out_specs=P("i")))
  for got, want in zip((a, b, c), g(xi, xs, xb)):
    assert_bits_equal(got, want)
  st = zc.stats()
  assert not st["int"].compressed and "int32" in st["int"].reason
  assert not st["tiny"].compressed and st["tiny"].wire_bytes == st["tiny"].raw_bytes
  assert st["big"].compressed and st["big"].wire_bytes < 0.75 * st["big"].raw_bytes
  # compress=True codes what the codec covers; other dtypes go through jax.lax unchanged
  h = jax.jit(jax.shard_map(lambda a: zj.all_to_all(a, "i", 0, 0, tiled=True, compress=True),
                            mesh=mesh, in_specs=P("i"), out_specs=P("i")))
  assert_bits_equal(h(xi), a)


def test_runtime_stats_count_fallbacks():
  mesh = mesh_of("n8")
  zc.reset_stats()
  prev = zc.set_runtime_stats(True)
  try:
    f = smap(mesh, lambda v: (zj.all_to_all(v, "i", 0, 0, tiled=True, compress=True, name="a2a"),
                              zj.ppermute(v, "i", _ring(8), compress=True, name="pp")))
    jax.block_until_ready(f(put(mesh, dataset("gaussian"))))
    jax.effects_barrier()
    st = zc.stats()
    assert st["a2a"].calls == 8 and st["a2a"].fallbacks == 0, st["a2a"]
    assert st["pp"].calls == 8 and st["pp"].fallbacks == 0, st["pp"]
    jax.block_until_ready(f(put(mesh, dataset("adversarial"))))
    jax.effects_barrier()
    st = zc.stats()
    assert st["a2a"].calls == 16 and st["a2a"].fallbacks == 8, st["a2a"]
    assert st["pp"].calls == 16 and st["pp"].fallbacks == 8, st["pp"]
    t = zc.totals()
    a, p = st["a2a"], st["pp"]
    assert t["calls"] == 32 and t["fallbacks"] == 16
    assert t["raw_bytes"] == 16 * (a.raw_bytes + p.raw_bytes)
    assert t["wire_bytes"] == 16 * (a.wire_bytes + p.wire_bytes) + 8 * (a.raw_bytes + p.raw_bytes)
  finally:
    zc.set_runtime_stats(prev)
    zc.reset_stats()


def test_runtime_stats_on_cpu_count_in_the_ffi_handler_not_in_python():
  """On CPU the counters are the zipccl_count handler's: no Python callback in the compiled step, and a
  vmapped call counts once per device execution (a fallback if any example fell back)."""
  mesh = mesh_of("n8")
  zc.reset_stats()
  prev = zc.set_runtime_stats(True)
  try:
    f = smap(mesh, lambda v: zj.all_to_all(v, "i", 0, 0, tiled=True, compress=True, name="a2a"))
    x = put(mesh, dataset("gaussian"))
    text = f.lower(x).compile().as_text()
    assert "zipccl_count" in text and "python_cpu_callback" not in text
    fv = jax.jit(jax.vmap(f, in_axes=1, out_axes=1))
    xs = np.stack([dataset("gaussian"), dataset("adversarial")], axis=1)  # example 1 falls back
    got = fv(jax.device_put(xs, NamedSharding(mesh, P("i"))))
    for k in range(2):
      assert_bits_equal(got[:, k], f(put(mesh, xs[:, k])))
    st = zc.stats()["a2a"]
    assert (st.calls, st.fallbacks) == (8 + 8 + 8, 8 + 8), st  # the vmapped call: 8 calls, 8 fallbacks
    zc.reset_stats()
    assert zc.stats() == {} and zc.totals()["calls"] == 0
    assert accounting.runtime_counts() == {}  # the handler's counters were reset too
  finally:
    zc.set_runtime_stats(prev)
    zc.reset_stats()


def test_capacity_override_and_overflow_fallback_are_exact():
  """A capacity too small for Gaussian data forces the fallback; a generous one moves more bytes."""
  mesh = mesh_of("n8")
  x = put(mesh, dataset("gaussian"))
  zc.reset_stats()
  f = smap(mesh, lambda v: (zj.all_to_all(v, "i", 0, 0, tiled=True, compress=True, capacity=0.5,
                                          name="tight"),
                            zj.all_to_all(v, "i", 0, 0, tiled=True, compress=True, capacity=1600,
                                          name="bytes"),
                            lax.all_to_all(v, "i", 0, 0, tiled=True)))
  tight, by, ref = f(x)
  assert_bits_equal(tight, ref, "capacity=0.5")
  assert_bits_equal(by, ref, "capacity=1600")
  st = zc.stats()
  assert st["bytes"].capacity == 1600
  assert st["tight"].capacity == zc.padded_capacity(M, BF16, ratio=0.5)


def test_vmap_inside_shard_map_with_fallback():
  mesh = mesh_of("n8")
  rng = np.random.default_rng(4)
  x = (rng.standard_normal((8 * 3, 8, 512)) * 0.02).astype(BF16)
  bits = x.view(np.uint16)  # NaN payloads in the coded examples: the batched decode keeps them
  bits[:, :, ::97], bits[:, :, 5::89] = 0x7F81, 0xFFC3  # (XLA:CPU's float map carry quieted them)
  x[4] = nan_bits((8, 512))  # one example overflows: only it falls back
  x = jax.device_put(x, NamedSharding(mesh, P("i")))
  f = smap(mesh, jax.vmap(lambda v: zj.all_to_all(v, "i", 0, 0, tiled=True, compress=True)),
           out_specs=P("i"))
  g = smap(mesh, jax.vmap(lambda v: lax.all_to_all(lax.bitcast_convert_type(v, jnp.uint16), "i", 0,
                                                   0, tiled=True)), out_specs=P("i"))
  assert_bits_equal(np.asarray(f(x)).view(np.uint16), np.asarray(g(x)), "vmap")


def test_psum_invariant_output_and_check_vma_off():
  mesh = mesh_of("n8")
  x = put(mesh, dataset("gaussian"))
  f = jax.jit(jax.shard_map(lambda v: zj.psum(v, "i", compress=True), mesh=mesh, in_specs=P("i"),
                            out_specs=P()))
  want = ordered_sum(dataset("gaussian").reshape(8, R, M))
  assert_bits_equal(f(x), want, "psum out_specs=P()")
  g = jax.jit(jax.shard_map(lambda v: zj.psum(v, "i", compress=True), mesh=mesh, in_specs=P("i"),
                            out_specs=P("i"), check_vma=False))
  assert_bits_equal(g(x), np.tile(want, (8, 1)), "psum check_vma=False")
  # the transpose without check_vma is psum (each device's cotangent is summed)
  gl = jax.jit(jax.grad(lambda v: jnp.sum(jax.shard_map(
      lambda u: zj.psum(u, "i", compress=True).astype(jnp.float32) ** 2, mesh=mesh, in_specs=P("i"),
      out_specs=P("i"), check_vma=False)(v))))
  gr = jax.jit(jax.grad(lambda v: jnp.sum(jax.shard_map(
      lambda u: lax.psum(u, "i").astype(jnp.float32) ** 2, mesh=mesh, in_specs=P("i"),
      out_specs=P("i"), check_vma=False)(v))))
  np.testing.assert_allclose(np.asarray(gl(x), np.float32), np.asarray(gr(x), np.float32),
                             rtol=2**-7, atol=1e-4)


def test_trace_time_errors():
  mesh = mesh_of("n8")
  x = put(mesh, dataset("gaussian"))

  def trace(body):
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))).trace(x)

  # an axis that is not bound: jax.lax's own error (tests/test_dropin.py compares the wording)
  with pytest.raises(NameError, match="unbound axis name: j"):
    trace(lambda v: zj.all_to_all(v, "j", 0, 0, tiled=True))
  with pytest.raises(NameError, match="unbound axis name: i"):
    jax.jit(lambda v: zj.all_gather(v, "i")).trace(jnp.ones((4,), jnp.bfloat16))
  with pytest.raises(NameError, match="unbound axis name: i"):
    zj.psum(jnp.ones((4,), jnp.bfloat16), "i")
  with pytest.raises(ValueError, match="not divisible"):
    trace(lambda v: zj.all_to_all(v[:6], "i", 0, 0, tiled=True))
  with pytest.raises(ValueError, match="must equal"):
    trace(lambda v: zj.all_to_all(v[:6], "i", 0, 0))
  with pytest.raises(ValueError, match="not divisible"):
    trace(lambda v: zj.psum_scatter(v[:6], "i", tiled=True))
  with pytest.raises(ValueError, match="out of range"):
    trace(lambda v: zj.all_to_all(v, "i", 2, 0, tiled=True))
  with pytest.raises(ValueError, match="must be unique"):  # jax.lax.ppermute's checks and types
    trace(lambda v: zj.ppermute(v, "i", [(0, 1), (0, 2)]))
  with pytest.raises(IndexError, match="out of range"):
    trace(lambda v: zj.ppermute(v, "i", [(0, 8)]))
  with pytest.raises(NotImplementedError):  # as jax.lax.psum inside shard_map
    trace(lambda v: zj.psum(v, "i", axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]))
  with pytest.raises(ValueError, match="axis_index_groups must split"):
    trace(lambda v: zj.all_gather(v, "i", axis_index_groups=[[0, 1]]))
  with pytest.raises(ValueError, match="compress must be"):
    trace(lambda v: zj.all_gather(v, "i", compress="yes"))
  with pytest.raises(ValueError, match="capacity must be >= 32"):
    trace(lambda v: zj.all_gather(v, "i", compress=True, capacity=8))


def test_padded_capacity_is_documented_function():
  assert zc.padded_capacity(65536, BF16) == -(-(32 + math.ceil(0.70 * 131072) + 64) // 8) * 8
  assert zc.padded_capacity(65536, BF16, kind="gradient") > zc.padded_capacity(65536, BF16)
  for dt in (BF16, np.float16, np.float32):
    for n in (1, 100, 4096, 70000):
      assert zc.padded_capacity(n, dt) <= zj.max_encoded_bytes(n, dt)
  with pytest.raises(TypeError):
    zc.padded_capacity(10, np.int32)


def test_hlo_parser_counts_each_kind():
  text = "\n".join([
      '  %a = (u8[1,16]{1,0}, u8[1,16]{1,0}) all-to-all(%x, %y), replica_groups={{0,1}}, dimensions={0}',
      '  %b = u8[8,16]{1,0} all-gather(%z), replica_groups=[1,8]<=[8], dimensions={0}',
      '  %c = bf16[4]{0} reduce-scatter(%w), replica_groups={{0,1,2,3}}, dimensions={0}',
      '  %d = f32[10]{0} all-reduce(%v), replica_groups={{0,1}}, to_apply=%add',
      '  %e = u8[100]{0} collective-permute(%u), source_target_pairs={{0,1},{1,0}}, '
      'metadata={op_name="jit(f)/zipccl_raw_fallback/ppermute"}',
  ])
  recs = zc.hlo_collectives(text, num_devices=2)
  assert [r["op"] for r in recs] == ["all-to-all", "all-gather", "reduce-scatter", "all-reduce",
                                     "collective-permute"]
  assert [r["sent_bytes"] for r in recs] == [16, 112, 24, 40, 100]
  assert [r["fallback"] for r in recs] == [False] * 4 + [True]
  assert zc.hlo_wire_bytes(text, num_devices=2) == 16 + 112 + 24 + 40


def test_hlo_collectives_reads_every_replica_group_form():
  """jax 0.10 prints listed groups, jax 0.11+ mesh axes (XLA's mesh-axes replica groups), and XLA may print
  iota groups: the same collectives over a 2 x 4 ("a", "b") mesh count the same bytes in each form. A form
  the parser does not know is an error, never a guess at the group size."""
  forms = {
      "listed": ("{{0,4},{1,5},{2,6},{3,7}}", "{{0,1,2,3},{4,5,6,7}}", "{{0,1,2,3,4,5,6,7}}"),
      "iota": ("[4,2]<=[2,4]T(1,0)", "[2,4]<=[8]", "[1,8]<=[8]"),
      "mesh": ("mesh['a'=2,'b'=4] {'a'}", "mesh['a'=2,'b'=4] {'b'}", "mesh['a'=2,'b'=4] {'a','b'}"),
  }
  got = {}
  for form, (over_a, over_b, over_ab) in forms.items():
    text = "\n".join([
        f"  %r = f32[4,16]{{1,0}} reduce-scatter(%p), channel_id=1, replica_groups={over_a}, dimensions={{0}}",
        f"  %s = f32[8,16]{{1,0}} all-reduce(%p), channel_id=1, replica_groups={over_b}, to_apply=%add",
        f"  %g = f32[64,16]{{1,0}} all-gather(%p), channel_id=1, replica_groups={over_ab}, dimensions={{0}}",
    ])
    got[form] = [(r["group_size"], r["sent_bytes"]) for r in zc.hlo_collectives(text, num_devices=8)]
  assert got["listed"] == got["iota"] == got["mesh"] == [(2, 256), (4, 768), (8, 3584)], got
  # a sub-axis ('b' split in two of size 2) counts its own size
  sub = "  %s = f32[8]{0} all-reduce(%p), replica_groups=mesh['a'=2,'b'=4] {'a','b':(2)2}, to_apply=%add"
  assert zc.hlo_collectives(sub, num_devices=8)[0]["group_size"] == 4
  for bad in ("mesh['a'=2,'b'=4] {'c'}", "somethingnew(8)"):
    with pytest.raises(ValueError, match="replica"):
      zc.hlo_collectives(f"  %s = f32[8]{{0}} all-reduce(%p), replica_groups={bad}, to_apply=%add",
                         num_devices=8)
