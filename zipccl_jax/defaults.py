"""The default ``compress`` and ``capacity`` of every collective, set once with `use_defaults`.

Existing code that calls ``jax.lax`` collectives changes one import, not every call::

  from zipccl_jax import all_to_all, psum            # instead of jax.lax's
  with zipccl_jax.use_defaults(compress=True, capacity=0.8):
    step = jax.jit(train_step)                       # traced here: every call site compressed
    step(params, batch)

A collective called with ``compress=None`` / ``capacity=None`` (their defaults) takes the
innermost `use_defaults` value at trace time (``"auto"`` and the padded default capacity when
none is active). Explicit arguments win. The setting is per thread (a `contextvars` variable)
and applies when a function is traced; a jitted function already traced keeps what it saw.
"""

from __future__ import annotations

import contextlib
import contextvars

__all__ = ["use_defaults", "get_defaults"]

_UNSET = object()
_DEFAULTS: contextvars.ContextVar[dict] = contextvars.ContextVar(
    "zipccl_jax_defaults", default={"compress": "auto", "capacity": None})


def get_defaults() -> dict:
  """The active defaults: ``{"compress": ..., "capacity": ...}``."""
  return dict(_DEFAULTS.get())


@contextlib.contextmanager
def use_defaults(*, compress=_UNSET, capacity=_UNSET):
  """Within the block, collectives called without ``compress=`` / ``capacity=`` use these.

  Args:
    compress: ``True``, ``False`` or ``"auto"`` (see :mod:`zipccl_jax.collectives`).
    capacity: anything ``capacity=`` accepts (bytes, a ratio, ``"observed"``, a
      ``(forward, backward)`` pair) or None for the padded default.
  Omitted arguments keep the enclosing value.
  """
  new = get_defaults()
  if compress is not _UNSET:
    new["compress"] = check_compress(compress, "use_defaults")
  if capacity is not _UNSET:
    new["capacity"] = capacity
  token = _DEFAULTS.set(new)
  try:
    yield
  finally:
    _DEFAULTS.reset(token)


def check_compress(compress, api: str):
  """`compress` if it is True, False or "auto"; else a ValueError naming `zipccl_jax.<api>`."""
  if compress is not True and compress is not False and compress != "auto":
    raise ValueError(f"zipccl_jax.{api}: compress must be True, False or 'auto', got {compress!r}")
  return compress


def resolve(compress, capacity):
  """The caller's ``compress`` / ``capacity``, None replaced by the active default."""
  d = _DEFAULTS.get()
  return (d["compress"] if compress is None else compress,
          d["capacity"] if capacity is None else capacity)
