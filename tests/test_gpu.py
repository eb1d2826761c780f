"""Ready for the first GPU host: `pytest -m gpu` (issue 15).

Every test takes a `backend` (tests/codec_backends.py): "cuda" (marked `gpu`; skipped with "no CUDA
device ..." where JAX sees none), "cpu" (XLA:CPU, 8 virtual devices) and, for the codec, "emulator" (the
CUDA kernel bodies on the SIMT emulator). The same test bodies therefore run in the normal suite on this
machine; `pytest -m gpu` selects the CUDA runs only.

- codec: the bytes of every coded dtype (float8 included), sizes 0, 1, odd tails, a block and a bit, rows
  at odd capacities, NaN payloads, +-0, subnormals, +-Inf and random bits, with and without the checksum,
  skipped and overflowing frames, equal the CPU driver's; decoding gives the bits back; damaged and
  truncated frames get the CPU driver's verdict (status code, NaN rows; a raise where the platform can);
- collectives: all_to_all, all_gather, ppermute, all_gather_invariant (bit-identical to jax.lax on the bits; also
  in 3 pieces, each decoded into its columns of one result), psum_scatter,
  psum, pmean (compress=True bit-identical to compress=False with fixed_order=True, psum to the documented
  fixed-order sum),
  with both transports, under jit and grad; ragged_all_to_all against jax.lax's documented semantics
  (and, on CUDA, against jax.lax.ragged_all_to_all itself); each on a one-device mesh with its row coded
  (`_exchange.code_own_row`: what a one-GPU host runs) and on up to 8 devices;
- `zipccl_jax.info()`: kernels built, a driver new enough, no problems;
- a multi-process run (jax.distributed on 127.0.0.1, one process per GPU: NCCL) of tests/mp_worker.py.
"""
from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zj
from codec_backends import (BLOCK, EXT, HOST, NO_CUDA, UINT, adversarial_bits, cuda_devices,
                            decode_rows, encode_rows, max_encoded_bytes, reference_decode,
                            reference_encode, rejected_fill, sprinkled_bits)
from mp_launch import launch, results
from zipccl_jax import _exchange, codec
from zipccl_jax import format as fmt

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
AXIS = "x"
BF16 = np.dtype(ml_dtypes.bfloat16)

_cuda = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not cuda_devices(), reason=NO_CUDA)])
_emulator = pytest.param("emulator", marks=pytest.mark.skipif(
    HOST is None, reason="extension built without the CUDA host bindings (no emulator)"))
CODEC_BACKENDS = [_cuda, "cpu", _emulator]
DEVICE_BACKENDS = [_cuda, "cpu"]
DTYPES = [dt.name for dt in fmt.SUPPORTED_DTYPES]


# ---- codec: bytes against the CPU driver -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", CODEC_BACKENDS)
def test_codec_bytes_equal_cpu_driver(backend, dtype):
  dtype = np.dtype(dtype)
  for i, n in enumerate([0, 1, 7, 2049, BLOCK + 3 * 2048 + 5]):
    bits = np.stack([adversarial_bits(dtype, n, seed=10 * i + f) for f in range(3)])
    bits[2, : n // 2] = 0  # a zero run, then the rest
    checksum = i % 2 == 1
    cap = max_encoded_bytes(n, dtype) + 3  # odd: rows 1 and 2 start unaligned
    skip = np.array([False, n == 2049, False])
    payload, nbytes = encode_rows(backend, bits, dtype, checksum=checksum, cap=cap, skip=skip, seed=i)
    for f in range(3):
      if skip[f]:
        assert nbytes[f] == 0 and not payload[f].any(), (n, f)
        continue
      want, need = reference_encode(bits[f], dtype, checksum, cap)
      assert nbytes[f] == need, (n, f, nbytes[f], need)
      np.testing.assert_array_equal(payload[f], want, err_msg=f"{backend} {dtype} n={n} frame {f}")
    out, status = decode_rows(backend, payload, dtype, n, skip=skip, seed=i)
    assert not status.any(), [codec.status_message(int(s)) for s in status]
    np.testing.assert_array_equal(out[~skip], bits[~skip], err_msg=f"{backend} {dtype} n={n} decode")
    assert not out[skip].any()


@pytest.mark.parametrize("backend", CODEC_BACKENDS)
def test_codec_overflow_header_only(backend):
  """A frame larger than the capacity leaves its header (frame_bytes = the size needed), zeros after it."""
  dtype, n = BF16, 3000
  bits = np.stack([adversarial_bits(dtype, n, seed=s) for s in range(2)])
  bits[1] = np.random.default_rng(1).integers(0, 1 << 16, n, dtype=np.uint16)  # random bits: RAW
  cap = 4500
  payload, nbytes = encode_rows(backend, bits, dtype, checksum=True, cap=cap)
  for f in range(2):
    want, need = reference_encode(bits[f], dtype, True, cap)
    assert nbytes[f] == need
    np.testing.assert_array_equal(payload[f], want)
  assert nbytes[1] > cap


def _damaged(dtype, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(bits, payload rows): a good frame with checksum, then copies with bit flips over header, directory,
  block headers, tables and bitstreams, a frame whose frame_bytes exceeds the row (truncated), one cut
  at half its length, and one of zeros."""
  rng = np.random.default_rng(seed)
  bits = adversarial_bits(dtype, n, seed)
  bits[: n // 3] = (rng.standard_normal(n // 3) * 0.02).astype(dtype).view(bits.dtype)
  cap = max_encoded_bytes(n, dtype)
  good, need = reference_encode(bits, dtype, seed % 2 == 0, cap)
  rows = [good]
  for at in [*range(0, 32, 3), *rng.integers(32, need, 24)]:
    bad = good.copy()
    bad[at] ^= np.uint8(1 << int(rng.integers(8)))
    rows.append(bad)
  big = good.copy()
  big[16:24] = np.frombuffer(np.uint64(cap + 1).tobytes(), np.uint8)
  cut = good.copy()
  cut[need // 2:] = 0
  rows += [big, cut, np.zeros_like(good)]
  return bits, np.stack(rows)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float8_e4m3fn"])
@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_codec_damaged_frames_get_the_cpu_verdict(backend, dtype):
  """Each damaged or truncated frame gets the CPU driver's verdict: its status code and a NaN row, or the
  same bits when the damage is invisible (a flipped mantissa without checksum). Without the status
  result the call raises on CPU; CUDA cannot raise, so there the rejected rows are NaN."""
  dtype = np.dtype(dtype)
  n = BLOCK + 2048 + 9
  bits, payload = _damaged(dtype, n, seed=len(dtype.name))
  out, status = decode_rows(backend, payload, dtype, n)
  verdicts = [reference_decode(row, dtype, n) for row in payload]
  fill = rejected_fill(dtype)
  for f, (want, err) in enumerate(verdicts):
    if err is None:
      assert status[f] == 0, (f, codec.status_message(int(status[f])))
      np.testing.assert_array_equal(out[f], want)
    else:
      assert status[f] != 0 and err.endswith(codec.status_message(int(status[f]))), (f, err)
      assert (out[f] == fill).all(), f
  assert status[0] == 0 and len({int(s) for s in status if s}) >= 4  # several distinct reasons
  bad = next(f for f, (_, err) in enumerate(verdicts) if err is not None)
  dev = jax.devices(backend)[0]
  decode = jax.jit(lambda p: codec.decode_frames(p, shape=(n,), dtype=dtype))
  if backend == "cpu":
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"zipccl decode \(frame 0"):
      np.asarray(decode(jax.device_put(payload[bad:bad + 1], dev)))
  else:
    got = np.asarray(decode(jax.device_put(payload[bad:bad + 1], dev))).view(UINT[dtype.itemsize])
    assert (got == fill).all()


# ---- collectives: bit-exact against jax.lax, both transports, jit and grad ---------------------------------


# "all": up to 8 devices of the backend (2 at least); "one": a single device with own-row skipping off
# (`_exchange.code_own_row`), so its one row takes the whole coded path: encode, transport (padded or
# ragged), the overflow test and raw fallback, decode. On a one-GPU host "one" is what runs.
MESHES = ["one", "all"]


@contextlib.contextmanager
def _mesh(backend, which: str):
  devs = cuda_devices() if backend == "cuda" else jax.devices("cpu")
  if which == "one":
    with _exchange.code_own_row():
      yield Mesh(np.array(devs[:1]), (AXIS,))
    return
  if len(devs) < 2:
    pytest.skip(f"needs at least 2 {backend} devices, found {len(devs)}")
  yield Mesh(np.array(devs[:8]), (AXIS,))


def _ring(n):
  return [(i, (i + 1) % n) for i in range(n)]


def _run(mesh, body, *xs):
  spec = P(AXIS)
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
  return f(*(jax.device_put(x, NamedSharding(mesh, spec)) for x in xs))


def _u(x):
  return np.asarray(x).view(UINT[np.asarray(x).dtype.itemsize])


def _bitcast(v):
  return lax.bitcast_convert_type(v, jnp.dtype(UINT[v.dtype.itemsize]))


MOVES = {  # name -> (zipccl_jax call with **kw, jax.lax twin)
    "all_to_all": (lambda v, n, **kw: zj.all_to_all(v, AXIS, 0, 0, tiled=True, **kw),
                   lambda v, n: lax.all_to_all(v, AXIS, 0, 0, tiled=True)),
    "all_gather": (lambda v, n, **kw: zj.all_gather(v, AXIS, tiled=True, **kw),
                   lambda v, n: lax.all_gather(v, AXIS, tiled=True)),
    "all_gather_axis1": (lambda v, n, **kw: zj.all_gather(v, AXIS, axis=1, **kw).reshape(v.shape[0], -1),
                         lambda v, n: lax.all_gather(v, AXIS, axis=1).reshape(v.shape[0], -1)),
    "ppermute": (lambda v, n, **kw: zj.ppermute(v, AXIS, _ring(n), **kw),
                 lambda v, n: lax.ppermute(v, AXIS, _ring(n))),
    "all_gather_invariant": (lambda v, n, **kw: zj.all_gather_invariant(v, AXIS, tiled=True, **kw),
                             lambda v, n: lax.all_gather(v, AXIS, tiled=True)),  # jax 0.10 has no lax twin
}
REDUCTIONS = {
    "psum_scatter": lambda v, **kw: zj.psum_scatter(v, AXIS, scatter_dimension=0, tiled=True, **kw),
    "psum": lambda v, **kw: zj.psum(v, AXIS, **kw),
    "pmean": lambda v, **kw: zj.pmean(v, AXIS, **kw),
}


def _collective_data(n: int, dtype, seed: int, kind: str = "coded") -> np.ndarray:
  """(n * 8n, 512) of `dtype`: "coded" (Gaussian with NaN payloads, +-0, subnormals and Inf sprinkled in:
  every frame fits) or "fallback" (random bits: frames overflow, every rank takes the raw path)."""
  rows, cols = 8 * n, 512
  size = n * rows * cols
  if kind == "fallback":
    u = UINT[np.dtype(dtype).itemsize]
    x = np.random.default_rng(seed).integers(0, np.iinfo(u).max, size, dtype=u, endpoint=True)
  else:
    x = sprinkled_bits(dtype, size, seed)
  return x.reshape(n * rows, cols).view(dtype)


def _with_stats(fn):
  """fn() traced and run with runtime statistics on; (its result, zipccl_jax.stats())."""
  zj.reset_stats()
  prev = zj.set_runtime_stats(True)  # before tracing: the counters are traced in
  try:
    out = jax.block_until_ready(fn())
    jax.effects_barrier()
  finally:
    zj.set_runtime_stats(prev)
  return out, zj.stats()


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("transport", ["padded", "ragged"])
@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_collectives_bit_exact(backend, transport, mesh):
  """Data movement bit-identical to jax.lax on coded data (no fallback) and on data that overflows
  (every rank falls back); reductions equal to compress=False and psum to the documented sum."""
  with _mesh(backend, mesh) as m:
    _collectives_bit_exact(m, transport)


def _collectives_bit_exact(mesh, transport):
  n = mesh.size
  names = list(MOVES)
  for dtype in (BF16, np.dtype(ml_dtypes.float8_e4m3fn)):
    for kind in ("coded", "fallback"):
      x = _collective_data(n, dtype, seed=3, kind=kind)
      body = lambda v: tuple(MOVES[k][0](v, n, compress=True, transport=transport, name=k) for k in names)
      got, stats = _with_stats(lambda: _run(mesh, body, x))
      want = _run(mesh, lambda v: tuple(MOVES[k][1](_bitcast(v), n) for k in names), x)
      for k, g, w in zip(names, got, want):
        what = f"{k} {dtype} {kind} {transport}"
        np.testing.assert_array_equal(_u(g), np.asarray(w), err_msg=what)
        st = stats[k]
        assert st.compressed and st.calls == n and (st.fallbacks > 0) == (kind == "fallback"), (what, st)
  x = _collective_data(n, BF16, seed=4)
  f32 = x.astype(np.float32)  # sums of finite normal values (XLA:CPU flushes subnormals)
  x = np.where(np.isfinite(f32) & (np.abs(f32) >= float(jnp.finfo(BF16).smallest_normal)), x,
               np.zeros_like(x))
  names = list(REDUCTIONS)
  got = _run(mesh, lambda v: tuple(REDUCTIONS[k](v, compress=True, transport=transport) for k in names), x)
  raw = _run(mesh, lambda v: tuple(REDUCTIONS[k](v, compress=False, fixed_order=True) for k in names), x)
  for k, g, r in zip(names, got, raw):
    np.testing.assert_array_equal(_u(g), _u(r), err_msg=f"{k} compress=True vs False, {transport}")
  acc = functools.reduce(lambda a, b: a + b, x.reshape(n, -1, x.shape[1]).astype(np.float32))
  np.testing.assert_array_equal(_u(got[1])[: acc.shape[0]], _u(acc.astype(BF16)),
                                err_msg="psum: the documented ascending-rank float32 sum")


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_collectives_in_pieces_bit_exact(backend, mesh):
  """The padded transport in 3 pieces (`zipccl_jax._pieces`: each piece decoded into its columns of one
  result by `zipccl_decode_into`, the raw fallback a loop): bit-identical to jax.lax on coded data and on
  data that overflows."""
  with _mesh(backend, mesh) as m:
    n = m.size
    names = ["all_to_all", "all_gather", "ppermute", "all_gather_invariant"]
    for kind in ("coded", "fallback"):  # 64 Ki elements per row: pieces large enough to code
      x = np.tile(_collective_data(n, BF16, seed=6, kind=kind), (1, 128))

      def body(v):
        with zj.use_algorithm(pieces=3):
          return tuple(MOVES[k][0](v, n, compress=True, transport="padded", name=k) for k in names)

      got, stats = _with_stats(lambda: _run(m, body, x))
      want = _run(m, lambda v: tuple(MOVES[k][1](_bitcast(v), n) for k in names), x)
      for k, g, w in zip(names, got, want):
        np.testing.assert_array_equal(_u(g), np.asarray(w), err_msg=f"{k} {kind} in 3 pieces")
        assert (stats[k].fallbacks > 0) == (kind == "fallback"), (k, kind, stats[k])


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_decode_into_writes_its_columns_on_the_device(backend):
  """`codec.decode_frames_into` on the device: frames of every kind of bits land in their columns,
  every other element keeps its bits."""
  dev = cuda_devices()[0] if backend == "cuda" else jax.devices("cpu")[0]
  dtype, frames, n, row, col = BF16, 3, BLOCK + 2049, BLOCK + 5000, 1999
  bits = np.stack([sprinkled_bits(dtype, n, seed=f) for f in range(frames)])
  into = np.stack([sprinkled_bits(dtype, row, seed=9 + f) for f in range(frames)])
  put = lambda a: jax.device_put(a.view(dtype), dev)  # noqa: E731
  payload, _ = jax.jit(lambda v: codec.encode_frames(v, capacity=max_encoded_bytes(n, dtype)))(put(bits))
  got = jax.jit(lambda i, p: codec.decode_frames_into(i, p, col=col, elems=n))(put(into), payload)
  want = into.copy()
  want[:, col:col + n] = bits
  np.testing.assert_array_equal(_u(got), want)


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("transport", ["padded", "ragged"])
@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_collectives_grad_bit_exact(backend, transport, mesh):
  """jax.grad through the compressed collectives: all_to_all and ppermute (transposes are data movement)
  bit-identical to jax.lax's grad; all_gather (transpose: psum_scatter) to compress=False."""
  with _mesh(backend, mesh) as m:
    _collectives_grad_bit_exact(m, transport)


def _collectives_grad_bit_exact(mesh, transport):
  n = mesh.size
  spec = P(AXIS)
  x = _collective_data(n, BF16, seed=5)

  def grad(op, **kw):
    def loss(v):
      y = jax.shard_map(lambda u: op(u, n, **kw), mesh=mesh, in_specs=spec, out_specs=spec)(v)
      weight = jnp.sin(jnp.arange(y.size, dtype=jnp.float32)).reshape(y.shape)
      return jnp.sum(y.astype(jnp.float32) * weight)
    return np.asarray(jax.jit(jax.grad(loss))(jax.device_put(x, NamedSharding(mesh, spec)))).view(np.uint16)

  for k in ("all_to_all", "ppermute"):
    ours, twin = MOVES[k]
    np.testing.assert_array_equal(grad(ours, compress=True, transport=transport), grad(twin),
                                  err_msg=f"grad {k} {transport}")
  ours = MOVES["all_gather"][0]
  with zj.use_defaults(fixed_order=True):  # the transposed psum_scatter, raw, in the fixed order too
    fixed = grad(ours, compress=False)
  np.testing.assert_array_equal(grad(ours, compress=True, transport=transport), fixed,
                                err_msg=f"grad all_gather {transport}")


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_ragged_all_to_all_bit_exact(backend, mesh):
  with _mesh(backend, mesh) as m:
    _ragged_all_to_all_bit_exact(backend, m)


def _ragged_all_to_all_bit_exact(backend, mesh):
  from test_ragged import model_ragged_all_to_all, random_case
  n = mesh.size
  case = random_case(70, n=n, spd=2, rows=24, row_shape=(128,), payload="gaussian")
  spec = P(AXIS)

  def run(fn):
    body = lambda *xs: fn(*(v[0] for v in xs))[None]
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
    return np.asarray(f(*(jax.device_put(a, NamedSharding(mesh, spec)) for a in case)))

  got = run(lambda *a: zj.ragged_all_to_all(*a, axis_name=AXIS, compress=True))
  want = np.stack(model_ragged_all_to_all(*[list(a) for a in case]))
  np.testing.assert_array_equal(_u(got), _u(want), err_msg="ragged_all_to_all vs the documented model")
  if backend == "cuda":  # XLA:CPU has no ragged-all-to-all: jax.lax itself runs on GPU only
    lax_out = run(lambda *a: lax.ragged_all_to_all(*a, axis_name=AXIS))
    np.testing.assert_array_equal(_u(got), _u(lax_out), err_msg="ragged_all_to_all vs jax.lax")


# ---- status output -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_info_reports_kernels_and_a_driver_new_enough(backend):
  """What `python -m zipccl_jax.info` prints is zipccl_jax.info(); on a GPU host it must show the kernels,
  a driver whose CUDA major runs them, and no problems. On CPU: the same fields, consistent with the
  build (no driver is fine there)."""
  out = subprocess.run([sys.executable, "-m", "zipccl_jax.info"], capture_output=True, text=True,
                       cwd="/", timeout=120, check=True).stdout
  shown, cuda = json.loads(out), zj.info()["cuda"]
  assert shown["cuda"]["kernels"] == cuda["kernels"] == bool(EXT.with_cuda)
  for key in ("toolkit", "runtime", "min_driver", "archs", "driver", "problems"):
    assert key in cuda, key
  if backend == "cpu" and not cuda["driver"]:
    assert not EXT.with_cuda or cuda["toolkit"] and cuda["min_driver"] and cuda["archs"]
    return
  assert cuda["kernels"], cuda["build_note"]
  major = lambda v: int(str(v).split(".")[0])
  # No CUDA runtime is linked ("runtime" says so): the NVRTC images need a driver of the toolkit's CUDA
  # major or newer (minor-version compatibility within a major, CUBINs for the device's architecture).
  assert cuda["runtime"].startswith("none"), cuda
  assert major(cuda["driver"]) >= major(cuda["toolkit"]), cuda
  assert not cuda["problems"], cuda["problems"]
  assert cuda["toolkit"] and cuda["min_driver"] and cuda["archs"], cuda
  # That the kernels run on this device's architecture is what the codec tests above show.


# ---- several processes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_multiprocess_run(backend):
  """tests/mp_worker.py (every collective next to its jax.lax twin, grad through all_to_all) under
  jax.distributed on 127.0.0.1: one process per GPU over NCCL with both transports; on CPU (gloo) two
  processes with the ragged transport (tests/test_multiprocess.py runs the default one)."""
  if backend == "cuda":
    nproc = len(cuda_devices())
    if nproc < 2:
      pytest.skip(f"needs at least 2 CUDA devices, found {nproc}")
    transports = ("padded", "ragged")
  else:
    nproc, transports = 2, ("ragged",)
  for t in transports:
    res = results(launch(HERE / "mp_worker.py", nproc, 1, ["--transport", t], timeout=600,
                         platform=backend))
    for r in res:
      assert r["platform"] == ("gpu" if backend == "cuda" else "cpu") and r["devices"] == nproc, r
      assert r["checks"] and all(r["checks"].values()), (t, r["rank"], r["checks"])


# ---- the benchmark's smoke mode ---------------------------------------------------------------------------


def test_codec_gpu_benchmark_cpu_smoke(tmp_path):
  """benchmarks/codec_gpu.py runs its code path on CPU devices with --platform cpu (tiny sizes) and
  writes its JSON; without a GPU and without that flag it says so and exits non-zero."""
  script = ROOT / "benchmarks" / "codec_gpu.py"
  out = tmp_path / "codec_gpu.json"
  run = subprocess.run([sys.executable, str(script), "--platform", "cpu", "--quick", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  rec = json.loads(out.read_text())
  assert rec["platform"] == "cpu" and rec["devices"] >= 2
  kernels = {(k["kernel"], k["dtype"]) for k in rec["kernels"]}
  assert {("encode", "bfloat16"), ("decode", "bfloat16"), ("encode", "float8_e4m3fn")} <= kernels
  for k in rec["kernels"]:
    assert k["gb_per_s"] > 0 and k["p25_gb_per_s"] <= k["gb_per_s"] <= k["p75_gb_per_s"], k
    assert k["bit_exact"], k
  ops = {c["op"] for c in rec["collectives"]}
  assert {"all_to_all", "all_gather", "ppermute", "psum_scatter"} <= ops
  assert [q["transport"] for q in rec["plumbing"]] == ["padded", "ragged"]
  for q in rec["plumbing"]:  # the one-device collective against its codec alone
    assert q["bit_exact"] and q["capacity_bytes"] > 0, q
    assert q["collective"]["median_s"] > 0 and q["codec"]["median_s"] > 0 and q["copy"]["median_s"] > 0, q
    assert q["plumbing_p25_s"] <= q["plumbing_s"] <= q["plumbing_p75_s"], q
  for c in rec["collectives"]:
    assert c["bit_exact"] and c["compressed"]["median_s"] > 0 and c["raw"]["median_s"] > 0, c
    assert c["ratio_p25"] <= c["ratio_p75"], c
  if not cuda_devices():
    run = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode != 0 and "no CUDA device" in run.stderr, (run.returncode, run.stderr[-2000:])
