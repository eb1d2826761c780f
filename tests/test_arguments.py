"""Arguments checked at the door: every public collective checks `compress`, `transport` and `capacity` when it
is called, whatever the plan then decides (a typo under compress="auto" must not wait for the cost model to pick
compression), with a ValueError/TypeError naming the function and the argument; so do `use_defaults` and
`compress_collectives`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import zipccl_jax as zj

PERM = [(k, (k + 1) % 8) for k in range(8)]
OPS = {
    "all_to_all": lambda v, **kw: zj.all_to_all(v, "i", 0, 0, tiled=True, **kw),
    "all_gather": lambda v, **kw: zj.all_gather(v, "i", tiled=True, **kw),
    "psum_scatter": lambda v, **kw: zj.psum_scatter(v, "i", tiled=True, **kw),
    "psum": lambda v, **kw: zj.psum(v, "i", **kw),
    "pmean": lambda v, **kw: zj.pmean(v, "i", **kw),
    "ppermute": lambda v, **kw: zj.ppermute(v, "i", PERM, **kw),
    "all_gather_invariant": lambda v, **kw: zj.all_gather_invariant(v, "i", tiled=True, **kw),
}


def _mesh():
  """Built when a test runs, not at import: the GPU kit collects this file on a one-GPU host."""
  return jax.make_mesh((8,), ("i",))


def _trace(fn, dtype=jnp.bfloat16):
  mesh = _mesh()
  x = jax.device_put(jnp.ones((64, 16), dtype), NamedSharding(mesh, P("i")))
  return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=P("i"))).lower(x)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("compress", ["auto", False, True])
def test_a_bad_transport_is_refused_whatever_the_decision(op, compress):
  with pytest.raises(ValueError, match=r"zipccl_jax\.\w+: transport must be 'auto', 'padded' or 'ragged', got 'ragd'"):
    _trace(lambda v: OPS[op](v, compress=compress, transport="ragd"))


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("capacity,error,match", [
    (-1, ValueError, "capacity must be >= 32 bytes"), (0.0, ValueError, "capacity ratio must be > 0"),
    (float("nan"), ValueError, "capacity ratio must be > 0"), ("obs", TypeError, "capacity must be an int"),
    (True, TypeError, "capacity must be an int"), ((0.7, 0.8, 0.9), ValueError, "capacity pair"),
])
def test_a_bad_capacity_is_refused_also_when_raw(op, capacity, error, match):
  for dtype in (jnp.bfloat16, jnp.int32):  # an uncoded dtype (always raw) is checked too
    with pytest.raises(error, match=match):
      _trace(lambda v: OPS[op](v, compress=False, capacity=capacity), dtype)


def test_ragged_all_to_all_checks_compress_and_capacity_first():
  def f(v):
    idx = jnp.zeros((8,), jnp.int32)
    return zj.ragged_all_to_all(v, v, idx, idx, idx, idx, axis_name="i", compress=False, capacity=-5)
  with pytest.raises(ValueError, match=r"zipccl_jax\.ragged_all_to_all: capacity must be >= 32"):
    _trace(f)


def test_defaults_and_the_transform_check_when_set():
  with pytest.raises(ValueError, match=r"use_defaults: capacity must be >= 32"):
    with zj.use_defaults(capacity=-1):
      pass
  with pytest.raises(ValueError, match=r"compress_collectives: capacity ratio must be > 0"):
    zj.compress_collectives(lambda v: v, capacity=-0.5)
  with pytest.raises(ValueError, match=r"compress_collectives: transport must be"):
    zj.compress_collectives(lambda v: v, transport="ragd")


def test_good_arguments_still_pass():
  for cap in (None, 64, 0.8, 2.0, "observed", (0.7, 0.8), np.int64(128)):
    _trace(lambda v: zj.all_to_all(v, "i", 0, 0, tiled=True, compress="auto", capacity=cap, transport="padded"))


def test_decode_names_the_dtype_it_refuses():
  payload, _ = zj.encode(jnp.ones(10, jnp.bfloat16))
  with pytest.raises(TypeError, match=r"^zipccl_jax: dtype=int8 is not coded; the codec codes bfloat16"):
    zj.decode(payload, shape=(10,), dtype=jnp.int8)
