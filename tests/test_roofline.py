"""jax.experimental.roofline sees our collectives (issue 37; zipccl_jax/_roofline.py).

Each collective is checked against jax.lax's estimate of the same call on the same mesh: raw, the same
``ici_bytes`` and ``ici_latency`` per axis and no HBM traffic; coded, jax.lax's ``ici_bytes`` scaled by the
bytes we send over the bytes jax.lax sends (the call site's statistics), which for all_to_all is exactly
jax.lax's estimate of an all_to_all of the uint8 frames, plus the codec's HBM traffic.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zj
from zipccl_jax import _compat, codec

rl = pytest.importorskip("jax.experimental.roofline")
pytestmark = [
    pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)"),
    pytest.mark.skipif(_compat.roofline_module() is None, reason="jax.experimental.roofline does not import"),
]

RING = [(j, (j + 1) % 4) for j in range(4)]
BODIES = {  # over "y" (4 ranks) of a 2 x 4 mesh, psum and pmean over both axes
    "all_to_all": lambda m, **k: lambda v: m.all_to_all(v, "y", 0, 0, tiled=True, **k),
    "all_gather": lambda m, **k: lambda v: m.all_gather(v, "y", tiled=True, **k),
    "psum_scatter": lambda m, **k: lambda v: m.psum_scatter(v, "y", scatter_dimension=0, tiled=True, **k),
    "psum": lambda m, **k: lambda v: m.psum(v, ("x", "y"), **k),
    "pmean": lambda m, **k: lambda v: m.pmean(v, "y", **k),
    "ppermute": lambda m, **k: lambda v: m.ppermute(v, "y", RING, **k),
}
OUT = {"psum": P(), "pmean": P("x")}
SPEC = P(("x", "y"))


def mesh():
  return jax.make_mesh((2, 4), ("x", "y"))


def operand(dtype=jnp.bfloat16, rows=8 * 64, cols=256):
  return jax.ShapeDtypeStruct((rows, cols), dtype, sharding=NamedSharding(mesh(), SPEC))


def estimate(body, op, x, **kw):
  return rl.roofline(body, mesh=mesh(), in_specs=SPEC, out_specs=OUT.get(op, SPEC), **kw)(x)[1]


@pytest.mark.parametrize("op", sorted(BODIES))
def test_raw_is_jax_lax_estimate(op):
  x = operand()
  want = estimate(BODIES[op](lax), op, x)
  got = estimate(BODIES[op](zj, compress=False), op, x)
  assert want.ici_bytes and got.ici_bytes == want.ici_bytes, (op, got, want)
  assert got.ici_latency == want.ici_latency
  assert got.hbm_bytes == want.hbm_bytes == 0
  assert got.peak_hbm_bytes == want.peak_hbm_bytes


@pytest.mark.parametrize("op", sorted(BODIES))
def test_coded_is_the_bytes_we_send(op):
  x = operand()
  want = estimate(BODIES[op](lax), op, x)
  zj.reset_stats()
  got = estimate(BODIES[op](zj, compress=True, name="rl"), op, x)
  sites = [s for k, s in zj.stats().items() if k.startswith("rl")]
  assert sites and all(s.compressed for s in sites), sites
  raw, sent = sum(s.raw_bytes for s in sites), sum(s.wire_bytes for s in sites)
  assert 0 < sent < raw
  assert got.ici_bytes == {a: b * sent // raw for a, b in want.ici_bytes.items()}, (op, got, want)
  assert got.ici_latency == want.ici_latency
  # the codec reads the operand (encode) and writes it back (decode), and the frames between
  per_device = x.size * 2 // 8
  assert got.hbm_bytes - want.hbm_bytes >= 2 * per_device, (op, got.hbm_bytes)


def test_coded_all_to_all_is_jax_lax_of_the_frames():
  """A coded all_to_all moves uint8 frames of `capacity` bytes per chunk: jax.lax's estimate of them."""
  x, cap = operand(), 4096  # chunks of 64 x 256 / 4 bf16 = 8 KiB
  got = estimate(BODIES["all_to_all"](zj, compress=True, capacity=cap), "all_to_all", x)
  frames = jax.ShapeDtypeStruct((8 * 4, cap), jnp.uint8, sharding=NamedSharding(mesh(), SPEC))
  want = estimate(BODIES["all_to_all"](lax), "all_to_all", frames)
  assert got.ici_bytes == want.ici_bytes, (got, want)


@pytest.mark.parametrize("compress", [False, True])
def test_backward_pass_is_counted(compress):
  x = operand()  # roofline's vjp sends bfloat16 cotangents
  f = BODIES["all_to_all"](zj, compress=compress)
  fwd = estimate(f, "all_to_all", x)
  both = estimate(f, "all_to_all", x, vjp=True)
  assert both.ici_bytes["y"] > 0
  if not compress:
    assert both.ici_bytes == estimate(BODIES["all_to_all"](lax), "all_to_all", x, vjp=True).ici_bytes
  assert fwd.ici_bytes["y"] > 0


def test_vmap_counts_every_example():
  """Two examples of half the rows each: twice the estimate of one such call."""
  half = estimate(BODIES["all_to_all"](zj, compress=True), "all_to_all", operand(rows=8 * 32))
  body = lambda v: jax.vmap(BODIES["all_to_all"](zj, compress=True))(v.reshape(2, -1, v.shape[-1]))
  two = rl.roofline(body, mesh=mesh(), in_specs=SPEC, out_specs=P(None, ("x", "y")))(operand())[1]
  assert two.ici_bytes == {a: 2 * b for a, b in half.ici_bytes.items()}, (half, two)
  # (the codec's bytes: those of the batched calls the callee holds; a custom_vmap_call keeps its
  # unbatched body, so the decode counts once: a lower bound)
  assert two.hbm_bytes > half.hbm_bytes > 0


def test_other_dtypes_are_jax_lax():
  x = operand(jnp.int32)
  for op in ("all_to_all", "ppermute"):
    assert estimate(BODIES[op](zj, compress=True), op, x) == estimate(BODIES[op](lax), op, x)


def test_codec_calls_count_their_hbm_traffic():
  x = jax.ShapeDtypeStruct((64, 256), jnp.bfloat16)
  res = rl.roofline(lambda v: codec.encode_frames(v.reshape(4, -1))[0])(x)[1]
  assert res.hbm_bytes >= 64 * 256 * 2 and res.ici_bytes == {}
