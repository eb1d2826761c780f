"""Every difference between the JAX releases zipccl_jax supports (jax and jaxlib 0.10.2 up to, not including,
0.13), in one place, detected by feature where a feature can be seen.

Each entry names the jax that needs it and when it can go. Nothing else in the package asks which jax it runs
on; `check_supported` (called first thing on import) refuses one outside the range with both versions named.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import re

import jax
import jaxlib

# The range CI tests (README, "Supported versions"); pyproject.toml declares the same.
MIN_JAX = (0, 10, 2)
MAX_JAX = (0, 13)     # exclusive
SUPPORTED = "jax and jaxlib >=0.10.2,<0.13"


def version_tuple(v: str) -> tuple[int, ...]:
  """"0.12.0.1" -> (0, 12, 0, 1); a local or pre-release suffix ("0.11.0.dev20260101") is dropped."""
  return tuple(int(p) for p in re.findall(r"\d+", v.split("+")[0])[:4]) if v else ()


def unsupported(jax_version: str, jaxlib_version: str) -> str | None:
  """Why this pair is outside the supported range (None: supported)."""
  bad = [f"{name} {v}" for name, v in (("jax", jax_version), ("jaxlib", jaxlib_version))
         if not MIN_JAX <= version_tuple(v) < MAX_JAX]
  if not bad:
    return None
  return (f"zipccl_jax 0.1.0 supports {SUPPORTED}; this environment has jax {jax_version} and jaxlib "
          f"{jaxlib_version} ({', '.join(bad)} outside that range). Install a supported JAX "
          "(pip install 'jax>=0.10.2,<0.13'), or a zipccl_jax that supports this one.")


def check_supported() -> None:
  why = unsupported(jax.__version__, jaxlib.__version__)
  if why:
    raise ImportError(why)


# --- Jaxpr accessors ---------------------------------------------------------------------------------------
# jax 0.10: make_jaxpr gives a ClosedJaxpr wrapping a Jaxpr (`.jaxpr`, `.consts`). jax 0.11 merged the two: a
# Jaxpr carries its consts, and `.jaxpr` is a legacy accessor returning itself, marked for removal. Goes with
# jax 0.10 (then: `closed, closed.consts`).

def jaxpr_and_consts(closed) -> tuple[object, list]:
  """(the Jaxpr that `jax.core.eval_jaxpr` takes, its constants) of what `jax.make_jaxpr` returned."""
  if hasattr(closed, "all_invars"):  # jax >= 0.11: one object; eval_jaxpr binds consts then args
    return closed, list(closed.consts)
  return closed.jaxpr, list(closed.consts)


# --- ppermute over a tuple of axes -------------------------------------------------------------------------
# How jax.lax.ppermute over a tuple of mesh axes numbers the ranks its (source, destination) pairs name:
# * jax 0.10.2: in the *mesh's* order of those axes, whatever the tuple's order (its lowering,
#   _pcollectives_lowering_common in jax/_src/lax/parallel.py, sorts each replica group);
# * jax 0.11 / 0.12: in the *tuple's* order (the group is no longer sorted), and, unless
#   `jax.raise_on_ppermute_sort_diff(False)` is in effect, a tuple in another order than the mesh's raises at
#   lowering ("Make sure that the axis_name passed to jax.lax.ppermute is in the same order ...").
# zipccl_jax.ppermute numbers ranks as the running jax.lax.ppermute does (it is a drop-in) and, inside, always
# hands jax.lax.ppermute its axes in the mesh's order with the pairs renumbered (_shard.lax_ppermute): one
# path that means the same on every version and never trips the check. Detected by the flag's presence. Goes
# with jax 0.10 (then: tuple order, the flag's value decides whether a user's out-of-order tuple raises).

_SORT_FLAG = "jax_raise_on_ppermute_sort_diff"


def _sort_flag():
  try:
    from jax._src import config as _cfg
    return getattr(_cfg, "raise_on_ppermute_sort_diff", None)
  except ImportError:  # pragma: no cover - internal module moved
    return None


def ppermute_numbers_in_tuple_order() -> bool:
  """Whether jax.lax.ppermute over a tuple numbers its ranks in the tuple's order (else: the mesh's)."""
  return _sort_flag() is not None


def ppermute_rejects_unsorted_tuple() -> bool:
  """Whether jax.lax.ppermute refuses, at this trace, a tuple of axes out of the mesh's order."""
  flag = _sort_flag()
  return flag is not None and bool(flag.value)


def ppermute_in_any_order():
  """A context in which jax.lax.ppermute accepts a tuple of axes out of the mesh's order (jax 0.11+: numbering
  it in the tuple's order; jax 0.10.2 always accepts it: nothing to change)."""
  flag = _sort_flag()
  return flag(False) if flag is not None else contextlib.nullcontext()


# --- ppermute's perm ---------------------------------------------------------------------------------------
# jax 0.11 / 0.12: jax.lax.ppermute refuses a perm that is not a list or a tuple (a zip, a generator, an array)
# with a TypeError, before it binds anything; jax 0.10.2 takes any iterable of pairs. Seen by calling it on an
# empty pytree (0.10.2 then binds nothing and returns). The other perm checks (pairs, int indices in [-n, n),
# no repeats) are the same in every supported jax (_shard.check_perm). Goes with jax 0.10 (then: the check,
# always).

@functools.lru_cache(maxsize=None)
def ppermute_requires_list_or_tuple() -> bool:
  """Whether jax.lax.ppermute refuses a perm that is not a list or a tuple."""
  try:
    jax.lax.ppermute((), "zipccl_compat_probe", iter(()))
  except TypeError:
    return True
  return False


def check_ppermute_perm_type(perm, api: str) -> None:
  """TypeError where the running jax.lax.ppermute refuses `perm`'s type."""
  if not isinstance(perm, (list, tuple)) and ppermute_requires_list_or_tuple():
    raise TypeError(f"zipccl_jax.{api}: `perm` must be a list or a tuple, as jax.lax.ppermute (jax "
                    f"{jax.__version__}) requires. Got perm of type {type(perm)}")


# --- Roofline ----------------------------------------------------------------------------------------------
# jax.experimental.roofline (every supported jax; the same register_roofline API, rules called as
# rule(ctx, *shapes, **params) and its interpreter _roofline_interpreter(name, jaxpr, mesh)). jax 0.10.2's
# imports absl, which jax does not depend on (0.11+ logs with the standard library): without absl-py there is
# no roofline to register rules with. Goes with jax 0.10 (then: import it).

def roofline_module():
  """The module jax.experimental.roofline.roofline (rules, RooflineResult, the interpreter), or None where
  it cannot be imported (jax 0.10.2 without absl-py)."""
  try:
    return importlib.import_module("jax.experimental.roofline.roofline")  # the package's `roofline` is
  except ImportError:                                                       # the function of that name
    return None


def ffi_call_primitive():
  """The primitive jax.ffi.ffi_call binds (jax._src.ffi.ffi_call_p in every supported jax), or None."""
  try:
    from jax._src import ffi as _jffi
  except ImportError:  # pragma: no cover - internal module moved
    return None
  return getattr(_jffi, "ffi_call_p", None)
