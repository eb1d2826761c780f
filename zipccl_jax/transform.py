"""`compress_collectives`: compress the ``jax.lax`` collectives of code you did not write.

One line around a function (a train step, a framework's MoE layer) makes every ``jax.lax``
collective it traces run as zipccl_jax's, whatever name the code called it by::

  step = jax.jit(zipccl_jax.compress_collectives(train_step, compress=True))

  @zipccl_jax.compress_collectives                     # compress="auto": the cost model decides
  def layer(x): ...

How it works
------------
While the returned function is traced, the collective primitives that ``jax.lax``'s functions
bind (``all_to_all``, ``all_gather``, ``all_gather_invariant``, ``reduce_scatter``
(psum_scatter), ``psum``, ``ppermute``, ``ragged_all_to_all``) are bound as zipccl_jax's
collective of the same name and arguments instead (`_RULES`). The policy (``compress``,
``capacity``, ``transport``) is a ``jax.make_user_context`` value, so it is part of ``jax.jit``'s
cache key: a jitted function first traced without it is traced again under it, and the other way
round. Every body traced inside -- ``shard_map``, ``jit``, ``cond``, ``scan``, ``while_loop``,
``checkpoint``, a ``custom_jvp`` or ``custom_vjp`` function -- is traced under the policy. The
rules a ``custom_jvp``/``custom_vjp`` defines (its ``jvp``, ``fwd`` and ``bwd``), which JAX traces
later, when it differentiates (possibly after the returned function has returned, as in
``jax.grad(compress_collectives(f))``), take the policy along with them.

Why not re-trace a jaxpr: the parameters of the higher-order primitives a re-interpreter must
rebuild changed between the JAX versions we support (``scan``'s ``num_consts``/``num_carry`` became
``ft_in``/``ft_out`` in 0.11; a ``custom_vjp`` backward rule carries logs since 0.12); the
primitives' ``bind`` interface did not. `_install` reaches them in ``jax._src`` (the same modules in
every supported version); a primitive that is missing fails loudly there.

What stays ``jax.lax``'s, exactly: a collective of a dtype the codec does not code (integers,
bool, float64, ...), one with ``axis_index_groups``, a ``psum`` over positional (pmap) axes, the
async ``*_start`` collectives, and everything zipccl_jax itself already passes to ``jax.lax``
(axes bound by ``vmap``, symbolic shapes, unreduced operands; see :mod:`zipccl_jax.collectives`).
A collective zipccl_jax runs gives ``jax.lax``'s bits (data movement) or the documented ordered
sum (reductions), forward and under ``grad``; its call site in `stats` and `explain` is the file
and line of the original ``jax.lax`` call.

Comparing bits with the untransformed function: one case differs around a collective, not in it.
In a BF16 row-parallel layer (a dot in F32, rounded to BF16, then ``psum_scatter`` or ``psum``),
XLA:CPU may fuse the unrounded F32 dot output into the reduce-scatter it widens to F32 next to
jax.lax's collective, and cannot next to ours, so the bits can differ even with
``compress=False``. Put the rounding behind ``jax.lax.optimization_barrier`` in the layer
(``y = lax.optimization_barrier(y.astype(jnp.bfloat16))`` before the collective) and both reduce
the same BF16 values.

zipccl_jax's own ``jax.lax`` calls (frames, raw paths, fallbacks, the transposes JAX traces
during the backward pass) are never rewritten, however and whenever they are traced (`_ours`).
With ``compress=True`` a call whose frame would not be smaller than its raw chunk goes raw
(``explain()`` says so); with ``"auto"`` on a CPU box nothing is coded (``explain()`` says why).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import importlib
import threading
from typing import Any, Callable

import jax
import numpy as np

from zipccl_jax import _ours, collectives, defaults, ragged
from zipccl_jax._shard import call_site
from zipccl_jax.capacity import CODED_DTYPES

__all__ = ["compress_collectives"]

# The policy under which a function is traced: part of jax.jit's cache key (`jax.make_user_context`).
_POLICY = jax.make_user_context(None)
_NOT_OURS = object()
# Call sites named in this trace: one jax.lax call on a pytree binds once per leaf from the same line,
# so the second and later leaves of a line are named "op@file:line[k]" (as zipccl_jax's own pytree
# calls name theirs), and `stats` keeps each leaf's bytes.
_SITES: contextvars.ContextVar[dict | None] = contextvars.ContextVar("zipccl_transform_sites", default=None)


@dataclasses.dataclass(frozen=True)
class _Policy:
  compress: Any
  capacity: Any
  transport: str

  @property
  def kw(self) -> dict:
    return {"compress": self.compress, "capacity": self.capacity, "transport": self.transport}


def _site(op: str) -> str:
  """The call site of the jax.lax call being rewritten: op@file:line of the first frame outside
  zipccl_jax and jax, numbered per leaf within one trace."""
  base = call_site(op, None)
  seen = _SITES.get()
  if seen is None:
    return base
  k = seen.get(base, 0)
  seen[base] = k + 1
  return base if k == 0 else f"{base}[{k}]"


def compress_collectives(fn: Callable | None = None, *, compress="auto", capacity=None,
                         transport: str = "auto") -> Callable:
  """``fn`` with every ``jax.lax`` collective it traces run as zipccl_jax's compressed one.

  Args:
    fn: any function; the result has its signature. Without it, returns a decorator.
    compress: ``True``, ``False`` or ``"auto"`` (the cost model decides per call), as the
      collectives of :mod:`zipccl_jax.collectives` take it.
    capacity: ``None`` (the default), a byte count, a ratio of the raw bytes, ``"observed"`` or a
      ``(forward, backward)`` pair.
    transport: ``"auto"``, ``"padded"`` or ``"ragged"``.

  Returns:
    A function with ``fn``'s signature and results: the bits of ``jax.lax``'s for data-movement
    collectives, the documented fixed-order sum for reductions. It composes with ``jax.jit``,
    ``jax.grad`` and ``jax.vmap`` in either order.

  Example (8 devices, one mesh axis "x"; ``x`` is (8 * 64, 512) bfloat16)::

    def moe_dispatch(x):                      # someone else's layer
      return jax.lax.all_to_all(x, "x", 0, 0, tiled=True)

    f = jax.shard_map(moe_dispatch, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    g = jax.jit(zipccl_jax.compress_collectives(f, compress=True))
    assert (g(x).view(jnp.uint16) == f(x).view(jnp.uint16)).all()   # ~1/3 fewer bytes on the wire
  """
  policy = _policy(compress, capacity, transport)
  if fn is None:
    return functools.partial(compress_collectives, compress=compress, capacity=capacity,
                             transport=transport)
  if not callable(fn):
    raise TypeError(f"zipccl_jax.compress_collectives: fn must be callable, got {type(fn).__name__}")
  _install()

  @functools.wraps(fn)
  def compressed(*args, **kwargs):
    with _POLICY(policy):
      return _traced(fn, args, kwargs)

  return compressed


def _traced(fn, args, kwargs):
  """fn(*args, **kwargs) with rewriting on (also inside a zipccl collective: a custom rule's trace)
  and a fresh call-site count."""
  sites = _SITES.set({})
  try:
    with _ours.user_code():
      return fn(*args, **kwargs)
  finally:
    _SITES.reset(sites)


def _policy(compress, capacity, transport) -> _Policy:
  defaults.check_compress(compress, "compress_collectives")
  if transport not in ("auto", "padded", "ragged"):
    raise ValueError(f"zipccl_jax.compress_collectives: transport must be 'auto', 'padded' or "
                     f"'ragged', got {transport!r}")
  if isinstance(capacity, list):
    capacity = tuple(capacity)
  defaults.check_capacity(capacity, "compress_collectives")
  try:
    hash(capacity)
  except TypeError:
    raise TypeError(f"zipccl_jax.compress_collectives: capacity must be None, an int, a float, "
                    f"'observed' or a (forward, backward) pair, got {capacity!r}") from None
  return _Policy(compress, capacity, transport)


# --------------------------------------------------------------------------- #
# Rules: a jax.lax primitive's operands and parameters -> zipccl_jax's collective
# --------------------------------------------------------------------------- #

def _coded(*xs) -> bool:
  return all(np.dtype(x.dtype) in CODED_DTYPES for x in xs)


def _all_to_all(p: _Policy, args, params):
  # A non-tiled jax.lax.all_to_all binds the primitive on an operand with the new axis already
  # inserted (and squeezes it after), where the tiled exchange gives the same result.
  (x,) = args
  return collectives.all_to_all(x, params["axis_name"], params["split_axis"], params["concat_axis"],
                                tiled=True, name=_site("all_to_all"), **p.kw)


def _all_gather(p: _Policy, args, params):
  (x,) = args
  return collectives.all_gather(x, params["axis_name"], axis=params["all_gather_dimension"],
                                tiled=params["tiled"], name=_site("all_gather"), **p.kw)


def _all_gather_invariant(p: _Policy, args, params):
  (x,) = args
  return collectives.all_gather_invariant(x, params["axis_name"], axis=params["all_gather_dimension"],
                                          tiled=params["tiled"], name=_site("all_gather_invariant"),
                                          **p.kw)


def _reduce_scatter(p: _Policy, args, params):
  (x,) = args
  return collectives.psum_scatter(x, params["axis_name"], scatter_dimension=params["scatter_dimension"],
                                  tiled=params["tiled"], name=_site("psum_scatter"), **p.kw)


def _psum(p: _Policy, args, params):
  axes = params["axes"]
  if any(isinstance(a, int) for a in axes):  # positional (pmap) axes: no wire of ours
    return _NOT_OURS
  # One result per operand; `_rewritten_bind` unwraps it where psum_p has a single result
  # (jax.lax.psum binds it once per leaf under check_vma=False).
  return [collectives.psum(x, axes, name=_site("psum"), **p.kw) for x in args]


def _psum_invariant(p: _Policy, args, params):
  (x,) = args
  return collectives.psum(x, params["axes"], name=_site("psum"), **p.kw)


def _ppermute(p: _Policy, args, params):
  (x,) = args
  return collectives.ppermute(x, params["axis_name"], params["perm"], name=_site("ppermute"), **p.kw)


def _ragged_all_to_all(p: _Policy, args, params):
  kw = {k: v for k, v in p.kw.items() if k != "transport"}  # its transport is always ragged
  return ragged.ragged_all_to_all(*args, axis_name=params["axis_name"], name=_site("ragged_all_to_all"),
                                  **kw)


# primitive name -> (rule, the operands whose dtype decides: all of them, or the first)
_RULES: dict[str, tuple[Callable, bool]] = {
    "all_to_all": (_all_to_all, False),
    "all_gather": (_all_gather, False),
    "all_gather_invariant": (_all_gather_invariant, False),
    "reduce_scatter": (_reduce_scatter, False),
    "psum": (_psum, True),
    "psum_invariant": (_psum_invariant, False),
    "ppermute": (_ppermute, False),
    "ragged_all_to_all": (_ragged_all_to_all, False),
}


def _rewritten_bind(name: str, rule: Callable, all_operands: bool, multiple_results: bool,
                    original: Callable) -> Callable:
  def bind(*args, **params):
    policy = _POLICY.value
    if policy is None or _ours.active() or params.get("axis_index_groups") is not None:
      return original(*args, **params)
    if not _coded(*(args if all_operands else args[:1])) or _ours.bound_by_us():
      return original(*args, **params)  # not coded, or a raw path of ours (`_ours`)
    with _ours.scope():
      out = rule(policy, args, params)
    if out is _NOT_OURS:
      return original(*args, **params)
    return out[0] if isinstance(out, list) and not multiple_results else out

  bind.__wrapped__ = original
  bind.__name__ = f"zipccl_{name}_bind"
  return bind


# --------------------------------------------------------------------------- #
# Custom derivative rules: traced later, under the policy of the trace that bound them
# --------------------------------------------------------------------------- #

def _under(policy: _Policy, f):
  """`f` (a linear_util.WrappedFun) traced under `policy` whenever JAX calls it."""
  from jax.extend import linear_util as lu

  def call(*args):
    with _POLICY(policy):
      return _traced(f.call_wrapped, args, {})

  return lu.wrap_init(call, debug_info=f.debug_info)


def _custom_rule_bind(original: Callable) -> Callable:
  def bind(*args, subfuns, **params):
    policy = _POLICY.value
    if policy is not None and not _ours.active():
      subfuns = tuple(_under(policy, f) for f in subfuns)
    return original(*args, subfuns=subfuns, **params)

  bind.__wrapped__ = original
  return bind


# --------------------------------------------------------------------------- #
# Installation (once, at the first compress_collectives)
# --------------------------------------------------------------------------- #

_INSTALL_LOCK = threading.Lock()
_INSTALLED = False


def _install() -> None:
  global _INSTALLED
  with _INSTALL_LOCK:
    if _INSTALLED:
      return
    # Where jax 0.10.2 through 0.12 define them (the primitives are not in jax.extend).
    parallel = importlib.import_module("jax._src.lax.parallel")
    custom = importlib.import_module("jax._src.custom_derivatives")
    for name, (rule, all_operands) in _RULES.items():
      prim = _primitive(parallel, name)
      prim.bind = _rewritten_bind(name, rule, all_operands, prim.multiple_results, prim.bind)
    for name in ("custom_jvp_call", "custom_vjp_call"):
      prim = _primitive(custom, name)
      prim.bind = _custom_rule_bind(prim.bind)
    _INSTALLED = True


def _primitive(module, name: str):
  prim = getattr(module, f"{name}_p", None)
  if prim is None or getattr(prim, "name", None) != name:
    raise RuntimeError(f"zipccl_jax.compress_collectives: jax {jax.__version__} has no primitive "
                       f"{name!r} in {module.__name__}; this JAX is not supported by the transform")
  return prim
