"""Prints what CMake needs to build CUDA kernels that match the installed JAX (cmake/cuda_toolkit.cmake).

Line 1: "<major>|<distribution>|<version>" of the installed JAX CUDA plugin (jax-cuda12-plugin, ...), or "".
Then:   one nvcc candidate per line from the NVIDIA PyPI wheels of that major (nvidia/cu13/bin/nvcc for the
        CUDA 13 wheels; nvidia/cuda_nvcc/bin/nvcc for CUDA 12, whose nvidia-cuda-nvcc-cu12 wheels ship
        only ptxas to this day, so that path usually does not exist).
Run with -I by CMake, so that under pip's build isolation it still sees the target environment.
"""

import importlib.metadata as md
import os
import sys

plugin = ""
for major in (13, 12):
  for dist in (f"jax-cuda{major}-plugin", f"jax_cuda{major}_plugin"):
    try:
      plugin = f"{major}|{dist.replace('_', '-')}|{md.version(dist)}"
      break
    except md.PackageNotFoundError:
      continue
  if plugin:
    break
print(plugin)
if plugin:
  major = plugin.split("|")[0]
  for site in sys.path:
    for rel in (f"nvidia/cu{major}/bin/nvcc", "nvidia/cuda_nvcc/bin/nvcc"):
      path = os.path.join(site, rel)
      if os.path.isfile(path) and os.access(path, os.X_OK):
        print(path)
