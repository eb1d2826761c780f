"""The emulator tests of test_cuda.py and test_fp8.py again, under ASan + UBSan with the race detector on.

Every test of those modules that runs kernels in the SIMT emulator (name containing "emulat") is collected
here a second time, with the module's HOST replaced by SanitizedHost: its emulate_encode / emulate_decode run
tests/cc/emulator_driver.cc, the same EmulateEncode / EmulateDecode of xla_ffi/simt_emulator.h that the
Python bindings run, built by tests/sanitized_build.py: the kernel bodies with the emulator's shared-memory
race detector, seeded random yields inside barrier intervals and ASan's checks on every access, the rest
with ASan; UBSan everywhere. A race, an out-of-bounds access, undefined behaviour, a misaligned vector
access or a barrier divergence fails the test with the sanitizer's or the emulator's report. The other
attributes of HOST (layouts, launch records, constants) are the extension's.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

import test_cuda
import test_fp8
from sanitized_build import CXX, HAVE_CXX, RACE, ROOT, binary, run

pytestmark = pytest.mark.skipif(not HAVE_CXX, reason=f"needs a C++ compiler ({CXX})")

_MODULES = (test_cuda, test_fp8)
for _mod in _MODULES:
  for _name, _test in vars(_mod).items():
    if _name.startswith("test_") and "emulat" in _name and callable(_test):
      globals()[_name] = _test  # collected again, with this module's fixture


class SanitizedHost:
  """Proxy of zipccl_jax._zipccl.cuda_host whose emulator entry points run the sanitized driver."""

  def __init__(self, host, exe: Path):
    self._host, self._exe = host, exe

  def __getattr__(self, name):
    return getattr(self._host, name)

  def _call(self, args: list, arrays: dict[str, np.ndarray], outputs: tuple[str, ...]):
    with tempfile.TemporaryDirectory() as d:
      paths = {k: Path(d) / k for k in arrays}
      for k, a in arrays.items():
        np.ascontiguousarray(a).tofile(paths[k])
      r = run(self._exe, [*args, *paths.values()])
      if r.returncode == 2:  # what the bindings raise as ValueError
        raise ValueError(r.stderr.strip())
      if r.returncode != 0:  # the emulator's error (RuntimeError in the bindings) or a sanitizer's report
        raise RuntimeError(f"sanitized emulator failed:\n{r.stdout}{r.stderr[-6000:]}")
      assert r.stdout.startswith("instrumented 1 "), r.stdout  # the detectors were on
      for k in outputs:
        arrays[k][...] = np.fromfile(paths[k], arrays[k].dtype).reshape(arrays[k].shape)

  def emulate_encode(self, x, frames, n_elems, dtype_code, checksum, out, nbytes, seed=0, skip=None):
    arrays = {"x": x, "out": out, "nbytes": nbytes}
    if skip is not None:
      arrays["skip"] = np.asarray(skip, np.uint8)
    self._call(["encode", frames, n_elems, dtype_code, int(checksum), seed], arrays, ("out", "nbytes"))

  def emulate_decode(self, payload, frames, dtype_code, n_elems, out, status, seed=0, skip=None):
    arrays = {"payload": payload, "out": out, "status": status}
    if skip is not None:
      arrays["skip"] = np.asarray(skip, np.uint8)
    self._call(["decode", frames, n_elems, dtype_code, seed], arrays, ("out", "status"))


DRIVER = {"tests/cc/emulator_driver.cc": RACE}


@pytest.fixture(scope="module")
def _driver() -> Path:
  return binary("emulator_driver", DRIVER)


@pytest.fixture(autouse=True)
def _sanitized_host(monkeypatch, _driver):
  for mod in _MODULES:
    if mod.HOST is not None:
      monkeypatch.setattr(mod, "HOST", SanitizedHost(mod.HOST, _driver))
  # Every kind of damage (the first 8 copies, then segment directories and units in one block, the other and
  # both), fewer copies of the last kind: the unsanitized run checks all 40 verdicts.
  monkeypatch.setattr(test_cuda, "DAMAGED_FRAMES", 16)


def test_driver_rejects_bad_arguments(_driver):
  r = run(_driver, ["encode", 1, 8, 99, 0, 0, "x", "out", "nbytes"])
  assert r.returncode == 2 and "unsupported dtype code" in r.stderr, r.stderr


# The seeded bug in the real encoder: AnalyseKernel's per-segment unit total as a plain `+=` where the 32 lanes of
# a warp add to one word (AtomicAddShared).
SEEDED_ADD = ("AtomicAddShared(&sm.seg_units[warp], LaneUnits(bits));",
              "sm.seg_units[warp] += LaneUnits(bits);")


def _seeded_host(tmp_path, header: str, seed: tuple, name: str):
  """The sanitized emulator built from a copy of the sources whose `header` (under xla_ffi/codec) has the one
  line seed[0] replaced by seed[1]."""
  shutil.copytree(ROOT / "xla_ffi", tmp_path / "xla_ffi")
  shutil.copytree(ROOT / "tests" / "cc", tmp_path / "tests" / "cc")
  path = tmp_path / "xla_ffi" / "codec" / header
  text = path.read_text()
  assert text.count(seed[0]) == 1, f"the seeded line moved in {header}: update the seed"
  path.write_text(text.replace(*seed))
  return SanitizedHost(test_cuda.HOST, binary(name, DRIVER, root=tmp_path))


def test_race_detector_catches_a_plain_add_in_the_real_analyse_kernel(tmp_path):
  host = _seeded_host(tmp_path, "cuda_encode.cuh", SEEDED_ADD, "emulator_driver_seeded_add")
  x = test_cuda._data("gauss", 5000, test_cuda.BF16)
  out, nbytes = np.zeros(8 * x.size, np.uint8), np.zeros(1, np.int64)
  with pytest.raises(RuntimeError, match=r"shared-memory race in zipccl_analyse \(CTA 0, barrier interval \d+\): "
                     r"byte \d+ of its Shared struct \(\d+ bytes\): thread \d+ .*, thread \d+ .* with no barrier"):
    host.emulate_encode(x.view(np.uint8), 1, x.size, test_cuda.BF16, False, out, nbytes, seed=1)


# The seeded bug in the real decoder: DecodeBlockKernel's warps writing their round's symbols into warp 0's rows,
# so the four warps (segments) store to the same shared bytes in one barrier interval.
SEEDED_ONE_ROW = ("sm.syms[warp][j][lane] = ok ? ent.sym : kNoSym;",
                  "sm.syms[0][j][lane] = ok ? ent.sym : kNoSym;")


def test_race_detector_catches_shared_symbol_rows_in_the_real_decoder(tmp_path):
  host = _seeded_host(tmp_path, "cuda_decode.cuh", SEEDED_ONE_ROW, "emulator_driver_seeded_one_row")
  x = test_cuda._data("gauss", 5000, test_cuda.BF16)  # HUFF: one segment, three idle warps
  payload, need = test_cuda._cpu_encode(x, test_cuda.BF16, False, 8 * x.size)
  assert 0 < need < 2 * x.size
  out, status = np.zeros(2 * x.size, np.uint8), np.full(1, -1, np.int32)
  with pytest.raises(RuntimeError, match=r"shared-memory race in zipccl_decode_block \(CTA 0, barrier interval \d+\): "
                     r"byte \d+ of its Shared struct \(\d+ bytes\): thread \d+ .*, thread \d+ .* with no barrier"):
    host.emulate_decode(payload, 1, test_cuda.BF16, x.size, out, status, seed=1)


# (size bytes, offset into the 64-byte block, read or write, past the end): aligned accesses take ASan's sized
# check in simt_race_hooks.cc, unaligned ones its region check; the last bytes of the block are no report.
PROBES = [(1, 64, "write", True), (2, 64, "read", True), (4, 64, "read", True), (8, 64, "write", True),
          (16, 64, "write", True), (16, 56, "read", True), (4, 62, "read", True), (8, 60, "write", True),
          (1, 63, "write", False), (8, 56, "read", False), (16, 48, "write", False), (4, 58, "read", False)]


@pytest.mark.parametrize("size,offset,rw,past", PROBES, ids=[f"{s}B@{o}-{rw}" for s, o, rw, _ in PROBES])
def test_asan_sees_the_instrumented_sources_accesses(size, offset, rw, past):
  """ASan reports an access past a heap block made by a source that carries only the emulator's
  instrumentation (its kernels' case), through the hooks, for every access size and on both of the hooks'
  paths; an access inside the block runs clean."""
  r = run(binary("asan_hooks_probe", {"tests/cc/asan_hooks_probe.cc": RACE}), [size, offset, rw])
  if past:
    assert r.returncode != 0 and "ERROR: AddressSanitizer" in r.stderr, r.stdout + r.stderr[-3000:]
    assert f"{rw.upper()} of size {size} at" in r.stderr, r.stderr[-3000:]
  else:
    assert r.returncode == 0 and r.stdout.endswith("ok\n"), r.stdout + r.stderr[-3000:]
