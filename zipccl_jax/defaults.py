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
import math

import numpy as np

from zipccl_jax.format import FRAME_HEADER_BYTES

__all__ = ["use_defaults", "get_defaults"]

_UNSET = object()
_DEFAULTS: contextvars.ContextVar[dict] = contextvars.ContextVar(
    "zipccl_jax_defaults", default={"compress": "auto", "capacity": None, "fixed_order": False})


def get_defaults() -> dict:
  """The active defaults: ``{"compress": ..., "capacity": ..., "fixed_order": ...}``."""
  return dict(_DEFAULTS.get())


@contextlib.contextmanager
def use_defaults(*, compress=_UNSET, capacity=_UNSET, fixed_order=_UNSET):
  """Within the block, collectives called without ``compress=`` / ``capacity=`` /
  ``fixed_order=`` use these.

  Args:
    compress: ``True``, ``False`` or ``"auto"`` (see :mod:`zipccl_jax.collectives`).
    capacity: anything ``capacity=`` accepts (bytes, a ratio, ``"observed"``, a
      ``(forward, backward)`` pair) or None for the padded default.
    fixed_order: ``True``: the reductions (psum_scatter, psum, pmean, and the psum_scatter that
      transposes an all_gather) compute the fixed-order float32 sum on every path, so their bits
      never depend on the decision; ``False`` (default): raw is ``jax.lax``'s own call.
  Omitted arguments keep the enclosing value.
  """
  new = get_defaults()
  if compress is not _UNSET:
    new["compress"] = check_compress(compress, "use_defaults")
  if capacity is not _UNSET:
    new["capacity"] = check_capacity(capacity, "use_defaults")
  if fixed_order is not _UNSET:
    new["fixed_order"] = check_fixed_order(fixed_order, "use_defaults")
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


TRANSPORTS = ("auto", "padded", "ragged")
_CAPACITY_FORMS = "an int, a float, 'observed' or None"


def check_call(api: str, compress, capacity, transport="auto") -> None:
  """A collective's ``compress``, ``capacity`` and ``transport``, checked when it is called, whatever
  the plan then decides (a typo must not wait for the cost model to choose compression): a
  ValueError or TypeError naming ``zipccl_jax.<api>`` and the argument. None means the default."""
  if compress is not None:
    check_compress(compress, api)
  check_transport(transport, api)
  check_capacity(capacity, api)


def check_transport(transport, api: str):
  if not isinstance(transport, str) or transport not in TRANSPORTS:
    raise ValueError(f"zipccl_jax.{api}: transport must be 'auto', 'padded' or 'ragged', got {transport!r}")
  return transport


def check_capacity(capacity, api: str):
  """`capacity` if it is a form every collective accepts (None, bytes >= a frame header, a
  fraction > 0, "observed", or a ``(forward, backward)`` pair of those); else the error."""
  if isinstance(capacity, (tuple, list)):
    if len(capacity) != 2:
      raise ValueError(f"zipccl_jax.{api}: a capacity pair must be (forward, backward), got {capacity!r}")
    for c in capacity:
      check_capacity(c, api)
    return capacity
  if capacity is None or (isinstance(capacity, str) and capacity == "observed"):
    return capacity
  if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, float, np.integer, np.floating)):
    raise TypeError(f"zipccl_jax.{api}: capacity must be {_CAPACITY_FORMS}, got {capacity!r}")
  if isinstance(capacity, (int, np.integer)) and capacity < FRAME_HEADER_BYTES:
    raise ValueError(f"zipccl_jax.{api}: capacity must be >= {FRAME_HEADER_BYTES} bytes (a frame's "
                     f"header), got {capacity}")
  if isinstance(capacity, (float, np.floating)) and not (math.isfinite(capacity) and capacity > 0):
    raise ValueError(f"zipccl_jax.{api}: capacity ratio must be > 0 (a fraction of the raw bytes), "
                     f"got {capacity}")
  return capacity


def check_fixed_order(fixed_order, api: str) -> bool:
  """`fixed_order` if it is a bool; else a TypeError naming `zipccl_jax.<api>`."""
  if not isinstance(fixed_order, (bool, np.bool_)):
    raise TypeError(f"zipccl_jax.{api}: fixed_order must be True or False, got {fixed_order!r}")
  return bool(fixed_order)


def resolve_fixed_order(fixed_order, api: str) -> bool:
  """The caller's ``fixed_order`` (checked), None replaced by the active default."""
  return _DEFAULTS.get()["fixed_order"] if fixed_order is None else check_fixed_order(fixed_order, api)


def resolve(compress, capacity):
  """The caller's ``compress`` / ``capacity``, None replaced by the active default."""
  d = _DEFAULTS.get()
  return (d["compress"] if compress is None else compress,
          d["capacity"] if capacity is None else capacity)
