"""The decode table of the CUDA block decoder (entry by entry: DecodeEntryAt) equals the CPU driver's (symbol by
symbol: BuildDecodeTable), entry for entry, for many random valid code-length vectors: tests/cc/decode_table_test.cc,
built here with g++ under ASan + UBSan (it is header-only: xla_ffi/codec/huffman.h) and also a Bazel cc_test.
"""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from sanitized_build import ASAN, BASE, CXX, HAVE_CXX, ROOT, run

pytestmark = pytest.mark.skipif(not HAVE_CXX, reason=f"needs a C++ compiler ({CXX})")

SOURCE = ROOT / "tests/cc/decode_table_test.cc"
HEADERS = ("tests/cc/check.h", "xla_ffi/codec/format.h", "xla_ffi/codec/huffman.h")


def test_entry_wise_table_equals_symbol_wise_table():
  flags = [*BASE, *ASAN, "-Wall", "-Wextra", "-Werror", "-I", str(ROOT)]
  key = hashlib.sha256("\0".join([SOURCE.read_text(), *((ROOT / h).read_text() for h in HEADERS), CXX, *flags])
                       .encode()).hexdigest()[:16]
  exe = ROOT / "build" / "sanitized" / f"decode_table_test-{key}"
  if not exe.exists():
    exe.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([CXX, *flags, str(SOURCE), "-o", str(exe)], check=True, timeout=300)
  r = run(exe, timeout=300)
  assert r.returncode == 0, r.stdout + r.stderr[-6000:]
  assert "[FAIL]" not in r.stdout and " 0 failed checks" in r.stdout, r.stdout
