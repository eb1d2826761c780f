"""The kernels built by NVRTC of each CUDA major (cmake/nvrtc_build.py), without building the extension.

- A CUDA 12 build: NVRTC 12 (nvidia-cuda-nvrtc-cu12, in the test and cuda12 extras) compiles
  xla_ffi/codec/kernels.cu for sm_80, sm_90 and compute_80, and every kernel of those CUBINs passes the
  resource gate (tests/cuda_gate.py), as for the installed extension (CUDA 13 here, tests/test_cuda_resources.py).
- ptxas inside NVRTC really refuses spills with the build's options (a kernel forced to spill fails to compile
  with them and compiles without them).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cuda_gate

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str):
  spec = importlib.util.spec_from_file_location(name, ROOT / "cmake" / f"{name}.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


jax_cuda = _module("jax_cuda")
nvrtc_build = _module("nvrtc_build")


def _nvrtc(major: int | None = None) -> Path:
  """The first NVRTC of that major (any major: None) the build itself would consider."""
  for lib in jax_cuda.candidates(dict(os.environ), sys.path):
    v = jax_cuda.version(lib)
    if v and (major is None or v.split(".")[0] == str(major)):
      return lib
  pytest.skip(f"no NVRTC {major or ''} installed: pip install '.[test]' (nvidia-cuda-nvrtc-cu12, nvidia-cuda-nvrtc)")


def test_cuda12_nvrtc_builds_every_kernel_within_the_gate(tmp_path):
  lib = _nvrtc(12)
  out = tmp_path / "images"
  r = subprocess.run([sys.executable, "-I", str(ROOT / "cmake" / "nvrtc_build.py"), "--nvrtc", str(lib),
                      "--src", str(ROOT / "xla_ffi" / "codec" / "kernels.cu"), "-I", str(ROOT / "xla_ffi" / "codec"),
                      "--arch", "80", "--arch", "90", "--ptx-arch", "80", "--out", str(out),
                      "--images", str(out / "kernel_images.cc")], capture_output=True, text=True, timeout=1200)
  assert r.returncode == 0, r.stderr[-4000:]
  images = [(a, "cubin", (out / f"zipccl_sm{a}.cubin").read_bytes()) for a in (80, 90)]
  ks = cuda_gate.check_images(images, tmp_path)
  assert sorted({k["arch"] for k in ks}) == ["sm_80", "sm_90"]
  assert len(ks) == 2 * cuda_gate.N_KERNELS, [k["name"] for k in ks]
  ptx = (out / "zipccl_compute80.ptx").read_text()
  assert ".target sm_80" in ptx and ptx.count(".visible .entry zipccl_") == cuda_gate.N_KERNELS
  # The generated source embeds exactly these files.
  cc = (out / "kernel_images.cc").read_text()
  assert all(f'.incbin \\"{(out / n).resolve()}\\"' in cc
             for n in ("zipccl_sm80.cubin", "zipccl_sm90.cubin", "zipccl_compute80.ptx"))


SPILLER = r"""
extern "C" __global__ void spill(float* out, const float* in) {
  float v[48];
  for (int i = 0; i < 48; ++i) v[i] = in[threadIdx.x * 48 + i];
  float s = 0.f;
  for (int i = 0; i < 48; ++i)
    for (int j = 0; j < 48; ++j) s += v[i] * v[(i * 7 + j) % 48];
  out[threadIdx.x] = s;
}
"""


def test_the_build_options_refuse_a_spilling_kernel():
  nvrtc = nvrtc_build.Nvrtc(str(_nvrtc()))
  forced = ["-std=c++17", "--gpu-architecture=sm_80", "--maxrregcount=16"]
  assert nvrtc.compile(SPILLER, "spill.cu", forced, "cubin")[:4] == b"\x7fELF"  # spills, but compiles
  options = nvrtc_build._options([], "sm_80") + ["--maxrregcount=16"]
  with pytest.raises(SystemExit, match="(?s)NVRTC compile.*spill"):
    nvrtc.compile(SPILLER, "spill.cu", options, "cubin")
