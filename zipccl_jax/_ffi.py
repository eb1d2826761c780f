"""Loads the compiled extension and registers every FFI target exactly once."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import warnings
from pathlib import Path

import jax

_log = logging.getLogger("zipccl_jax")
_lock = threading.Lock()
_registered = False

ENCODE_TARGET = "zipccl_encode"
DECODE_TARGET = "zipccl_decode"
DECODE_INTO_TARGET = "zipccl_decode_into"  # decode into the columns of a given (aliased) buffer
COUNT_TARGET = "zipccl_count"  # runtime call/fallback counter (accounting.py), CPU only


def extension():
  """The `zipccl_jax._zipccl` module, with a clear error if it was not built.

  From a source checkout (`python -m zipccl_jax.info` in the repository root puts the tree, which has
  no compiled extension, first on sys.path), the extension of the zipccl_jax installed in this
  environment is loaded instead: the Python code is the tree's, the codec the installed build's."""
  try:
    from zipccl_jax import _zipccl
  except ImportError as e:
    _zipccl = _installed_extension()
    if _zipccl is None:
      here = os.path.dirname(os.path.abspath(__file__))
      raise ImportError(
          f"zipccl_jax._zipccl (the compiled codec) is not in {here}, and no installed zipccl_jax was "
          f"found on sys.path for {sys.executable}. Install it into this Python: `pip install .` from "
          "the repository root (CPU; see README.md, Install, for GPUs).") from e
  return _zipccl


def _installed_extension():
  """The compiled extension of another zipccl_jax on sys.path (the installed one), loaded as
  `zipccl_jax._zipccl`; None if there is none."""
  import importlib.machinery
  import importlib.util
  here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
  for entry in sys.path:
    pkg = os.path.join(entry or os.getcwd(), "zipccl_jax")
    if not os.path.isdir(pkg) or os.path.realpath(pkg) == here:
      continue
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
      path = os.path.join(pkg, "_zipccl" + suffix)
      if os.path.isfile(path):
        spec = importlib.util.spec_from_file_location("zipccl_jax._zipccl", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["zipccl_jax._zipccl"] = module
        setattr(sys.modules["zipccl_jax"], "_zipccl", module)
        _log.debug("zipccl_jax: the source tree %s has no extension; loaded %s", here, path)
        return module
  return None


def runtime_ffi_api() -> str | None:
  """The XLA FFI API version ("0.5") of the running jaxlib: what its c_api.h declares."""
  import jaxlib
  try:
    text = (Path(jaxlib.__file__).parent / "include/xla/ffi/api/c_api.h").read_text(errors="ignore")
  except OSError:
    return None
  got = [re.search(rf"#define XLA_FFI_API_{k} (\d+)", text) for k in ("MAJOR", "MINOR")]
  return f"{got[0].group(1)}.{got[1].group(1)}" if all(got) else None


def ffi_api_mismatch(build: dict, jaxlib_version: str | None = None, api: str | None = None) -> str | None:
  """Why the extension (its `build_info()`) and a jaxlib (default: the running one, its FFI API version)
  disagree on the XLA FFI API, or None. XLA checks the FFI structs' sizes at call time, so such calls may
  fail or misread their operands."""
  import jaxlib
  jaxlib_version = jaxlib_version or jaxlib.__version__
  built, now = build.get("ffi_api") or None, api or runtime_ffi_api()
  if not (built and now and built != now):
    return None
  return (f"built against jaxlib {build.get('jaxlib') or '(unknown)'} (XLA FFI API {built}) but running jaxlib "
          f"{jaxlib_version} (XLA FFI API {now}): reinstall zipccl_jax next to this jaxlib "
          "(pip install --no-build-isolation --no-deps .)")


def _check_headers(ext) -> None:
  """Warns at registration what zipccl_jax.info()["build"]["problems"] reports (`ffi_api_mismatch`)."""
  why = ffi_api_mismatch(ext.build_info())
  if why:
    warnings.warn(f"zipccl_jax was {why}", RuntimeWarning, stacklevel=3)


def _traits(platform: str) -> dict:
  """The registration's traits: the CUDA handlers are command-buffer compatible (they launch only the codec's
  kernels on XLA's stream, use only the buffers XLA passes, scratch included, and never synchronise:
  xla_ffi/handlers_cuda.cc), so XLA may capture them into a CUDA graph. `traits=` reaches
  `jaxlib.xla_client.register_custom_call_target` through `jax.ffi.register_ffi_target`'s keywords in
  every supported jax (0.10.2 to 0.12)."""
  if platform.upper() != "CUDA":
    return {}
  from jaxlib import xla_client
  return {"traits": xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE}


def register() -> None:
  """Registers the encode/decode targets for every platform the build supports."""
  global _registered
  with _lock:
    if _registered:
      return
    ext = extension()
    _check_headers(ext)
    for platform, targets in ext.registrations().items():
      for name, capsule in targets.items():
        jax.ffi.register_ffi_target(name, capsule, platform=platform, **_traits(platform))
      _log.debug("registered %s for platform %s", sorted(targets), platform)
    _registered = True


def export_disabled_checks() -> list:
  """The ``disabled_checks=`` with which ``jax.export`` serializes code holding our custom calls.

  ``jax.export`` refuses custom-call targets that are not in its list of targets with a
  compatibility guarantee. Ours have one of their own: the bytes they exchange follow FORMAT.md,
  whose version every frame carries and every decoder checks. So::

    exp = jax.export.export(jax.jit(f), disabled_checks=zipccl_jax.export_disabled_checks())(x)
    blob = exp.serialize()
    # later, in a process that has imported zipccl_jax (which registers the targets):
    jax.export.deserialize(blob).call(x)

  The serialized module needs the same targets at run time: zipccl_jax installed and imported,
  with a build whose FORMAT.md version decodes the frames the module writes (the module encodes
  and decodes its own frames, so any build of the same format version does).
  """
  return [jax.export.DisabledSafetyCheck.custom_call(t)
          for t in (ENCODE_TARGET, DECODE_TARGET, DECODE_INTO_TARGET, COUNT_TARGET)]
