"""What this zipccl_jax build is and what it sees: `zipccl_jax.info()`; paste `python -m zipccl_jax.info` (info.py,
the command line) into bug reports.

>>> import zipccl_jax
>>> sorted(zipccl_jax.info())[:3]
['cpu', 'cuda', 'jax']
"""

from __future__ import annotations

import importlib.metadata as _md
import sys

import jax
import jaxlib

from zipccl_jax import _ffi

_PLUGINS = ("jax-cuda13-plugin", "jax-cuda12-plugin")


def _version(dist: str) -> str | None:
  try:
    return _md.version(dist)
  except _md.PackageNotFoundError:
    return None


# The kernels are NVRTC images launched through the CUDA driver API: no CUDA runtime is linked or loaded.
_RUNTIME = "none (CUDA driver API, libcuda.so.1)"


def _cuda_version(v: int) -> str | None:
  """12090 (cuDriverGetVersion's encoding) -> "12.9"; 0 -> None."""
  return f"{v // 1000}.{v % 1000 // 10}" if v else None


def _jax_cuda_plugin() -> str | None:
  for dist in _PLUGINS:
    if (v := _version(dist)) is not None:
      return f"{dist} {v}"
  return None


def _cuda(build: dict, plugin: str | None) -> dict:
  ext = _ffi.extension()
  versions = ext.cuda_versions() if build["cuda_kernels"] else None
  cuda = {
      "kernels": bool(build["cuda_kernels"]),
      "toolkit": build["cuda_toolkit"] or None,  # the CUDA version of the NVRTC that compiled the kernels
      "compiler": f"NVRTC {build['cuda_toolkit']}" if build["cuda_kernels"] else None,
      "runtime": _RUNTIME if versions else None,
      "driver": _cuda_version(versions["driver"]) if versions else None,  # None: no NVIDIA driver
      "min_driver": build["cuda_min_driver"] or None,
      "archs": [int(a) for a in build["cuda_archs"].split(",") if a],  # CUBINs; PTX of the first for later GPUs
      "build_note": build["cuda_note"],
      "jax_cuda_plugin_at_build": build["jax_cuda_plugin"] or None,
  }
  problems = []
  if versions and versions["driver"] and versions["driver_error"]:
    problems.append(versions["driver_error"])
  if plugin and cuda["toolkit"]:
    want = plugin.split()[0].removeprefix("jax-cuda").removesuffix("-plugin")
    if cuda["toolkit"].split(".")[0] != want:
      problems.append(f"{plugin} runs CUDA {want}, but the kernels were built with CUDA {cuda['toolkit']}: "
                      "reinstall zipccl_jax (pip install .) next to the plugin")
  if plugin and not cuda["kernels"]:
    problems.append(f"{plugin} is installed but this build has no CUDA kernels ({build['cuda_note']}): reinstall "
                    "zipccl_jax now that the plugin is here (pip install --force-reinstall --no-deps .), and the "
                    "build compiles them with NVRTC of the plugin's CUDA major")
  cuda["problems"] = problems
  return cuda


def _jaxlib_build(build: dict) -> dict:
  """The jaxlib whose FFI headers the extension was compiled against, and whether the running one differs
  in a way that matters: another FFI API version (`_ffi.ffi_api_mismatch`)."""
  why = _ffi.ffi_api_mismatch(build)
  return {"jaxlib": build.get("jaxlib") or None, "ffi_api": build.get("ffi_api") or None,
          "runtime_ffi_api": _ffi.runtime_ffi_api(), "problems": [why] if why else []}


def info() -> dict:
  """The build and environment as a JSON-serialisable dict.

  Keys: `version`, `jax`, `jaxlib`, `build` {`jaxlib` (whose XLA FFI headers were compiled in), `ffi_api`
  (their API version), `runtime_ffi_api` (the running jaxlib's), `problems`},
  `jax_cuda_plugin` (installed now, "name version" or None),
  `cuda` {`kernels`, `toolkit` (NVRTC's CUDA version, "12.9"), `compiler`, `runtime` (none is linked: the
  kernels run through the driver API), `driver`, `min_driver`, `archs`, `build_note`,
  `jax_cuda_plugin_at_build`, `problems`}, `cpu` {`code_paths`, `native`}, `python`.
  Does not initialise any JAX backend.
  """
  build = _ffi.extension().build_info()
  plugin = _jax_cuda_plugin()
  return {
      "version": sys.modules["zipccl_jax"].__version__,  # the parent package is loaded first
      "jax": jax.__version__,
      "jaxlib": jaxlib.__version__,
      "build": _jaxlib_build(build),
      "jax_cuda_plugin": plugin,
      "cuda": _cuda(build, plugin),
      "cpu": {
          "code_paths": [p for p in build["cpu_code_paths"].split(",") if p],
          "native": bool(build["cpu_native"]),  # built with -march=native for the build machine
      },
      "python": sys.version.split()[0],
  }

