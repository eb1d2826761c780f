"""Autodiff of a linear function with a custom transpose: forward mode, reverse mode, transposition.

Every collective is linear in its operand. `linear(impl, transpose, x)` declares that once, as a
``linear_call`` of `impl` with the transpose rule `transpose` (bound as
``jax.custom_derivatives.linear_call`` binds it, less its tracer leak; see `linear`):

* ``jax.jvp``, ``jax.linearize``, ``jax.jacfwd`` and Hessian-vector products apply ``impl``
  (the compressed collective) to the tangent;
* ``jax.grad``, ``jax.vjp`` and ``jax.linear_transpose`` apply ``transpose`` (itself a compressed
  collective, declared the same way) to the cotangent;
* the lowered program is ``impl``'s (StableHLO identical to calling ``impl`` directly).

jax's ``linear_call`` (0.10.2 through 0.12.0.1 alike) has no batching rule, so ``jax.vmap`` of
a collective would fail; `_linear_call_batch` is that rule (registered only if jax has none): it
batches every operand at axis 0, the callee and its transpose alike, so that the transposed call
stays consistent.
Its JVP rule binds the tangents as they come, so a linear argument that is not differentiated
(a symbolic zero tangent, e.g. ``ragged_all_to_all``'s ``output`` when only ``operand`` is)
fails to bind; `_linear_call_jvp` instantiates those zeros first. Its transpose rule then asserts
that every linear argument is being transposed; `_linear_call_transpose` transposes the known
ones too and drops their cotangents.

What JAX evaluates of a linear_call's callee again (impl, lowering, batching) runs in
`_ours.scope`: the jax.lax collectives there are zipccl_jax's own, never rewritten by
`compress_collectives` (module `_ours`).
"""

from __future__ import annotations

import contextlib
from typing import Callable

import jax
from jax._src import custom_derivatives as _cd
from jax._src import ad_util
from jax._src.interpreters import ad, batching, mlir
from jax._src.interpreters import partial_eval as pe

from zipccl_jax import _ours

__all__ = ["linear", "wire_of"]


def linear(impl: Callable, transpose: Callable, x, *res, wire=None):
  """`impl(x, *res)` for an `impl` linear in the pytree `x`, whose transpose is `transpose(ct, *res)`.

  `res` are non-linear arguments (index tables: integers, no tangent) that both functions read;
  `transpose` returns a cotangent with `x`'s structure. This is ``linear_call_p`` bound as
  ``jax.custom_derivatives.linear_call`` binds it, with two differences that every supported jax
  needs:

  * `impl`'s own constants (masks, tables it builds) are residual arguments, not callee
    constants: jax's transpose rule keeps a callee's constants in a closure, so a second
    transposition (``jax.grad`` of ``jax.grad``) would read values of a finished trace.
    Residuals are passed afresh at every transposition.
  * the transpose thunk holds avals, trees and `transpose`, never a traced value: jax's own
    ``linear_call`` (0.12, since jax-ml/jax b4e876a49b) closes its thunk over the call's
    arguments, which the jaxpr then keeps alive, so ``jax_check_tracer_leaks`` reports a leaked
    trace for every call.

  `wire` (a `_roofline.Wire`, or None) rides on the transpose thunk: the roofline rule of a
  collective of ours reads it (`wire_of`).
  """
  res_leaves, res_tree = jax.tree.flatten(res)
  x_leaves, x_tree = jax.tree.flatten(x)
  closed, out_shape = jax.make_jaxpr(lambda r, t: impl(t, *r), return_shape=True)(res, x)
  callee, consts = pe.separate_consts(closed)  # impl's constants lead the callee's arguments
  out_tree = jax.tree.structure(out_shape)
  res_avals = [jax.typeof(a) for a in (*consts, *res_leaves)]
  n_consts = len(consts)

  @pe._memoize
  def transpose_thunk():
    def t_fun(r, cts):
      ct_x = transpose(jax.tree.unflatten(out_tree, cts), *jax.tree.unflatten(res_tree, r[n_consts:]))
      if jax.tree.structure(ct_x) != x_tree:
        raise TypeError(f"transpose output pytree structure must match that of linear inputs, got "
                        f"output structure {jax.tree.structure(ct_x)} and input structure {x_tree}.")
      return jax.tree.leaves(ct_x)
    return pe.separate_consts(jax.make_jaxpr(t_fun)(res_avals, list(callee.out_avals)))

  transpose_thunk.zipccl_wire = wire  # what the call moves, for its roofline rule (`_roofline`)
  out = _cd.linear_call_p.bind(*consts, *res_leaves, *x_leaves, callee=callee,
                               transpose_thunk=transpose_thunk, num_callee_consts=0,
                               num_res=n_consts + len(res_leaves))
  return jax.tree.unflatten(out_tree, out)


def wire_of(transpose_thunk):
  """The `wire` a linear_call of `linear` was given (None: another linear_call, or none given)."""
  return getattr(transpose_thunk, "zipccl_wire", None)


def _wide(closed_jaxpr) -> bool:
  """Whether `closed_jaxpr` holds 64-bit values (the ragged exchanges' offsets, traced inside
  `jax.enable_x64`)."""
  return any(getattr(v.aval, "dtype", None) is not None and v.aval.dtype.itemsize == 8
             and v.aval.dtype.kind in "iu"
             for eqn in closed_jaxpr.jaxpr.eqns for v in eqn.outvars)


def _batch(closed_jaxpr, axis_data, batched):
  """`batching.batch_jaxpr`, inside `jax.enable_x64` where the jaxpr holds 64-bit values: the
  batching rules (ragged_all_to_all's among them) make new values of their operands' dtypes,
  which without x64 jax truncates to 32 bits with a warning, beside the 64-bit ones."""
  with jax.enable_x64(True) if _wide(closed_jaxpr) else contextlib.nullcontext():
    return batching.batch_jaxpr(closed_jaxpr, axis_data, batched, instantiate=True)[0]


def _linear_call_batch(axis_data, args, dims, *, callee, transpose_thunk, num_callee_consts,
                       num_res):
  size, mesh_axis = axis_data.size, axis_data.explicit_mesh_axis
  args = [batching.bdim_at_front(a, d, size, mesh_axis) for a, d in zip(args, dims)]
  b_callee = _batch(callee, axis_data, [True] * len(args))

  def b_transpose_thunk():
    t_jaxpr, t_consts = transpose_thunk()
    n_in = len(t_jaxpr.in_avals) - len(t_consts)
    return _batch(t_jaxpr, axis_data, [False] * len(t_consts) + [True] * n_in), t_consts

  if (wire := wire_of(transpose_thunk)) is not None:
    b_transpose_thunk.zipccl_wire = wire.batched(size)
  out = _cd.linear_call_p.bind(*args, callee=b_callee, transpose_thunk=b_transpose_thunk,
                               num_callee_consts=num_callee_consts, num_res=num_res)
  return out, [0] * len(out)


if _cd.linear_call_p not in batching.fancy_primitive_batchers:
  batching.fancy_primitive_batchers[_cd.linear_call_p] = _linear_call_batch


_jax_linear_call_jvp = ad.primitive_jvps[_cd.linear_call_p]


def _linear_call_jvp(primals, tangents, *, num_callee_consts, num_res, **params):
  n_fixed = num_callee_consts + num_res  # their tangents stay symbolic zeros (jax asserts so)
  tangents = [t if i < n_fixed or type(t) is not ad_util.Zero else ad.instantiate_zeros(t)
              for i, t in enumerate(tangents)]
  return _jax_linear_call_jvp(primals, tangents, num_callee_consts=num_callee_consts,
                              num_res=num_res, **params)


if _jax_linear_call_jvp is _cd._linear_call_jvp_rule:  # jax's own rule, not one already fixed
  ad.primitive_jvps[_cd.linear_call_p] = _linear_call_jvp

_jax_linear_call_transpose = ad.primitive_transposes[_cd.linear_call_p]


def _linear_call_transpose(cts, *args, num_callee_consts, num_res, **params):
  n_fixed = num_callee_consts + num_res
  known = [i >= n_fixed and not ad.is_undefined_primal(a) for i, a in enumerate(args)]
  args = [ad.UndefinedPrimal(jax.typeof(a)) if k else a for a, k in zip(args, known)]
  out = _jax_linear_call_transpose(cts, *args, num_callee_consts=num_callee_consts,
                                   num_res=num_res, **params)
  return [None if k else ct for ct, k in zip(out, known)]


if _jax_linear_call_transpose is _cd._linear_call_transpose_rule:
  ad.primitive_transposes[_cd.linear_call_p] = _linear_call_transpose


# The rules of linear_call_p that evaluate its callee's jaxpr again (impl, lowering, batching; the
# JVP binds it twice) run in `_ours.scope`. (A transpose, traced later by JAX, is the caller's:
# zipccl_jax's collectives pass theirs in `_ours.ours`.)
_linear_call_impl = getattr(_cd, "_linear_call_impl", None)
if _linear_call_impl is not None and _cd.linear_call_p.impl is _linear_call_impl:
  _cd.linear_call_p.def_impl(_ours.ours(_linear_call_impl))
  mlir.register_lowering(_cd.linear_call_p,
                         mlir.lower_fun(_ours.ours(_linear_call_impl), multiple_results=True))
for _rules in (ad.primitive_jvps, batching.fancy_primitive_batchers):
  _rules[_cd.linear_call_p] = _ours.ours(_rules[_cd.linear_call_p])
