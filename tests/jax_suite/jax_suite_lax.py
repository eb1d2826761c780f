"""The collectives a JAX test file calls once run.py has rewritten it: `_zs_lax.psum` for `lax.psum`.

run.py rewrites its working copy of each test file so that `lax.NAME` and `jax.lax.NAME` for NAME in
`SWAPPED` read `_zs_lax.NAME`, with `import jax_suite_lax as _zs_lax` at the top: the swap is in place before
the module body runs (parameter lists such as `[("Gather", lax.all_gather)]` are built at import). jax.lax
itself is never patched, so JAX's internals and zipccl_jax (which calls jax.lax) keep the real collectives.
Each call is recorded in `CALLS` (name, and whether its axes were manual shard_map axes) so the runner knows
which tests exercise the collectives at all.

Modes (env ZIPCCL_SUITE_MODE):
  lax         jax.lax's own functions (recorded only): the reference run
  raw         zipccl_jax with compress=False: the reference for reductions (one documented order)
  default     zipccl_jax with its default compress
  compressed  zipccl_jax with floats forced compressed (compress=True set once as the default)
"""

from __future__ import annotations

import functools
import os

import jax

# jax 0.10.2 has no public lax.all_gather_invariant (it is all_gather(..., to="invarying")).
SWAPPED = tuple(n for n in ("all_to_all", "all_gather", "psum_scatter", "psum", "ppermute", "pmean",
                            "all_gather_invariant") if hasattr(jax.lax, n))
REDUCTIONS = ("psum_scatter", "psum", "pmean")
MODULE_NAME = "_zs_lax"  # run.py rewrites lax.NAME / jax.lax.NAME to _zs_lax.NAME
MODES = ("lax", "raw", "default", "compressed")

CALLS: list[tuple[str, bool]] = []  # (name, inside shard_map) for the running test


def _manual(axis_name) -> bool:
  axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
  try:
    manual = set(jax.sharding.get_abstract_mesh().manual_axes)
  except Exception:  # noqa: BLE001 - no mesh context at all
    manual = set()
  return bool(axes) and all(a in manual for a in axes)


def _axis_arg(args, kwargs):
  if "axis_name" in kwargs:
    return kwargs["axis_name"]
  return args[1] if len(args) > 1 else None


def _recorded(name, fn):
  @functools.wraps(fn)
  def call(*args, **kwargs):
    CALLS.append((name, _manual(_axis_arg(args, kwargs))))
    return fn(*args, **kwargs)
  return call


def _ours(name, mode):
  import zipccl_jax
  fn = getattr(zipccl_jax, name)
  if mode == "raw":
    @functools.wraps(fn)  # keeps the name: parameterized tests name their cases after it
    def raw(*args, **kwargs):
      return fn(*args, compress=False, **kwargs)
    return raw
  return fn  # "compressed": plugin.py sets compress=True once with zipccl_jax.use_defaults


def _build(mode: str) -> None:
  if mode not in MODES:
    raise ValueError(f"ZIPCCL_SUITE_MODE must be one of {MODES}, got {mode!r}")
  for name in SWAPPED:
    fn = getattr(jax.lax, name) if mode == "lax" else _ours(name, mode)
    globals()[name] = _recorded(name, fn)


MODE = os.environ.get("ZIPCCL_SUITE_MODE", "lax")
_build(MODE)
