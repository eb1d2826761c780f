"""The unsigned integer type that holds a dtype's bit patterns.

Layout copies, collectives and fallbacks move bit patterns, not values: XLA:CPU may compute a
bfloat16 copy or slice in float32 (under vmap) and quiet NaN payloads on the way.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

__all__ = ["uint_of"]

_UINT_OF_SIZE = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def uint_of(dtype):
  """The unsigned integer type of `dtype`'s width (1, 2, 4 or 8 bytes)."""
  return _UINT_OF_SIZE[np.dtype(dtype).itemsize]
