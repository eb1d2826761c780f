"""Which ``jax.lax`` collectives are zipccl_jax's own: never rewritten by `compress_collectives`.

zipccl_jax binds ``jax.lax`` collectives itself: uint8 frames, the raw paths of a coded dtype
(``compress=False``, ``"auto"`` deciding raw, the overflow fallback, the CPU emulation of
``ragged_all_to_all``), the calls it leaves to jax.lax. `transform.compress_collectives` must
leave every one of them as it is, whoever traces it and when: the call of a public collective,
a transpose rule JAX traces during the backward pass (possibly long after the collective
returned, with the policy still on, as in ``compress_collectives(jax.grad(f))``), and JAX
re-binding the primitives of a jaxpr of ours (``linear_call``'s impl, lowering and batching
rules evaluate its callee again). Two marks, either of which makes a bind ours:

* `scope` (a context variable): set around the public collectives' entry (`_recipe.run`,
  `ragged.ragged_all_to_all`), their transpose rules and ``linear_call``'s rules (`_linear`);
* `bound_by_us`: the nearest Python frame that is not JAX's is a zipccl_jax module other than
  `transform` (a raw call of ours that some future path reaches without the scope).

`user_code` clears the scope where zipccl_jax calls the user's code (the transformed function,
a user's custom rule traced later).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import sys

import jax

__all__ = ["scope", "user_code", "active", "bound_by_us", "ours"]

_SCOPE: contextvars.ContextVar[bool] = contextvars.ContextVar("zipccl_ours", default=False)
_HERE = os.path.abspath(__file__)
_PKG = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TRANSFORM = _PKG + "transform.py"
_JAX = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep
_JAXLIB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(jax.__file__))), "jaxlib") + os.sep


@contextlib.contextmanager
def scope():
  """The jax.lax collectives bound inside are zipccl_jax's (see the module docstring)."""
  token = _SCOPE.set(True)
  try:
    yield
  finally:
    _SCOPE.reset(token)


@contextlib.contextmanager
def user_code():
  """The jax.lax collectives bound inside are the user's again (the transform rewrites them)."""
  token = _SCOPE.set(False)
  try:
    yield
  finally:
    _SCOPE.reset(token)


def ours(fn):
  """`fn` run inside `scope` whenever it is called (a rule JAX calls later)."""
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with scope():
      return fn(*args, **kwargs)

  return wrapped


def active() -> bool:
  return _SCOPE.get()


def bound_by_us(depth: int = 2) -> bool:
  """Whether the nearest frame outside JAX (and outside `transform`'s bind wrapper, `depth`
  frames up) is a zipccl_jax module other than transform.py."""
  frame = sys._getframe(depth)
  while frame is not None:
    path = os.path.abspath(frame.f_code.co_filename)
    if not (path.startswith(_JAX) or path.startswith(_JAXLIB) or path == _TRANSFORM
            or path == _HERE):
      return path.startswith(_PKG)
    frame = frame.f_back
  return False
