"""The CUDA toolkit CMake picks matches the installed JAX CUDA plugin (cmake/cuda_toolkit.cmake, issue 15).

Runs the selection alone (ZIPCCL_CUDA_SELECT_ONLY) in a scratch CMake project, with a fake Python that reports
a plugin and fake nvcc scripts of given CUDA versions, so every branch runs without any CUDA toolkit.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


def _script(path: Path, text: str) -> Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("#!/bin/sh\n" + text)
  path.chmod(0o755)
  return path


def _nvcc(path: Path, version: str) -> Path:
  return _script(path, f'echo "Cuda compilation tools, release {version}, V{version}.1"\n')


def _select(tmp: Path, probe_lines: list[str], env: dict[str, str]) -> tuple[str, str]:
  python = _script(tmp / "fakepy" / "python", "cat <<'EOT'\n" + "\n".join(probe_lines) + "\nEOT\n")
  (tmp / "proj").mkdir(exist_ok=True)
  (tmp / "proj" / "CMakeLists.txt").write_text(
      "cmake_minimum_required(VERSION 3.18)\nproject(t LANGUAGES NONE)\n"
      f'set(Python_EXECUTABLE "{python}")\nset(ZIPCCL_CUDA_SELECT_ONLY ON)\n'
      f'include("{ROOT}/cmake/cuda_toolkit.cmake")\n'
      'message(STATUS "CHOSEN=[${ZIPCCL_CUDA_NVCC}]")\nmessage(STATUS "NOTE=[${ZIPCCL_CUDA_NOTE}]")\n')
  full = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "ZIPCCL_CUDA_HOME",
                                                           "ZIPCCL_DISABLE_CUDA")}
  full.update(env)
  r = subprocess.run(["cmake", "-S", str(tmp / "proj"), "-B", str(tmp / "build")], capture_output=True,
                     text=True, env=full, timeout=120)
  assert r.returncode == 0, r.stdout + r.stderr
  out = r.stdout + r.stderr
  chosen = re.search(r"CHOSEN=\[(.*?)\]", out).group(1)
  note = re.search(r"NOTE=\[(.*?)\]", out, re.S).group(1)
  return chosen, note


def test_cuda12_plugin_never_gets_a_cuda13_nvcc(tmp_path):
  nvcc13 = _nvcc(tmp_path / "bin13" / "nvcc", "13.0")
  chosen, note = _select(tmp_path, ["12|jax-cuda12-plugin|0.10.2"],
                         {"PATH": f"{nvcc13.parent}:/usr/bin:/bin"})
  assert chosen == ""
  assert "jax-cuda12-plugin 0.10.2 needs CUDA 12 kernels" in note and "(CUDA 13)" in note


def test_cuda12_plugin_takes_the_cuda12_toolkit_it_is_given(tmp_path):
  nvcc13 = _nvcc(tmp_path / "bin13" / "nvcc", "13.0")
  nvcc12 = _nvcc(tmp_path / "cuda12" / "bin" / "nvcc", "12.9")
  chosen, note = _select(tmp_path, ["12|jax-cuda12-plugin|0.10.2"],
                         {"PATH": f"{nvcc13.parent}:/usr/bin:/bin", "ZIPCCL_CUDA_HOME": str(tmp_path / "cuda12")})
  assert chosen == str(nvcc12)
  assert note == "CUDA 12 to match jax-cuda12-plugin 0.10.2"


def test_a_wheel_nvcc_of_the_plugins_major_is_used(tmp_path):
  """The probe lists nvcc from the NVIDIA wheels (nvidia/cu13/bin/nvcc for CUDA 13); when no system toolkit of
  that major exists, that one is chosen. (CUDA 12 here: this machine has a system CUDA 13.)"""
  wheel_nvcc = _nvcc(tmp_path / "site" / "nvidia" / "cuda_nvcc" / "bin" / "nvcc", "12.8")
  chosen, _ = _select(tmp_path, ["12|jax-cuda12-plugin|0.10.2", str(wheel_nvcc)], {"PATH": "/usr/bin:/bin"})
  assert chosen == str(wheel_nvcc)


def test_disable_wins(tmp_path):
  nvcc12 = _nvcc(tmp_path / "cuda12" / "bin" / "nvcc", "12.9")
  chosen, note = _select(tmp_path, ["12|jax-cuda12-plugin|0.10.2"],
                         {"ZIPCCL_CUDA_HOME": str(nvcc12.parent.parent), "ZIPCCL_DISABLE_CUDA": "1"})
  assert chosen == "" and note == "ZIPCCL_DISABLE_CUDA is set"


def test_probe_reports_no_plugin_here():
  """This environment has no JAX CUDA plugin: the probe's first line is empty (today's behaviour)."""
  r = subprocess.run([sys.executable, "-I", str(ROOT / "cmake" / "jax_cuda.py")], capture_output=True, text=True,
                     check=True)
  first = r.stdout.splitlines()[0] if r.stdout else ""
  import importlib.metadata as md
  installed = [d for d in ("jax-cuda12-plugin", "jax-cuda13-plugin")
               if any(x.metadata["Name"] == d for x in md.distributions())]
  assert (first == "") == (not installed), (first, installed)
