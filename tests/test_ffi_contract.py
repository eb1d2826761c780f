"""The CUDA FFI handlers against XLA's FFI contract, on the CPU (issue 15).

tests/cc/ffi_contract_test.cc calls the real ZipcclEncodeCuda / ZipcclDecodeCuda (xla_ffi/handlers_cuda.cc)
through a mock XLA_FFI_Api that enforces what xla/ffi/ffi_api.cc enforces (the stream from the context, errors
propagated) and what a command-buffer compatible handler must not do (any call of XLA's device allocator is a
violation: the scratch is the call's last result, a buffer aligned as XLA aligns buffers and no better), over
the real launch layer
(xla_ffi/codec/kernels_host.cc) with a mock CUDA driver (xla_ffi/emulated_driver.cc, linked in place of
codec/cuda_driver.cc's dlopen of libcuda.so.1) whose launches run the kernels in the SIMT emulator. Built here with g++ under
ASan + UBSan, the kernel bodies with the emulator's race detector and random yields (tests/sanitized_build.py).
"""

from __future__ import annotations

import re
import shutil

import pytest

from sanitized_build import ASAN, CXX, HAVE_CXX, RACE, ROOT, binary, run

# The sources that instantiate kernel bodies (the real ones, and the test's seeded ones) carry the emulator's
# race instrumentation; the handlers and the CPU driver carry ASan.
# The launch layer and the mock driver are built as for an NVRTC 12.9 build (the test checks the messages).
CUDA_BUILD = ["-DZIPCCL_CUDA_VERSION=12090", '-DZIPCCL_CUDA_MIN_DRIVER="525.60.13"']
SOURCES = {"tests/cc/ffi_contract_test.cc": RACE + CUDA_BUILD, "xla_ffi/handlers_cuda.cc": ASAN,
           "xla_ffi/codec/kernels_host.cc": ASAN + CUDA_BUILD, "xla_ffi/emulated_driver.cc": RACE + CUDA_BUILD,
           "xla_ffi/codec/cpu_driver.cc": ASAN}

pytestmark = pytest.mark.skipif(not HAVE_CXX, reason=f"needs a C++ compiler ({CXX})")


def _binary(root=ROOT, name: str = "contract"):
  return binary(name, dict(SOURCES), root=root)


def _run(exe, tests=()):
  """The contract test, or only the TESTs named in `tests` (a seeded bug: the ones that must catch it)."""
  return run(exe, list(tests), timeout=600)


def _seeded(tmp_path, seeds: list[tuple[str, str]], name: str):
  """The contract test built from a copy of the sources whose xla_ffi/handlers_cuda.cc has each seed[0]
  replaced by seed[1]."""
  for d in ("xla_ffi", "tests/cc"):
    shutil.copytree(ROOT / d, tmp_path / d)
  path = tmp_path / "xla_ffi" / "handlers_cuda.cc"
  text = path.read_text()
  for old, new in seeds:
    assert text.count(old) == 1, f"the seeded text moved in handlers_cuda.cc: update the seed: {old}"
    text = text.replace(old, new)
  path.write_text(text)
  return _binary(tmp_path, name)


def test_cuda_handlers_keep_xlas_ffi_contract():
  r = _run(_binary())
  assert r.returncode == 0, r.stdout + r.stderr
  n_tests = len(re.findall(r"^TEST\(", (ROOT / "tests/cc/ffi_contract_test.cc").read_text(), re.M))
  assert f"{n_tests} tests, 0 failed checks" in r.stdout, r.stdout  # every TEST ran
  assert "[FAIL]" not in r.stdout


# Seeded: the encoder takes scratch from XLA's allocator at run time again (what kept the handlers out of command
# buffers), through the ffi::ScratchAllocator context.
SEED_ALLOCATE = [
    ("ffi::Error EncodeImpl(CUstream_st* stream, ffi::AnyBuffer x,",
     "ffi::Error EncodeImpl(CUstream_st* stream, ffi::ScratchAllocator seeded, ffi::AnyBuffer x,"),
    ("  int err = zipccl::cuda::EncodeAsync(",
     "  (void)seeded.Allocate(L.scratch_bytes, 16);\n  int err = zipccl::cuda::EncodeAsync("),
    ("ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream_st*>>())\n                                  .Ret<",
     "ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream_st*>>().Ctx<ffi::ScratchAllocator>())\n"
     "                                  .Ret<"),
]


def test_the_contract_test_catches_a_run_time_allocation(tmp_path):
  r = _run(_seeded(tmp_path, SEED_ALLOCATE, "contract_seeded_allocate"),
           ["encode_through_xla_ffi_gives_the_cpu_drivers_bytes", "the_handlers_never_call_xlas_allocator"])
  assert r.returncode != 0
  assert "XLA_FFI_DeviceMemory_Allocate called" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
  assert "[FAIL] encode_through_xla_ffi_gives_the_cpu_drivers_bytes" in r.stdout


# Seeded: the handlers no longer check the scratch result's size (the kernels would write past it).
SEED_NO_SIZE_CHECK = [("  if (got < need)\n", "  if (false && got < need)\n")]


def test_the_contract_test_catches_a_missing_scratch_size_check(tmp_path):
  r = _run(_seeded(tmp_path, SEED_NO_SIZE_CHECK, "contract_seeded_size"),
           ["a_scratch_result_too_small_is_an_invalid_argument"])
  assert r.returncode != 0
  assert ("[FAIL] a_scratch_result_too_small_is_an_invalid_argument" in r.stdout
          or "heap-buffer-overflow" in r.stderr), (r.stdout + r.stderr)[-3000:]


# Seeded: decode_into writes from column 0 instead of its `col` (the other columns would be overwritten).
SEED_NO_COLUMN = [("  auto* base = static_cast<uint8_t*>(out) + call.col * uint64_t(zipccl::ElemBytes(call.dtype));\n",
                   "  auto* base = static_cast<uint8_t*>(out);\n")]


def test_the_contract_test_catches_decode_into_ignoring_its_column(tmp_path):
  r = _run(_seeded(tmp_path, SEED_NO_COLUMN, "contract_seeded_column"), ["decode_into_writes_only_its_columns"])
  assert r.returncode != 0
  assert "[FAIL] decode_into_writes_only_its_columns" in r.stdout, (r.stdout + r.stderr)[-3000:]
