"""psum's two algorithms (zipccl_jax/collectives.py, strategy.decide_psum) on 8 virtual CPU devices.

"a2a-sum+gather" (reduce-scatter + all-gather) and "gather-sum" (all-gather + local ordered sum) both
compute round(((f32(x_0) + f32(x_1)) + ...) + f32(x_{n-1})), so every algorithm, with and without
compression, returns the same bits, which are compared against a NumPy evaluation of that order.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import zipccl_jax
from zipccl_jax import strategy
from zipccl_jax.strategy.codec_cost import CodecModel
from zipccl_jax.strategy.links import LinkModel
from zipccl_jax.strategy.profile import Profile

N = 8
ALGS = ("a2a-sum+gather", "gather-sum")
pytestmark = pytest.mark.skipif(jax.device_count() < N, reason="needs 8 devices")


def _mesh():
  return jax.make_mesh((N,), ("i",))


def _bits(a):
  a = np.asarray(a)
  return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _per_device(shape, dtype, seed=0):
  """(N, *shape): device r's operand; Gaussian with +-0, +-Inf and subnormals mixed in."""
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal((N,) + shape, np.float32) * 0.05).astype(dtype)
  flat = x.reshape(-1)
  fin = ml_dtypes.finfo(dtype)
  specials = np.array([0.0, -0.0, fin.smallest_subnormal, -fin.smallest_subnormal], dtype)
  idx = rng.choice(flat.size, size=min(flat.size, 16), replace=False)
  flat[idx] = np.resize(specials, idx.size)
  flat[0] = np.array(np.inf, dtype)  # one Inf (device 0, element 0): Inf in the sum
  return x


def _ordered_sum(x, dtype):
  acc = x[0].astype(np.float32)
  for r in range(1, N):
    acc = acc + x[r].astype(np.float32)
  return acc.astype(dtype)


def _psum_fn(mesh, alg, compress, *, check_vma=True, pieces=None, name="ps"):
  def body(v):
    with zipccl_jax.use_algorithm(psum=alg, pieces=pieces):
      return zipccl_jax.psum(v[0], "i", compress=compress, name=name)[None]
  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                               check_vma=check_vma))


@pytest.mark.parametrize("dtype,shape", [(ml_dtypes.bfloat16, (5, 37)), (np.float32, (300,)),
                                         (np.float16, (3, 8, 4))])
def test_both_algorithms_bit_identical_to_the_documented_order(dtype, shape):
  """Sizes not divisible by n (the reduce-scatter pads): every algorithm x compress x K gives the
  documented order's bits on every rank."""
  mesh = _mesh()
  x = _per_device(shape, dtype)
  want = _ordered_sum(x, dtype)
  xs = jax.device_put(x, NamedSharding(mesh, P("i")))
  for alg in ALGS:
    for compress in (True, False):
      for pieces in (None, 2, 3):
        with zipccl_jax.use_defaults(fixed_order=True):  # raw too (else raw is jax.lax.psum)
          got = np.asarray(_psum_fn(mesh, alg, compress, pieces=pieces)(xs))
        for r in range(N):
          assert np.array_equal(_bits(got[r]), _bits(want)), (alg, compress, pieces, r)


def test_overflowing_frames_fall_back_with_the_same_bits():
  """Random bit patterns do not fit the default capacity: both algorithms take the raw fallback
  and keep the order's bits. (Normal numbers only: XLA:CPU flushes subnormal sums to zero, which
  the NumPy reference does not; the algorithms agree with each other either way.)"""
  mesh = _mesh()
  rng = np.random.default_rng(5)
  u = rng.integers(0x0080, 0x7000, size=(N, 4096), dtype=np.uint16)  # normal, every exponent
  u[::2] |= 0x8000
  x = u.view(ml_dtypes.bfloat16)
  want = _ordered_sum(x, ml_dtypes.bfloat16)
  xs = jax.device_put(x, NamedSharding(mesh, P("i")))
  for alg in ALGS:
    for pieces in (None, 2):
      got = np.asarray(_psum_fn(mesh, alg, True, pieces=pieces)(xs))
      assert np.array_equal(_bits(got[3]), _bits(want)), (alg, pieces)


def _latency_profile():
  """200 us per collective at 1 GB/s: latency dominates messages below ~100 KB."""
  p = Profile()
  p.links = {"*": {"*": LinkModel(2e-4, 1e9)}}
  p.codec = {"cpu": {"bfloat16": CodecModel(5e9, 5e9, 1e-6, 1e-6)}}
  return p


def test_model_picks_gather_sum_for_small_and_reduce_scatter_for_large_messages():
  """Between zipccl's fixed-order programs (fixed_order=True: raw runs them too). Without it raw is
  jax.lax.psum, the same program whichever algorithm the coded path would use."""
  prof = _latency_profile()
  small = strategy.decide("psum", ml_dtypes.bfloat16, 16, axis_size=N, message_elems=128,
                          profile=prof, platform="cpu", log=False, fixed_order=True)
  large = strategy.decide("psum", ml_dtypes.bfloat16, 1 << 20, axis_size=N,
                          message_elems=N << 20, profile=prof, platform="cpu", log=False,
                          fixed_order=True)
  lax_raw = strategy.decide("psum", ml_dtypes.bfloat16, 16, axis_size=N, message_elems=128,
                            profile=prof, platform="cpu", log=False)
  assert not lax_raw.compress and len({t for _, t in lax_raw.candidates}) == 1
  assert lax_raw.est_raw_s == pytest.approx(2 * (2e-4 + 7 * 16 * 2 / 1e9))  # a ring all-reduce
  assert small.algorithm == "gather-sum" and large.algorithm == "a2a-sum+gather", (small, large)
  for d in (small, large):
    names = [a for a, _ in d.candidates]
    assert names == list(ALGS) and "gather-sum" in d.reason and "a2a-sum+gather" in d.reason
  assert small.chunk_elems == 128 and large.chunk_elems == 1 << 20
  # raw: one latency against two for a tiny message; (n-1) messages against ~2 for a large one
  t_small = dict(small.candidates)
  assert t_small["gather-sum"] < t_small["a2a-sum+gather"]
  t_large = dict(large.candidates)
  assert t_large["a2a-sum+gather"] < t_large["gather-sum"]


def test_traced_calls_follow_the_model_and_explain_says_why():
  mesh = _mesh()
  strategy.reset_decisions()
  small = _per_device((64,), ml_dtypes.bfloat16)
  large = _per_device((N * 65536,), ml_dtypes.bfloat16, seed=1)
  with zipccl_jax.use_profile(_latency_profile()), zipccl_jax.use_defaults(fixed_order=True):
    for x, name in ((small, "small"), (large, "large")):
      f = _psum_fn(mesh, "auto", "auto", name=name)
      got = np.asarray(f(jax.device_put(x, NamedSharding(mesh, P("i")))))
      assert np.array_equal(_bits(got[0]), _bits(_ordered_sum(x, x.dtype)))
  ds = strategy.decisions()
  assert ds["small"].algorithm == "gather-sum", ds["small"]
  assert ds["large"].algorithm == "a2a-sum+gather", ds["large"]
  text = zipccl_jax.explain("small")
  assert "psum gather-sum (model: a2a-sum+gather" in text and "candidates" in text
  assert "gather-sum" in zipccl_jax.explain()


def test_int_capacity_keeps_reduce_scatter_unless_pinned():
  prof = _latency_profile()
  d = strategy.decide("psum", ml_dtypes.bfloat16, 16, axis_size=N, message_elems=128, capacity=64,
                      profile=prof, platform="cpu", log=False)
  assert d.algorithm == "a2a-sum+gather" and [a for a, _ in d.candidates] == ["a2a-sum+gather"]


def _hlo_collectives(f, x):
  text = f.lower(x).compile().as_text()
  return [(c["op"], c["shape"].split("[")[0].lstrip("(")) for c in zipccl_jax.hlo_collectives(text)
          if not c["fallback"]]


def test_compiled_hlo_of_each_algorithm():
  """gather-sum: one all-gather of uint8 frames; a2a-sum+gather: an all-to-all and an all-gather of
  frames; raw with fixed_order: the same collectives on the bit patterns (no float all-reduce);
  raw without: jax.lax.psum's all-reduce. Chunks of 2 KiB:
  compress=True sends raw a chunk whose frame would not be smaller (1024 elements: 256-byte chunks)."""
  mesh = _mesh()
  xs = jax.device_put(_per_device((8192,), ml_dtypes.bfloat16), NamedSharding(mesh, P("i")))
  assert sorted(_hlo_collectives(_psum_fn(mesh, "gather-sum", True), xs)) == [("all-gather", "u8")]
  assert sorted(_hlo_collectives(_psum_fn(mesh, "a2a-sum+gather", True), xs)) == [
      ("all-gather", "u8"), ("all-to-all", "u8")]
  with zipccl_jax.use_defaults(fixed_order=True):
    assert sorted(_hlo_collectives(_psum_fn(mesh, "gather-sum", False), xs)) == [
        ("all-gather", "u16")]
    assert sorted(_hlo_collectives(_psum_fn(mesh, "a2a-sum+gather", False), xs)) == [
        ("all-gather", "u16"), ("all-to-all", "u16")]
  # without fixed_order raw is jax.lax.psum as called: XLA's all-reduce, whichever algorithm
  # (of floats: XLA:CPU widens bfloat16 to f32)
  assert [op for op, _ in _hlo_collectives(_psum_fn(mesh, "gather-sum", False), xs)] == ["all-reduce"]


@pytest.mark.parametrize("check_vma", [True, False])
def test_grad_and_vmap_of_gather_sum(check_vma):
  """grad (psum's transpose: a pcast under check_vma, else psum again, also gather-sum) and vmap
  give the same bits as the reduce-scatter algorithm."""
  mesh = _mesh()
  x = _per_device((4, 24), np.float32, seed=2)
  x[0, 0, 0] = 0.25  # no Inf: gradients of a finite loss
  xs = jax.device_put(x, NamedSharding(mesh, P("i")))
  w = jnp.asarray(np.random.default_rng(3).standard_normal((4, 24), np.float32))
  out = {}
  for alg in ALGS:
    def loss(v, alg=alg):
      with zipccl_jax.use_algorithm(psum=alg):
        return jnp.sum(zipccl_jax.psum(v * w, "i", compress=True) * w)

    def body(v, alg=alg):
      g = jax.grad(loss)(v[0])
      with zipccl_jax.use_algorithm(psum=alg):
        y = jax.vmap(lambda r: zipccl_jax.psum(r, "i", compress=True))(v[0])
      return g[None], y[None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=(P("i"), P("i")),
                              check_vma=check_vma))
    out[alg] = [np.asarray(a) for a in f(xs)]
  for a, b in zip(out["a2a-sum+gather"], out["gather-sum"]):
    assert np.array_equal(_bits(a), _bits(b))
  # vmap over rows: row j is the psum of row j
  assert np.array_equal(_bits(out["gather-sum"][1][0]), _bits(_ordered_sum(x, np.float32)))


def test_use_algorithm_rejects_bad_psum_and_pieces():
  for kw in (dict(psum="ring"), dict(pieces=0), dict(pieces=True), dict(pieces=2.0)):
    with pytest.raises(ValueError, match="use_algorithm"):
      with zipccl_jax.use_algorithm(**kw):
        pass


def test_psum_algorithms_benchmark_smoke(tmp_path):
  """benchmarks/psum_algorithms.py runs, checks the variants' bits and writes its ratios."""
  import json
  import pathlib
  import subprocess
  import sys
  script = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "psum_algorithms.py"
  out = tmp_path / "psum.json"
  r = subprocess.run([sys.executable, "-P", str(script), "--sizes", "100", "--reps", "2", "--iters", "1",
                      "--json", str(out)], capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout + r.stderr
  rec = json.loads(out.read_text())["records"][0]
  assert rec["bit_identical"] and set(rec["ratios"]) == {"raw", "compressed"}
  assert len(rec["times_s"]["gather-sum compressed"]) == 2
