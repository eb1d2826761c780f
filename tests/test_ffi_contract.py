"""The CUDA FFI handlers against XLA's FFI contract, on the CPU (issue 15).

tests/cc/ffi_contract_test.cc calls the real ZipcclEncodeCuda / ZipcclDecodeCuda (xla_ffi/handlers_cuda.cc)
through a mock XLA_FFI_Api that enforces what xla/ffi/ffi_api.cc enforces (scratch alignment <= 16, scratch
freed when the handler returns, the stream from the context, errors propagated), over the real launch layer
(xla_ffi/codec/kernels_host.cc) with a mock CUDA driver (xla_ffi/emulated_driver.cc, linked in place of
codec/cuda_driver.cc's dlopen of libcuda.so.1) whose launches run the kernels in the SIMT emulator. Built here with g++ under
ASan + UBSan, the kernel bodies with the emulator's race detector and random yields (tests/sanitized_build.py).
"""

from __future__ import annotations

import re

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


def _binary(handler_flags: list[str] | None = None):
  sources = dict(SOURCES)
  if handler_flags:
    sources["xla_ffi/handlers_cuda.cc"] = ASAN + handler_flags
  return binary("contract", sources)


def _run(exe):
  return run(exe, timeout=600)


def test_cuda_handlers_keep_xlas_ffi_contract():
  r = _run(_binary())
  assert r.returncode == 0, r.stdout + r.stderr
  n_tests = len(re.findall(r"^TEST\(", (ROOT / "tests/cc/ffi_contract_test.cc").read_text(), re.M))
  assert f"{n_tests} tests, 0 failed checks" in r.stdout, r.stdout  # every TEST ran
  assert "[FAIL]" not in r.stdout


def test_the_contract_test_catches_a_scratch_alignment_above_16():
  """Seeded bug: the handlers ask XLA for 256-byte aligned scratch (the shipped defect 1)."""
  r = _run(_binary(["-DZIPCCL_SCRATCH_REQUEST_ALIGN=256"]))
  assert r.returncode != 0
  assert "Unsupported alignment: 256" in r.stderr, r.stderr[-3000:]
  assert "[FAIL] encode_through_xla_ffi_gives_the_cpu_drivers_bytes" in r.stdout
