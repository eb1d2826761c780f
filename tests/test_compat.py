"""Supported JAX versions (issue 26): the range refused at import, the version seam (zipccl_jax/_compat.py), the
FFI headers the build takes (cmake/jaxlib_headers.py) and what info() says about them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest

import zipccl_jax
from zipccl_jax import _compat, _ffi

ROOT = Path(__file__).resolve().parents[1]
_info = sys.modules["zipccl_jax._info"]


@pytest.mark.parametrize("jv,lv", [("0.10.2", "0.10.2"), ("0.11.2", "0.11.2"), ("0.12.0.1", "0.12.0.1"),
                                   ("0.12.0.1", "0.11.2"), ("0.12.1", "0.12.1")])
def test_supported_pairs(jv, lv):
  assert _compat.unsupported(jv, lv) is None


@pytest.mark.parametrize("jv,lv,bad", [("0.10.1", "0.10.1", "jax 0.10.1"), ("0.13.0", "0.13.0", "jax 0.13.0"),
                                       ("0.12.0.1", "0.9.2", "jaxlib 0.9.2"), ("0.4.38", "0.4.38", "jax 0.4.38")])
def test_unsupported_pairs_name_both_versions(jv, lv, bad):
  why = _compat.unsupported(jv, lv)
  assert why and f"jax {jv} and jaxlib {lv}" in why and bad in why and ">=0.10.2,<0.13" in why, why


def test_import_refuses_an_unsupported_jax_naming_both_versions():
  """The real import path, in a child whose jax reports a version outside the range."""
  code = ("import jax, jaxlib; jax.__version__ = '0.13.0'\n"
          "try:\n  import zipccl_jax\nexcept ImportError as e:\n  print('REFUSED', e)\n")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/",
                     env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, r.stderr
  assert r.stdout.startswith("REFUSED") and "jax 0.13.0" in r.stdout, r.stdout
  assert f"jaxlib {jaxlib.__version__}" in r.stdout, r.stdout


def test_this_jax_is_supported():
  assert _compat.unsupported(jax.__version__, jaxlib.__version__) is None


def test_jaxpr_and_consts_evaluates_what_make_jaxpr_traced():
  """jax 0.10's ClosedJaxpr and jax 0.11+'s Jaxpr (which carries its consts) alike."""
  table = np.arange(8, dtype=np.float32)
  closed = jax.make_jaxpr(lambda x: x * jnp.asarray(table) + 1.0)(jnp.ones(8, jnp.float32))
  jaxpr, consts = _compat.jaxpr_and_consts(closed)
  x = np.full(8, 2.0, np.float32)
  (out,) = jax.core.eval_jaxpr(jaxpr, consts, x)
  assert np.array_equal(np.asarray(out), x * table + 1.0)


def test_ppermute_numbering_is_detected_from_jax():
  """jax 0.10.2 sorts ppermute's replica groups (mesh order); jax 0.11+ has the sort-diff flag and numbers a
  tuple in its own order (the collective tests check the data itself)."""
  tuple_order = _compat.ppermute_numbers_in_tuple_order()
  assert tuple_order == (_compat.version_tuple(jax.__version__) >= (0, 11)), jax.__version__
  if tuple_order:
    assert _compat.ppermute_rejects_unsorted_tuple()
    with _compat.ppermute_in_any_order():
      assert not _compat.ppermute_rejects_unsorted_tuple()
  assert _compat.ppermute_rejects_unsorted_tuple() == tuple_order


def test_the_extension_was_built_against_the_running_jaxlib():
  """`pip install .` compiles against the jaxlib of the environment it installs into (not build isolation's)."""
  build = zipccl_jax.info()["build"]
  assert build["jaxlib"] == jaxlib.__version__, build
  assert build["ffi_api"] == build["runtime_ffi_api"] == _ffi.runtime_ffi_api() and build["problems"] == []


def test_another_ffi_api_at_run_time_is_a_reported_problem():
  p = _ffi.ffi_api_mismatch({"jaxlib": "0.10.2", "ffi_api": "0.3"}, "0.12.0.1", "0.5")
  assert "jaxlib 0.10.2 (XLA FFI API 0.3)" in p and "jaxlib 0.12.0.1 (XLA FFI API 0.5)" in p and "reinstall" in p
  # another jaxlib with the same FFI API is not a problem
  assert _ffi.ffi_api_mismatch({"jaxlib": "0.10.2", "ffi_api": "0.3"}, "0.11.0", "0.3") is None
  # info() reports what registration warns (one message, _ffi.ffi_api_mismatch)
  build = _ffi.extension().build_info()
  assert _info._jaxlib_build(build)["problems"] == ([_ffi.ffi_api_mismatch(build)] if _ffi.ffi_api_mismatch(build)
                                                    else [])


def _site(root: Path, version: str | None) -> Path:
  site = root / "site-packages"
  if version:
    (site / "jaxlib" / "include" / "xla" / "ffi" / "api").mkdir(parents=True)
    (site / "jaxlib" / "include" / "xla" / "ffi" / "api" / "ffi.h").write_text("// ffi.h\n")
    meta = site / f"jaxlib-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: jaxlib\nVersion: {version}\n")
  else:
    site.mkdir(parents=True)
  return site


def _probe(target: Path, build: Path) -> dict:
  code = (f"import sys, runpy; sys.path[:] = [{str(target)!r}] + [p for p in sys.path if 'site-packages' not in p]; "
          f"sys.argv = ['jaxlib_headers.py', {str(build)!r}]; "
          f"runpy.run_path({str(ROOT / 'cmake' / 'jaxlib_headers.py')!r}, run_name='__main__')")
  r = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120, check=True)
  return dict(line.split("=", 1) for line in r.stdout.splitlines())


def test_headers_come_from_the_target_environment_first(tmp_path):
  target, build = _site(tmp_path / "t", "0.11.2"), _site(tmp_path / "b", "0.12.0.1")
  got = _probe(target, build)
  assert got == {"INCLUDE": str(target / "jaxlib" / "include"), "VERSION": "0.11.2", "FROM": "target"}, got


def test_headers_from_the_build_environment_when_the_target_has_no_jaxlib(tmp_path):
  target, build = _site(tmp_path / "t", None), _site(tmp_path / "b", "0.12.0.1")
  got = _probe(target, build)
  assert got == {"INCLUDE": str(build / "jaxlib" / "include"), "VERSION": "0.12.0.1", "FROM": "build"}, got


def test_the_real_probe_finds_this_environments_jaxlib():
  """CMake's call (python -I, the build environment's sys.path as argv[1]) in this environment."""
  r = subprocess.run([sys.executable, "-I", str(ROOT / "cmake" / "jaxlib_headers.py"), ""], capture_output=True,
                     text=True, timeout=120, check=True)
  got = dict(line.split("=", 1) for line in r.stdout.splitlines())
  assert got["FROM"] == "target" and got["VERSION"] == jaxlib.__version__, got
  assert Path(got["INCLUDE"]) == Path(jaxlib.__file__).parent / "include"
