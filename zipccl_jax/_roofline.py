"""Roofline rules (``jax.experimental.roofline``) for zipccl_jax's primitives.

jax's roofline interpreter sums the rule registered for each primitive of a jaxpr. A collective of ours
is a ``linear_call`` (`_linear`) whose callee holds the exchange inside ``lax.cond``s (the transport, the
overflow fallback) that the interpreter does not enter, so with no rule it reported nothing. Registered
here, on import, where ``jax.experimental.roofline`` imports (`_compat.roofline_module`):

* ``linear_call`` of a collective of ours (its transpose thunk carries a `Wire`): jax.lax's own
  estimate of the same call (the rules jax registers for what that jax.lax call binds, on the same
  operand and mesh) with its ``ici_bytes`` scaled by the bytes we send over the bytes jax.lax sends
  (both from the one bytes-sent model, `accounting.sent_bytes`): equal when the call goes raw, the
  frames' bytes when it is coded; plus the codec's HBM traffic (``hbm_bytes`` and
  ``unfused_hbm_bytes``: what every zipccl encode and decode of the call reads and writes, on the
  path taken when no frame overflows). Any other ``linear_call``: its callee's estimate.
* ``ffi_call`` of a zipccl codec target (`codec.encode` / `decode` called directly): the bytes it
  reads and writes. Other targets keep the rule they had (or none).
* ``zipccl_count`` (the runtime counter of `accounting`): nothing.
* a ``cond`` of ``lax.platform_dependent`` (the codec stages its CPU and CUDA calls as one, `codec._codec_call`):
  its largest branch, by HBM bytes (one branch runs, chosen when the platform is known), and its
  ``platform_index``: nothing. Other conds keep the rule they had (jax registers none: a warning, nothing).
The codec's bytes leave out the CUDA calls' scratch result (working memory, neither read nor written as data).

ragged_all_to_all passes no `Wire` (its send sizes are not static, and jax registers no rule for
jax.lax.ragged_all_to_all either): its linear_call gets its callee's estimate, which the conds hide.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

import jax
import numpy as np
from jax._src import config, core
from jax._src import custom_derivatives as _cd
from jax._src.lax.control_flow import conditionals as _conds

from zipccl_jax import _compat, _ffi, _linear, accounting

__all__ = ["Wire", "wire", "estimate"]

_CODEC_TARGETS = (_ffi.ENCODE_TARGET, _ffi.DECODE_TARGET)


@dataclasses.dataclass(frozen=True)
class Wire:
  """What a collective of ours moves, for its roofline rule: jax.lax's call of the same collective
  (`lax_call(operand)`), and the bytes one device sends, jax.lax's (`raw`) and ours (`sent`)."""
  lax_call: Callable
  operand: core.AbstractValue
  raw: int
  sent: int
  check_vma: bool = True  # the enclosing shard_map's (jax.lax.psum binds another primitive without)
  times: int = 1  # a batched (jax.vmap) call moves `times` operands in one collective

  def batched(self, size: int) -> Wire:
    return dataclasses.replace(self, times=self.times * size)


def wire(lax_call: Callable, operand, raw: int, sent: int) -> Wire:
  """The `Wire` of a call being traced now (`operand`: a value or its aval)."""
  return Wire(lax_call, jax.typeof(operand), raw, sent, bool(config._check_vma.value))


def _zeros(rl):
  return rl.RooflineResult.zeros()


def estimate(wire: Wire, callee, mesh, rl):
  """The RooflineResult of one collective of ours (see the module docstring)."""
  axes = list(mesh.shape.items()) if mesh is not None else []
  with core.extend_axis_env_nd(axes), config._check_vma(wire.check_vma):
    jaxpr = jax.make_jaxpr(wire.lax_call)(wire.operand)
  lax = rl._roofline_interpreter("zipccl_jax", jaxpr, mesh)
  scale = (lambda b: b * wire.sent // wire.raw) if wire.raw else (lambda b: 0)
  codec = _codec_bytes(callee)  # a batched callee's codec calls are batched already
  return rl.RooflineResult(ici_bytes={a: scale(b) * wire.times for a, b in lax.ici_bytes.items()},
                           ici_latency=dict(lax.ici_latency), hbm_bytes=codec,
                           unfused_hbm_bytes=codec)


def _aval_bytes(aval) -> int:
  return int(np.prod(aval.shape)) * np.dtype(aval.dtype).itemsize


def _codec_call_bytes(target: str, avals_in, avals_out) -> int:
  """Bytes one codec call reads and writes: its operands and results, less the CUDA call's scratch (the
  results after encode's payload and sizes; decode's uint8 result: its own results are floats and int32)."""
  outs = avals_out[:2] if target == _ffi.ENCODE_TARGET else [a for a in avals_out if a.dtype != np.uint8]
  return sum(_aval_bytes(a) for a in (*avals_in, *outs))


def _codec_bytes(jaxpr) -> int:
  """Bytes the zipccl encodes/decodes of `jaxpr` read and write; of a cond, its largest branch (the
  raw fallback runs no codec, so this is the coded path; a platform_dependent's branches code alike)."""
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "ffi_call" and eqn.params.get("target_name") in _CODEC_TARGETS:
      total += _codec_call_bytes(eqn.params["target_name"], [v.aval for v in eqn.invars],
                                 [v.aval for v in eqn.outvars])
    elif "branches" in eqn.params:
      total += max((_codec_bytes(b) for b in eqn.params["branches"]), default=0)
    else:
      total += sum(_codec_bytes(p) for p in eqn.params.values() if hasattr(p, "eqns"))
  return total


def _register(rl) -> None:
  rules = rl._rooflines
  previous_linear = rules.get(_cd.linear_call_p)

  def linear_call_rule(ctx, *args, callee, transpose_thunk, **params):
    wire = _linear.wire_of(transpose_thunk)
    if wire is not None:
      return estimate(wire, callee, ctx.mesh, rl)
    if previous_linear is not None:
      return previous_linear(ctx, *args, callee=callee, transpose_thunk=transpose_thunk, **params)
    return rl._roofline_interpreter("linear_call", callee, ctx.mesh,
                                             pin_lhs_in_vmem=ctx.pin_lhs_in_vmem,
                                             pin_rhs_in_vmem=ctx.pin_rhs_in_vmem)

  ffi_call_p = _compat.ffi_call_primitive()
  previous_ffi = rules.get(ffi_call_p)

  def ffi_call_rule(ctx, *args, **params):
    if params.get("target_name") in _CODEC_TARGETS:
      b = _codec_call_bytes(params["target_name"], ctx.avals_in, ctx.avals_out)
      return rl.RooflineResult(hbm_bytes=b, unfused_hbm_bytes=b)
    if previous_ffi is not None:
      return previous_ffi(ctx, *args, **params)
    return _zeros(rl)  # what the interpreter adds for a primitive it has no rule for

  previous_cond = rules.get(_conds.cond_p)

  def cond_rule(ctx, *args, branches, **params):
    if params.get("branches_platforms") is None:  # a data-dependent cond: as before
      if previous_cond is not None:
        return previous_cond(ctx, *args, branches=branches, **params)
      logging.warning("No roofline rule for cond, skipping...")  # jax's words for a primitive without one
      return _zeros(rl)
    results = [rl._roofline_interpreter("platform_dependent", b.jaxpr, ctx.mesh,
                                        pin_lhs_in_vmem=ctx.pin_lhs_in_vmem,
                                        pin_rhs_in_vmem=ctx.pin_rhs_in_vmem) for b in branches]
    return max(results, key=lambda r: (r.hbm_bytes, r.unfused_hbm_bytes, r.flops))

  rl.register_roofline(_cd.linear_call_p)(linear_call_rule)
  rl.register_roofline(_conds.cond_p)(cond_rule)
  rl.register_roofline(_conds.platform_index_p)(lambda ctx, *args, **params: _zeros(rl))
  if ffi_call_p is not None:
    rl.register_roofline(ffi_call_p)(ffi_call_rule)
  rl.register_standard_roofline(accounting._count_p)


_rl = _compat.roofline_module()
if _rl is not None:
  _register(_rl)
