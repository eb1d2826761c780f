"""`python -m zipccl_jax.info` / `zipccl_jax.info()`: what the build is and what it sees (issue 15)."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jaxlib

import zipccl_jax
from zipccl_jax import _zipccl as ext

info_mod = importlib.import_module("zipccl_jax._info")  # what builds the dict (info.py is the command line)
MIN_DRIVER = {"11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}


def _cli() -> dict:
  r = subprocess.run([sys.executable, "-m", "zipccl_jax.info"], capture_output=True, text=True, timeout=300,
                     cwd="/", env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, r.stderr
  assert "RuntimeWarning" not in r.stderr, r.stderr  # runpy's, when the package had imported the module
  return json.loads(r.stdout)


def test_cli_prints_the_dict_info_returns():
  d = _cli()
  assert d == zipccl_jax.info()
  assert d["version"] == zipccl_jax.__version__
  assert (d["jax"], d["jaxlib"]) == (jax.__version__, jaxlib.__version__)
  for key in ("kernels", "toolkit", "runtime", "driver", "min_driver", "archs", "problems"):
    assert key in d["cuda"], key


def test_cuda_fields_describe_the_build():
  cuda = zipccl_jax.info()["cuda"]
  assert cuda["kernels"] == ext.with_cuda
  if not cuda["kernels"]:
    assert cuda["toolkit"] is None and cuda["archs"] == [] and cuda["runtime"] is None
    return
  assert re.fullmatch(r"\d+\.\d+", cuda["toolkit"]), cuda
  major = cuda["toolkit"].split(".")[0]
  assert cuda["min_driver"] == MIN_DRIVER[major]
  assert cuda["archs"] == [80, 90]
  # No CUDA runtime: NVRTC images launched through the driver API.
  assert cuda["runtime"] == info_mod._RUNTIME and cuda["compiler"] == f"NVRTC {cuda['toolkit']}", cuda
  # No NVIDIA driver on this machine: reported as such, not as a mismatch.
  if not Path("/proc/driver/nvidia").exists():
    assert cuda["driver"] is None


def test_a_plugin_of_another_cuda_major_is_a_reported_problem():
  """On this build, whichever it is; then on a CUDA 12 build faked around info._cuda (the check itself runs
  on any machine: before, a build without CUDA returned without asserting anything)."""
  if ext.with_cuda:
    cuda, plugin = zipccl_jax.info()["cuda"], zipccl_jax.info()["jax_cuda_plugin"]
    mismatch = plugin is not None and not plugin.startswith(f"jax-cuda{cuda['toolkit'].split('.')[0]}-")
    assert any("reinstall zipccl_jax" in p for p in cuda["problems"]) == mismatch


def test_cuda_problems_of_a_faked_build(monkeypatch):
  class Ext:
    def cuda_versions(self):
      return {"compiled": 12090, "driver": 0, "driver_error": ""}

  monkeypatch.setattr(info_mod._ffi, "extension", lambda: Ext())
  build = {"cuda_kernels": True, "cuda_toolkit": "12.9", "cuda_min_driver": "525.60.13", "cuda_archs": "80,90",
           "cuda_note": "", "jax_cuda_plugin": ""}
  ok = info_mod._cuda(build, "jax-cuda12-plugin 0.10.2")
  assert ok["problems"] == [] and ok["runtime"] == info_mod._RUNTIME and ok["driver"] is None
  assert ok["archs"] == [80, 90] and ok["compiler"] == "NVRTC 12.9"
  (p,) = info_mod._cuda(build, "jax-cuda13-plugin 0.10.2")["problems"]
  assert "runs CUDA 13" in p and "built with CUDA 12.9" in p and "reinstall zipccl_jax" in p
  no_kernels = dict(build, cuda_kernels=False, cuda_toolkit="", cuda_note="nvcc not found")
  (p,) = info_mod._cuda(no_kernels, "jax-cuda12-plugin 0.10.2")["problems"]
  assert "no CUDA kernels (nvcc not found): reinstall zipccl_jax now that the plugin is here" in p


def test_cpu_code_paths_match_the_build_machine():
  d = zipccl_jax.info()["cpu"]
  assert d["native"] == ext.build_info()["cpu_native"]
  flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""

  def has(*names):
    return all(re.search(rf"\b{f}\b", flags) for f in names)

  avx512 = has("avx512f", "avx512bw", "avx512vl", "bmi2")
  vbmi2 = avx512 and has("avx512vbmi", "avx512_vbmi2", "gfni")
  avx2 = has("avx2", "popcnt")
  if d["native"]:  # one tier: the widest the build machine runs
    widest = ["avx512_vbmi2"] if vbmi2 else ["avx512bw"] if avx512 else ["avx2"] if avx2 else []
    assert d["code_paths"] == widest, (d, flags)
  assert set(d["code_paths"]) <= {"avx512_vbmi2", "avx512bw", "avx2"}


def test_info_from_a_source_tree_loads_the_installed_extension(tmp_path):
  """`python -m zipccl_jax.info` in a checkout's root imports the tree, which has no compiled extension: the
  extension of the zipccl_jax installed elsewhere on sys.path is loaded instead (`_ffi.extension`)."""
  import shutil
  src = Path(zipccl_jax.__file__).parent
  tree, site = tmp_path / "checkout", tmp_path / "site"
  shutil.copytree(src, tree / "zipccl_jax", ignore=shutil.ignore_patterns("_zipccl*", "__pycache__"))
  (site / "zipccl_jax").mkdir(parents=True)
  shutil.copy(ext.__file__, site / "zipccl_jax" / Path(ext.__file__).name)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(site))
  r = subprocess.run([sys.executable, "-m", "zipccl_jax.info"], cwd=tree, env=env, capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  assert json.loads(r.stdout)["version"] == zipccl_jax.__version__
  # with no installed copy at all, the error says what to do
  r = subprocess.run([sys.executable, "-m", "zipccl_jax.info"], cwd=tree, env=dict(env, PYTHONPATH=""),
                     capture_output=True, text=True, timeout=300)
  if r.returncode != 0:  # (an installed zipccl_jax in this Python's site-packages is found too)
    assert "Install it into this Python: `pip install .`" in r.stderr, r.stderr
