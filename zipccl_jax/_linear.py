"""Autodiff of a linear function with a custom transpose: forward mode, reverse mode, transposition.

Every collective is linear in its operand. `linear(impl, transpose, x)` declares that once, as
``jax.custom_derivatives.linear_call(impl, transpose)``:

* ``jax.jvp``, ``jax.linearize``, ``jax.jacfwd`` and Hessian-vector products apply ``impl``
  (the compressed collective) to the tangent;
* ``jax.grad``, ``jax.vjp`` and ``jax.linear_transpose`` apply ``transpose`` (itself a compressed
  collective, declared the same way) to the cotangent;
* the lowered program is ``impl``'s (StableHLO identical to calling ``impl`` directly).

jax 0.10.2's ``linear_call`` has no batching rule, so ``jax.vmap`` of a collective would fail;
`_linear_call_batch` is that rule (registered only if jax has none): it batches every operand
at axis 0, the callee and its transpose alike, so that the transposed call stays consistent.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax._src import custom_derivatives as _cd
from jax._src.interpreters import batching

__all__ = ["linear"]


def linear(impl: Callable, transpose: Callable, x):
  """`impl(x)` for a linear `impl` whose transpose is `transpose`.

  `impl`'s constants (index tables, masks) are passed as residual arguments, not left for
  ``linear_call`` to hoist: ``linear_call``'s transpose keeps its callee's hoisted constants in a
  closure, so a second transposition (``jax.grad`` of ``jax.grad``) would read values of a
  finished trace. Residuals are passed afresh at every transposition.
  """
  closed = jax.make_jaxpr(impl)(x)

  def fun(consts, t):
    (y,) = jax.core.eval_jaxpr(closed.jaxpr, consts, t)
    return y

  return jax.custom_derivatives.linear_call(fun, lambda _, ct: transpose(ct),
                                            list(closed.consts), x)


def _linear_call_batch(axis_data, args, dims, *, callee, transpose_thunk, num_callee_consts,
                       num_res):
  size, mesh_axis = axis_data.size, axis_data.explicit_mesh_axis
  args = [batching.bdim_at_front(a, d, size, mesh_axis) for a, d in zip(args, dims)]
  b_callee, _ = batching.batch_jaxpr(callee, axis_data, [True] * len(args), instantiate=True)

  def b_transpose_thunk():
    t_jaxpr, t_consts = transpose_thunk()
    n_in = len(t_jaxpr.in_avals) - len(t_consts)
    b_t, _ = batching.batch_jaxpr(t_jaxpr, axis_data, [False] * len(t_consts) + [True] * n_in,
                                  instantiate=True)
    return b_t, t_consts

  out = _cd.linear_call_p.bind(*args, callee=b_callee, transpose_thunk=b_transpose_thunk,
                               num_callee_consts=num_callee_consts, num_res=num_res)
  return out, [0] * len(out)


if _cd.linear_call_p not in batching.fancy_primitive_batchers:
  batching.fancy_primitive_batchers[_cd.linear_call_p] = _linear_call_batch
