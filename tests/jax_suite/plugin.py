"""pytest plugin for JAX's own test files: swap the collectives, record what each test did.

Loaded by run.py (`-p plugin`) with ZIPCCL_SUITE_MODE (see jax_suite_lax.py), ZIPCCL_SUITE_OUT (a JSON-lines
file, one record per test) and optionally ZIPCCL_SUITE_SELECT (a file of node ids: run only those) or
ZIPCCL_SUITE_PREFILTER (file names whose tests run only if their source, or a module-level function it names,
calls a swapped collective: a cheap first cut for files where few tests do).

A record: node id, outcome, the first error line, the swapped collectives the test called (and whether
inside shard_map), and one digest per assertion (`assertAllClose` / `assertArraysEqual` /
`assertArraysAllClose`: the bits of both arguments). Comparing digests between the jax.lax run and ours
counts bit mismatches without trusting the tests' tolerances.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os

import numpy as np
import pytest

import jax_suite_lax as shim

_MODE = os.environ.get("ZIPCCL_SUITE_MODE", "lax")
_DIGESTS: list[str] = []
_DEPTH = [0]
_RECORD: dict = {}
_DEFAULTS = []


def _leaf_bytes(leaf) -> bytes:
  import jax
  try:
    if hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      leaf = jax.random.key_data(leaf)
    a = np.asarray(leaf)
    if a.dtype == object:
      return repr(leaf).encode()
    return f"{a.dtype}{a.shape}".encode() + np.ascontiguousarray(a).tobytes()
  except Exception:  # noqa: BLE001 - not an array: its repr is what the test compares
    return repr(leaf).encode()


def _digest(*trees) -> str:
  import jax
  h = hashlib.sha1()
  for tree in trees:
    for leaf in jax.tree_util.tree_leaves(tree):
      h.update(_leaf_bytes(leaf))
  return h.hexdigest()[:16]


def _wrap_assert(cls, meth):
  orig = getattr(cls, meth)

  def wrapped(self, actual, desired, *args, **kwargs):
    if _DEPTH[0] == 0:  # assertAllClose recurses into itself and assertArraysAllClose
      _DIGESTS.append(_digest(actual, desired))
    _DEPTH[0] += 1
    try:
      return orig(self, actual, desired, *args, **kwargs)
    finally:
      _DEPTH[0] -= 1

  setattr(cls, meth, wrapped)


def pytest_configure(config):
  from jax._src import test_util as jtu
  for meth in ("assertAllClose", "assertArraysEqual", "assertArraysAllClose"):
    _wrap_assert(jtu.JaxTestCase, meth)
  import zipccl_jax
  if _MODE == "compressed":
    ctx = zipccl_jax.use_defaults(compress=True)  # floats coded, other dtypes through jax.lax
    ctx.__enter__()
    _DEFAULTS.append(ctx)


def _codes(code):
  yield code
  for c in code.co_consts:
    if hasattr(c, "co_names"):
      yield from _codes(c)


def _calls_swapped(fn, scope, depth=3, seen=None) -> bool:
  """`fn`'s code (nested functions, decorated functions in its closure, and the module functions or
  class methods it names, `depth` levels deep) loads the rewritten `_zs_lax` module."""
  seen = set() if seen is None else seen
  fn = getattr(fn, "__func__", fn)
  if getattr(fn, "__module__", None) == shim.__name__:  # a swapped collective passed as a value
    return True
  code = getattr(fn, "__code__", None)
  if code is None or code in seen or depth < 0:
    return False
  seen.add(code)
  names = set()
  for c in _codes(code):
    names.update(c.co_names)
  if shim.MODULE_NAME in names:
    return True
  inner = []
  for cell in getattr(fn, "__closure__", None) or ():
    try:
      v = cell.cell_contents
    except ValueError:  # an empty cell
      continue
    values = v.values() if isinstance(v, dict) else v if isinstance(v, (tuple, list)) else (v,)
    inner += [f for f in values if callable(f)]  # parameterized tests close over their params
  inner += [obj for obj in (scope(n) for n in names) if callable(obj)]
  return any(_calls_swapped(f, scope, depth - 1, seen) for f in inner)


def _mentions_swapped(item) -> bool:
  """A cheap static first cut: could this test call a swapped collective?"""
  g = getattr(item.module, "__dict__", {})
  cls = getattr(item, "cls", None)

  def scope(name):
    obj = g.get(name)
    if obj is None and cls is not None:
      obj = getattr(cls, name, None)
    return obj if inspect.isfunction(obj) or inspect.ismethod(obj) else None

  return _calls_swapped(getattr(item, "function", None) or item.obj, scope)


def pytest_collection_modifyitems(session, config, items):
  select = os.environ.get("ZIPCCL_SUITE_SELECT")
  prefilter = set(filter(None, os.environ.get("ZIPCCL_SUITE_PREFILTER", "").split(",")))
  if select:
    with open(select) as f:
      wanted = {line.strip() for line in f if line.strip()}
    keep = lambda it: it.nodeid in wanted
  elif prefilter:
    keep = lambda it: it.path.name not in prefilter or _mentions_swapped(it)
  else:
    return
  kept = [it for it in items if keep(it)]
  config.hook.pytest_deselected(items=[it for it in items if not keep(it)])
  items[:] = kept


def pytest_runtest_setup(item):
  shim.CALLS.clear()
  _DIGESTS.clear()
  _RECORD.clear()
  _RECORD.update(nodeid=item.nodeid, outcome="passed", error="")


def _first_error_line(report) -> str:
  crash = getattr(report.longrepr, "reprcrash", None)
  text = crash.message if crash is not None else str(report.longrepr)
  if report.skipped and isinstance(report.longrepr, tuple):
    text = report.longrepr[2]
  return (text.strip().splitlines() or [""])[0][:300]


def pytest_runtest_logreport(report):
  if not _RECORD or report.nodeid != _RECORD.get("nodeid"):
    return
  if report.failed and _RECORD["outcome"] == "passed":
    _RECORD.update(outcome="failed" if report.when == "call" else "error",
                   error=_first_error_line(report))
  elif report.skipped and _RECORD["outcome"] == "passed":
    _RECORD.update(outcome="skipped", error=_first_error_line(report))
  if report.when == "teardown":
    _RECORD.update(calls=sorted({n for n, _ in shim.CALLS}),
                   shard_map=any(m for _, m in shim.CALLS), digests=list(_DIGESTS))
    with open(os.environ["ZIPCCL_SUITE_OUT"], "a") as f:
      f.write(json.dumps(_RECORD) + "\n")
    _RECORD.clear()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
  while _DEFAULTS:
    _DEFAULTS.pop().__exit__(None, None, None)
