"""Exact ragged exchange (zipccl_jax/_ragged.py) on 8 virtual CPU devices, against a NumPy model.

`model_ragged_all_to_all` is written from jax.lax.ragged_all_to_all's documentation (its SEND/RECEIVE
pseudocode), not from our code: sender s sends its slice ``i`` (``input_offsets[i]``, ``send_sizes[i]``)
to rank ``i // spd``; receiver r writes the slice it gets as its ``i``-th at
``all_to_all(output_offsets)[i]`` with ``recv_sizes[i]`` rows, and keeps ``output`` elsewhere.
Every comparison is on bit patterns (random bits: NaN payloads, -0, subnormals, Inf).
"""
from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from zipccl_jax import _ragged

HERE = Path(__file__).resolve().parent

BF16 = np.dtype(ml_dtypes.bfloat16)
AXIS = "x"

pytestmark = pytest.mark.skipif(jax.device_count() < 8,
                                reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")


# --------------------------------------------------------------------------------------------------------- #
# the model (from the documentation) and random cases
# --------------------------------------------------------------------------------------------------------- #

def model_ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes):
  """Per-rank lists in, per-rank results out (the documented pseudocode, rank by rank)."""
  n = len(operand)
  k = len(input_offsets[0])
  spd = k // n
  result = [np.array(o, copy=True) for o in output]
  for r in range(n):
    # output_offsets_ = all_to_all(output_offsets, tiled): entry i comes from rank i // spd
    offsets_here = [output_offsets[i // spd][r * spd + i % spd] for i in range(k)]
    for i in range(k):
      src, j = divmod(i, spd)
      sent = r * spd + j  # the slice `src` sent to r as its j-th for r
      lo = input_offsets[src][sent]
      data = operand[src][lo:lo + send_sizes[src][sent]]
      assert len(data) == recv_sizes[r][i], "send_sizes must equal all_to_all(recv_sizes)"
      result[r][offsets_here[i]:offsets_here[i] + recv_sizes[r][i]] = data
  return result


def random_bits(rng, shape, dtype):
  dt = np.dtype(dtype)
  u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dt.itemsize]
  return rng.integers(0, np.iinfo(u).max, size=shape, dtype=u, endpoint=True).view(dt)


def gaussian_rows(rng, shape, dtype, *, nan_rows=2):
  """Compressible rows (N(0, 0.02)), with a few rows of NaNs with payloads, -0 and subnormals."""
  x = (rng.standard_normal(shape) * 0.02).astype(dtype)
  u = {1: np.uint8, 2: np.uint16, 4: np.uint32}[np.dtype(dtype).itemsize]
  flat = x.reshape(shape[0], shape[1], -1).view(u)
  special = {1: [0x7F, 0xFF, 0x80, 0x01], 2: [0x7F81, 0xFFC3, 0x8000, 0x0001],
             4: [0x7F800001, 0xFFC00123, 0x80000000, 1]}[np.dtype(dtype).itemsize]
  for r in range(shape[0]):
    for q in rng.choice(shape[1], size=min(nan_rows, shape[1]), replace=False):
      flat[r, q, :] = np.resize(np.array(special, u), flat.shape[2])
  return x


def disjoint_offsets(rng, sizes, total: int) -> np.ndarray:
  """Offsets placing slices of `sizes` in a buffer of `total` rows in random order, with random gaps."""
  k = len(sizes)
  gaps = rng.multinomial(total - sizes.sum(), np.ones(k + 1) / (k + 1))
  offsets = np.zeros(k, np.int64)
  pos = gaps[0]
  for q, i in enumerate(rng.permutation(k)):
    offsets[i] = pos
    pos += sizes[i] + gaps[q + 1]
  return offsets


def random_case(seed, *, n=8, spd=1, rows=12, out_rows=None, row_shape=(3,), dtype=BF16,
                payload="bits"):
  """Slices of random sizes (0 and whole-operand ones included) at random operand offsets
  (overlapping reads allowed), placed in each receiver's buffer disjointly with random gaps.
  `payload`: "bits" (uniformly random bit patterns: NaN payloads, incompressible) or
  "gaussian" (compressible, with NaN/-0/subnormal rows)."""
  rng = np.random.default_rng(seed)
  k = n * spd
  send = rng.integers(0, rows + 1, size=(n, k))
  send[rng.random((n, k)) < 0.2] = 0
  send[rng.random((n, k)) < 0.1] = rows  # full slices
  recv = np.stack([[send[i // spd][r * spd + i % spd] for i in range(k)] for r in range(n)])
  need = int(recv.sum(axis=1).max())
  m = out_rows if out_rows is not None else need + int(rng.integers(0, 8))
  assert m >= need
  in_off = np.stack([[rng.integers(0, rows - s + 1) for s in send[p]] for p in range(n)])
  out_here = np.stack([disjoint_offsets(rng, recv[r], m) for r in range(n)])  # receiver r's i-th slice
  # the sender gives output_offsets in the receiver's buffer: inverse of the tiled all_to_all
  out_off = np.stack([[out_here[i // spd][p * spd + i % spd] for i in range(k)] for p in range(n)])
  if payload == "bits":
    operand = random_bits(rng, (n, rows) + row_shape, dtype)
  else:
    operand = gaussian_rows(rng, (n, rows) + row_shape, dtype)
  output = random_bits(rng, (n, m) + row_shape, dtype)
  ints = lambda a: np.asarray(a, np.int32)
  return operand, output, ints(in_off), ints(send), ints(out_off), ints(recv)


@functools.lru_cache(None)
def mesh8():
  return jax.make_mesh((8,), (AXIS,))


def run_sharded(fn, *per_rank, mesh=None, **smap_kw):
  """fn on each rank's slice of the stacked (n, ...) arrays; returns the stacked (n, ...) results."""
  mesh = mesh or mesh8()
  spec = P(AXIS)
  args = [jax.device_put(a, NamedSharding(mesh, spec)) for a in per_rank]

  def body(*xs):
    return fn(*(x[0] for x in xs))[None]

  return np.asarray(jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, **smap_kw))(*args))


def exact(*args, **kw):
  return _ragged.exchange(*args, axis_name=AXIS, **kw)


def variants():
  """The implementations checked across processes (tests/ragged_mp_worker.py), by name."""
  import zipccl_jax as zj
  coded = lambda compress: lambda *a: zj.ragged_all_to_all(*a, axis_name=AXIS, compress=compress)
  return {"exact": exact, "compressed": coded(True), "raw": coded(False)}


def assert_bits_equal(got, want, what=""):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
  u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
  bad = np.argwhere(got.view(u) != want.view(u))
  assert bad.size == 0, f"{what}: {len(bad)} elements differ bitwise, first at {bad[:3].tolist()}"


def model(*case):
  return np.stack(model_ragged_all_to_all(*[list(a) for a in case]))


def check_case(case, **kw):
  want = model(*case)
  got = run_sharded(lambda *a: exact(*a, **kw), *case)
  assert_bits_equal(got, want)


# --------------------------------------------------------------------------------------------------------- #
# exactness
# --------------------------------------------------------------------------------------------------------- #

def test_documented_two_device_example():
  """The example of jax.lax.ragged_all_to_all's docstring, on the first two of 8 ranks (others send 0)."""
  operand = np.zeros((8, 3), np.int32)
  output = np.zeros((8, 4), np.int32)
  io, ss, oo, rs = (np.zeros((8, 8), np.int32) for _ in range(4))
  operand[0], operand[1] = [1, 2, 2], [3, 4, 0]
  io[0, :2], ss[0, :2], oo[0, :2], rs[0, :2] = [0, 1], [1, 2], [0, 0], [1, 1]
  io[1, :2], ss[1, :2], oo[1, :2], rs[1, :2] = [0, 1], [1, 1], [1, 2], [2, 1]
  got = run_sharded(exact, operand, output, io, ss, oo, rs)
  assert got[0].tolist() == [1, 3, 0, 0] and got[1].tolist() == [2, 2, 4, 0]
  assert not got[2:].any()


@pytest.mark.parametrize("spd", [1, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_cases_bit_exact(spd, seed):
  check_case(random_case(seed, spd=spd))


@pytest.mark.parametrize("dtype,row_shape", [(np.float32, ()), (np.float16, (2, 2)), (np.int32, (5,)),
                                             (np.complex64, (2,)), (np.bool_, (4,)),
                                             (np.dtype(ml_dtypes.float8_e4m3fn), (3,))])
def test_dtypes_and_row_shapes(dtype, row_shape):
  check_case(random_case(10, spd=2, row_shape=row_shape, dtype=dtype))


def test_output_fully_overwritten_and_untouched():
  case = random_case(4, spd=2, rows=6)
  need = int(case[5].sum(axis=1).max())
  check_case(random_case(4, spd=2, rows=6, out_rows=need))  # some receiver gets exactly M rows
  empty = list(random_case(5, spd=2))
  for a in (3, 5):
    empty[a] = np.zeros_like(empty[a])  # nothing moves: output comes back bit for bit
  got = run_sharded(exact, *empty)
  assert_bits_equal(got, empty[1])


def test_tight_max_send_rows_and_wide_indices():
  """A caller's bound that holds gives the same bits; 64-bit offsets (x64 index path) too."""
  case = random_case(6, spd=2, rows=10)
  per_dest = int(max(case[3][p].reshape(8, 2).sum(axis=1).max() for p in range(8)))
  check_case(case, max_send_rows=per_dest)
  with jax.enable_x64(True):
    wide = case[:2] + tuple(a.astype(np.int64) for a in case[2:])
    check_case(wide)


def test_wide_index_math_matches(monkeypatch):
  """The int64 row arithmetic (used once n*bound or offsets reach 2**31) gives the same rows."""
  monkeypatch.setattr(_ragged, "_INT32_LIMIT", 16)
  check_case(random_case(7, spd=2))


def test_axis_index_groups():
  groups = [[0, 2, 4, 6], [1, 3, 5, 7]]
  case = random_case(8, n=4, spd=2, rows=5)
  # rank g[q] of each group plays rank q of the 4-rank case; the other group runs the same case
  per_rank = [np.zeros((8,) + a.shape[1:], a.dtype) for a in case]
  for g in groups:
    for q, r in enumerate(g):
      for full, a in zip(per_rank, case):
        full[r] = a[q]
  want_g = np.stack(model_ragged_all_to_all(*[list(a) for a in case]))
  got = run_sharded(lambda *a: exact(*a, axis_index_groups=groups), *per_rank)
  for g in groups:
    assert_bits_equal(got[g], want_g)


def test_check_vma_off_and_vmap():
  case = random_case(9, spd=2, rows=6)
  want = np.stack(model_ragged_all_to_all(*[list(a) for a in case]))
  got = run_sharded(exact, *case, check_vma=False)
  assert_bits_equal(got, want)
  # vmap over a batch of 3 cases inside shard_map: example b is case b
  cases = [random_case(20 + b, spd=2, rows=6, out_rows=want.shape[1]) for b in range(3)]
  stacked = [np.stack([c[a] for c in cases], axis=1) for a in range(6)]  # (n, B, ...)
  got = run_sharded(lambda *a: jax.vmap(exact)(*a), *stacked)
  for b, c in enumerate(cases):
    assert_bits_equal(got[:, b], np.stack(model_ragged_all_to_all(*[list(a) for a in c])), f"example {b}")


# --------------------------------------------------------------------------------------------------------- #
# platforms and errors
# --------------------------------------------------------------------------------------------------------- #

def test_cuda_lowering_is_xla_ragged_all_to_all():
  mesh = mesh8()
  case = random_case(0, spd=2)
  spec = P(AXIS)
  f = jax.jit(jax.shard_map(lambda *a: exact(*(x[0] for x in a))[None], mesh=mesh, in_specs=spec,
                            out_specs=spec))
  args = [jax.device_put(a, NamedSharding(mesh, spec)) for a in case]
  cuda = f.trace(*args).lower(lowering_platforms=("cuda",)).as_text(dialect="hlo")
  assert "ragged-all-to-all" in cuda and "all-to-all(" not in cuda.replace("ragged-all-to-all(", "")
  cpu = f.lower(*args).as_text(dialect="hlo")
  assert "ragged-all-to-all" not in cpu and "all-to-all(" in cpu


def _trace(operand, output, *idx, n=8):
  mesh = mesh8()
  spec = P(AXIS)
  args = [jax.ShapeDtypeStruct((n,) + np.shape(a), np.asarray(a).dtype,
                               sharding=NamedSharding(mesh, spec)) for a in (operand, output, *idx)]
  jax.jit(jax.shard_map(lambda *a: exact(*(x[0] for x in a))[None], mesh=mesh, in_specs=spec,
                        out_specs=spec)).trace(*args)


def test_trace_time_errors():
  f32 = lambda *s: np.zeros(s, np.float32)
  i32 = lambda *s: np.zeros(s, np.int32)
  with pytest.raises(ValueError, match="multiple of the number of ranks"):
    _trace(f32(4, 2), f32(4, 2), i32(12), i32(12), i32(12), i32(12))
  with pytest.raises(ValueError, match="same length"):
    _trace(f32(4, 2), f32(4, 2), i32(8), i32(16), i32(8), i32(8))
  with pytest.raises(TypeError, match="send_sizes must be an integer array"):
    _trace(f32(4, 2), f32(4, 2), i32(8), f32(8), i32(8), i32(8))
  with pytest.raises(TypeError, match="same dtype"):
    _trace(f32(4, 2), i32(4, 2), i32(8), i32(8), i32(8), i32(8))
  with pytest.raises(ValueError, match="same row shape"):
    _trace(f32(4, 2), f32(4, 3), i32(8), i32(8), i32(8), i32(8))
  with pytest.raises(ValueError, match="recv_sizes must be rank 1"):
    _trace(f32(4, 2), f32(4, 2), i32(8), i32(8), i32(8), i32(8, 1))


def test_concrete_slices_outside_the_buffers_raise():
  """Offsets and sizes known at trace time (closed-over constants) are checked against the buffers."""
  operand, output, io, ss, oo, rs = random_case(11, spd=1, rows=6)
  def call(io_, ss_, oo_):  # NumPy constants, the same on every rank
    return run_sharded(lambda a, b, r: exact(a, b, io_, ss_, oo_, r), operand, output, rs)
  ok_io, ok_ss, ok_oo = io[0], ss[0], oo[0]  # rank 0's, valid, used as constants on every rank
  with pytest.raises(ValueError, match=r"slice 3 \(input_offsets\[3\] = 5, send_sizes\[3\] = 2\) does not "
                                       r"fit in operand's 6 rows"):
    call(np.where(np.arange(8) == 3, 5, ok_io), np.where(np.arange(8) == 3, 2, ok_ss), ok_oo)
  with pytest.raises(ValueError, match=r"output_offsets\[0\] = -1"):
    call(ok_io, ok_ss, np.where(np.arange(8) == 0, -1, ok_oo))
  with pytest.raises(ValueError, match=r"send_sizes\[7\] = -2"):
    call(ok_io, np.where(np.arange(8) == 7, -2, ok_ss), ok_oo)
  # valid constants: every rank sends its row 0 to every rank, which stores it at the sender's index
  io0, ss1 = np.zeros(8, np.int32), np.ones(8, np.int32)
  oo = np.repeat(np.arange(8, dtype=np.int32)[:, None], 8, axis=1)
  for name, fn in variants().items():
    got = run_sharded(lambda a, b, o, r, fn=fn: fn(a, b, io0, ss1, o, r), operand, output, oo, np.ones_like(oo))
    want = model(operand, output, np.zeros_like(oo), np.ones_like(oo), oo, np.ones_like(oo))
    assert_bits_equal(got, want, name)


# --------------------------------------------------------------------------------------------------------- #
# reverse mode (the model's adjoint; tests/test_ragged_collective.py checks jax.grad against it)
# --------------------------------------------------------------------------------------------------------- #

def disjoint_reads(case, seed):
  """The case with each sender's slices at disjoint operand offsets (so the adjoint is a scatter)."""
  rng = np.random.default_rng(seed)
  operand, output, _, send, out_off, recv = case
  n = send.shape[0]
  rows = int(send.sum(axis=1).max()) + 3
  in_off = np.stack([disjoint_offsets(rng, send[p], rows) for p in range(n)])
  operand = random_bits(rng, (n, rows) + operand.shape[2:], operand.dtype)
  return operand, output, in_off, send, out_off, recv


def model_vjp(case, ct):
  """Adjoint of the model: each received row's cotangent goes back to the operand row it came from;
  `output`'s cotangent is `ct` where nothing landed."""
  operand, output, in_off, send, out_off, recv = case
  n, k = send.shape
  spd = k // n
  op_ct = np.zeros_like(operand)
  out_ct = np.array(ct, copy=True)
  for r in range(n):
    for i in range(k):
      src, j = divmod(i, spd)
      sent = r * spd + j
      dst = out_off[src][sent]
      lo, size = in_off[src][sent], send[src][sent]
      op_ct[src][lo:lo + size] = ct[r][dst:dst + size]
      out_ct[r][dst:dst + size] = 0
  return op_ct, out_ct


def test_across_processes():
  """2 processes x 2 devices (jax.distributed, gloo): every variant matches the model bit for bit."""
  from mp_launch import launch, results
  for res in results(launch(HERE / "ragged_mp_worker.py", 2, 2, timeout=300)):
    assert res["devices"] == 4 and res["checks"]
    assert all(res["checks"].values()), f"rank {res['rank']}: failed checks {res['checks']}"
