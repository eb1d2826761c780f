"""FP8 payloads through the collectives on 8 virtual CPU devices.

Every float8 dtype the codec knows is coded by the collectives too (the symbol is the whole
byte). Data movement must give jax.lax's bits for all 256 bit patterns (NaNs, +-0, Inf of
e5m2) and for amax-scaled Gaussian data; reductions give compress=False's bits (the documented
float32 order, rounded once to the FP8 dtype).

The reference for data movement is jax.lax applied to the uint8 view: XLA:CPU's own collectives
on float8_e5m2 canonicalise NaN payloads (0x7D, 0x7E, 0xFD.. all become 0x7F; seen with
jax 0.10.2), so jax.lax on the float8 array itself is only compared where there is no NaN.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zj
from zipccl_jax import capacity, format as fmt

pytestmark = pytest.mark.skipif(jax.device_count() < 8,
                                reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")

N = 8
FP8 = [np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)]
ALL_FP8 = list(fmt.FP8_DTYPES)


def _mesh():
  return jax.make_mesh((N,), ("i",))


def _data(dt, kind: str, rows: int = 8 * N, cols: int = 1024) -> np.ndarray:
  rng = np.random.default_rng(7)
  if kind == "patterns":  # every bit pattern on every device, shuffled per row
    base = np.tile(np.arange(256, dtype=np.uint8), rows * cols // 256).reshape(rows, cols)
    return rng.permuted(base, axis=1).view(dt)
  g = rng.standard_normal((rows, cols)).astype(np.float32)
  q = (g / np.abs(g).max() * float(ml_dtypes.finfo(dt).max)).astype(dt)
  if kind == "padded":  # a capacity-padded dispatch buffer: the last half of each row empty
    q[:, cols // 2:] = np.zeros((), dt)
  return q


def _bits(a):
  return np.asarray(a).view(np.uint8)


def _run(op: str, dt, x, compress, lax_on_bits: bool = True):
  mesh = _mesh()
  ops = {
      "all_to_all": (functools.partial(zj.all_to_all, axis_name="i", split_axis=0, concat_axis=0,
                                       tiled=True, compress=compress),
                     functools.partial(lax.all_to_all, axis_name="i", split_axis=0,
                                       concat_axis=0, tiled=True)),
      "all_gather": (functools.partial(zj.all_gather, axis_name="i", tiled=True, compress=compress),
                     functools.partial(lax.all_gather, axis_name="i", tiled=True)),
      "ppermute": (functools.partial(zj.ppermute, axis_name="i",
                                     perm=[(j, (j + 3) % N) for j in range(N)], compress=compress),
                   functools.partial(lax.ppermute, axis_name="i",
                                     perm=[(j, (j + 3) % N) for j in range(N)])),
      "psum_scatter": (functools.partial(zj.psum_scatter, axis_name="i", tiled=True,
                                         compress=compress), None),
  }
  ours, theirs = ops[op]
  if lax_on_bits and theirs is not None:
    theirs = _on_bits(theirs)
  arr = jax.device_put(x, NamedSharding(mesh, P("i")))
  got = jax.jit(jax.shard_map(ours, mesh=mesh, in_specs=P("i"), out_specs=P("i")))(arr)
  want = None
  if theirs is not None:
    want = jax.jit(jax.shard_map(theirs, mesh=mesh, in_specs=P("i"), out_specs=P("i")))(arr)
  return np.asarray(got), None if want is None else np.asarray(want)


def _on_bits(fn):
  """fn applied to the uint8 view: jax.lax's data movement without XLA:CPU's NaN canonicalising."""
  def wrapped(v):
    return lax.bitcast_convert_type(fn(lax.bitcast_convert_type(v, jnp.uint8)), v.dtype)
  return wrapped


@pytest.mark.parametrize("kind", ["patterns", "gaussian", "padded"])
@pytest.mark.parametrize("op", ["all_to_all", "all_gather", "ppermute"])
@pytest.mark.parametrize("dt", FP8, ids=lambda d: d.name)
def test_fp8_data_movement_is_bit_identical_to_lax(dt, op, kind):
  x = _data(dt, kind)
  zj.reset_stats()
  got, want = _run(op, dt, x, compress=True)
  assert got.dtype == dt and np.array_equal(_bits(got), _bits(want)), (op, kind)
  # the message really was coded (not sent raw through jax.lax)
  (site,) = [s for s in zj.stats().values() if s.op == op]
  assert site.compressed, site
  if kind != "patterns":  # no NaN: jax.lax on the float8 array itself agrees too
    _, want_f8 = _run(op, dt, x, compress=False, lax_on_bits=False)
    assert np.array_equal(_bits(got), _bits(want_f8))


@pytest.mark.parametrize("dt", [d for d in ALL_FP8 if d not in FP8], ids=lambda d: d.name)
def test_other_fp8_variants_all_to_all(dt):
  got, want = _run("all_to_all", dt, _data(dt, "patterns"), compress=True)
  assert np.array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("dt", FP8, ids=lambda d: d.name)
def test_fp8_reduction_compression_keeps_bits(dt):
  x = _data(dt, "gaussian")
  coded, _ = _run("psum_scatter", dt, x, compress=True)
  with zj.use_defaults(fixed_order=True):  # raw in the fixed order too (else jax.lax's call)
    raw, _ = _run("psum_scatter", dt, x, compress=False)
  assert coded.dtype == dt and np.array_equal(_bits(coded), _bits(raw))
  # the documented order: float32 additions in ascending rank order, rounded once
  parts = x.astype(np.float32).reshape(N, N, -1, x.shape[1])  # (device, chunk, rows, cols)
  acc = parts[0]
  for j in range(1, N):
    acc = acc + parts[j]
  assert np.array_equal(_bits(raw), _bits(acc.astype(dt).reshape(raw.shape)))


@pytest.mark.parametrize("dt", FP8, ids=lambda d: d.name)
def test_fp8_capacity_has_a_documented_ratio(dt):
  n = 1 << 16
  c = capacity.padded_capacity(n, dt)
  assert fmt.FRAME_HEADER_BYTES < c < fmt.max_encoded_bytes(n, dt)
  assert c == capacity.padded_capacity(n, dt, ratio=capacity.EXPECTED_RATIO["activation"][dt])


def test_fp8_auto_plans_and_explains():
  plan_site = "fp8_a2a_auto"
  mesh = _mesh()
  dt = FP8[0]
  x = jax.device_put(_data(dt, "gaussian"), NamedSharding(mesh, P("i")))
  f = jax.shard_map(lambda v: zj.all_to_all(v, "i", 0, 0, tiled=True, name=plan_site), mesh=mesh,
                    in_specs=P("i"), out_specs=P("i"))
  jax.jit(f).lower(x)
  assert plan_site in zj.decisions()
  assert dt.name in zj.explain(plan_site)
