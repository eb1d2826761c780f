"""Every vector tier of the CPU codec against its portable loops, whatever tier this machine's build compiled.

The installed extension compiles one tier, the widest the build machine runs (`-march=native`), and the suite's
code-path tests (tests/test_reference.py) and the fuzzers check that one. Here each tier is built on its own
(xla_ffi/codec/cpu_driver.cc with that tier's instruction-set flags, ASan and UBSan, and
tests/cc/cpu_tiers_check.cc) and, where this CPU runs it, checked against the portable loops on shaped inputs
and damaged frames: same frames, same bits, same verdicts. A tier this CPU cannot run is compiled, so that an
edit made on one machine cannot break another machine's tier unseen; running it needs a CPU that has it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CXX = shutil.which("g++") or shutil.which("c++")

# tier (CompiledCodePaths()) -> (compiler flags, the /proc/cpuinfo flags it needs)
TIERS = {
    "avx2": (["-mavx2", "-mpopcnt"], ["avx2", "popcnt"]),
    "avx512bw": (["-mavx512f", "-mavx512bw", "-mavx512vl", "-mbmi2", "-mpopcnt"],
                 ["avx512f", "avx512bw", "avx512vl", "bmi2", "popcnt"]),
    "avx512_vbmi2": (["-mavx512f", "-mavx512bw", "-mavx512vl", "-mbmi2", "-mpopcnt", "-mavx512vbmi",
                      "-mavx512vbmi2", "-mgfni"],
                     ["avx512f", "avx512bw", "avx512vl", "bmi2", "popcnt", "avx512vbmi", "avx512_vbmi2", "gfni"]),
}
SOURCES = [ROOT / "tests/cc/cpu_tiers_check.cc", ROOT / "xla_ffi/codec/cpu_driver.cc"]
FLAGS = ["-std=c++17", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
         "-I", str(ROOT / "xla_ffi"), "-I", str(ROOT / "xla_ffi/codec")]


def _cpu_flags() -> set[str]:
  try:
    text = Path("/proc/cpuinfo").read_text()
  except OSError:
    return set()
  m = re.search(r"^flags\s*:(.*)$", text, re.M)
  return set(m.group(1).split()) if m else set()


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
@pytest.mark.parametrize("tier", list(TIERS))
def test_tier_matches_the_portable_loops(tier, tmp_path):
  isa, needs = TIERS[tier]
  missing = [f for f in needs if f not in _cpu_flags()]
  if missing:
    subprocess.run([CXX, *FLAGS, *isa, "-fsyntax-only", str(SOURCES[1])], check=True, timeout=300)
    pytest.skip(f"{tier} compiles; this CPU cannot run it (no {', '.join(missing)})")
  exe = tmp_path / f"cpu_tiers_check_{tier}"
  subprocess.run([CXX, *FLAGS, *isa, *map(str, SOURCES), "-o", str(exe)], check=True, timeout=600)
  r = subprocess.run([str(exe), "300", "7"], capture_output=True, text=True, timeout=600,
                     env={"ASAN_OPTIONS": "detect_leaks=0"})
  assert r.returncode == 0, r.stdout + r.stderr
  assert r.stdout.splitlines()[0] == f"tier: {tier}", r.stdout
  assert r.stdout.splitlines()[-1].startswith("ok: 300 cases"), r.stdout
