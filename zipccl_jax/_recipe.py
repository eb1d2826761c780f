"""The path every collective shares: plan, record, and bind a linear function.

A collective is a `Recipe` (how to check its arguments, count its bytes, run it raw or coded and
transpose it); `run` applies one to every leaf of an operand. Calls that have no wire of ours
(`_shard.lax_only_reason`: axes not manual, symbolic shapes, reduced/unreduced operands) go to
``jax.lax`` as called; every other call is planned (`strategy.plan`), recorded
(`accounting.record`) and bound as a linear function (`_linear.linear`) whose transpose is the
recipe's named transpose rule, so jvp, grad, vmap and transposition all run the compressed
collective.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from zipccl_jax import _exchange, _ours, _roofline, accounting, defaults, hierarchical, strategy
from zipccl_jax.strategy import levels as two_level
from zipccl_jax._linear import linear
from zipccl_jax._shard import (axis_size, batched, call_site, check_groups, lax_only_reason,
                               tree_apply)
from zipccl_jax.capacity import CODED_DTYPES, piece_capacities, split_capacity

@dataclasses.dataclass(frozen=True)
class Call:
  """The static parameters of one traced collective call (what its rules need)."""
  op: str
  axis_name: Any
  params: tuple           # the op's own static arguments (see each _xx_params)
  capacity: int           # bytes per chunk, 0 for the raw path
  transport: str
  site: str
  backward: tuple         # (compress, capacity) of the transposed collective
  groups: tuple | None = None  # axis_index_groups (raw bits; ranks are positions in a group)
  algorithm: str = ""     # psum: "a2a-sum+gather" or "gather-sum" (strategy.PSUM_ALGORITHMS)
  pieces: int = 1         # coded chains per chunk (_pieces)
  fixed_order: bool = False  # reductions: raw runs the fixed-order program, not jax.lax's call


@dataclasses.dataclass(frozen=True)
class Recipe:
  """One collective: how to check its arguments, count its bytes, run it and transpose it."""
  op: str
  role: str                                    # forward role: "activation" or "gradient"
  params: Callable    # (x, n, axis_name, args) -> (params, chunk_elems, raw_reason)
  wire: Callable      # (x, n, params, capacity, algorithm) -> (raw bytes, coded bytes) one
                      # device sends; capacity: bytes per chunk, summed over its pieces
  lax_fn: Callable    # (x, axis_name, params, groups) -> the jax.lax collective as called
  impl: Callable      # (call, x) -> y
  transpose: Callable  # (call, ct) -> x_ct
  # a call planned raw for a `raw_reason` goes straight to jax.lax (all_gather to="reduced": a
  # reduced result has no zipccl path); otherwise it takes the raw path below (bits, counted)
  lax_when_forced_raw: bool = False
  prepare: Callable = lambda call, x: x  # (call, x) -> x, applied outside the linear function


# The public collectives by op name, filled in by collectives.py (which imports this module):
# the two-level algorithms of `hierarchical` run them phase by phase.
PUBLIC: dict[str, Callable] = {}


@_ours.ours  # the jax.lax collectives it binds are ours (never rewritten by compress_collectives)
def run(recipe: Recipe, x, axis_name, args, *, compress, capacity, transport, name,
                role=None, groups=None, fixed_order=None):
  """Plans, records and runs `recipe` on every leaf of `x` (role: None = the recipe's;
  fixed_order: None = the active default, `defaults.use_defaults`)."""
  defaults.check_call(recipe.op, compress, capacity, transport)  # at the door, whatever the plan
  fixed_order = defaults.resolve_fixed_order(fixed_order, recipe.op)
  compress, capacity = defaults.resolve(compress, capacity)
  fwd_cap, bwd_cap = split_capacity(capacity)
  site = call_site(recipe.op, name)
  role = role or recipe.role

  def leaf(x, site):
    x = jnp.asarray(x)
    if lax_only_reason(x, axis_name) or (groups is not None and recipe.op == "psum"):
      return recipe.lax_fn(x, axis_name, args, groups)  # no wire of ours: jax.lax as called
    grp = check_groups(groups, axis_name, recipe.op)
    n = len(grp[0]) if grp else axis_size(axis_name, recipe.op)
    if n == 1 and not _exchange.coding_own_row():  # no wire: jax.lax's result, checks and types
      return recipe.lax_fn(x, axis_name, args, groups)
    params, m, raw_reason = recipe.params(x, n, axis_name, args)
    if grp and raw_reason is None and not _codes_groups(recipe.op, params, x):
      raw_reason = "axis_index_groups"  # raw bits
    lp = None if grp else two_level.plan(recipe.op, x, axis_name, params, compress, fwd_cap, site,
                                         role, fixed_order)
    if lp is not None and lp.algorithm == "hierarchical":
      def backward(ct, args):  # the transposed collective, as `transposed` runs it
        return run(recipe, ct, axis_name, args, compress=compress, capacity=bwd_cap,
                   transport=transport, name=site + "/bwd", role="gradient",
                   fixed_order=fixed_order)
      return hierarchical.run(lp, x, params, PUBLIC, capacity=fwd_cap, transport=transport,
                              backward=backward)
    pin_alg, pin_pieces = two_level.pinned()
    p = strategy.plan(recipe.op, x.dtype, m, axis_size=n, compress=compress, capacity=fwd_cap,
                      role=role, site=site, axis_name=axis_name, transport=transport,
                      raw_reason=raw_reason, algorithm=pin_alg if recipe.op == "psum" else None,
                      pieces=pin_pieces if recipe.op in strategy.PIPELINED_OPS else None,
                      message_elems=x.size, fixed_order=fixed_order,
                      flat_est=lp.flat_estimates() if lp is not None else None)
    raw_b, wire_b = recipe.wire(x, n, params, _wire_capacity(p, x, m), p.algorithm)
    with accounting.site_scope(accounting.record(site, recipe.op, x, n, p, raw_b, wire_b)):
      return _bind(recipe, p, x, raw_reason, Call(
          recipe.op, axis_name, params, p.capacity if p.compress else 0, p.transport or transport,
          site, (compress, bwd_cap), grp, p.algorithm, p.pieces, fixed_order), (raw_b, wire_b))

  return tree_apply(leaf, x, site)


def _codes_groups(op: str, params, x) -> bool:
  """Whether `op` codes a call on `x` with ``axis_index_groups`` (`_exchange.in_groups`):
  all_to_all, psum_scatter and all_gather, not an all_gather whose result is invariant over the
  whole axis, and not under ``jax.vmap`` (the coded exchanges move sizes and frames with grouped
  all_to_alls, which jax cannot batch), where a grouped call stays the raw one, as jax.lax's."""
  if batched(x):
    return False
  return op in ("all_to_all", "psum_scatter") or (op == "all_gather" and params[2] == "varying")


def _bind(recipe: Recipe, p, x, raw_reason, call: Call, sent):
  """The planned call: jax.lax where nothing of ours runs, else a linear function (`sent`: the
  bytes one device sends, jax.lax's and ours, for its roofline rule)."""
  lax_direct = raw_reason and raw_reason != "axis_index_groups" and recipe.lax_when_forced_raw
  if np.dtype(x.dtype) not in CODED_DTYPES or lax_direct:
    return recipe.lax_fn(x, call.axis_name, call.params, call.groups)
  wire = _wire(recipe, call, x, sent[0], sent[1] if p.compress else sent[0])
  x = recipe.prepare(call, x)
  return linear(functools.partial(_in_groups, recipe.impl, call),
                _ours.ours(functools.partial(recipe.transpose, call)), x, wire=wire)


def _in_groups(impl: Callable, call: Call, x):
  """`impl(call, x)` with its exchanges inside the call's ``axis_index_groups`` (`_exchange`)."""
  with _exchange.in_groups(call.groups):
    return impl(call, x)


def _wire(recipe: Recipe, call: Call, x, raw_b: int, sent_b: int) -> _roofline.Wire:
  """What `call` moves, for its roofline rule: jax.lax's call of it and the bytes each sends."""
  return _roofline.wire(lambda v: recipe.lax_fn(v, call.axis_name, call.params, call.groups), x,
                        raw_b, sent_b)


def _wire_capacity(p, x, m: int) -> int:
  """Bytes per chunk of plan `p` summed over its pieces (frame: the algorithm's chunk)."""
  if not p.compress or p.pieces == 1:
    return p.capacity
  elems = x.size if p.algorithm == "gather-sum" else m
  return sum(c for _, _, c in piece_capacities(p.capacity, elems, p.pieces, x.dtype))


def size_of(call: Call) -> int:
  """Ranks taking part in `call`: its group's size, or the axis size."""
  return len(call.groups[0]) if call.groups else axis_size(call.axis_name, call.op)


def transposed(recipe: Recipe, call: Call, ct, args):
  """The compressed `recipe` on the cotangent `ct`: the gradient role, site `<site>/bwd`."""
  compress, capacity = call.backward
  return run(recipe, ct, call.axis_name, args, compress=compress, capacity=capacity,
                     transport=call.transport, name=call.site + "/bwd", role="gradient",
                     groups=call.groups, fixed_order=call.fixed_order)


def raw_path(call: Call, x, lax_fn):
  """The uncoded path of a coded dtype (compress=False or auto deciding raw): bits via jax.lax."""
  accounting.count(call.site, jnp.bool_(False))
  return _exchange.raw_bits(lax_fn, x)


def lax_raw(call: Call) -> bool:
  """Whether a reduction's `call` runs jax.lax's own call: planned raw, not `fixed_order`."""
  return not call.capacity and not call.fixed_order


def check_positional(x, api):
  if x.ndim == 0:
    raise ValueError(f"zipccl_jax.{api}: x must have at least one positional axis")
