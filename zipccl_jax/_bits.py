"""The unsigned integer type that holds a dtype's bit patterns, and a zero XLA cannot fold.

Layout copies, collectives and fallbacks move bit patterns, not values: XLA:CPU may compute a
bfloat16 copy or slice in float32 (under vmap) and quiet NaN payloads on the way.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["uint_of", "zero_after"]

_UINT_OF_SIZE = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def uint_of(dtype):
  """The unsigned integer type of `dtype`'s width (1, 2, 4 or 8 bytes)."""
  return _UINT_OF_SIZE[np.dtype(dtype).itemsize]


def zero_after(x, dtype=jnp.int32):
  """A zero of `dtype` computed from `x`'s first element, which XLA cannot prove zero (the minimum
  of an unsigned value and 0): what it feeds is computed once `x` exists, not hoisted before it."""
  first = lax.bitcast_convert_type(x.reshape(-1)[:1], uint_of(x.dtype))[0]
  return jnp.minimum(first, jnp.zeros((), first.dtype)).astype(dtype)
