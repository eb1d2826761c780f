"""Trace-time helpers for code inside `jax.shard_map`: axes, manual-axis types, argument checks.

Nothing here moves data; every function runs at trace time (or adds a `pcast`).
"""

from __future__ import annotations

import dataclasses
import math
import operator
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.interpreters.batching import BatchTracer

from zipccl_jax import _compat

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def axes_of(axis_name) -> tuple:
  """`axis_name` (a name or a tuple of names) as a tuple."""
  return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def axis_size(axis_name, api: str) -> int:
  """Ranks along `axis_name` (the product over a tuple); NameError if an axis is not bound."""
  axes = axes_of(axis_name)
  if not axes:
    raise ValueError(f"zipccl_jax.{api}: axis_name must name at least one mesh axis")
  try:
    from jax._src import core as _core
    bound = tuple(_core.get_axis_env().axis_names())
  except Exception:  # pragma: no cover - internal API moved
    bound = None
  if bound is not None:
    for a in axes:
      if a not in bound:
        if not bound:
          raise NameError(
              f"zipccl_jax.{api}: axis name {a!r} is not bound. This collective must be called "
              f"inside jax.shard_map over a mesh that has the axis {a!r} (no mesh axes are "
              "bound here).")
        raise NameError(f"zipccl_jax.{api}: unknown axis name {a!r}; the axes bound here are "
                        f"{bound}.")
  try:
    return int(math.prod(lax.axis_size(a) for a in axes))
  except NameError as e:
    raise NameError(f"zipccl_jax.{api}: {e}; call it inside jax.shard_map") from None


def ppermute_rank(axes):
  """coords (one index per axis of the tuple `axes`, in its order) -> the rank the running
  `jax.lax.ppermute` over `axes` means by that device (`_compat.ppermute_numbers_in_tuple_order`).

  jax 0.11 and later number a tuple's ranks in the tuple's order, as `axis_index`, all_to_all and
  all_gather do. jax 0.10.2 numbers them in the *mesh's* order of those axes (its lowering,
  ``_pcollectives_lowering_common`` in jax/_src/lax/parallel.py, sorts each replica group before
  it indexes the group with the pairs): over ``("local", "host")`` of a 2 x 4 ``("host",
  "local")`` mesh, its rank 1 is the device ``host=0, local=1``; axis_index's rank 1 is
  ``local=0, host=1``. A permutation built from tuple coordinates goes through this, and then
  through `lax_ppermute`.
  """
  axes, order, sizes = _ppermute_order(axes)
  if _compat.ppermute_numbers_in_tuple_order():
    order = list(range(len(axes)))

  def rank(coords) -> int:
    r = 0
    for i in order:
      r = r * sizes[i] + int(coords[i])
    return r

  return rank


def ppermute_index(axis_name):
  """This device's rank as `jax.lax.ppermute` over `axis_name` numbers it (`ppermute_rank`), as a
  traced int32: what indexes a table built from a ppermute's ``(source, destination)`` pairs."""
  axes, order, sizes = _ppermute_order(axis_name)
  if order == sorted(order) or _compat.ppermute_numbers_in_tuple_order():
    return lax.axis_index(axis_name)  # the tuple's order: axis_index's numbering
  r = jnp.int32(0)
  for i in order:
    r = r * sizes[i] + lax.axis_index(axes[i]).astype(jnp.int32)
  return r


def perm_in_tuple_order(axis_name, perm) -> list:
  """`perm`'s ``(source, destination)`` pairs, numbered by ppermute (`ppermute_rank`), renumbered
  as `axis_index`, all_to_all and ragged_all_to_all number the ranks of `axis_name`."""
  axes, _, sizes = _ppermute_order(axis_name)
  rank = ppermute_rank(axes)
  to_tuple = {rank(np.unravel_index(t, sizes)): t for t in range(int(np.prod(sizes)))}
  return [(to_tuple[int(a)], to_tuple[int(b)]) for a, b in perm]


def lax_ppermute(x, axis_name, perm):
  """`jax.lax.ppermute(x, axis_name, perm)`, `perm` numbered as `ppermute_rank` says, lowered over
  `axis_name`'s axes in the mesh's order with the pairs renumbered to match.

  In the mesh's order every supported jax numbers the ranks alike and none refuses the tuple
  (jax 0.11+ raises on another order unless ``jax_raise_on_ppermute_sort_diff`` is off), so this
  is the one ppermute of zipccl_jax's own exchanges. A tuple already in the mesh's order (and a
  single axis) is passed as given: the lowering is then exactly the caller's.
  """
  axes, order, sizes = _ppermute_order(axis_name)
  if order == sorted(order):
    return lax.ppermute(x, axis_name, perm)
  rank = ppermute_rank(axes)
  to_mesh = {}
  for t in range(int(np.prod(sizes))):
    coords = np.unravel_index(t, sizes)
    m = 0
    for i in order:
      m = m * sizes[i] + int(coords[i])
    to_mesh[rank(coords)] = m
  pairs = [(to_mesh[int(a)], to_mesh[int(b)]) for a, b in perm]
  return lax.ppermute(x, tuple(axes[i] for i in order), pairs)


def check_ppermute_order(axis_name, api: str) -> None:
  """RuntimeError (jax.lax.ppermute's) where the running jax.lax.ppermute refuses `axis_name` (a
  tuple out of the mesh's order, jax 0.11+ with ``jax_raise_on_ppermute_sort_diff`` on): a drop-in
  refuses it too."""
  axes, order, _ = _ppermute_order(axis_name)
  if order != sorted(order) and _compat.ppermute_rejects_unsorted_tuple():
    mesh_order = tuple(axes[i] for i in order)
    raise RuntimeError(
        f"zipccl_jax.{api}: axis_name {axes} is not in the mesh's order {mesh_order}, which "
        f"jax.lax.ppermute (jax {jax.__version__}) refuses. Make sure that the axis_name passed to "
        "jax.lax.ppermute is in the mesh's order, or number the ranks in the tuple's order with "
        "jax.config.update('jax_raise_on_ppermute_sort_diff', False)")


def _ppermute_order(axis_name):
  """(axes, their positions in the mesh's order, their sizes)."""
  axes = axes_of(axis_name)
  try:  # the enclosing shard_map's mesh, whose device ids ppermute's lowering sorts
    bound = tuple(jax.sharding.get_abstract_mesh().axis_names)
  except Exception:  # pragma: no cover - no such API
    bound = ()
  if not all(a in bound for a in axes):
    try:
      from jax._src import core as _core
      bound = tuple(_core.get_axis_env().axis_names())   # the bound axes, in binding order
    except Exception:  # pragma: no cover - internal API moved
      bound = ()
  order = sorted(range(len(axes)), key=lambda i: bound.index(axes[i]) if axes[i] in bound else i)
  return axes, order, [int(lax.axis_size(a)) for a in axes]


def level_groups(H: int, L: int, level: str) -> list:
  """The ``axis_index_groups`` of one level of an axis of ``H x L`` ranks, rank ``h * L + l`` on
  host ``h``: the hosts' ``L`` ranks (``"fast"``), or the ``H`` ranks of each local index
  (``"slow"``), each in ascending rank, so a rank's position in its group is ``l``, or ``h``."""
  if level == "fast":
    return [[h * L + l for l in range(L)] for h in range(H)]
  return [[h * L + l for h in range(H)] for l in range(L)]


@dataclasses.dataclass(frozen=True)
class TwoLevels:
  """Where a two-level collective runs: over the mesh axes ``(slow, fast)`` (`axis` None), or over
  ONE axis of ``H x L`` ranks, rank ``h * L + l`` on host ``h``, each level a collective over its
  `level_groups` of that axis (`strategy.levels.use_levels`). Device ``(h, l)`` is the same rank
  both ways, so a program written against this gives the same bits on either mesh."""
  slow: str
  fast: str
  H: int
  L: int
  axis: object = None

  @property
  def axes(self):
    """The ``axis_name`` of a collective over every rank."""
    return (self.slow, self.fast) if self.axis is None else self.axis

  def over(self, level: str) -> dict:
    """``axis_name`` (and ``axis_index_groups``) of a collective over one level ("slow", "fast")."""
    if self.axis is None:
      return {"axis_name": self.slow if level == "slow" else self.fast}
    return {"axis_name": self.axis, "axis_index_groups": level_groups(self.H, self.L, level)}

  def coords(self):
    """``(h, l)``, int32 scalars varying over the collective's axes (as its data)."""
    if self.axis is None:
      return tuple(vary(lax.axis_index(a).astype(jnp.int32), (self.slow, self.fast))
                   for a in (self.slow, self.fast))
    r = vary(lax.axis_index(self.axis).astype(jnp.int32), (self.axis,))
    L = jnp.int32(self.L)
    return lax.div(r, L), lax.rem(r, L)  # r >= 0: truncation, no floor's sign fix-ups

  def rank(self):
    """``(h, l) -> `` the rank `lax_ppermute` over `axes` means by that device."""
    if self.axis is None:
      return ppermute_rank((self.slow, self.fast))
    return lambda c: int(c[0]) * self.L + int(c[1])


def manual_axes(axis_name) -> tuple:
  """Every manual mesh axis of the enclosing shard_map (at least `axis_name`'s)."""
  axes = ()
  try:
    axes = tuple(jax.sharding.get_abstract_mesh().manual_axes)
  except Exception:  # pragma: no cover - API moved
    pass
  for a in axes_of(axis_name):
    if a not in axes:
      axes += (a,)
  return axes


def check_vma_on() -> bool:
  """Whether the enclosing shard_map checks varying manual axes (`check_vma`)."""
  try:
    from jax._src import config as _cfg
    return bool(_cfg._check_vma.value)
  except Exception:  # pragma: no cover
    return True


def vary(x, axes):
  """pcast `x` to varying over `axes` where it is not already (check_vma only)."""
  if not check_vma_on():
    return x
  try:
    varying = jax.typeof(x).mat.varying
  except AttributeError:  # pragma: no cover
    return x
  missing = tuple(a for a in axes if a not in varying)
  return lax.pcast(x, missing, to="varying") if missing else x


def vary_together(axes, *xs) -> list:
  """`xs` pcast to varying over `axes` and over every axis one of them varies over (check_vma
  only): operands that meet in one result (a ragged exchange's operand and output) agree."""
  if not check_vma_on():
    return list(xs)
  union = set(axes).union(*(jax.typeof(x).mat.varying for x in xs))
  return [vary(x, tuple(sorted(union, key=str))) for x in xs]


def vary_like(z, ref):
  """pcast `z` to the varying axes of `ref` (check_vma only)."""
  if not check_vma_on():
    return z
  try:
    axes = tuple(sorted(jax.typeof(ref).mat.varying - jax.typeof(z).mat.varying, key=str))
  except AttributeError:  # pragma: no cover
    return z
  return lax.pcast(z, axes, to="varying") if axes else z


def canonical_axis(axis: int, ndim: int, what: str, api: str) -> int:
  """`axis` in [0, ndim); TypeError/ValueError naming the argument `what`."""
  if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
    raise TypeError(f"zipccl_jax.{api}: {what} must be an int, got {axis!r}")
  a = int(axis)
  if not -ndim <= a < ndim:
    raise ValueError(f"zipccl_jax.{api}: {what}={axis} is out of range for an operand of "
                     f"rank {ndim}")
  return a % ndim


def check_split(x, dim: int, what: str, n: int, tiled: bool, axis_name, api: str) -> None:
  """The dimension split across `n` ranks: divisible by n (tiled) or equal to n."""
  size = x.shape[dim]
  if tiled and size % n:
    raise ValueError(
        f"zipccl_jax.{api}: x.shape[{what}={dim}] = {size} is not divisible by the size {n} "
        f"of axis {axis_name!r} (tiled=True)")
  if not tiled and size != n:
    raise ValueError(
        f"zipccl_jax.{api}: x.shape[{what}={dim}] = {size} must equal the size {n} of axis "
        f"{axis_name!r} (tiled=False)")


def batched(x) -> bool:
  """Whether `x` is traced under ``jax.vmap`` here (a grouped exchange cannot be batched by jax:
  ``jax.lax.all_to_all`` with ``axis_index_groups`` raises NotImplementedError under vmap)."""
  return isinstance(x, BatchTracer)


def check_groups(groups, axis_name, api):
  """`axis_index_groups` as a tuple of equal-sized tuples of ranks covering the axis once, or None."""
  if groups is None:
    return None
  try:
    grp = tuple(tuple(int(r) for r in g) for g in groups)
  except (TypeError, ValueError):
    raise TypeError(f"zipccl_jax.{api}: axis_index_groups must be a sequence of sequences of "
                    f"ints, got {groups!r}") from None
  n = axis_size(axis_name, api)
  if not grp or len({len(g) for g in grp}) != 1 or sorted(r for g in grp for r in g) != list(range(n)):
    raise ValueError(f"zipccl_jax.{api}: axis_index_groups must split the {n} ranks of "
                     f"{axis_name!r} into groups of equal size, each rank once; got {groups!r}")
  return grp


def lax_only_reason(x, axis_name) -> str | None:
  """Why a call has no wire of ours and is exactly `jax.lax`'s (None: zipccl_jax handles it).

  * an axis that is not a manual axis of the enclosing ``shard_map`` (bound by ``jax.vmap`` or
    ``pmap``, or not bound at all: jax.lax raises its own error);
  * a symbolic dimension (``jax.export`` shape polymorphism: capacities need concrete sizes);
  * a reduced or unreduced operand (shard_map's newer types: jax.lax gives the result types).
  """
  try:
    manual = set(jax.sharding.get_abstract_mesh().manual_axes)
  except Exception:  # pragma: no cover - no mesh context at all
    manual = set()
  if not all(a in manual for a in axes_of(axis_name)):
    return "axis not a manual mesh axis"
  if not all(isinstance(d, (int, np.integer)) for d in x.shape):
    return "symbolic shape"
  mat = getattr(jax.typeof(x), "mat", None)
  if mat is not None and (getattr(mat, "reduced", None) or getattr(mat, "unreduced", None)):
    return "reduced/unreduced operand"
  return None


def perm_argument(perm, api: str):
  """`perm` as jax.lax.ppermute takes it: refused where the running jax refuses its type
  (`_compat.check_ppermute_perm_type`); an iterator, which jax 0.10.2 takes, read once."""
  _compat.check_ppermute_perm_type(perm, api)
  return perm if isinstance(perm, (list, tuple)) else list(perm)


def check_perm(perm, n, api, axis_name=None):
  """`perm` checked as the running jax.lax.ppermute checks it, as (source, destination) pairs in
  [0, n): its type (`_compat.check_ppermute_perm_type`), two per pair (ValueError), int indices
  (TypeError), no source or destination twice modulo n (ValueError), each in [-n, n), a negative
  one counting from the end (IndexError); over `axis_name`, an axis order jax.lax.ppermute refuses
  (`check_ppermute_order`)."""
  if axis_name is not None:
    check_ppermute_order(axis_name, api)
  _compat.check_ppermute_perm_type(perm, api)
  perm = tuple(map(tuple, perm))
  pairs = [(_int_index(s, api), _int_index(d, api)) for s, d in perm]
  srcs = [s % n for s, _ in pairs]
  dsts = [d % n for _, d in pairs]
  if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
    raise ValueError(f"zipccl_jax.{api}: ppermute sources and destinations must be unique, got "
                     f"{perm}.")
  for v in (i for pair in pairs for i in pair):
    if not -n <= v < n:
      raise IndexError(f"zipccl_jax.{api}: perm index {v} is out of range for an axis of size {n}")
  return tuple(zip(srcs, dsts))


def _int_index(v, api: str) -> int:
  try:
    return operator.index(v)
  except TypeError:
    raise TypeError(f"zipccl_jax.{api}: perm indices must be integers, got {v!r}") from None


def itemsize(x) -> int:
  return np.dtype(x.dtype).itemsize


def tree_apply(fn, x, name):
  """`fn(leaf, site)` on every leaf of `x`; leaf `i` of several is named `name[i]`."""
  leaves, treedef = jax.tree_util.tree_flatten(x)
  if len(leaves) == 1:
    return jax.tree_util.tree_unflatten(treedef, [fn(leaves[0], name)])
  return jax.tree_util.tree_unflatten(
      treedef, [fn(leaf, f"{name}[{i}]") for i, leaf in enumerate(leaves)])


def call_site(op: str, name) -> str:
  """`name`, or `op@file:line` of the first caller outside zipccl_jax and jax."""
  if name is not None:
    return str(name)
  jax_dir = os.path.dirname(os.path.abspath(jax.__file__))
  f = sys._getframe(1)
  while f is not None:
    fn = os.path.abspath(f.f_code.co_filename)
    if os.path.dirname(fn) != _PACKAGE_DIR and not fn.startswith(jax_dir):
      return f"{op}@{os.path.basename(fn)}:{f.f_lineno}"
    f = f.f_back
  return op
