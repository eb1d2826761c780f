"""Two-level collectives (zipccl_jax/hierarchical.py) on 8 virtual CPU devices, mesh ("host", "local") = (2, 4).

Every variant (flat raw/compressed, hierarchical with each phase raw or compressed) is compared bit for bit:
data movement against jax.lax on the bit patterns, psum_scatter against the order its algorithm documents.
"""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import zipccl_jax
from zipccl_jax import _exchange, _mixed, strategy
from zipccl_jax._shard import TwoLevels
from zipccl_jax.strategy import levels as two_level
from zipccl_jax.strategy.codec_cost import CodecModel
from zipccl_jax.strategy.links import LinkModel
from zipccl_jax.strategy.profile import Profile

H, L = 2, 4
AXES = ("host", "local")
pytestmark = pytest.mark.skipif(jax.device_count() < H * L, reason="needs 8 devices")

VARIANTS = [("flat", None, False), ("flat", None, True)] + [
    ("hierarchical", {"host": cs, "local": cf}, None) for cs, cf in itertools.product((False, True), repeat=2)]


def _mesh():
  return Mesh(np.array(jax.devices()[:H * L]).reshape(H, L), AXES)


def _two_level_profile(host_Bps=3e7, local_Bps=3e9):
  """A slow host level, a fast local one, and the flat tuple as slow as the host level."""
  p = Profile()
  p.links = {"host": {"*": LinkModel(1e-4, host_Bps)}, "local": {"*": LinkModel(1e-5, local_Bps)},
             "host,local": {"*": LinkModel(2e-4, host_Bps)}}
  return p


def _payload(shape, dtype, seed=0):
  """Gaussian values with NaN payloads, +-0, +-Inf and subnormals mixed in (bit patterns count)."""
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal(shape, np.float32) * 0.02).astype(dtype)
  u = x.reshape(-1).view(np.uint16 if np.dtype(dtype).itemsize == 2 else np.uint32)
  specials = ([0x7FC1, 0xFFA3, 0x8000, 0x0000, 0x7F80, 0xFF80, 0x0001, 0x8003]
              if u.dtype == np.uint16 else
              [0x7FC00001, 0xFFA00003, 0x80000000, 0, 0x7F800000, 0xFF800000, 1, 0x80000005])
  idx = rng.choice(u.size, size=min(u.size, 64), replace=False)
  u[idx] = np.resize(np.array(specials, u.dtype), idx.size)
  return x


def _run(mesh, body, x, spec=P(AXES)):
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
  return np.asarray(f(jax.device_put(x, NamedSharding(mesh, spec))))


def _bits(a):
  return np.asarray(a).view(np.uint8)


def _variant_body(op_fn, alg, levels, compress):
  def body(v):
    mode = compress if alg == "flat" else True
    with two_level.use_algorithm(alg, levels):
      return op_fn(v, mode)
  return body


def _uint(dtype):
  return jnp.uint16 if np.dtype(dtype).itemsize == 2 else jnp.uint32


@pytest.mark.parametrize("dtype,axis,tiled", [(ml_dtypes.bfloat16, 0, True), (np.float32, 1, True),
                                              (ml_dtypes.bfloat16, 2, False)])
def test_all_gather_every_variant_bit_identical(dtype, axis, tiled):
  mesh = _mesh()
  x = _payload((H * L * 8, 96), dtype)

  def lax_bits(v):
    u = jax.lax.bitcast_convert_type(v, _uint(v.dtype))
    return jax.lax.bitcast_convert_type(jax.lax.all_gather(u, AXES, axis=axis, tiled=tiled), v.dtype)

  ref = _bits(_run(mesh, lambda v: lax_bits(v)[None], x))
  for alg, levels, compress in VARIANTS:
    op = lambda v, c: zipccl_jax.all_gather(v, AXES, axis=axis, tiled=tiled, compress=c)[None]  # noqa: E731
    got = _bits(_run(mesh, _variant_body(op, alg, levels, compress), x))
    assert np.array_equal(got, ref), (alg, levels, compress)


@pytest.mark.parametrize("dtype,split,concat,tiled", [(ml_dtypes.bfloat16, 0, 0, True), (np.float32, 0, 1, True),
                                                      (ml_dtypes.bfloat16, 1, 0, True),
                                                      (np.float32, 1, 2, False)])
def test_all_to_all_every_variant_bit_identical(dtype, split, concat, tiled):
  mesh = _mesh()
  shape = [H * L * 2, 24, 40]
  if not tiled:
    shape[split] = H * L
  x = _payload((H * L * shape[0],) + tuple(shape[1:]), dtype, seed=1)

  def lax_bits(v):
    u = jax.lax.bitcast_convert_type(v, _uint(v.dtype))
    return jax.lax.bitcast_convert_type(jax.lax.all_to_all(u, AXES, split, concat, tiled=tiled), v.dtype)

  def wrap(f):  # keep the leading (sharded) dimension: a per-device result of any shape
    return lambda v: f(v)[None]

  ref = _bits(_run(mesh, wrap(lax_bits), x))
  for alg, levels, compress in VARIANTS:
    op = lambda v, c: zipccl_jax.all_to_all(v, AXES, split, concat, tiled=tiled, compress=c)  # noqa: E731
    got = _bits(_run(mesh, wrap(_variant_body(op, alg, levels, compress)), x))
    assert np.array_equal(got, ref), (alg, levels, compress)


def _ordered_sums(xs, dtype, hierarchical_order):
  """The documented order: flat = one float32 sum over ranks 0..n-1, rounded once; hierarchical = per host
  the float32 sum over local ranks, rounded to dtype, then the float32 sum over hosts, rounded once."""
  f32 = [np.asarray(x, np.float32) for x in xs]
  if not hierarchical_order:
    acc = np.zeros_like(f32[0])
    for v in f32:
      acc = acc + v
    return acc.astype(dtype)
  acc = np.zeros_like(f32[0])
  for h in range(H):
    part = np.zeros_like(f32[0])
    for l in range(L):
      part = part + f32[h * L + l]
    acc = acc + part.astype(dtype).astype(np.float32)
  return acc.astype(dtype)


@pytest.mark.parametrize("dtype,dim,tiled", [(ml_dtypes.bfloat16, 0, True), (np.float32, 1, True),
                                             (ml_dtypes.bfloat16, 1, False)])
def test_psum_scatter_documented_order_per_algorithm(dtype, dim, tiled):
  mesh = _mesh()
  per = [H * L * 4, 48] if dim == 0 else [6, H * L * 8]
  if not tiled:
    per[dim] = H * L
  rng = np.random.default_rng(3)
  xs = [(rng.standard_normal(per, np.float32) * 0.02).astype(dtype) for _ in range(H * L)]
  x = np.concatenate([v[None] for v in xs])  # (n, *per): device r holds xs[r]
  spec = P(AXES)
  want = {}
  for hier in (False, True):
    full = _ordered_sums(xs, dtype, hier)
    if tiled:
      want[hier] = np.stack(np.split(full, H * L, axis=dim))
    else:
      want[hier] = np.stack([np.take(full, r, axis=dim) for r in range(H * L)])
  for alg, levels, compress in VARIANTS:
    op = lambda v, c: zipccl_jax.psum_scatter(v[0], AXES, scatter_dimension=dim, tiled=tiled, compress=c)[None]  # noqa: E731
    got = _run(mesh, _variant_body(op, alg, levels, compress), x, spec)
    assert np.array_equal(_bits(got), _bits(want[alg == "hierarchical"])), (alg, levels, compress)


def _psum_run(mesh, body, x, vma):
  spec = P(AXES)
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=P(None) if vma else spec,
                            check_vma=vma))
  return np.asarray(f(jax.device_put(x, NamedSharding(mesh, spec))))


@pytest.mark.parametrize("vma", [True, False], ids=["check_vma", "no_vma"])
@pytest.mark.parametrize("dtype,per", [(ml_dtypes.bfloat16, (5, 37)), (np.float32, (H * L * 6,))],
                         ids=["bf16_185_elems", "f32_48_elems"])
def test_psum_documented_order_per_algorithm(dtype, per, vma):
  """psum over the tuple: hierarchical (psum_scatter's two phases, then all_gather's) gives every device the
  hierarchical order's bits, every level raw or coded, whether the size divides by n or not; flat compressed
  the flat order; flat raw is jax.lax.psum. check_vma: the result is typed invariant (out_specs P())."""
  mesh = _mesh()
  rng = np.random.default_rng(4)
  xs = [(rng.standard_normal(per, np.float32) * 0.02).astype(dtype) for _ in range(H * L)]
  x = np.concatenate([v[None] for v in xs])
  lax_bits = _bits(_psum_run(mesh, lambda v: jax.lax.psum(v[0], AXES)[None], x, vma).reshape((-1,) + per)[0])
  for alg, levels, compress in VARIANTS:
    body = _variant_body(lambda v, c: zipccl_jax.psum(v[0], AXES, compress=c)[None], alg, levels, compress)
    got = _psum_run(mesh, body, x, vma).reshape((-1,) + per)
    if alg == "hierarchical":
      want = _bits(_ordered_sums(xs, dtype, True))
    else:
      want = _bits(_ordered_sums(xs, dtype, False)) if compress else lax_bits
    assert all(np.array_equal(_bits(g), want) for g in got), (alg, levels, compress)


@pytest.mark.parametrize("vma", [True, False], ids=["check_vma", "no_vma"])
def test_grad_of_hierarchical_psum(vma):
  """The phases' transposes make psum's, as jax.lax's: a cotangent invariant over the axes comes back
  unchanged with check_vma (jax's psum transposes to a pvary: here the gathers' local slices), and summed
  over the ranks without it (a psum); small integers, so every sum is exact and the bits are jax.lax's."""
  mesh = _mesh()
  spec = P(AXES)
  w = jnp.asarray(np.arange(24, dtype=np.float32) % 7 - 3)  # a constant: invariant over the axes
  x = _payload((H * L, 24), np.float32, seed=7)

  def grad(fn):
    f = lambda v: jnp.sum(fn(v[0]) * w)  # noqa: E731
    return jax.jit(jax.shard_map(jax.grad(f), mesh=mesh, in_specs=spec, out_specs=spec, check_vma=vma))

  def hier(v):
    with two_level.use_algorithm("hierarchical", {"host": True, "local": False}):
      return zipccl_jax.psum(v, AXES)

  xs = jax.device_put(x, NamedSharding(mesh, spec))
  got = np.asarray(grad(hier)(xs))
  assert np.array_equal(got, np.broadcast_to(np.asarray(w) * (1 if vma else H * L), (H * L, 24)))
  assert np.array_equal(_bits(got), _bits(grad(lambda v: jax.lax.psum(v, AXES))(xs)))


@pytest.mark.parametrize("vma", [True, False], ids=["check_vma", "no_vma"])
def test_vmap_of_hierarchical_psum(vma):
  """jax.vmap over examples: each example's sum in the hierarchical order, on every device."""
  mesh = _mesh()
  rng = np.random.default_rng(8)
  xs = [(rng.standard_normal((3, 40), np.float32) * 0.02).astype(ml_dtypes.bfloat16) for _ in range(H * L)]
  x = np.concatenate([v[None] for v in xs])

  def body(v):
    with two_level.use_algorithm("hierarchical", {"host": True, "local": False}):
      return jax.vmap(lambda u: zipccl_jax.psum(u, AXES))(v[0])[None]
  got = _psum_run(mesh, body, x, vma).reshape(-1, 3, 40)
  want = np.stack([_ordered_sums([v[i] for v in xs], ml_dtypes.bfloat16, True) for i in range(3)])
  assert all(np.array_equal(_bits(g), _bits(want)) for g in got)


def test_auto_psum_hierarchical_on_a_slow_host_link_and_explains_why():
  """A data-parallel gradient psum over the tuple: `auto` runs it two-level with the host level coded (each
  of its four phases logged), and flat where the message is small."""
  mesh = _mesh()
  x = _payload((H * L, 8 * 65536), ml_dtypes.bfloat16)
  strategy.reset_decisions()
  with zipccl_jax.use_profile(_two_level_profile()):
    _psum_run(mesh, lambda v: zipccl_jax.psum(v[0], AXES, name="dp")[None], x, True)
    _psum_run(mesh, lambda v: zipccl_jax.psum(v[0, :64], AXES, name="small")[None], x, True)
  ds = zipccl_jax.decisions()
  assert ds["dp [levels]"].algorithm.startswith("hierarchical(host:c"), ds["dp [levels]"]
  assert "psum_scatter then all_gather" in ds["dp [levels]"].reason
  assert {"dp/host", "dp/local", "dp/gather/host", "dp/gather/local"} <= set(ds)
  assert ds["dp/host"].compress and ds["dp/gather/host"].compress and not ds["dp/local"].compress
  assert ds["small [levels]"].algorithm == "flat" and "small/host" not in ds


def test_hierarchical_compressed_codes_only_the_slow_level():
  """HLO: the slow phase (groups of H) moves uint8 frames, the fast one (groups of L) raw bit patterns."""
  mesh = _mesh()
  x = _payload((H * L * 4096,), ml_dtypes.bfloat16)

  def body(v):
    with two_level.use_algorithm("hierarchical", {"host": True, "local": False}):
      return zipccl_jax.all_gather(v, AXES, tiled=True)[None]

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(AXES), out_specs=P(AXES)))
  hlo = f.lower(jax.device_put(x, NamedSharding(mesh, P(AXES)))).compile().as_text()
  colls = [c for c in zipccl_jax.hlo_collectives(hlo, num_devices=H * L)
           if c["op"] == "all-gather" and not c["fallback"]]
  by_group = {}
  for c in colls:
    by_group.setdefault(c["group_size"], set()).add(c["shape"].split("[")[0].lstrip("("))
  assert "u8" in by_group[H] and by_group[L] == {"u16"}, colls


def test_auto_picks_hierarchical_on_a_slow_host_link_and_explains_why():
  mesh = _mesh()
  x = _payload((H * L * 65536,), ml_dtypes.bfloat16)
  strategy.reset_decisions()
  with zipccl_jax.use_profile(_two_level_profile()):
    out = _run(mesh, lambda v: zipccl_jax.all_gather(v, AXES, tiled=True, name="ag")[None], x)
  ref = np.broadcast_to(x.reshape(1, -1), (H * L, x.size))
  assert np.array_equal(_bits(out.reshape(H * L, -1)), _bits(ref))
  ds = zipccl_jax.decisions()
  lv = ds["ag [levels]"]
  assert lv.algorithm.startswith("hierarchical(host:c"), lv
  assert "flat raw" in lv.reason and "flat compressed" in lv.reason, lv.reason
  assert "ag/host" in ds and ds["ag/host"].compress and "ag/local" in ds and not ds["ag/local"].compress
  assert "ag [levels]" in zipccl_jax.explain()


def test_auto_stays_flat_without_per_level_links():
  """No link model for the levels: the call is the flat collective, as before (no [levels] decision)."""
  mesh = _mesh()
  x = _payload((H * L * 1024,), ml_dtypes.bfloat16)
  strategy.reset_decisions()
  _run(mesh, lambda v: zipccl_jax.all_gather(v, AXES, tiled=True, name="ag_flat")[None], x)
  assert "ag_flat [levels]" not in zipccl_jax.decisions() and "ag_flat" in zipccl_jax.decisions()


def test_grad_of_hierarchical_all_to_all_is_bit_identical_to_lax():
  mesh = _mesh()
  x = _payload((H * L * H * L * 2, 16), np.float32, seed=5)
  w = _payload((H * L * H * L * 2, 16), np.float32, seed=6)
  spec = P(AXES)

  def loss(fn):
    def f(v, w):
      return jnp.sum(fn(v) * w)
    return jax.jit(jax.shard_map(jax.grad(f), mesh=mesh, in_specs=(spec, spec), out_specs=spec))

  def hier(v):
    with two_level.use_algorithm("hierarchical", {"host": True, "local": False}):
      return zipccl_jax.all_to_all(v, AXES, 0, 0, tiled=True)

  put = lambda a: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
  got = np.asarray(loss(hier)(put(x), put(w)))
  ref = np.asarray(loss(lambda v: jax.lax.all_to_all(v, AXES, 0, 0, tiled=True))(put(x), put(w)))
  assert np.array_equal(_bits(got), _bits(ref))


def test_use_algorithm_rejects_bad_arguments():
  with pytest.raises(ValueError, match="algorithm must be"):
    with two_level.use_algorithm("ring"):
      pass
  with pytest.raises(ValueError, match="compress must be None"):
    with two_level.use_algorithm("flat", {"host": True}):
      pass


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
def test_fp8_data_movement_every_variant_bit_identical(dtype):
  """One-byte floats take the same phases: compared on the uint8 view (NaN payloads included)."""
  mesh = _mesh()
  rng = np.random.default_rng(7)
  x = (rng.standard_normal((H * L * H * L * 4, 32), np.float32) * 8).astype(dtype)
  u = x.reshape(-1).view(np.uint8)
  u[rng.choice(u.size, 64, replace=False)] = np.resize(np.array([0x7F, 0xFF, 0x80, 0x00, 0x01, 0x7E], np.uint8), 64)

  def lax_bits(v, coll):
    b = jax.lax.bitcast_convert_type(v, jnp.uint8)
    r = (jax.lax.all_to_all(b, AXES, 0, 0, tiled=True) if coll == "a2a"
         else jax.lax.all_gather(b, AXES, axis=0, tiled=True))
    return jax.lax.bitcast_convert_type(r, v.dtype)[None]

  for coll, op in (("a2a", lambda v, c: zipccl_jax.all_to_all(v, AXES, 0, 0, tiled=True, compress=c)[None]),
                   ("ag", lambda v, c: zipccl_jax.all_gather(v, AXES, axis=0, tiled=True, compress=c)[None])):
    ref = _bits(_run(mesh, lambda v: lax_bits(v, coll), x))
    for alg, levels, compress in VARIANTS:
      got = _bits(_run(mesh, _variant_body(op, alg, levels, compress), x))
      assert np.array_equal(got, ref), (coll, dtype, alg, levels, compress)


def _hier_a2a(levels, one_axis=False, **kw):
  """The two-level all_to_all over the (host, local) tuple, or over one axis "i" declared as its levels."""
  def body(v):
    with two_level.use_algorithm("hierarchical", levels), zipccl_jax.use_levels({"i": L}):
      return zipccl_jax.all_to_all(v, "i" if one_axis else AXES, 0, 0, tiled=True, **kw)[None]
  return body


def _lax_a2a_bits(v):
  u = jax.lax.bitcast_convert_type(v, _uint(v.dtype))
  return jax.lax.bitcast_convert_type(jax.lax.all_to_all(u, AXES, 0, 0, tiled=True), v.dtype)[None]


def _hlo(body, x):
  f = jax.jit(jax.shard_map(body, mesh=_mesh(), in_specs=P(AXES), out_specs=P(AXES)))
  return f.lower(jax.device_put(x, NamedSharding(_mesh(), P(AXES)))).compile().as_text()


def _colls(hlo, op, fallback=False):
  return [c for c in zipccl_jax.hlo_collectives(hlo, num_devices=H * L) if c["op"] == op and c["fallback"] == fallback]


def test_mixed_all_to_all_hlo_moves_one_slot_exchange_and_the_tails():
  """HLO of hierarchical all_to_all, host coded / local raw (the mixed-slot exchange): the encoder codes the n
  rows with the L own-host rows skipped (a pred[n] mask); one all-to-all over all n devices of n u8 slots of C
  bytes, one over the groups of L (the hosts) of the own host's row tails (the T = B - (C - 8) bytes that do not
  fit before the slot's overflow flag, as u16 elements), and nothing else: no flag psum, no collective-permute;
  the raw fallback is one all-to-all over all n devices of the bits (u16). The call site's wire bytes are those
  two all-to-alls'."""
  m, B = 16 * 64, 16 * 64 * 2
  x = _payload((H * L * H * L * 16, 64), ml_dtypes.bfloat16)
  hlo = _hlo(_hier_a2a({"host": True, "local": False}, name="mixed_hlo"), x)
  C = zipccl_jax.stats()["mixed_hlo/host"].capacity
  T = B - 2 * _mixed.mixed_head_elems(C, m, ml_dtypes.bfloat16)
  assert 32 <= C < B and T == B - (C - 8), (C, T)
  assert not _colls(hlo, "collective-permute") and not _colls(hlo, "collective-permute", True)
  assert not _colls(hlo, "all-reduce"), _colls(hlo, "all-reduce")
  a2a = sorted(_colls(hlo, "all-to-all"), key=lambda c: -c["group_size"])
  assert [(c["group_size"], c["shape"].count("u8["), c["shape"].count("u16["), c["result_bytes"]) for c in a2a] == [
      (H * L, H * L, 0, H * L * C), (L, 0, L, L * T)], a2a
  fb = _colls(hlo, "all-to-all", fallback=True)
  assert [(c["group_size"], c["result_bytes"]) for c in fb] == [(H * L, H * L * B)] and "u16[" in fb[0]["shape"]
  enc = [ln for ln in hlo.splitlines() if 'custom_call_target="zipccl_encode"' in ln]
  assert len(enc) == 1 and f"pred[{H * L}]" in enc[0] and f"(u8[{H * L},{C}]" in enc[0], enc
  st = zipccl_jax.stats()["mixed_hlo/host"]
  assert st.wire_bytes == sum(c["sent_bytes"] for c in a2a) == (H * L - 1) * C + (L - 1) * T
  assert st.raw_bytes == fb[0]["sent_bytes"] == (H * L - 1) * B


def test_mixed_all_to_all_hlo_without_tails_when_a_row_fits_its_slot():
  """A capacity of at least B + 8 bytes (ratio 2): the whole own-host row and the flag ride in the slot, no
  tails exchange."""
  x = _payload((H * L * H * L * 16, 64), ml_dtypes.bfloat16)
  hlo = _hlo(_hier_a2a({"host": True, "local": False}, capacity=2.0, name="mixed_notail"), x)
  C = zipccl_jax.stats()["mixed_notail/host"].capacity
  assert C >= 16 * 64 * 2 + 8
  assert [c["group_size"] for c in _colls(hlo, "all-to-all")] == [H * L]
  assert zipccl_jax.stats()["mixed_notail/host"].wire_bytes == (H * L - 1) * C


def test_both_levels_coded_all_to_all_sends_cross_host_rows_directly_in_rounds():
  """HLO of hierarchical all_to_all with both levels coded (the rounds form): (H - 1) L collective-permutes move
  one u8 frame each, every pair crossing hosts (no row is forwarded inside a host), and the own host's rows go
  coded (u8) in one all-to-all over groups of L."""
  x = _payload((H * L * H * L * 16, 64), ml_dtypes.bfloat16)
  hlo = _hlo(_hier_a2a({"host": True, "local": True}), x)
  perms = _colls(hlo, "collective-permute")
  assert len(perms) == (H - 1) * L and all(c["shape"].startswith("u8[") for c in perms), perms
  for line in hlo.splitlines():
    if " collective-permute(" in line and "= u8[" in line:
      pairs = [tuple(int(v) for v in p.split(",")) for p in
               line.split("source_target_pairs={{")[1].split("}}")[0].split("},{")]
      assert sorted(s for s, _ in pairs) == list(range(H * L))
      assert all(s // L != d // L for s, d in pairs), line          # every frame crosses hosts
  a2a = _colls(hlo, "all-to-all")
  assert {c["group_size"] for c in a2a} == {L} and all("u8" in c["shape"] for c in a2a), a2a


def _overflow_operand(hot):
  """float32 zeros (every frame fits capacity 0.5), except: hot=None every row Gaussian (every sender
  overflows); hot=(s, d) sender s's row for rank d random bits (only that one frame overflows)."""
  if hot is None:
    return _payload((H * L * H * L * 8, 96), np.float32, seed=11)
  s, d = hot
  x = np.zeros((H * L, H * L, 8, 96), np.float32)
  x[s, d] = np.random.default_rng(11).integers(0, 2**32, (8, 96), dtype=np.uint32).view(np.float32)
  return x.reshape(-1, 96)


def _assert_falls_back_everywhere(levels, hot, name, one_axis=False):
  """The two-level all_to_all with `levels` at capacity 0.5 on `_overflow_operand(hot)`: its results are
  jax.lax's bits and the runtime counter of its slow phase sees a fallback on all n devices."""
  x = _overflow_operand(hot)
  ref = _bits(_run(_mesh(), _lax_a2a_bits, x))
  zipccl_jax.reset_stats()
  prev = zipccl_jax.set_runtime_stats(True)
  mesh, spec = (Mesh(np.array(jax.devices()[:H * L]), ("i",)), P("i")) if one_axis else (_mesh(), P(AXES))
  try:
    got = _bits(_run(mesh, _hier_a2a(levels, one_axis, capacity=0.5, name=name), x, spec))
    jax.effects_barrier()
    st = zipccl_jax.stats()[f"{name}/host"]
  finally:
    zipccl_jax.set_runtime_stats(prev)
  assert np.array_equal(got, ref)
  assert st.calls == H * L and st.fallbacks == H * L, st


@pytest.mark.parametrize("one_axis", [False, True], ids=["tuple", "one_axis"])
@pytest.mark.parametrize("hot", [None, (5, 1), (1, 6)], ids=["every_sender", "dev5_row_for_dev1", "dev1_row_for_dev6"])
def test_all_to_all_cross_host_rounds_overflow_falls_back_everywhere_bit_identical(hot, one_axis):
  """Both levels coded (the cross-host rows go in collective-permute rounds): frames that do not fit the
  capacity, everywhere or in one frame of device 5 (or 1). Every device must take the raw rounds together (they
  span both hosts); the senders that send a device nothing report through the flag psum over the fast level
  (over one axis "i", an all_gather over each host's group of it)."""
  _assert_falls_back_everywhere({"host": True, "local": True}, hot, "xh", one_axis)


def test_vmap_of_hierarchical_all_to_all_is_bit_identical():
  """Gaussian data: NaN payloads under vmap are quieted by the flat coded all_to_all too (on one axis, in
  main), a defect of the coded path's batching, not of the two-level exchange."""
  mesh = _mesh()
  x = (np.random.default_rng(12).standard_normal((H * L * 3, H * L * 2, 24)) * 0.02).astype(ml_dtypes.bfloat16)

  def body(v):  # v: (3, n * 2, 24) per device; vmap over the 3
    with two_level.use_algorithm("hierarchical", {"host": True, "local": False}):
      return jax.vmap(lambda r: zipccl_jax.all_to_all(r, AXES, 0, 0, tiled=True))(v)

  def ref(v):
    return jax.vmap(lambda r: _lax_a2a_bits(r)[0])(v)

  assert np.array_equal(_bits(_run(mesh, body, x)), _bits(_run(mesh, ref, x)))


MIXED = {"host": True, "local": False}   # host coded / local raw: the mixed-slot exchange


def _specials(shape, dtype, seed):
  """`_payload`, or for one-byte floats scaled normals with NaNs, +-0, +-max and the smallest subnormal."""
  if np.dtype(dtype).itemsize != 1:
    return _payload(shape, dtype, seed)
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal(shape, np.float32) * 8).astype(dtype)
  u = x.reshape(-1).view(np.uint8)
  u[rng.choice(u.size, 64, replace=False)] = np.resize(np.array([0x7F, 0xFF, 0x80, 0x00, 0x01, 0x7E], np.uint8), 64)
  return x


def _lax_a2a(split, concat, tiled):
  def f(v):
    u = jax.lax.bitcast_convert_type(v, {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[v.dtype.itemsize])
    return jax.lax.bitcast_convert_type(jax.lax.all_to_all(u, AXES, split, concat, tiled=tiled), v.dtype)
  return f


def _a2a_operand(dtype, split, tiled, seed):
  shape = [H * L * 2, H * L * 2, H * L * 16]           # per device; m = 4096 elements per row (tiled)
  if not tiled:
    shape[split] = H * L
  return _specials((H * L * shape[0],) + tuple(shape[1:]), dtype, seed)


def _fitting_ratio(x, split, tiled):
  """A capacity ratio whose capacity fits every row's frame of `x` (per device, rows for each rank)."""
  n = H * L
  per = np.split(x, n)                                     # device d's operand
  rows = np.concatenate([np.moveaxis(p, split, 0).reshape(n, -1) for p in per])
  _, nbytes = zipccl_jax.codec.encode_frames(jnp.asarray(rows))
  return float(np.max(nbytes)) / (rows.shape[1] * rows.dtype.itemsize)


@pytest.mark.parametrize("capacity", ["fits", 2.0], ids=["tails", "no_tails"])
@pytest.mark.parametrize("dtype,split,concat,tiled", [
    (ml_dtypes.bfloat16, 0, 0, True), (np.float16, 1, 0, True), (np.float32, 0, 2, True),
    (ml_dtypes.float8_e4m3fn, 2, 1, True), (ml_dtypes.bfloat16, 1, 2, False), (np.float16, 2, 0, False),
], ids=["bf16-0-0-tiled", "f16-1-0-tiled", "f32-0-2-tiled", "f8e4m3fn-2-1-tiled", "bf16-1-2-untiled",
        "f16-2-0-untiled"])
def test_mixed_all_to_all_bit_identical_to_lax(dtype, split, concat, tiled, capacity):
  """Host coded / local raw over dtypes and split/concat axes, with the own host's rows cut into slot heads and
  tails (default capacity, < B) or whole in their slots (ratio 2, >= B); NaN payloads, +-0, Inf, subnormals."""
  x = _a2a_operand(dtype, split, tiled, seed=21)
  if capacity == "fits":  # the smallest capacity that fits: < B bytes, the rows' tails move over `local`
    capacity = _fitting_ratio(x, split, tiled)
  ref = _bits(_run(_mesh(), lambda v: _lax_a2a(split, concat, tiled)(v)[None], x))
  zipccl_jax.reset_stats()
  prev = zipccl_jax.set_runtime_stats(True)
  try:
    def body(v):
      with two_level.use_algorithm("hierarchical", MIXED):
        return zipccl_jax.all_to_all(v, AXES, split, concat, tiled=tiled, capacity=capacity, name="mixed")[None]
    got = _bits(_run(_mesh(), body, x))
    jax.effects_barrier()
    st = zipccl_jax.stats()["mixed/host"]
  finally:
    zipccl_jax.set_runtime_stats(prev)
  assert np.array_equal(got, ref)
  assert st.calls == H * L and st.fallbacks == 0, st            # the coded path ran
  B = x.size // (H * L) // (H * L) * np.dtype(dtype).itemsize
  assert (st.capacity - 8 < B) == (capacity < 1), (st.capacity, B)   # tails moved, or none


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32, ml_dtypes.float8_e4m3fn],
                         ids=["bf16", "f32", "f8e4m3fn"])
def test_vmap_of_mixed_all_to_all_keeps_every_bit(dtype):
  """vmap: the overflow predicate is per example (the cond becomes a select on bit patterns), the own host's
  rows are rebuilt from bytes: NaN payloads survive."""
  x = _specials((H * L * 3, H * L * 2, 24), dtype, seed=22)

  def body(v):  # v: (3, n * 2, 24) per device; vmap over the 3
    with two_level.use_algorithm("hierarchical", MIXED):
      return jax.vmap(lambda r: zipccl_jax.all_to_all(r, AXES, 0, 0, tiled=True))(v)

  ref = jax.vmap(_lax_a2a(0, 0, True))
  assert np.array_equal(_bits(_run(_mesh(), body, x)), _bits(_run(_mesh(), ref, x)))


def test_vmap_of_mixed_all_to_all_falls_back_per_example():
  """Batch of 3 where only example 1 is incompressible at capacity 0.5 (random bits; the others sparse: zeros,
  1% Gaussian, NaN payloads and the other specials): that example takes the raw all_to_all, the others decode;
  every example is bit-identical to jax.lax."""
  rng = np.random.default_rng(23)
  x = np.zeros((H * L, 3, H * L * 4, 32), np.float32)
  dense = _payload((x.size // 100,), np.float32, seed=23)
  x.reshape(-1)[rng.choice(x.size, dense.size, replace=False)] = dense
  x[:, 1] = rng.integers(0, 2**32, x[:, 1].shape, dtype=np.uint32).view(np.float32)
  x = x.reshape(H * L * 3, H * L * 4, 32)

  def body(v):
    with two_level.use_algorithm("hierarchical", MIXED):
      return jax.vmap(lambda r: zipccl_jax.all_to_all(r, AXES, 0, 0, tiled=True, capacity=0.5))(v)

  ref = jax.vmap(_lax_a2a(0, 0, True))
  assert np.array_equal(_bits(_run(_mesh(), body, x)), _bits(_run(_mesh(), ref, x)))


@pytest.mark.parametrize("mode", ["jvp", "grad"])
def test_mixed_all_to_all_autodiff_bit_identical(mode):
  """jvp applies the mixed exchange to the tangent; grad transposes it (an all_to_all with split and concat
  swapped): both bit-identical to jax.lax's (bfloat16 with NaN payloads, +-0, Inf, subnormals)."""
  mesh = _mesh()
  n = H * L
  x = _payload((n * n * 2, 16, 8), ml_dtypes.bfloat16, seed=24)       # per device (n * 2, 16, 8)
  t = _payload((n * n * 2, 16, 8) if mode == "jvp" else (n * 2, n * 16, 8), ml_dtypes.bfloat16, seed=25)

  def hier(v):
    with two_level.use_algorithm("hierarchical", MIXED):
      return zipccl_jax.all_to_all(v, AXES, 0, 1, tiled=True)

  if mode == "jvp":
    body = lambda v, w: jax.jvp(hier, (v,), (w,))[1]  # noqa: E731
    want = _lax_a2a(0, 1, True)                         # the tangent's all_to_all, on bits
  else:  # w: the cotangent, in the result's per-device shape (2, n * 16, 8)
    body = lambda v, w: jax.vjp(hier, v)[1](w)[0]  # noqa: E731
    want = _lax_a2a(1, 0, True)                         # the transpose: split and concat swapped
  put = lambda a: jax.device_put(a, NamedSharding(mesh, P(AXES)))  # noqa: E731
  got = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(AXES), P(AXES)), out_specs=P(AXES)))(put(x), put(t))
  ref = _run(mesh, want, t)                             # (jax.lax on bfloat16 floats may quiet NaN payloads)
  assert np.array_equal(_bits(got), _bits(ref))


@pytest.mark.parametrize("hot", [None, (0, 5), (5, 1)], ids=["every_sender", "dev0_row_for_dev5",
                                                             "dev5_row_for_dev1"])
@pytest.mark.parametrize("one_axis", [False, True], ids=["tuple", "one_axis"])
def test_mixed_all_to_all_forced_overflow_falls_back_everywhere(hot, one_axis):
  """Frames that do not fit capacity 0.5: every device takes the raw flat all_to_all (its results are jax.lax's
  bits) and the runtime counter sees a fallback on all n devices, also when one frame of one sender overflows
  (the rest of that sender's host learns it from the flag in its slot, the other host from poisoned frames)."""
  _assert_falls_back_everywhere(MIXED, hot, "mixed_over", one_axis)


@pytest.mark.parametrize("hot,falls_back", [((0, 5), True), ((1, 6), True), ((5, 1), True), ((6, 2), True),
                                             ((1, 0), False)],
                         ids=["dev0_row_for_dev5", "dev1_row_for_dev6", "dev5_row_for_dev1", "dev6_row_for_dev2",
                              "dev1_row_for_dev0_same_host_raw"])
@pytest.mark.parametrize("one_axis", [False, True], ids=["tuple", "one_axis"])
def test_mixed_exchange_fallback_decision_is_uniform(hot, falls_back, one_axis):
  """`_mixed.exchange_mixed` with a fallback that moves nothing (it returns a marker row on the rank that
  takes it): one overflowing frame of one sender must turn every rank to the fallback, not just the ranks its
  poisoned frames reach (a rank that decided otherwise would leave the real raw all_to_all one short). A row
  for the sender's own host is not coded, so incompressible data there overflows nothing. The same over one
  axis "i" split into the levels (`use_levels`: the tails over the host's group of "i")."""
  x = _overflow_operand(hot)
  marker = jnp.uint32(0x7FC0DEAD)

  def body(v):
    rows = v.reshape(H * L, -1)
    cap = zipccl_jax.padded_capacity(rows.shape[1], rows.dtype, ratio=0.5)
    bits = jax.lax.bitcast_convert_type(rows, jnp.uint32)
    raw = lambda: jax.lax.bitcast_convert_type(bits * 0 + marker, rows.dtype)  # noqa: E731  (varying, like rows)
    grid = TwoLevels("host", "local", H, L, "i" if one_axis else None)
    got = _mixed.exchange_mixed(rows, grid=grid, capacity=cap, site="uniform", raw=raw)
    return jax.lax.bitcast_convert_type(got, jnp.uint32)[None]

  mesh = Mesh(np.array(jax.devices()[:H * L]), ("i",)) if one_axis else _mesh()
  got = _run(mesh, body, x, P("i") if one_axis else P(AXES))
  fell_back = [bool(np.all(got[r] == np.uint32(marker))) for r in range(H * L)]
  assert fell_back == [falls_back] * (H * L), fell_back


def test_mixed_all_to_all_overflow_test_ignores_the_raw_own_host_slots():
  """Own-host slots hold raw bytes: rows whose bytes [16, 24) (the frame_bytes field of a frame header) are all
  0xFF must not read as an overflow; the coded path runs (no fallback) and the result is jax.lax's."""
  x = np.zeros((H * L * H * L * 8, 96), np.float32)
  u = x.reshape(H * L, H * L, -1).view(np.uint32)
  u[:, :, 4:6] = 0xFFFFFFFF                 # bytes [16, 24) of every row: NaNs with all-ones payloads
  ref = _bits(_run(_mesh(), _lax_a2a_bits, x))
  zipccl_jax.reset_stats()
  prev = zipccl_jax.set_runtime_stats(True)
  try:
    got = _bits(_run(_mesh(), _hier_a2a(MIXED, name="mixed_ff"), x))
    jax.effects_barrier()
    st = zipccl_jax.stats()["mixed_ff/host"]
  finally:
    zipccl_jax.set_runtime_stats(prev)
  assert np.array_equal(got, ref)
  assert st.calls == H * L and st.fallbacks == 0, st


def _level_choice(prof, m=H * L * 4096, fixed_order=False):
  """The [levels] decision of an auto all_to_all of m bfloat16 elements per device, traced under `prof`
  (fixed_order: zipccl's raw two-level program is a candidate too)."""
  strategy.reset_decisions()
  with zipccl_jax.use_profile(prof), zipccl_jax.use_defaults(fixed_order=fixed_order):
    f = jax.jit(jax.shard_map(lambda v: zipccl_jax.all_to_all(v, AXES, 0, 0, tiled=True, name="lvl"),
                              mesh=_mesh(), in_specs=P(AXES), out_specs=P(AXES)))
    f.trace(jax.ShapeDtypeStruct((H * L * m,), jnp.bfloat16))
  return zipccl_jax.decisions()["lvl [levels]"]


def _estimates(prof, m=H * L * 4096):
  """Every variant's estimate, the raw two-level program's included (a candidate with fixed_order)."""
  allowed = two_level._allowed("auto", "auto", None, "host", "local", fixed_order=True)
  with zipccl_jax.use_profile(prof):
    est, note = two_level._candidates("all_to_all", np.dtype(ml_dtypes.bfloat16), m, AXES, "host", "local",
                                         (H, L), "activation", allowed)
  return {k: v[0] for k, v in est.items()}, note


def test_plan_costs_hierarchical_variants_from_the_measured_raw_program():
  """With calibrate's measurement of the hierarchical raw program (links['host,local']['hierarchical_<op>'])
  the hierarchical estimates are that time plus the model's difference per compressed phase; explain() says
  so. A slow measured program moves the choice to flat; a fast one to hierarchical."""
  base = _two_level_profile()
  model, note = _estimates(base)
  assert note == "hierarchical raw = sum of the phases' models"
  assert "sum of the phases' models" in _level_choice(base).reason
  raw = "hierarchical host:raw local:raw"
  sent = (H * L - 1) * 4096 * 2   # the flat raw collective's bytes per device
  for bw, want in ((1e9, "hierarchical"), (1e6, "flat")):
    prof = base.copy()
    prof.links["host,local"]["hierarchical_all_to_all"] = LinkModel(0.0, bw)
    est, note = _estimates(prof)
    assert note == "hierarchical raw measured"
    assert est[raw] == pytest.approx(sent / bw)
    for k in est:  # a compressed phase adds the same difference as in the per-phase model
      if k.startswith("hierarchical"):
        assert est[k] - est[raw] == pytest.approx(model[k] - model[raw], rel=1e-9, abs=1e-12), k
      else:
        assert est[k] == model[k]
    d = _level_choice(prof, fixed_order=True)
    assert "hierarchical raw measured" in d.reason and d.algorithm.startswith(want), (bw, d.algorithm, d.reason)
    if want == "hierarchical":  # without fixed_order raw is the jax.lax call, never the raw two-level one
      assert not _level_choice(prof).algorithm.startswith("hierarchical(host:r,local:r)")


def test_measured_flat_compressed_program_replaces_its_model():
  """calibrate also times the flat compressed program over the tuple (flat_<op>_coded): the plan then costs
  flat compressed at that time, beside the measured hierarchical programs. The 2 x 4 testbed's MoE dispatch
  all_to_all in figures: its model put flat compressed at 84.6 ms, behind the measured mixed-slot program
  (77.7 ms; the run measured 77 and 86 ms). With flat compressed measured (70 ms), auto runs it."""
  prof = _two_level_profile(host_Bps=5e7)                 # flat raw ~92 ms
  prof.codec = {"cpu": {"bfloat16": CodecModel(4.6e8, 4.6e8, 1e-4, 1e-4)}}
  m = 8 * 1280 * 256                                      # bfloat16 elements per device
  sent = (H * L - 1) * (m // (H * L)) * 2                 # 4.6 MB: the flat raw all_to_all's bytes
  prof.links["host,local"]["hierarchical_all_to_all"] = LinkModel(0.0, sent / 99.8e-3)
  prof.links["host,local"]["hierarchical_all_to_all_slow_coded"] = LinkModel(0.0, sent / 77.7e-3)
  model, _ = _estimates(prof, m)
  assert model["flat compressed"] == pytest.approx(84.6e-3, rel=0.01)
  p = prof.copy()
  p.links["host,local"][two_level.flat_coded_key("all_to_all")] = LinkModel(0.0, sent / 70e-3)
  est, note = _estimates(p, m)
  assert note.endswith(", flat compressed measured")
  assert est["flat compressed"] == pytest.approx(70e-3)
  for k in est:
    if k != "flat compressed":
      assert est[k] == pytest.approx(model[k], rel=1e-12), k
  assert _level_choice(prof, m).algorithm == "hierarchical(host:c,local:r)"
  assert _level_choice(p, m).algorithm == "flat"


@pytest.mark.parametrize("one_axis", [False, True], ids=["tuple", "one_axis"])
@pytest.mark.parametrize("flat_coded_ms,compressed", [(95.0, False), (70.0, True)])
def test_a_call_the_plan_keeps_flat_is_decided_once(flat_coded_ms, compressed, one_axis):
  """Where the two-level plan keeps a call flat, the flat path decides raw or compressed with the plan's
  own flat estimates (`LevelPlan.flat_estimates`), not a second model. The 2 x 4 AVX2 run's all_to_all: the
  plan put flat compressed (measured) at 101.2 ms against flat raw's 100.7 and kept the call flat, and the
  flat path, whose model said 96.3 ms, then ran it compressed (106.1 ms, flat raw 99.2). Here the model says
  compressed (84.6 ms against ~92 raw) and the measured program decides: 95 ms raw, 70 ms compressed."""
  prof = _two_level_profile(host_Bps=5e7)
  prof.codec = {"cpu": {"bfloat16": CodecModel(4.6e8, 4.6e8, 1e-4, 1e-4)}}
  m = 8 * 1280 * 256                                      # bfloat16 elements per device
  sent = (H * L - 1) * (m // (H * L)) * 2                 # the flat raw all_to_all's bytes
  prof.links["host,local"]["hierarchical_all_to_all"] = LinkModel(0.0, sent / 150e-3)   # both slower
  prof.links["host,local"]["hierarchical_all_to_all_slow_coded"] = LinkModel(0.0, sent / 140e-3)
  prof.links["host,local"][two_level.flat_coded_key("all_to_all")] = LinkModel(0.0, sent / (flat_coded_ms * 1e-3))
  axis, mesh = ("i", Mesh(np.array(jax.devices()[:H * L]), ("i",))) if one_axis else (AXES, _mesh())
  strategy.reset_decisions()
  with zipccl_jax.use_profile(prof), zipccl_jax.use_levels({"i": L}):
    f = jax.jit(jax.shard_map(lambda v: zipccl_jax.all_to_all(v, axis, 0, 0, tiled=True, name="once"),
                              mesh=mesh, in_specs=P(axis), out_specs=P(axis)))
    f.trace(jax.ShapeDtypeStruct((H * L * m,), jnp.bfloat16))
  levels, flat = zipccl_jax.decisions()["once [levels]"], zipccl_jax.decisions()["once"]
  assert levels.algorithm == "flat" and levels.reason.index("flat raw") > 0, levels.reason
  assert flat.compress is compressed, flat.reason
  assert "two-level plan's flat estimates" in flat.reason
  assert flat.est_compressed_s == pytest.approx(flat_coded_ms * 1e-3)
  assert flat.est_raw_s == dict(two_level.choose("all_to_all", ml_dtypes.bfloat16, m, AXES, AXES, (H, L),
                                                 "auto", "activation", profile=prof,
                                                 platform="cpu").candidates)["flat raw"]


def test_measured_coded_program_replaces_the_modelled_slow_phase_difference():
  """calibrate also times the program with the slow phase coded (hierarchical_<op>_slow_coded): the variants
  that code the slow phase then cost that time (plus the model's difference between the fast phase coded and
  raw; all_to_all's measured program is the mixed-slot exchange, both-coded runs rounds), the others keep theirs.
  A coded program measured no faster than the raw one turns `auto` away from the coded slow phase (the model
  alone saw a saving there that a quiet 2 x 4 testbed did not: 12 ms modelled, 3.5 ms measured)."""
  prof = _two_level_profile()
  sent = (H * L - 1) * 4096 * 2
  prof.links["host,local"]["hierarchical_all_to_all"] = LinkModel(0.0, 1e9)
  model, _ = _estimates(prof)
  for coded_bw in (4e9, 0.5e9):
    p = prof.copy()
    p.links["host,local"]["hierarchical_all_to_all_slow_coded"] = LinkModel(0.0, coded_bw)
    est, note = _estimates(p)
    assert note == "hierarchical raw measured, slow phase coded measured"
    assert est["hierarchical host:compressed local:raw"] == pytest.approx(sent / coded_bw)
    both, slow = "hierarchical host:compressed local:compressed", "hierarchical host:compressed local:raw"
    fast_c, raw = "hierarchical host:raw local:compressed", "hierarchical host:raw local:raw"
    assert est[both] - est[slow] == pytest.approx(model[fast_c] - model[raw], rel=1e-9, abs=1e-12)
    for k in ("hierarchical host:raw local:raw", "hierarchical host:raw local:compressed", "flat raw",
              "flat compressed"):
      assert est[k] == pytest.approx(model[k], rel=1e-12), k
    d = _level_choice(p, fixed_order=True)
    assert "slow phase coded measured" in d.reason
    assert ("host:c" in d.algorithm) == (coded_bw > 1e9), (coded_bw, d.algorithm, d.reason)


def test_coded_programs_measured_on_bfloat16_do_not_cost_float32_calls():
  """calibrate times the coded programs over the tuple on bfloat16 (two_level.PROGRAM_DTYPE). A float32
  call codes at another capacity (0.85 of raw against 0.70) and codec speed, so its coded variants keep the
  model (anchored on the measured raw program, which moves bytes whatever their dtype), and the note says so;
  a bfloat16 call costs the measurements."""
  prof = _two_level_profile()
  prof.links["host,local"]["hierarchical_all_to_all"] = LinkModel(0.0, 1e9)
  allowed = two_level._allowed("auto", "auto", None, "host", "local")

  def estimates(p, dt, m=H * L * 4096):
    with zipccl_jax.use_profile(p):
      est, note = two_level._candidates("all_to_all", np.dtype(dt), m, AXES, "host", "local", (H, L),
                                           "activation", allowed)
    return {k: v[0] for k, v in est.items()}, note

  p = prof.copy()
  p.links["host,local"]["hierarchical_all_to_all_slow_coded"] = LinkModel(0.0, 7e9)
  p.links["host,local"][two_level.flat_coded_key("all_to_all")] = LinkModel(0.0, 9e9)
  for dt in (np.float32, ml_dtypes.bfloat16):
    model, _ = estimates(prof, dt)
    est, note = estimates(p, dt)
    if np.dtype(dt) == two_level.PROGRAM_DTYPE:
      assert note.endswith("slow phase coded measured, flat compressed measured"), note
      assert est["flat compressed"] != pytest.approx(model["flat compressed"])
    else:
      assert note == "hierarchical raw measured, coded programs modelled (float32: measured on bfloat16)"
      assert est == model


@pytest.mark.parametrize("op", ["all_to_all", "all_gather"])
def test_every_variant_over_a_tuple_in_the_order_opposite_to_the_mesh(op):
  """("local", "host") on a ("host", "local") mesh: the first axis (local, 4 ranks) is the slow level and
  the tuple's ranks are local * 2 + host. jax.lax.ppermute numbers a tuple's ranks in the *mesh's* order
  (axis_index, all_to_all and all_gather in the tuple's), so the all_to_all rounds' permutations go through
  _shard.ppermute_rank: built from tuple coordinates they misrouted rows (and, coded, the receivers
  disagreed on the fallback and the devices hung in different branches)."""
  mesh, axes = _mesh(), ("local", "host")
  n = H * L
  x = _payload((n * n * 130,), ml_dtypes.bfloat16, seed=3)
  lax_op, zc_op = {
      "all_to_all": (lambda u: jax.lax.all_to_all(u.reshape(n, -1), axes, 0, 0, tiled=True),
                     lambda v, c: zipccl_jax.all_to_all(v.reshape(n, -1), axes, 0, 0, tiled=True, compress=c)),
      "all_gather": (lambda u: jax.lax.all_gather(u, axes, tiled=True),
                     lambda v, c: zipccl_jax.all_gather(v, axes, tiled=True, compress=c))}[op]

  def lax_bits(v):
    return jax.lax.bitcast_convert_type(lax_op(jax.lax.bitcast_convert_type(v, jnp.uint16)), v.dtype)

  ref = _bits(_run(mesh, lax_bits, x, P(axes)))
  for slow_c, fast_c in itertools.product((False, True), repeat=2):
    body = _variant_body(zc_op, "hierarchical", {"local": slow_c, "host": fast_c}, None)
    assert np.array_equal(_bits(_run(mesh, body, x, P(axes))), ref), (op, slow_c, fast_c)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32])
@pytest.mark.parametrize("capacity", [40, 1000, 4096 + 8])   # a small head, most of a row, the whole row
def test_slot_passes_give_back_every_bit(dtype, capacity):
  """`_mixed.slot_passes` (what calibrate times as the mixed exchange's own-row passes) runs `own_slots`
  and `own_rows` as the exchange does: the rows' bit patterns come back whole, NaN payloads and -0
  included, whether a row's head fills its slot or leaves a tail."""
  u = np.uint16 if np.dtype(dtype).itemsize == 2 else np.uint32
  bits = np.random.default_rng(3).integers(0, np.iinfo(u).max, (4, 4096 // np.dtype(dtype).itemsize),
                                           dtype=np.uint64).astype(u)
  bits[0, :3] = [u(0x7fc1 if u is np.uint16 else 0x7fc00001), u(1), u(1 << (8 * bits.itemsize - 1))]
  got = np.asarray(jax.jit(lambda r: _mixed.slot_passes(r, capacity))(jnp.asarray(bits.view(dtype))))
  assert got.dtype == u and np.array_equal(got, bits)
  slots = np.asarray(_mixed.own_slots(jnp.asarray(bits), capacity, jnp.bool_(True)))
  assert slots.shape == (4, capacity) and (slots[:, -_mixed.MIXED_FLAG_BYTES:] == 0xFF).all()
