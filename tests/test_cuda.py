"""CUDA codec: build and registration, host-side pieces, kernels in the SIMT emulator, GPU runs.

This machine has no GPU, so the CUDA path is checked in four layers:
- the extension was built with the kernels (sm_80 and sm_90 cubins present) and registers
  `zipccl_encode`/`zipccl_decode` for platform "CUDA"; the codec lowers to those custom calls for
  `lowering_platforms=("cuda",)`;
- the host-side pieces: scratch layout, launch sequence and geometry, error keys;
- the kernel bodies of xla_ffi/codec/cuda_{encode,decode,launch}.cuh and their launch sequence, run on the CPU by
  the SIMT emulator of xla_ffi/cuda_host_bindings.cc (one fiber per thread, shuffled thread and
  CTA order, garbage-filled shared and scratch memory), must produce the CPU driver's bytes and
  verdicts;
- the real kernels through JAX on a GPU: tests/test_gpu.py (`pytest -m gpu`), whose test bodies also
  run here on CPU devices and on this emulator.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import zipccl_jax
from zipccl_jax import _ffi

EXT = _ffi.extension()
HOST = getattr(EXT, "cuda_host", None)

BF16, F16, F32 = 1, 2, 3
E5M2 = zipccl_jax.format.dtype_code(np.dtype(ml_dtypes.float8_e5m2))
NP_DTYPE = {BF16: ml_dtypes.bfloat16, F16: np.float16, F32: np.float32, E5M2: ml_dtypes.float8_e5m2}
UINT = {BF16: np.uint16, F16: np.uint16, F32: np.uint32, E5M2: np.uint8}
HEADER = 32
BLOCK = 65536
SEGMENT = 16384


ROOT = Path(__file__).resolve().parents[1]


def _cuda_build_expected() -> bool:
  """What the build's own probe (cmake/jax_cuda.py) finds here: an NVRTC to compile the kernels with."""
  if os.environ.get("ZIPCCL_DISABLE_CUDA", "") not in ("", "0"):
    return False
  if EXT.build_info()["cuda_note"].startswith("built by Bazel"):  # xla_ffi/BUILD.bazel: CPU-only extension
    return False
  if EXT.build_info()["cuda_note"].startswith("no NVRTC found"):  # a CPU-only pip install: no NVRTC at build
    return False  # time (cmake/zipccl_build.py fetches none without a JAX CUDA plugin or ZIPCCL_CUDA)
  r = subprocess.run([sys.executable, "-I", str(ROOT / "cmake" / "jax_cuda.py")], capture_output=True, text=True,
                     check=True, timeout=300)
  return "\nNVRTC=/" in "\n" + r.stdout


needs_host = pytest.mark.skipif(
    HOST is None and not EXT.with_cuda,
    reason="extension built without xla_ffi/cuda_host_bindings.cc (no CUDA host bindings)")


# ---- Build and registration ---------------------------------------------------------


def test_extension_reports_cuda():
  if not _cuda_build_expected():
    pytest.skip("no NVRTC found (here or at build time) or ZIPCCL_DISABLE_CUDA set: CUDA build not expected")
  assert EXT.with_cuda, "an NVRTC is installed but the extension was built without the CUDA kernels"
  regs = EXT.registrations()
  assert "CUDA" in regs, sorted(regs)
  assert sorted(regs["CUDA"]) == ["zipccl_decode", "zipccl_decode_into", "zipccl_encode"]
  # zipccl_count (runtime statistics) is CPU-only: other platforms count with jax.debug.callback
  assert sorted(regs["cpu"]) == ["zipccl_count", "zipccl_decode", "zipccl_decode_into", "zipccl_encode"]


def test_host_bindings_present_with_cuda():
  if not EXT.with_cuda:
    pytest.skip("extension built without CUDA")
  assert HOST is not None, "module.cc must register the cuda_host submodule"
  assert hasattr(HOST, "emulate_scan")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_lowering_for_cuda_has_custom_calls(dtype):
  x = jnp.zeros((3000,), dtype)
  text = jax.jit(lambda x: zipccl_jax.encode(x, checksum=True)).trace(x).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "stablehlo.custom_call @zipccl_encode" in text
  assert "checksum = true" in text
  payload, _ = zipccl_jax.encode(x)
  text = jax.jit(lambda p: zipccl_jax.decode(p, shape=x.shape, dtype=dtype)).trace(payload).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "stablehlo.custom_call @zipccl_decode" in text


def test_lowering_for_cuda_batched():
  from zipccl_jax import codec
  x = jnp.zeros((4, 5, 700), jnp.bfloat16)
  f = lambda x: codec.decode_frames(codec.encode_frames(x, capacity=900)[0], shape=(5, 700),
                                    dtype=jnp.bfloat16)
  text = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()
  assert "@zipccl_encode" in text and "@zipccl_decode" in text
  assert "tensor<4x900xui8>" in text


# ---- Host-side pieces ----------------------------------------------------------------


@needs_host
@pytest.mark.parametrize("frames,n", [(1, 0), (1, 1), (1, BLOCK), (3, BLOCK + 1), (8, 5 * BLOCK - 7),
                                      (1, 1 << 31), (1000, 4099)])
def test_scratch_layout(frames, n):
  c = HOST.constants()
  align = c["SCRATCH_ALIGN"]
  nb = -(-n // BLOCK)
  total = frames * nb
  enc = HOST.encode_layout(frames, n)
  assert (enc["blocks_per_frame"], enc["total_blocks"]) == (nb, total)
  if total == 0:
    assert enc["scratch_bytes"] == 0  # header-only frames need no scratch
  else:
    sections = [("plans_off", total * c["BLOCK_PLAN_BYTES"]),
                ("sizes_off", (total + 1) * 8), ("offsets_off", (total + 1) * 8), ("hashes_off", total * 4)]
    _check_sections(enc, sections, align)
  dec = HOST.decode_layout(frames, n)
  sections = [("ferr_off", frames * 8), ("berr_off", frames * 8)]
  if total:
    sections += [("sizes_off", (total + 1) * 8), ("offsets_off", (total + 1) * 8), ("hashes_off", total * 4)]
  _check_sections(dec, sections, align)


def _check_sections(layout, sections, align):
  end = 0
  for key, size in sections:
    off = layout[key]
    assert off % align == 0, (key, off)
    assert off >= end, f"{key} overlaps the previous section"
    end = off + size
  assert layout["scratch_bytes"] >= end
  assert layout["scratch_bytes"] % align == 0


@needs_host
@pytest.mark.parametrize("frames,n", [(1, 1), (1, BLOCK), (3, BLOCK + 1), (130, 2 * BLOCK)])
@pytest.mark.parametrize("code", [BF16, F32])
def test_encode_launch_geometry(frames, n, code):
  c = HOST.constants()
  total = frames * (-(-n // BLOCK))
  cap = 3 * 16384 + 5  # payload row bytes: the zero-tail grid is sized by them
  launches = HOST.encode_launches(frames, n, code, cap)
  assert [l[0] for l in launches] == ["zipccl_analyse", "zipccl_scan", "zipccl_write", "zipccl_finish",
                                      "zipccl_zero_tail"]  # five launches per call
  grid = {name: (g, t) for name, g, t, _ in launches}
  assert grid["zipccl_analyse"] == (total + 1, c["SEG_THREADS"])  # a CTA per block, one for the trailing 0
  assert grid["zipccl_scan"] == (1, c["THREADS"])         # one CTA walks sizes + the trailing 0
  assert grid["zipccl_write"] == (total, c["SEG_THREADS"])  # a warp per segment
  assert grid["zipccl_finish"] == (frames, c["ITEM_THREADS"])    # one CTA per frame (checksum)
  assert grid["zipccl_zero_tail"] == (frames * 4, c["THREADS"])  # 16 KB of the row per CTA
  for name, _, _, shared in launches:
    assert shared <= 48 * 1024, f"{name} needs {shared} B of static shared memory"
  empty = HOST.encode_launches(frames, 0, code, cap)
  assert [l[:3] for l in empty] == [("zipccl_finish", frames, 64), ("zipccl_zero_tail", frames * 4, 256)]
  assert HOST.encode_launches(0, n, code) == []


@needs_host
@pytest.mark.parametrize("status", [False, True])
def test_decode_launch_geometry(status):
  c = HOST.constants()
  frames, n = 5, 3 * BLOCK + 11
  total = frames * 4
  launches = HOST.decode_launches(frames, n, F16, status)
  names = ["zipccl_dir", "zipccl_scan", "zipccl_frame_check", "zipccl_decode_block",
           "zipccl_poison"] + (["zipccl_status"] if status else [])
  assert [l[0] for l in launches] == names  # the directory first: the checksum hashes its blocks
  grid = {name: (g, t) for name, g, t, _ in launches}
  assert grid["zipccl_frame_check"] == (frames, c["ITEM_THREADS"])  # one CTA per frame (checksum)
  assert grid["zipccl_dir"] == (-(-(total + 1) // 64), c["ITEM_THREADS"])
  assert grid["zipccl_decode_block"] == (total, c["SEG_THREADS"])  # a warp per segment
  assert grid["zipccl_poison"] == (total, c["THREADS"])
  for name, _, _, shared in launches:
    assert shared <= 48 * 1024, f"{name} needs {shared} B of static shared memory"
  assert c["SEG_THREADS"] == 128  # 4 segments of 16384 elements per 65536-element block


@needs_host
@pytest.mark.parametrize("n", [0, 1, 255, 2047, 2048, 2049, 3 * 2048 + 5])
def test_scan_kernel_is_an_exact_exclusive_sum(n):
  """The block-size scan (codec/cuda_scan.cuh) that replaced cub::DeviceScan, run by the emulator: chunk
  boundaries at 2048 items, a carry past 2^32 and the trailing 0; garbage-filled shared memory, shuffled
  thread order, so a missing barrier or an uninitialised read shows up as a wrong sum."""
  rng = np.random.default_rng(n)
  values = rng.integers(0, 1 << 23, n, dtype=np.uint64)  # larger than any block: the sum passes 2^32
  if n:
    values[-1] = 0  # the launch sequences scan the sizes plus a trailing 0
  for seed in (1, 2):
    out = np.full(n, 0xDEADBEEF, np.uint64)
    HOST.emulate_scan(values, out, seed)
    want = np.concatenate([[0], np.cumsum(values, dtype=np.uint64)[:-1]]).astype(np.uint64) if n else out[:0]
    assert np.array_equal(out, want), (n, seed)
  if n > 2048:
    assert int(out[-1]) > 1 << 32


@needs_host
def test_error_keys_order_like_the_cpu_driver():
  k = HOST.error_key
  assert k(-1, 9) < k(0, 1) < k(0, 13) < k(1, 1) < k(70000, 1)


# ---- Kernels in the emulator vs the CPU driver -------------------------------------------

RNG = np.random.default_rng(20261122)


def _gauss(n, code, scale=1.0):
  return (RNG.standard_normal(n) * scale).astype(NP_DTYPE[code]).view(UINT[code])


def _data(kind, n, code):
  if kind == "gauss":
    return _gauss(n, code)
  if kind == "sparse":  # embedding-gradient-like: 88% zeros
    x = _gauss(n, code, 1e-3)
    x[RNG.random(n) < 0.88] = 0
    return x
  if kind == "const":
    return np.full(n, NP_DTYPE[code](0.375)).view(UINT[code])
  if kind == "random":  # incompressible: RAW blocks
    return RNG.integers(0, np.iinfo(UINT[code]).max, n, dtype=UINT[code], endpoint=True)
  if kind == "allsym":  # every exponent and zero: 257-symbol code, long codes
    x = RNG.integers(0, np.iinfo(UINT[code]).max, n, dtype=UINT[code], endpoint=True)
    x[RNG.random(n) < 0.5] = 0
    return x
  if kind == "upcast":  # float32 holding bfloat16 values: LOW16 blocks
    assert code == F32
    return _gauss(n, BF16).astype(np.uint32) << 16
  if kind == "mixed":  # per-block mode changes inside one frame
    kinds = itertools.cycle(["const", "random", "gauss", "sparse"])
    parts = [_data(k, min(BLOCK, n - i), code) for i, k in zip(range(0, n, BLOCK), kinds)]
    return np.concatenate(parts) if parts else np.zeros(0, UINT[code])
  raise ValueError(kind)


def _cpu_encode(row: np.ndarray, code: int, checksum: bool, cap: int):
  out = np.zeros(max(cap, 1), np.uint8)[:cap]
  need = EXT.encode_host(row.view(np.uint8).ravel(), row.size, code, checksum, out)
  return out, need


def _emu_encode(x: np.ndarray, code: int, checksum: bool, cap: int, seed: int = 0):
  frames = x.shape[0]
  n = x[0].size if frames else 0
  out = RNG.integers(0, 256, frames * cap, dtype=np.uint8)  # device memory is not zeroed
  nbytes = np.full(frames, -1, np.int64)
  HOST.emulate_encode(np.ascontiguousarray(x).view(np.uint8).ravel(), frames, n, code, checksum,
                      out, nbytes, seed)
  return out.reshape(frames, cap), nbytes


def _assert_same_frames(x, code, checksum, cap, seed=0):
  """Emulated CUDA payloads equal the CPU driver's, byte for byte: frames, overflow headers, zero tails."""
  out, nbytes = _emu_encode(x, code, checksum, cap, seed)
  for f in range(x.shape[0]):
    ref, need = _cpu_encode(x[f], code, checksum, cap)
    assert nbytes[f] == need, (f, nbytes[f], need)
    shown = need if need <= cap else HEADER
    np.testing.assert_array_equal(out[f, :shown], ref[:shown], err_msg=f"frame {f}")
    # Device memory starts as garbage; the bytes the padded transport sends past the frame
    # must be zero, as on the CPU.
    assert not out[f, shown:].any(), f"frame {f}: stale bytes after the frame"
  return out, nbytes


@needs_host
@pytest.mark.parametrize("code", [BF16, F16, F32])
@pytest.mark.parametrize("n", [1, 5, 8, 2047, 2049, 9000])
def test_emulated_encode_small(code, n):
  x = _data("gauss", n, code)[None]
  _assert_same_frames(x, code, False, zipccl_jax.max_encoded_bytes(n, NP_DTYPE[code]))


@needs_host
@pytest.mark.parametrize("kind,code", [("gauss", BF16), ("sparse", BF16), ("allsym", BF16),
                                       ("random", F16), ("upcast", F32), ("gauss", F32),
                                       ("sparse", F32), ("allsym", F16)])
def test_emulated_encode_blocks(kind, code):
  n = BLOCK + SEGMENT * 2 + 5  # one full block, and a short one of three segments, the last partial
  x = _data(kind, n, code)[None]
  _assert_same_frames(x, code, False, zipccl_jax.max_encoded_bytes(n, NP_DTYPE[code]))


@needs_host
def test_emulated_encode_mixed_modes_and_checksum():
  n = 4 * BLOCK - 100
  x = _data("mixed", n, BF16)[None]
  out, nbytes = _assert_same_frames(x, BF16, True, zipccl_jax.max_encoded_bytes(n, jnp.bfloat16))
  sizes = np.frombuffer(out[0, HEADER:HEADER + 16].tobytes(), np.uint32).astype(np.int64)
  starts = HEADER + 16 + np.concatenate([[0], np.cumsum(sizes)[:-1]])
  assert [int(out[0, s]) for s in starts] == [1, 0, 2, 2]  # CONST, RAW, HUFF, HUFF
  assert out[0, 6] == 1  # checksum flag


@needs_host
@pytest.mark.parametrize("code", [BF16, F32])
def test_emulated_encode_batched_unaligned_frames(code):
  # Odd n and odd capacity: frames, blocks, bitstreams and raw regions start at every alignment.
  frames, n = 5, 4099
  x = np.stack([_data(k, n, code) for k in ["gauss", "sparse", "const", "random", "allsym"]])
  cap = zipccl_jax.max_encoded_bytes(n, NP_DTYPE[code]) + 3
  _assert_same_frames(x, code, False, cap, seed=1)
  _assert_same_frames(x, code, True, cap, seed=2)


@needs_host
def test_emulated_encode_overflow_header_only():
  frames, n = 3, 3000
  x = np.stack([_data("gauss", n, BF16), _data("random", n, BF16), _data("const", n, BF16)])
  cap = 4500  # fits the Gaussian and constant frames, not the random one
  out, nbytes = _assert_same_frames(x, BF16, True, cap)
  assert nbytes[1] > cap and nbytes[0] <= cap and nbytes[2] <= cap
  assert int.from_bytes(out[1, 16:24].tobytes(), "little") == nbytes[1]
  assert out[1, 6] == 0 and not out[1, 28:32].any()  # flags and checksum zero on overflow


@needs_host
def test_emulated_encode_empty_frames():
  x = np.zeros((2, 0), np.uint16)
  out, nbytes = _assert_same_frames(x, BF16, True, 40)
  assert list(nbytes) == [HEADER, HEADER]


@needs_host
def test_emulated_encode_is_schedule_independent():
  x = _data("sparse", 3 * 2048 + 77, F16)[None]
  cap = zipccl_jax.max_encoded_bytes(x.size, np.float16)
  a, na = _emu_encode(x, F16, False, cap, seed=11)
  b, nb = _emu_encode(x, F16, False, cap, seed=12)
  assert na[0] == nb[0]
  np.testing.assert_array_equal(a[0, :na[0]], b[0, :nb[0]])


def _emu_decode(payload: np.ndarray, code: int, n: int, seed: int = 0):
  frames, cap = payload.shape
  out = RNG.integers(0, 256, frames * n * np.dtype(UINT[code]).itemsize, dtype=np.uint8)
  status = np.full(frames, -1, np.int32)
  HOST.emulate_decode(np.ascontiguousarray(payload).ravel(), frames, code, n, out, status, seed)
  return out.view(UINT[code]).reshape(frames, n), status


def _cpu_verdict(row: np.ndarray, code: int, n: int):
  out = np.zeros(n * np.dtype(UINT[code]).itemsize, np.uint8)
  try:
    EXT.decode_host(row, code, n, out)
  except ValueError as e:
    return None, str(e)
  return out.view(UINT[code]), None


NAN_BITS = {BF16: 0x7FC0, F16: 0x7E00, F32: 0x7FC00000}


@needs_host
@pytest.mark.parametrize("kind,code", [("gauss", BF16), ("mixed", F16), ("upcast", F32),
                                       ("gauss", F32), ("allsym", BF16), ("sparse", F16)])
def test_emulated_decode_roundtrip(kind, code):
  n = BLOCK + 2 * 2048 + 999 if kind != "mixed" else 4 * BLOCK - 3
  x = _data(kind, n, code)
  cap = zipccl_jax.max_encoded_bytes(n, NP_DTYPE[code])
  frame, need = _cpu_encode(x, code, kind == "mixed", cap)
  y, status = _emu_decode(frame[None], code, n)
  assert status[0] == 0, HOST.status_message(int(status[0]))
  np.testing.assert_array_equal(y[0], x)


@needs_host
def test_emulated_decode_batched_unaligned():
  frames, n, code = 4, 2051, BF16
  x = np.stack([_data(k, n, code) for k in ["gauss", "sparse", "const", "random"]])
  cap = zipccl_jax.max_encoded_bytes(n, jnp.bfloat16) + 1  # odd capacity: unaligned frames
  payload = np.stack([_cpu_encode(x[f], code, False, cap)[0] for f in range(frames)])
  y, status = _emu_decode(payload, code, n, seed=3)
  assert list(status) == [0] * frames
  np.testing.assert_array_equal(y, x)


def _huff_structure(frame: np.ndarray, n: int):
  """[start, end) of each HUFF block's header, table, segment directory and units."""
  nb = -(-n // BLOCK)
  sizes = np.frombuffer(frame[HEADER:HEADER + 4 * nb].tobytes(), np.uint32).astype(np.int64)
  at, spans = HEADER + 4 * nb, []
  for b in range(nb):
    if frame[at] == 2:
      lo, hi = int(frame[at + 8]), int(frame[at + 9])
      d = at + 8 + 2 + (hi - lo + 3) // 2
      ns = -(-min(BLOCK, n - b * BLOCK) // SEGMENT)
      units = np.frombuffer(frame[d:d + 4 * ns].tobytes(), np.uint16)[::2].astype(np.int64).sum()
      spans.append((at, d + 4 * ns + 2 * int(units)))
    at += int(sizes[b])
  return spans


# How many damaged copies _damaged_frames makes: 8 of the header, directory, block headers and code tables,
# the rest of segment directories and units. tests/test_emulator_sanitized.py runs the emulator tests with 16
# (ASan, UBSan and the race detector make each emulated decode ~10x slower; 40 there took ~400 s of CI).
DAMAGED_FRAMES = 40


def _damaged_frames():
  """(x, n, code, cases): DAMAGED_FRAMES damaged copies of a two-block bfloat16 frame (header, directory,
  block headers, code tables, segment directories and units)."""
  n, code = BLOCK + 2 * SEGMENT + 17, BF16
  x = np.concatenate([_data("gauss", BLOCK, code), _data("sparse", n - BLOCK, code)])
  cap = zipccl_jax.max_encoded_bytes(n, jnp.bfloat16)
  frame, need = _cpu_encode(x, code, False, cap)
  spans = _huff_structure(frame, n)
  assert len(spans) == 2
  cases = []
  rng = np.random.default_rng(5)
  for i in range(DAMAGED_FRAMES):
    bad = frame.copy()
    if i == 0:
      bad[16:24] = np.frombuffer(np.uint64(need + 1).tobytes(), np.uint8)  # frame_bytes
    elif i == 1:
      bad[:4] = 0  # magic
    elif i == 2:
      bad[HEADER:HEADER + 4] = np.frombuffer(np.uint32(8).tobytes(), np.uint8)  # directory
    elif i < 8:  # block headers and code tables
      lo = spans[i % 2][0]
      bad[lo + int(rng.integers(0, 16))] ^= np.uint8(1 << int(rng.integers(8)))
    else:  # segment directories and units, one or two flips, in one or both blocks
      for lo, hi in spans[i % 2:(i % 2) + 1 + (i % 3 == 0)]:
        for at in rng.integers(lo + 8, hi, 1 + i % 2):
          bad[at] ^= np.uint8(1 << int(rng.integers(8)))
    cases.append(bad)
  return x, n, code, cases


@needs_host
def test_emulated_decode_rejects_like_cpu():
  """Damaged frames: the emulated kernels give the CPU's verdict, and NaN for rejected frames."""
  x, n, code, cases = _damaged_frames()
  payload = np.stack(cases)
  y, status = _emu_decode(payload, code, n, seed=7)
  rejected = set()
  for f, row in enumerate(cases):
    ref, err = _cpu_verdict(row, code, n)
    if err is None:
      assert status[f] == 0, (f, HOST.status_message(int(status[f])))
      np.testing.assert_array_equal(y[f], ref)
    else:
      rejected.add(int(status[f]))
      assert status[f] != 0, (f, err)
      assert err.endswith(HOST.status_message(int(status[f]))), (f, err, int(status[f]))
      assert (y[f] == NAN_BITS[code]).all()
  assert len(rejected) >= 4, rejected  # several distinct reasons were exercised


@needs_host
def test_cpu_status_result_matches_the_emulated_kernels():
  """The CPU handler's status result (decode_frames(return_status=True)) gives the emulated CUDA
  kernels' status codes and output bytes: decoded rows, NaN-filled rejected rows, zero skipped rows."""
  from zipccl_jax import codec
  x, n, code, cases = _damaged_frames()
  garbage = np.full_like(cases[0], 0xFF)
  payload = np.stack([*cases, garbage, cases[1]])
  skip = np.zeros(len(payload), bool)
  skip[[-2, -1, 3]] = True                       # garbage, a damaged frame, a good-or-bad one
  y_emu, s_emu = _emu_decode_skip(payload, code, n, skip.astype(np.uint8), seed=11)
  y_cpu, s_cpu = codec.decode_frames(payload, shape=(n,), dtype=jnp.bfloat16, skip=skip,
                                     return_status=True)
  y_cpu, s_cpu = np.asarray(y_cpu).view(UINT[code]), np.asarray(s_cpu)
  np.testing.assert_array_equal(s_cpu, s_emu)
  np.testing.assert_array_equal(y_cpu, y_emu)
  assert (s_cpu != 0).sum() >= 10 and not s_cpu[skip].any()


@needs_host
def test_emulated_decode_checksum_and_overflow():
  n, code = 5000, F32
  x = _data("gauss", n, code)
  cap = zipccl_jax.max_encoded_bytes(n, np.float32)
  good, need = _cpu_encode(x, code, True, cap)
  flipped = good.copy()
  flipped[need - 1] ^= 1  # a raw byte: only the checksum can see it
  padded = np.zeros(cap, np.uint8)
  padded[:need] = good[:need]  # bytes past frame_bytes are ignored
  y, status = _emu_decode(np.stack([good, flipped, padded]), code, n)
  assert list(status[[0, 2]]) == [0, 0]
  np.testing.assert_array_equal(y[0], x)
  np.testing.assert_array_equal(y[2], x)
  assert HOST.status_message(int(status[1])).startswith("checksum mismatch")
  assert (y[1] == NAN_BITS[code]).all()
  # An overflowed frame (header only, frame_bytes > capacity) is rejected as truncated.
  small, _ = _cpu_encode(x, code, True, 1000)
  y, status = _emu_decode(small[None], code, n)
  assert HOST.status_message(int(status[0])) == "payload is truncated (shorter than its frame)"


@needs_host
def test_emulated_checksum_every_tail_and_chunk_boundary():
  """The CTA checksum (four XXH32 chains over staged 2 KB chunks, then the < 16 tail bytes by one
  thread) gives FrameChecksum's bytes for frames of every length mod 16, just below, at and above
  the chunk boundaries, at every start alignment; a wrong chain, word order, chunk hand-over or
  tail would change the checksum field. The decoder's CTA checksum accepts them and rejects a flip
  in the header stripes, at a chunk boundary and in the tail."""
  chunk = 8 * HOST.constants()["ITEM_THREADS"] * 4  # kSumChunkWords * 4 bytes
  code = E5M2
  lengths, tails = set(), set()
  # Random bytes code as one RAW block: frame_bytes = 32 + 4 + 8 + n (one-byte elements).
  for n in [0, *range(1, 17), chunk - 45, chunk - 44, chunk - 43, 2 * chunk - 44 + 13,
            3 * chunk - 44 + 16 * 7 + 4]:
    x = RNG.integers(0, 256, (3, n), dtype=np.uint8)
    cap = (44 + n) | 1                       # odd: rows 1 and 2 start unaligned
    out, nbytes = _assert_same_frames(x, code, True, cap, seed=n)
    lengths.update(int(b) for b in nbytes)
    tails.update(int(b) % 16 for b in nbytes)
    y, status = _emu_decode(out, code, n, seed=n + 1)
    assert not status.any(), [HOST.status_message(int(v)) for v in status]
    np.testing.assert_array_equal(y, x)
    need = int(nbytes[1])
    for at in sorted({8, 20, min(chunk, need - 1), need - 1} - {28, 29, 30, 31}):
      bad = out.copy()
      bad[1, at] ^= 0x10
      _, status = _emu_decode(bad, code, n, seed=at)
      assert HOST.status_message(int(status[1])).startswith("checksum mismatch") or at < 32, at
      assert status[1] != 0 and status[0] == 0 and status[2] == 0, (at, list(status))
  assert tails == set(range(16)), sorted(tails)       # every tail length
  assert {chunk - 1, chunk, chunk + 1} <= lengths      # both sides of the 2 KB chunk boundary


# ---- Skipped frames (the `skip` operand) ------------------------------------------------------


def _emu_encode_skip(x, code, checksum, cap, skip, seed=0):
  frames = x.shape[0]
  n = x[0].size if frames else 0
  out = RNG.integers(0, 256, frames * cap, dtype=np.uint8)  # device memory is not zeroed
  nbytes = np.full(frames, -1, np.int64)
  HOST.emulate_encode(np.ascontiguousarray(x).view(np.uint8).ravel(), frames, n, code, checksum,
                      out, nbytes, seed, skip=np.asarray(skip, np.uint8))
  return out.reshape(frames, cap), nbytes


def _emu_decode_skip(payload, code, n, skip, seed=0):
  frames, cap = payload.shape
  out = RNG.integers(0, 256, frames * n * np.dtype(UINT[code]).itemsize, dtype=np.uint8)
  status = np.full(frames, -1, np.int32)
  HOST.emulate_decode(np.ascontiguousarray(payload).ravel(), frames, code, n, out, status, seed,
                      skip=np.asarray(skip, np.uint8))
  return out.view(UINT[code]).reshape(frames, n), status


@needs_host
@pytest.mark.parametrize("code", [BF16, F32])
@pytest.mark.parametrize("skip", [[0, 1, 0, 0, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]],
                         ids=["some", "all", "none", "first"])
def test_emulated_encode_skip(code, skip):
  """Skipped frames: all-zero rows (over garbage device memory) and size 0, no coding (their
  statistics and plans stay garbage in scratch); the others are the CPU driver's bytes."""
  n = BLOCK + 2 * 2048 + 7  # two blocks per frame
  x = np.stack([_data(k, n, code) for k in ["gauss", "sparse", "const", "random", "allsym"]])
  skip = np.array(skip, bool)
  cap = zipccl_jax.max_encoded_bytes(n, NP_DTYPE[code]) + 3  # odd: unaligned frames
  for checksum, seed in [(False, 4), (True, 5)]:
    out, nbytes = _emu_encode_skip(x, code, checksum, cap, skip, seed)
    for f in range(x.shape[0]):
      if skip[f]:
        assert nbytes[f] == 0 and not out[f].any(), f
        continue
      ref, need = _cpu_encode(x[f], code, checksum, cap)
      assert nbytes[f] == need, (f, nbytes[f], need)
      np.testing.assert_array_equal(out[f], ref, err_msg=f"frame {f}")


@needs_host
def test_emulated_encode_skip_with_overflow_and_empty_frames():
  n, code = 3000, BF16
  x = np.stack([_data("gauss", n, code), _data("random", n, code), _data("random", n, code)])
  cap = 4500  # the random frames overflow
  out, nbytes = _emu_encode_skip(x, code, True, cap, [0, 1, 0])
  assert nbytes[1] == 0 and not out[1].any()
  for f in (0, 2):
    ref, need = _cpu_encode(x[f], code, True, cap)
    assert nbytes[f] == need
    np.testing.assert_array_equal(out[f], ref)
  assert nbytes[2] > cap  # overflow header of a frame that is not skipped
  out, nbytes = _emu_encode_skip(np.zeros((3, 0), np.uint16), BF16, False, 40, [1, 0, 1])
  assert list(nbytes) == [0, HEADER, 0] and not out[[0, 2]].any() and not out[1, HEADER:].any()


@needs_host
@pytest.mark.parametrize("code", [F16, F32])
def test_emulated_decode_skip_ignores_garbage(code):
  """Skipped frames are not read: garbage, 0xFF poison or a wrong frame decode to zeros with
  status 0, while a damaged frame that is not skipped still gets NaN and its status."""
  n = BLOCK + 3 * 2048 + 5
  x = np.stack([_data(k, n, code) for k in ["gauss", "sparse", "const", "random", "gauss", "gauss"]])
  cap = zipccl_jax.max_encoded_bytes(n, NP_DTYPE[code]) + 1
  payload = np.stack([_cpu_encode(x[f], code, True, cap)[0] for f in range(x.shape[0])])
  payload[1] = 0xFF                                               # the collectives' poison
  payload[3] = RNG.integers(0, 256, cap, dtype=np.uint8)          # garbage
  payload[4, 200] ^= 1                                            # damaged, not skipped
  payload[5, HEADER:HEADER + 4] = 0xFF                            # huge directory entry, skipped
  skip = np.array([0, 1, 0, 1, 0, 1], bool)
  y, status = _emu_decode_skip(payload, code, n, skip, seed=9)
  for f in np.flatnonzero(skip):
    assert status[f] == 0 and not y[f].any(), f
  for f in (0, 2):
    assert status[f] == 0, HOST.status_message(int(status[f]))
    np.testing.assert_array_equal(y[f], x[f])
  ref, err = _cpu_verdict(payload[4], code, n)
  assert err is not None and err.endswith(HOST.status_message(int(status[4])))
  assert (y[4] == NAN_BITS[code]).all()
  # all skipped / none skipped
  y, status = _emu_decode_skip(payload, code, n, np.ones(6, bool))
  assert not status.any() and not y.any()
  good = np.stack([_cpu_encode(x[f], code, False, cap)[0] for f in range(3)])
  y, status = _emu_decode_skip(good, code, n, np.zeros(3, bool))
  assert not status.any()
  np.testing.assert_array_equal(y, x[:3])


@needs_host
def test_emulated_decode_skip_empty_frames():
  good = _cpu_encode(np.zeros(0, np.uint16), BF16, False, 40)[0]
  payload = np.stack([good, np.full(40, 0xFF, np.uint8)])
  y, status = _emu_decode_skip(payload, BF16, 0, [0, 1])
  assert y.shape == (2, 0) and list(status) == [0, 0]
  y, status = _emu_decode_skip(payload, BF16, 0, [0, 0])
  assert status[0] == 0 and status[1] != 0


@needs_host
def test_emulator_skip_argument_checked():
  x = np.zeros(2 * 10, np.uint16)
  with pytest.raises(ValueError, match="one uint8 flag per frame"):
    HOST.emulate_encode(x.view(np.uint8), 2, 10, BF16, False, np.zeros(2 * 64, np.uint8),
                        np.zeros(2, np.int64), 0, skip=np.zeros(3, np.uint8))


def test_lowering_for_cuda_with_skip():
  from zipccl_jax import codec
  x = jnp.zeros((4, 700), jnp.bfloat16)
  skip = jnp.arange(4) == 2

  def f(x, s):
    p, _ = codec.encode_frames(x, capacity=900, skip=s)
    return codec.decode_frames(p, shape=(700,), dtype=jnp.bfloat16, skip=s)

  text = jax.jit(f).trace(x, skip).lower(lowering_platforms=("cuda",)).as_text()
  calls = [l for l in text.splitlines() if "@zipccl_encode" in l or "@zipccl_decode" in l]
  assert len(calls) == 2 and all("tensor<4xi1>" in c for c in calls), calls
