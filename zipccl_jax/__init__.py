"""zipccl_jax: lossless compressed collectives for JAX training.

Codec: `encode`, `decode`, `max_encoded_bytes` (see FORMAT.md for the bytes).
Collectives (inside `jax.shard_map`): `all_to_all`, `all_gather`,
`psum_scatter`, `psum`, `ppermute`, with `jax.lax` signatures.
Strategy behind `compress="auto"`: `calibrate`, `Profile`, `load_profile`,
`use_profile`, `observe`, `explain`, `decisions`.
Introspection: `stats`, `totals`, `hlo_wire_bytes`.
"""

from zipccl_jax import format
from zipccl_jax.codec import decode, encode, max_encoded_bytes
from zipccl_jax.info import info

__version__ = "0.1.0"

__all__ = ["encode", "decode", "max_encoded_bytes", "format", "info"]

try:  # the collectives land in their own module
  from zipccl_jax.collectives import *  # noqa: F401,F403
  from zipccl_jax import collectives as _collectives
  __all__ += list(_collectives.__all__)
except ImportError as _e:  # pragma: no cover
  if "zipccl_jax.collectives" not in str(_e):
    raise
