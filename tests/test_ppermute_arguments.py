"""zipccl_jax.ppermute takes and refuses the `perm` and `axis_name` that the running jax.lax.ppermute does
(issue 37): jax 0.11+ refuses a perm that is not a list or a tuple (a zip, a generator, an array; 0.10.2
takes any iterable, `_compat.check_ppermute_perm_type`); every supported jax reads an index as a Python
index into the group (negative ones from the end, floats refused) and refuses a source or destination
twice. Same exception type, or the same bits, raw and compressed.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zj
from zipccl_jax import _compat

pytestmark = pytest.mark.skipif(jax.device_count() < 8,
                                reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")

N = 8
RING = [(j, (j + 1) % N) for j in range(N)]
PERMS = {
    "zip": lambda: zip(range(N), [(j + 1) % N for j in range(N)]),
    "generator": lambda: ((s, d) for s, d in RING),
    "ndarray": lambda: np.array(RING),
    "set": lambda: set(RING),
    "lists": lambda: [list(p) for p in RING],
    "tuple": lambda: tuple(RING),
    "numpy_ints": lambda: [(np.int32(s), np.int64(d)) for s, d in RING],
    "bools": lambda: [(False, True), (True, False)],
    "negative": lambda: [(0, -1), (-1, 0)],
    "past_the_end": lambda: [(0, N + 1), (N + 1, 0)],
    "before_the_start": lambda: [(0, -N - 1)],
    "repeated": lambda: [(0, 1), (0, 2)],
    "repeated_modulo_n": lambda: [(0, 1), (N, 2)],
    "floats": lambda: [(0.0, 1.0), (1.0, 0.0)],
    "strings": lambda: [("0", "1")],
    "triples": lambda: [(0, 1, 2)],
    "empty": lambda: [],
}
AXES = {"name": "i", "tuple": ("i",), "list": ["i"]}


def outcome(mod, perm, axis_name, **kw):
  """The result's bits, or the exception's type."""
  mesh = jax.make_mesh((N,), ("i",))
  x = jax.device_put(np.random.default_rng(0).standard_normal((N * 4, 16)).astype(np.float32),
                     NamedSharding(mesh, P("i")))
  f = jax.jit(jax.shard_map(lambda v: mod.ppermute(v, axis_name, perm(), **kw), mesh=mesh,
                            in_specs=P("i"), out_specs=P("i")))
  try:
    return np.asarray(f(x)).view(np.uint32)
  except Exception as e:  # noqa: BLE001 - the type is what is compared
    return type(e)


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize("perm", sorted(PERMS))
def test_perm_is_taken_or_refused_as_jax_lax_does(perm, compress):
  want = outcome(lax, PERMS[perm], "i")
  got = outcome(zj, PERMS[perm], "i", compress=compress)
  if isinstance(want, type):
    assert got is want, (perm, got, want)
  else:
    assert not isinstance(got, type), (perm, got)
    assert np.array_equal(got, want), perm


@pytest.mark.parametrize("axis_name", sorted(AXES))
@pytest.mark.parametrize("perm", ["zip", "negative", "tuple"])
def test_axis_name_is_taken_or_refused_as_jax_lax_does(perm, axis_name):
  want = outcome(lax, PERMS[perm], AXES[axis_name])
  got = outcome(zj, PERMS[perm], AXES[axis_name], compress=True)
  if isinstance(want, type):
    assert got is want, (perm, axis_name, got, want)
  else:
    assert np.array_equal(got, want), (perm, axis_name)


def test_perm_type_rule_is_the_running_jax():
  """jax 0.10.2 takes any iterable; 0.11 and 0.12 refuse what is not a list or tuple."""
  assert _compat.ppermute_requires_list_or_tuple() == (_compat.version_tuple(jax.__version__) >= (0, 11))


def test_a_zip_is_read_once_for_every_leaf():
  """jax 0.10.2 takes an iterator; ours reads it once, so every leaf of a pytree gets the whole perm."""
  if _compat.ppermute_requires_list_or_tuple():
    pytest.skip("this jax refuses an iterator perm")
  mesh = jax.make_mesh((N,), ("i",))
  x = jax.device_put(np.arange(N * 2, dtype=np.float32).reshape(N, 2), NamedSharding(mesh, P("i")))
  f = jax.jit(jax.shard_map(
      lambda v: zj.ppermute((v, v + 1), "i", zip(range(N), [(j + 1) % N for j in range(N)]),
                            compress=True),
      mesh=mesh, in_specs=P("i"), out_specs=P("i")))
  a, b = f(x)
  want = np.roll(np.asarray(x), 1, axis=0)
  assert np.array_equal(np.asarray(a), want) and np.array_equal(np.asarray(b), want + 1)
