"""zipccl_jax.ragged_all_to_all (compressed) and the ragged transport of the other collectives, run on 8
virtual CPU devices (XLA:CPU has no ragged-all-to-all: zipccl_jax._ragged's exact emulation runs there).

ragged_all_to_all is checked against the NumPy model of jax.lax's documented semantics in
tests/test_ragged.py (not against our own code); all_to_all / all_gather / ppermute with
``transport="ragged"`` against jax.lax on held-out data (tests/data). Bits are compared, never values.
"""
from __future__ import annotations

import re
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
from zipccl_jax import _ragged
from test_ragged import (AXIS, BF16, assert_bits_equal, disjoint_reads, mesh8, model_ragged_all_to_all,
                         model_vjp, random_case, run_sharded)

DATA = Path(__file__).resolve().parent / "data"

pytestmark = pytest.mark.skipif(jax.device_count() < 8,
                                reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")


def zrag(*args, **kw):
  return zj.ragged_all_to_all(*args, axis_name=AXIS, **kw)


def model(case):
  return np.stack(model_ragged_all_to_all(*[list(a) for a in case]))


def held_out_bf16(n_values: int) -> np.ndarray:
  """MoE dispatch activations from tests/data (held out from every capacity or ratio choice)."""
  a = np.load(DATA / "act_moe_dispatch.bf16.npy")
  a = a.view(BF16) if a.dtype == np.uint16 else a.astype(BF16)
  return np.resize(a.ravel(), n_values)


def run_with_stats(fn, *case, site):
  zj.reset_stats()
  prev = zj.set_runtime_stats(True)
  try:
    got = run_sharded(fn, *case)
    jax.effects_barrier()
  finally:
    zj.set_runtime_stats(prev)
  return got, zj.stats()[site]


# --------------------------------------------------------------------------------------------------------- #
# ragged_all_to_all
# --------------------------------------------------------------------------------------------------------- #

@pytest.mark.parametrize("spd", [1, 2])
def test_compressed_bit_exact_coded_and_fallback(spd):
  """Compressible rows (NaN payload rows included) go coded; random bits do not fit and travel raw, row by
  row (the ragged transport has no uniform fallback: a device counts a fallback when it received a raw
  row, and the one receiving only zero-padded frames that fit counts none); both equal the model bit for
  bit."""
  for payload, fallbacks in (("gaussian", range(0, 1)), ("bits", range(1, 9))):
    case = random_case(40 + spd, spd=spd, rows=24, row_shape=(128,), payload=payload)
    got, st = run_with_stats(lambda *a: zrag(*a, compress=True, name="rag"), *case, site="rag")
    assert_bits_equal(got, model(case), f"{payload}, spd={spd}")
    assert st.op == "ragged_all_to_all" and st.compressed and st.capacity > 0
    assert st.calls == 8 and st.fallbacks in fallbacks, (payload, st)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_rows_coded_bit_exact(dtype):
  """FP8 rows (the symbol is the whole byte) go coded, NaN bytes included."""
  dt = np.dtype(getattr(ml_dtypes, dtype))
  case = random_case(45, spd=2, rows=24, row_shape=(256,), dtype=dt, payload="gaussian")
  got, st = run_with_stats(lambda *a: zrag(*a, compress=True, name="f8"), *case, site="f8")
  assert_bits_equal(got, model(case), dtype)
  assert st.compressed and st.dtype == dtype and st.fallbacks == 0, st


def test_held_out_data_two_slices_empty_full_and_nan():
  case = list(random_case(50, spd=2, rows=32, row_shape=(64,), payload="gaussian"))
  case[0] = held_out_bf16(case[0].size).reshape(case[0].shape)
  case[0][3, 5, :] = np.array(0x7FC1, np.uint16).view(BF16)  # a NaN payload row
  send = case[3]
  assert (send == 0).any() and (send == 32).any()  # empty and full slices
  got, st = run_with_stats(lambda *a: zrag(*a, compress=True, name="held"), *case, site="held")
  assert_bits_equal(got, model(case), "held-out")
  assert st.fallbacks == 0
  raw = run_sharded(lambda *a: zrag(*a, compress=False), *case)
  assert_bits_equal(raw, got, "compress=False")


@pytest.mark.parametrize("compress", [True, False])
def test_grad_is_the_documented_transpose(compress):
  case = disjoint_reads(random_case(60, spd=2, dtype=np.float32, row_shape=(8,), payload="gaussian"), 3)
  ct = (np.random.default_rng(4).standard_normal(case[1].shape) * 0.02).astype(np.float32)

  def grads(operand, output, io, ss, oo, rs, w):
    f = lambda a, b: jnp.sum(zrag(a, b, io, ss, oo, rs, compress=compress, name="g") * w)
    ga, gb = jax.grad(f, argnums=(0, 1))(operand, output)
    return jnp.concatenate([ga, gb])

  zj.reset_stats()
  got = run_sharded(grads, *case, ct)
  op_ct, out_ct = model_vjp(case, ct)
  n_rows = case[0].shape[1]
  assert_bits_equal(got[:, :n_rows], op_ct, "operand cotangent")
  assert_bits_equal(got[:, n_rows:], out_ct, "output cotangent")
  st = zj.stats()
  assert st["g/bwd"].compressed is compress and st["g/bwd"].op == "ragged_all_to_all"


@pytest.mark.parametrize("compress", [True, False])
def test_forward_mode_applies_the_collective_to_the_tangent(compress):
  """jvp / linearize of a linear map: the tangent out is the map of the tangents in, bit for bit."""
  case = random_case(64, spd=2, dtype=np.float32, row_shape=(8,), payload="gaussian")
  rng = np.random.default_rng(5)
  t_op, t_out = (rng.standard_normal(a.shape).astype(np.float32) for a in case[:2])

  def tangents(operand, output, io, ss, oo, rs, dx, dy):
    f = lambda a, b: zrag(a, b, io, ss, oo, rs, compress=compress)
    y, dy_out = jax.jvp(f, (operand, output), (dx, dy))
    _, f_lin = jax.linearize(f, operand, output)
    return jnp.stack([y, dy_out, f_lin(dx, dy)])

  got = run_sharded(tangents, *case, t_op, t_out)
  assert_bits_equal(got[:, 0], model(case), "primal")
  want_t = model((t_op, t_out) + tuple(case[2:]))
  assert_bits_equal(got[:, 1], want_t, "jvp tangent")
  assert_bits_equal(got[:, 2], want_t, "linearize")


@pytest.mark.parametrize("compress", [True, False])
def test_hessian_vector_product_transposes_twice(compress):
  """jvp of grad wrt operand only: the offsets are residuals of each transposition (not constants
  of a finished trace), and `output`, not differentiated, is a known linear argument."""
  case = disjoint_reads(random_case(66, spd=2, dtype=np.float32, row_shape=(4,), payload="gaussian"), 3)

  def hvp(operand, output, io, ss, oo, rs):
    f = lambda a: jnp.sum(zrag(a, output, io, ss, oo, rs, compress=compress) ** 2)
    return jax.jvp(jax.grad(f), (operand,), (jnp.ones_like(operand),))[1]

  # f = |R a + K output|^2 has Hessian 2 R^T R: 2 R^T (R ones), with R^T the documented transpose.
  ones, zeros = np.ones_like(case[0]), np.zeros_like(case[1])
  want, _ = model_vjp(case, model((ones, zeros) + tuple(case[2:])))
  assert_bits_equal(run_sharded(hvp, *case), 2 * want, "Hessian-vector product")


def test_vmap_batches_examples():
  cases = [random_case(70 + b, spd=2, rows=10, out_rows=140, row_shape=(64,),
                       payload="bits" if b == 1 else "gaussian") for b in range(3)]
  stacked = [np.stack([c[a] for c in cases], axis=1) for a in range(6)]  # (n, B, ...)
  got = run_sharded(lambda *a: jax.vmap(lambda *x: zrag(*x, compress=True))(*a), *stacked)
  for b, c in enumerate(cases):  # example 1 falls back, the others decode
    assert_bits_equal(got[:, b], model(c), f"example {b}")


def test_compress_auto_and_uncoded_dtypes():
  case = random_case(80, spd=2, rows=10, dtype=np.int32, row_shape=(4,))
  got = run_sharded(lambda *a: zrag(*a, name="ints"), *case)  # auto: ints go raw
  assert_bits_equal(got, model(case), "int32")
  assert not zj.stats()["ints"].compressed
  # compress=True sends dtypes the codec does not cover raw, as jax.lax would (the drop-in rule)
  got = run_sharded(lambda *a: zrag(*a, compress=True, name="ints_forced"), *case)
  assert_bits_equal(got, model(case), "int32, compress=True")
  assert not zj.stats()["ints_forced"].compressed


def test_axis_index_groups_send_raw_bits():
  groups = [[0, 2, 4, 6], [1, 3, 5, 7]]
  case = random_case(91, n=4, spd=2, rows=5)
  per_rank = [np.zeros((8,) + a.shape[1:], a.dtype) for a in case]  # rank g[q] plays rank q
  for g in groups:
    for q, r in enumerate(g):
      for full, a in zip(per_rank, case):
        full[r] = a[q]
  want_g = np.stack(model_ragged_all_to_all(*[list(a) for a in case]))
  got = run_sharded(lambda *a: zrag(*a, compress=True, axis_index_groups=groups), *per_rank)
  for g in groups:
    assert_bits_equal(got[g], want_g)


def test_trace_time_errors():
  case = random_case(90, spd=1, rows=4)
  twelve = [np.zeros((8, 12), np.int32)] * 4  # 12 offsets: not a multiple of the 8 ranks
  with pytest.raises(ValueError, match="zipccl_jax.ragged_all_to_all: the length of the offsets"):
    run_sharded(lambda *a: zrag(*a, compress=True), *case[:2], *twelve)
  with pytest.raises(TypeError, match="zipccl_jax.ragged_all_to_all: recv_sizes must be an integer"):
    run_sharded(lambda *a: zrag(*a, compress=True), *case[:5], case[5].astype(np.float32))
  with pytest.raises(ValueError, match="compress must be True, False or 'auto'"):
    run_sharded(lambda *a: zrag(*a, compress="yes"), *case)


def test_cuda_lowering_moves_coded_frames_with_ragged_all_to_all():
  mesh = mesh8()
  spec = P(AXIS)
  case = random_case(0, spd=2, payload="gaussian")
  # frames of 24 rows x 3 bf16 (144 B) are smaller raw than a default capacity, which compress=True sends
  # raw: a byte-count capacity codes them all the same
  f = jax.jit(jax.shard_map(lambda *a: zrag(*(x[0] for x in a), compress=True, capacity=160)[None], mesh=mesh,
                            in_specs=spec, out_specs=spec))
  args = [jax.device_put(a, NamedSharding(mesh, spec)) for a in case]
  cuda = f.trace(*args).lower(lowering_platforms=("cuda",)).as_text(dialect="hlo")
  assert "ragged-all-to-all" in cuda
  assert 'custom_call_target="zipccl_encode' in cuda and 'custom_call_target="zipccl_decode' in cuda


# --------------------------------------------------------------------------------------------------------- #
# transport="ragged" of the other collectives executes on CPU
# --------------------------------------------------------------------------------------------------------- #

def _ring(n):
  return [(i, (i + 1) % n) for i in range(n)]


PAIRS = {
    "all_to_all": (lambda v, **kw: zj.all_to_all(v, AXIS, 0, 0, tiled=True, **kw),
                   lambda v: lax.all_to_all(v, AXIS, 0, 0, tiled=True)),
    "all_gather": (lambda v, **kw: zj.all_gather(v, AXIS, tiled=True, **kw),
                   lambda v: lax.all_gather(v, AXIS, tiled=True)),
    "ppermute": (lambda v, **kw: zj.ppermute(v, AXIS, _ring(8), **kw),
                 lambda v: lax.ppermute(v, AXIS, _ring(8))),
}


def _data(kind):
  n = 8 * 16 * 512
  if kind == "held_out":
    return held_out_bf16(n).reshape(8 * 16, 512)
  rng = np.random.default_rng(5)
  return rng.integers(0, 2**16, size=n, dtype=np.uint16).view(BF16).reshape(8 * 16, 512)


@pytest.mark.parametrize("op", sorted(PAIRS))
def test_ragged_transport_runs_on_cpu_bit_identical(op):
  mesh = mesh8()
  spec = P(AXIS)
  ours, theirs = PAIRS[op]
  g = jax.jit(jax.shard_map(lambda v: theirs(lax.bitcast_convert_type(v, jnp.uint16)), mesh=mesh,
                            in_specs=spec, out_specs=spec))
  for kind, fell_back in (("held_out", False), ("bits", True)):  # random bits overflow
    x = jax.device_put(_data(kind), NamedSharding(mesh, spec))
    zj.reset_stats()
    prev = zj.set_runtime_stats(True)  # before tracing: the counters are traced in
    try:
      f = jax.jit(jax.shard_map(lambda v: ours(v, compress=True, transport="ragged", name=op),
                                mesh=mesh, in_specs=spec, out_specs=spec))
      assert "ragged-all-to-all" not in f.lower(x).as_text(dialect="hlo")  # the exact emulation
      got = np.asarray(f(x))
      jax.effects_barrier()
    finally:
      zj.set_runtime_stats(prev)
    assert_bits_equal(got.view(np.uint16), np.asarray(g(x)), f"{op} {kind}")
    st = zj.stats()[op]
    assert st.compressed and st.calls == 8 and (st.fallbacks > 0) is fell_back, (kind, st)


# (calls, fallbacks) when sender 3's rows are random bits: the devices that receive a raw row
RAW_RECEIVERS = {"all_to_all": 7, "all_gather": 7, "ppermute": 1}  # the ring: only device 4


@pytest.mark.parametrize("op", sorted(PAIRS))
def test_ragged_transport_sends_rows_that_do_not_fit_raw_without_a_conditional(op):
  """On the ragged transport all_to_all, all_gather and ppermute have no uniform fallback: only the rows
  that do not fit travel raw. Sender 3's rows are random bits, every other sender's compress: the devices
  that receive from 3 each receive one raw row (a fallback in their stats), the others none; the bits
  are jax.lax's. The CUDA lowering on this transport has no conditional (XLA:GPU would stop the host for
  its predicate); the padded transport keeps its one per call."""
  mesh = mesh8()
  spec = P(AXIS)
  ours, theirs = PAIRS[op]
  data = _data("held_out")
  data[3 * 16:4 * 16] = _data("bits")[3 * 16:4 * 16]
  x = jax.device_put(data, NamedSharding(mesh, spec))
  g = jax.jit(jax.shard_map(lambda v: theirs(lax.bitcast_convert_type(v, jnp.uint16)), mesh=mesh,
                            in_specs=spec, out_specs=spec))
  zj.reset_stats()
  prev = zj.set_runtime_stats(True)
  try:
    f = jax.jit(jax.shard_map(lambda v: ours(v, compress=True, transport="ragged", name="rows"),
                              mesh=mesh, in_specs=spec, out_specs=spec))
    got = np.asarray(f(x))
    jax.effects_barrier()
  finally:
    zj.set_runtime_stats(prev)
  assert_bits_equal(got.view(np.uint16), np.asarray(g(x)), "one incompressible sender")
  st = zj.stats()["rows"]
  assert (st.calls, st.fallbacks) == (8, RAW_RECEIVERS[op]), st
  for tr, conds in (("auto", 0), ("padded", 1)):
    h = jax.jit(jax.shard_map(lambda v: ours(v, compress=True, transport=tr), mesh=mesh, in_specs=spec,
                              out_specs=spec))
    cuda = h.trace(x).lower(lowering_platforms=("cuda",)).as_text(dialect="hlo")
    assert len(re.findall(r" conditional\(", cuda)) == conds, (op, tr)
    assert ("ragged-all-to-all" in cuda) is (tr == "auto"), (op, tr)


@pytest.mark.parametrize("name,call,conds", [
    ("psum_scatter", lambda v, tr: zj.psum_scatter(v, AXIS, tiled=True, compress=True, transport=tr), (0, 1)),
    ("psum", lambda v, tr: zj.psum(v, AXIS, compress=True, transport=tr), (1, 2)),
    ("all_gather_invariant", lambda v, tr: zj.all_gather_invariant(v, AXIS, tiled=True, compress=True,
                                                                   transport=tr), (1, 1))],
    ids=lambda v: v if isinstance(v, str) else None)
def test_cuda_conditionals_of_the_other_compressed_calls(name, call, conds):
  """The CUDA lowering's conditionals on the default and the padded transport: none in psum_scatter on the
  default; psum's device-invariant gather and all_gather(to="invarying") stay padded, with the uniform
  fallback's one (psum padded: one per phase)."""
  mesh = mesh8()
  spec = P(AXIS)
  x = jax.device_put(_data("held_out"), NamedSharding(mesh, spec))
  for tr, want in zip(("auto", "padded"), conds):
    out = P() if name == "all_gather_invariant" else spec
    h = jax.jit(jax.shard_map(lambda v: call(v, tr), mesh=mesh, in_specs=spec, out_specs=out))
    cuda = h.trace(x).lower(lowering_platforms=("cuda",)).as_text(dialect="hlo")
    assert len(re.findall(r" conditional\(", cuda)) == want, (name, tr)


def test_ragged_all_to_all_lowers_without_a_conditional():
  mesh = mesh8()
  spec = P(AXIS)
  case = random_case(46, spd=2, rows=24, row_shape=(128,), payload="gaussian")
  rag = jax.jit(jax.shard_map(lambda *a: zrag(*(v[0] for v in a), compress=True)[None], mesh=mesh,
                              in_specs=spec, out_specs=spec))
  args = [jax.device_put(a, NamedSharding(mesh, spec)) for a in case]
  cuda = rag.trace(*args).lower(lowering_platforms=("cuda",)).as_text(dialect="hlo")
  assert "ragged-all-to-all" in cuda and " conditional(" not in cuda


# a partial permutation: a rank sending to itself (5, the incompressible sender), ranks receiving nothing
# (2, 4, 6) or sending nothing (1, 4, 7)
_PARTIAL = [(0, 3), (3, 0), (5, 5), (6, 1), (2, 7)]
SLOT_OPS = {
    "all_to_all": (lambda v, **kw: zj.all_to_all(v, AXIS, 0, 0, tiled=True, **kw),
                   lambda v: lax.all_to_all(v, AXIS, 0, 0, tiled=True)),
    "all_gather": (lambda v, **kw: zj.all_gather(v, AXIS, tiled=True, **kw),
                   lambda v: lax.all_gather(v, AXIS, tiled=True)),
    "ppermute_partial": (lambda v, **kw: zj.ppermute(v, AXIS, _PARTIAL, **kw),
                         lambda v: lax.ppermute(v, AXIS, _PARTIAL)),
}


@pytest.mark.parametrize("op", sorted(SLOT_OPS))
@pytest.mark.parametrize("dtype,cols,capacity", [
    ("bfloat16", 512, None), ("float16", 333, None), ("float32", 256, None),
    ("float8_e4m3fn", 777, None), ("float8_e5m2", 512, None),
    ("bfloat16", 512, 4096), ("float32", 64, 96)],
    ids=["bf16", "f16_odd_cols", "f32", "e4m3_odd_bytes", "e5m2", "bf16_slot_is_capacity",
         "f32_tiny_capacity"])
def test_ragged_rows_share_one_receive_buffer_bit_exact(op, dtype, cols, capacity):
  """The ragged transport's receive buffer holds a frame or a raw row per slot: rows that fit (coded),
  rows that do not (sender 5's random bits, raw), the own row (a local copy; ppermute: a rank sending to
  itself), slots wider than a row (a capacity above the row's bytes), a capacity too small for any frame
  (every row raw) and, for a partial ppermute, ranks that receive nothing (zeros), with NaN payloads, -0,
  subnormals and infinities among compressible values. Bits equal jax.lax's."""
  ours, theirs = SLOT_OPS[op]
  mesh = mesh8()
  spec = P(AXIS)
  dt = np.dtype(getattr(ml_dtypes, dtype) if dtype.startswith(("bfloat", "float8")) else dtype)
  u = {1: np.uint8, 2: np.uint16, 4: np.uint32}[dt.itemsize]
  rng = np.random.default_rng(11)
  data = (rng.standard_normal((8 * 8, cols)) * 0.02).astype(dt)
  bits = data.view(u)
  bits[5 * 8:6 * 8] = rng.integers(0, np.iinfo(u).max, size=(8, cols), dtype=u, endpoint=True)
  special = np.array([np.nan, -0.0, np.inf, -np.inf], dt).view(u)
  specials = np.concatenate([special, special | 1, np.array([1, 2, u(1) << (8 * dt.itemsize - 1) | 1], u)])
  bits[::7, :specials.size] = specials
  x = jax.device_put(bits.view(dt), NamedSharding(mesh, spec))
  f = jax.jit(jax.shard_map(lambda v: ours(v, compress=True, capacity=capacity, transport="ragged"),
                            mesh=mesh, in_specs=spec, out_specs=spec))
  g = jax.jit(jax.shard_map(lambda v: theirs(lax.bitcast_convert_type(v, u)), mesh=mesh, in_specs=spec,
                            out_specs=spec))
  assert_bits_equal(np.asarray(f(x)).view(u), np.asarray(g(x)), f"{op} {dtype} {cols} {capacity}")


def test_ragged_transport_int64_offsets(monkeypatch):
  """Frame offsets are int64 once n*C can pass 2**31 (forced here with a small limit): still exact on
  CPU, and the CUDA ragged-all-to-all takes s64 offsets."""
  monkeypatch.setattr(_ragged, "_INT32_LIMIT", 16)  # rows of 64 bytes: a few dozen per buffer
  mesh = mesh8()
  spec = P(AXIS)
  ours, theirs = PAIRS["all_to_all"]
  f = jax.jit(jax.shard_map(lambda v: ours(v, compress=True, transport="ragged"), mesh=mesh,
                            in_specs=spec, out_specs=spec))
  x = jax.device_put(_data("held_out"), NamedSharding(mesh, spec))
  g = jax.jit(jax.shard_map(lambda v: theirs(lax.bitcast_convert_type(v, jnp.uint16)), mesh=mesh,
                            in_specs=spec, out_specs=spec))
  assert_bits_equal(np.asarray(f(x)).view(np.uint16), np.asarray(g(x)), "int64 offsets")
  prev = zj.set_runtime_stats(False)  # debug callbacks cannot be lowered for another platform
  try:
    cuda = f.trace(x).lower(lowering_platforms=("cuda",)).as_text(dialect="hlo")
  finally:
    zj.set_runtime_stats(prev)
  calls = re.findall(r"ragged-all-to-all\(([^)]*)\)", cuda)
  type_of = lambda name: re.search(rf"\n\s*{re.escape(name)} = (\w+)\[", cuda).group(1)
  # operand, output, then the four offsets and sizes: both exchanges (the frames, then the raw rows into
  # the same receive buffer) move bytes, with int64 offsets
  kinds = sorted((type_of(ops.split(", ")[0]), {type_of(x) for x in ops.split(", ")[2:]}) for ops in calls)
  assert kinds == [("u8", {"s64"}), ("u8", {"s64"})], kinds


@pytest.mark.parametrize("axis", ["b", ("a", "b")], ids=["one_axis_of_2x4", "both_axes"])
def test_two_dimensional_mesh(axis):
  """On a 2x4 mesh: over 'b' (4 ranks; operands also vary over 'a', each 'a' row its own exchange) and over
  ('a', 'b') (8 ranks, row-major)."""
  mesh = jax.make_mesh((2, 4), ("a", "b"))
  n = 4 if axis == "b" else 8
  groups = [random_case(100 + g, n=n, spd=2, rows=16, out_rows=260, row_shape=(64,), payload="gaussian")
            for g in range(8 // n)]
  per_rank = [np.concatenate([c[i] for c in groups]) for i in range(6)]  # rank order = row-major (a, b)
  spec = P(("a", "b"))
  args = [jax.device_put(x, NamedSharding(mesh, spec)) for x in per_rank]
  f = jax.jit(jax.shard_map(lambda *xs: zj.ragged_all_to_all(*(x[0] for x in xs), axis_name=axis,
                                                             compress=True)[None],
                            mesh=mesh, in_specs=spec, out_specs=spec))
  got = np.asarray(f(*args))
  want = np.concatenate([model(c) for c in groups])
  assert_bits_equal(got, want, str(axis))


@pytest.mark.parametrize("op", sorted(SLOT_OPS))
def test_ragged_transport_under_vmap_bit_exact(op):
  """jax.vmap of the ragged transport (ragged_all_to_all batches its offsets with the frames): two
  examples per device, the second of sender 5 random bits (raw rows in that example only)."""
  ours, theirs = SLOT_OPS[op]
  mesh = mesh8()
  spec = P(None, AXIS)
  rng = np.random.default_rng(3)
  bits = (rng.standard_normal((2, 8 * 8, 96)) * 0.02).astype(BF16).view(np.uint16)
  bits[1, 5 * 8:6 * 8] = rng.integers(0, 2**16, size=(8, 96), dtype=np.uint16)
  x = jax.device_put(bits.view(BF16), NamedSharding(mesh, spec))
  f = jax.jit(jax.shard_map(jax.vmap(lambda v: ours(v, compress=True, transport="ragged")), mesh=mesh,
                            in_specs=spec, out_specs=spec))
  g = jax.jit(jax.shard_map(jax.vmap(lambda v: theirs(lax.bitcast_convert_type(v, jnp.uint16))),
                            mesh=mesh, in_specs=spec, out_specs=spec))
  assert_bits_equal(np.asarray(f(x)).view(np.uint16), np.asarray(g(x)), f"vmap {op}")
