"""The NVRTC the build picks matches the installed JAX CUDA plugin (cmake/jax_cuda.py, cmake/cuda_toolkit.cmake).

The choice (cmake/jax_cuda.py: `candidates`, `choose`) runs on fake wheel and toolkit layouts; the CMake side runs
alone (ZIPCCL_CUDA_SELECT_ONLY) in a scratch project with a fake Python that prints a probe's answer.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("jax_cuda", ROOT / "cmake" / "jax_cuda.py")
jax_cuda = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jax_cuda)

PLUGIN12 = (12, "jax-cuda12-plugin", "0.10.2")


def _lib(path: Path) -> Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(b"\x7fELF")
  return path


def test_cuda12_plugin_never_gets_nvrtc13():
  lib, ver, note = jax_cuda.choose(PLUGIN12, [(Path("/x/libnvrtc.so.13"), "13.0")])
  assert lib is None and ver == ""
  assert "jax-cuda12-plugin 0.10.2 needs CUDA 12 kernels and no NVRTC 12 was found" in note
  assert "/x/libnvrtc.so.13 (13.0)" in note and "pip install nvidia-cuda-nvrtc-cu12 (the cuda12 extra)" in note


def test_cuda12_plugin_takes_nvrtc12_even_after_a_13():
  found = [(Path("/a/libnvrtc.so.13"), "13.0"), (Path("/b/libnvrtc.so.12"), "12.9")]
  assert jax_cuda.choose(PLUGIN12, found) == (Path("/b/libnvrtc.so.12"), "12.9",
                                              "NVRTC 12.9 to match jax-cuda12-plugin 0.10.2")
  lib, _, _ = jax_cuda.choose((13, "jax-cuda13-plugin", "0.10.2"), found)
  assert lib == Path("/a/libnvrtc.so.13")


def test_without_a_plugin_the_newest_nvrtc():
  found = [(Path("/b/libnvrtc.so.12"), "12.9"), (Path("/a/libnvrtc.so.13"), "13.0")]
  lib, ver, note = jax_cuda.choose(None, found)
  assert (lib, ver) == (Path("/a/libnvrtc.so.13"), "13.0") and "no JAX CUDA plugin" in note
  lib, _, note = jax_cuda.choose(None, [])
  assert lib is None and note.startswith("no NVRTC found")


def test_candidates_in_wheels_and_toolkits(tmp_path):
  """Where the NVIDIA wheels put libnvrtc (cu12: nvidia/cuda_nvrtc/lib, 13: nvidia/cu13/lib), then toolkits: an
  explicit home, and the toolkit behind an nvcc wrapper script on PATH (as on this machine)."""
  w12 = _lib(tmp_path / "site" / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12")
  w13 = _lib(tmp_path / "site" / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13")
  home = _lib(tmp_path / "cuda-12.4" / "lib64" / "libnvrtc.so.12").parent.parent
  behind = _lib(tmp_path / "cuda-13.0" / "targets" / "x86_64-linux" / "lib" / "libnvrtc.so.13").parents[3]
  (behind / "bin").mkdir()
  wrapper = tmp_path / "bin" / "nvcc"
  wrapper.parent.mkdir()
  wrapper.write_text(f'#!/bin/sh\nexec {behind}/bin/nvcc "$@"\n')
  wrapper.chmod(0o755)
  explicit = _lib(tmp_path / "mine" / "libnvrtc.so.12")
  env = {"ZIPCCL_NVRTC": str(explicit), "ZIPCCL_CUDA_HOME": str(home), "PATH": str(wrapper.parent)}
  got = jax_cuda.candidates(env, [str(tmp_path / "site")])
  assert got[:4] == [explicit, w13, w12, home / "lib64" / "libnvrtc.so.12"], got
  assert behind / "targets" / "x86_64-linux" / "lib" / "libnvrtc.so.13" in got


def _script(path: Path, text: str) -> Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("#!/bin/sh\n" + text)
  path.chmod(0o755)
  return path


def _cmake(tmp: Path, probe: str, env: dict[str, str]) -> tuple[str, str, str]:
  python = _script(tmp / "fakepy" / "python", "cat <<'EOT'\n" + probe + "\nEOT\n")
  (tmp / "proj").mkdir(exist_ok=True)
  (tmp / "proj" / "CMakeLists.txt").write_text(
      "cmake_minimum_required(VERSION 3.18)\nproject(t LANGUAGES NONE)\n"
      f'set(Python_EXECUTABLE "{python}")\nset(ZIPCCL_CUDA_SELECT_ONLY ON)\n'
      f'include("{ROOT}/cmake/cuda_toolkit.cmake")\n'
      'message(STATUS "CHOSEN=[${ZIPCCL_NVRTC}]")\nmessage(STATUS "NOTE=[${ZIPCCL_CUDA_NOTE}]")\n'
      'message(STATUS "PLUGIN=[${ZIPCCL_JAX_CUDA_PLUGIN}]")\n')
  full = {k: v for k, v in os.environ.items() if k != "ZIPCCL_DISABLE_CUDA"}
  full.update(env)
  r = subprocess.run(["cmake", "-S", str(tmp / "proj"), "-B", str(tmp / "build")], capture_output=True,
                     text=True, env=full, timeout=120)
  assert r.returncode == 0, r.stdout + r.stderr
  out = r.stdout + r.stderr
  return tuple(re.search(rf"{k}=\[(.*?)\]", out, re.S).group(1) for k in ("CHOSEN", "NOTE", "PLUGIN"))


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_cmake_reads_the_probe(tmp_path):
  probe = ("PLUGIN=12|jax-cuda12-plugin|0.10.2\nNVRTC=/w/nvidia/cuda_nvrtc/lib/libnvrtc.so.12\nNVRTC_VERSION=12.9\n"
           "NOTE=NVRTC 12.9 to match jax-cuda12-plugin 0.10.2")
  assert _cmake(tmp_path, probe, {}) == ("/w/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
                                         "NVRTC 12.9 to match jax-cuda12-plugin 0.10.2", "jax-cuda12-plugin 0.10.2")


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_disable_wins(tmp_path):
  probe = "PLUGIN=\nNVRTC=/w/libnvrtc.so.13\nNVRTC_VERSION=13.0\nNOTE=x"
  chosen, note, _ = _cmake(tmp_path, probe, {"ZIPCCL_DISABLE_CUDA": "1"})
  assert chosen == "" and note == "ZIPCCL_DISABLE_CUDA is set"


def test_probe_reports_the_plugin_installed_here():
  r = subprocess.run([sys.executable, "-I", str(ROOT / "cmake" / "jax_cuda.py")], capture_output=True, text=True,
                     check=True, timeout=300)
  first = r.stdout.splitlines()[0]
  import importlib.metadata as md
  installed = [d for d in ("jax-cuda12-plugin", "jax-cuda13-plugin")
               if any(x.metadata["Name"] == d for x in md.distributions())]
  assert (first == "PLUGIN=") == (not installed), (first, installed)


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("c++") is None, reason="needs cmake and c++")
def test_build_info_strings_survive_semicolons_and_quotes(tmp_path):
  """cmake/build_info.cmake: the note of a build that skips its kernels names the NVRTCs it tried, joined by
  '; ', which as a -D value split into two flags and broke module.cc's compile. The generated header must
  give back every byte of the strings, whatever they hold."""
  note = ('jax-cuda12-plugin 0.10.2 needs CUDA 12 kernels and no NVRTC 12 was found (tried: /a/libnvrtc.so.13 '
          '(13.5)); pip install nvidia-cuda-nvrtc-cu12 "quoted" back\\slash @ONLY@ ${VAR} $<SEMICOLON>')
  plugin = "jax-cuda12-plugin 0.10.2"
  (tmp_path / "main.cc").write_text(
      '#include <cstdio>\n#include "zipccl_build_info.h"\n'
      'int main() { std::printf("%s\\n%s\\n%s\\n", ZIPCCL_CUDA_NOTE, ZIPCCL_BUILD_JAX_CUDA_PLUGIN,'
      ' ZIPCCL_BUILD_JAXLIB); }\n')
  (tmp_path / "CMakeLists.txt").write_text(
      "cmake_minimum_required(VERSION 3.18)\nproject(t LANGUAGES CXX)\n"
      f'include("{ROOT}/cmake/build_info.cmake")\n'
      # the note arrives as a CMake variable, as from cmake/cuda_toolkit.cmake
      'set(NOTE [==[' + note + ']==])\n'
      f'zipccl_write_build_info("${{CMAKE_BINARY_DIR}}/gen/zipccl_build_info.h" "${{NOTE}}" "{plugin}" "0.12.0.1")\n'
      "add_executable(show main.cc)\ntarget_include_directories(show PRIVATE ${CMAKE_BINARY_DIR}/gen)\n")
  build = tmp_path / "build"
  for cmd in (["cmake", "-S", str(tmp_path), "-B", str(build)], ["cmake", "--build", str(build)]):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
  out = subprocess.run([str(build / "show")], capture_output=True, text=True, check=True).stdout
  assert out.splitlines() == [note, plugin, "0.12.0.1"]
