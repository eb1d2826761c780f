"""Builds the sanitized C++ binaries that run the CUDA kernel bodies in the SIMT emulator (issue 15).

Every source is compiled with UBSan. Sources that instantiate kernel bodies get the compiler's ThreadSanitizer
instrumentation (RACE) instead of AddressSanitizer's, which GCC and Clang cannot combine in one object: the
emulator's runtime xla_ffi/simt_race_hooks.cc, linked in place of TSan's, turns each of their accesses into a
shared-memory race check and a seeded random yield between fibers, and forwards it to ASan's check. All other
sources but the hooks get ASan (ASAN), and the binary links ASan's runtime. Objects and binaries are cached under
build/sanitized/ by a hash of the source, the headers and the flags (not the tree's path: a copy with one
seeded source reuses the others' objects).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import jaxlib

ROOT = Path(__file__).resolve().parents[1]
XLA_INCLUDE = Path(jaxlib.__file__).parent / "include"
CXX = os.environ.get("CXX", "g++")
BASE = ["-std=c++17", "-O1", "-g", "-fno-sanitize-recover=undefined", "-isystem", str(XLA_INCLUDE)]
ASAN = ["-fsanitize=address,undefined"]
RACE = ["-fsanitize=thread,undefined"]  # instrumentation only: simt_race_hooks.cc is its runtime
HOOKS = "xla_ffi/simt_race_hooks.cc"
# The hooks run on every access of an instrumented source and call ASan's checks themselves (a probe tests
# that they do: tests/cc/asan_hooks_probe.cc); they are the emulator's machinery, not code under test, so
# they are built optimised and without ASan's own instrumentation (that poisoned and unpoisoned the race
# detector's stack frame on every call): 44.3 s of CPU for test_emulated_decode_rejects_like_cpu built as
# ASAN, 30.5 s so (57.8 s before the sized checks).
HOOKS_FLAGS = ["-fsanitize=undefined", "-O2"]  # after BASE's -O1 on the command line: the last -O wins
HAVE_CXX = shutil.which(CXX) is not None


def _headers_digest(root: Path) -> str:
  h = hashlib.sha256()
  for d in ("xla_ffi", "tests/cc"):
    for p in sorted((root / d).rglob("*")):
      if p.suffix in (".h", ".cuh"):
        h.update(p.read_bytes())
  return h.hexdigest()


def _object(root: Path, src: str, flags: list[str], headers: str) -> Path:
  # Keyed by what the object is made of (the source, every header, the flags), not by where the tree lies:
  # a test that seeds a bug in a copy of one source recompiles only that one.
  key = hashlib.sha256("\0".join([src, (root / src).read_text(), headers, CXX] + BASE + flags).encode())
  flags = BASE + ["-I", str(root), "-I", str(root / "xla_ffi")] + flags
  out = ROOT / "build" / "sanitized" / f"{Path(src).stem}-{key.hexdigest()[:16]}.o"
  if not out.exists():
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp.o")
    subprocess.run([CXX, *flags, "-c", str(root / src), "-o", str(tmp)], check=True, timeout=900)
    tmp.rename(out)
  return out


def binary(name: str, sources: dict[str, list[str]], root: Path = ROOT) -> Path:
  """Links `sources` (path under root -> its flags: RACE or ASAN, plus extras) with the race hooks into
  build/sanitized/; `root` is a copy of the repository's sources (a test seeding a bug), by default itself."""
  headers = _headers_digest(root)
  objs = [_object(root, src, flags, headers) for src, flags in {**sources, HOOKS: HOOKS_FLAGS}.items()]
  exe = objs[0].parent / f"{name}-{hashlib.sha256(''.join(map(str, objs)).encode()).hexdigest()[:16]}"
  if not exe.exists():
    subprocess.run([CXX, *BASE, *ASAN, *map(str, objs), "-o", str(exe)], check=True, timeout=300)
  return exe


def run(exe: Path, args: list[str] = (), timeout: float = 900) -> subprocess.CompletedProcess:
  # Fibers switch stacks: ASan's fake stacks and leak checks do not follow them.
  env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:detect_stack_use_after_return=0")
  return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)
