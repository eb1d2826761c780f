"""The build backend: scikit-build-core's, with NVRTC as a build requirement only where CUDA kernels are built.

NVRTC (NVIDIA's runtime compiler, 60-90 MB a wheel) compiles the CUDA kernels at build time (cmake/jax_cuda.py
picks it, cmake/cuda_toolkit.cmake uses it). A CPU-only `pip install .` needs none and downloads none. It is
added to the build's requirements (pyproject.toml, `backend-path`) when:
  - ZIPCCL_CUDA=12 or 13 asks for the kernels of that CUDA major (ZIPCCL_CUDA=all: both NVRTCs), or
  - a JAX CUDA plugin (jax-cuda12-plugin, jax-cuda13-plugin) is installed in the target environment and no
    NVRTC of its major is (`pip install "jax[cuda12]"` brings one; a bare plugin does not).
ZIPCCL_DISABLE_CUDA=1 builds no kernels and adds nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scikit_build_core import build as _skb
from scikit_build_core.build import *  # noqa: F401,F403  (every PEP 517 hook not defined below)

NVRTC_WHEEL = {12: "nvidia-cuda-nvrtc-cu12", 13: "nvidia-cuda-nvrtc"}
_PROBE = Path(__file__).with_name("jax_cuda.py")


def _probe() -> dict[str, str]:
  """cmake/jax_cuda.py's answer for the target environment (`-I`: its site-packages, not the build's)."""
  try:
    r = subprocess.run([sys.executable, "-I", str(_PROBE)], capture_output=True, text=True, timeout=600)
  except (OSError, subprocess.SubprocessError):
    return {}
  return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


def nvrtc_requires(env=None, probe=_probe) -> list[str]:
  """The NVRTC wheels this build needs (see the module docstring)."""
  env = os.environ if env is None else env
  if env.get("ZIPCCL_DISABLE_CUDA", "") not in ("", "0"):
    return []
  asked = env.get("ZIPCCL_CUDA", "").strip().lower()
  if asked in ("12", "13"):
    return [NVRTC_WHEEL[int(asked)]]
  if asked == "all":
    return [NVRTC_WHEEL[13], NVRTC_WHEEL[12]]
  if asked not in ("", "auto"):
    raise ValueError(f"ZIPCCL_CUDA must be 12, 13, all or auto, got {asked!r}")
  found = probe()
  plugin = found.get("PLUGIN", "")
  if plugin and not found.get("NVRTC"):
    return [NVRTC_WHEEL[int(plugin.split("|")[0])]]
  return []


def get_requires_for_build_wheel(config_settings=None):
  return [*_skb.get_requires_for_build_wheel(config_settings), *nvrtc_requires()]


def get_requires_for_build_editable(config_settings=None):
  return [*_skb.get_requires_for_build_editable(config_settings), *nvrtc_requires()]
