"""cmake/zipccl_build.py: NVRTC joins the build's requirements only where CUDA kernels are built.

A CPU-only `pip install .` downloads no NVRTC wheel; a JAX CUDA plugin without NVRTC of its major, or
ZIPCCL_CUDA=12|13|all, gets the NVRTC wheel(s) (pyproject.toml's build-system lists none).
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _backend():
  if importlib.util.find_spec("scikit_build_core") is None:  # the hooks only: a stand-in for the import
    pkg, build = types.ModuleType("scikit_build_core"), types.ModuleType("scikit_build_core.build")
    pkg.build = build
    sys.modules.setdefault("scikit_build_core", pkg)
    sys.modules.setdefault("scikit_build_core.build", build)
  spec = importlib.util.spec_from_file_location("zipccl_build", ROOT / "cmake" / "zipccl_build.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


backend = _backend()


def test_pyproject_builds_with_this_backend_and_no_nvrtc():
  bs = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
  assert bs["build-backend"] == "zipccl_build" and bs["backend-path"] == ["cmake"]
  assert not [r for r in bs["requires"] if "nvrtc" in r], bs["requires"]


def _probe(plugin="", nvrtc=""):
  return lambda: {"PLUGIN": plugin, "NVRTC": nvrtc}


def test_cpu_only_needs_no_nvrtc():
  assert backend.nvrtc_requires({}, _probe()) == []


@pytest.mark.parametrize("major,wheel", [(12, "nvidia-cuda-nvrtc-cu12"), (13, "nvidia-cuda-nvrtc")])
def test_a_bare_plugin_gets_nvrtc_of_its_major(major, wheel):
  plugin = f"{major}|jax-cuda{major}-plugin|0.10.2"
  assert backend.nvrtc_requires({}, _probe(plugin)) == [wheel]
  # jax[cudaN] brought its NVRTC: nothing to add
  assert backend.nvrtc_requires({}, _probe(plugin, f"/site/libnvrtc.so.{major}")) == []


def test_asked_for_and_disabled():
  never = lambda: pytest.fail("the environment was probed although the choice was given")  # noqa: E731
  assert backend.nvrtc_requires({"ZIPCCL_CUDA": "12"}, never) == ["nvidia-cuda-nvrtc-cu12"]
  assert backend.nvrtc_requires({"ZIPCCL_CUDA": "13"}, never) == ["nvidia-cuda-nvrtc"]
  assert backend.nvrtc_requires({"ZIPCCL_CUDA": "all"}, never) == ["nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12"]
  assert backend.nvrtc_requires({"ZIPCCL_DISABLE_CUDA": "1", "ZIPCCL_CUDA": "13"}, never) == []
  with pytest.raises(ValueError, match="ZIPCCL_CUDA must be 12, 13, all or auto"):
    backend.nvrtc_requires({"ZIPCCL_CUDA": "11"}, never)


def test_the_probe_is_cmake_jax_cuda():
  """The hook asks the same probe CMake does, in the target environment (python -I)."""
  found = backend._probe()
  assert set(found) >= {"PLUGIN", "NVRTC", "NOTE"}, found
