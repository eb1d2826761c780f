"""zipccl_jax: lossless compressed collectives for JAX training.

Codec: `encode`, `decode`, `max_encoded_bytes` (see FORMAT.md for the bytes).
Collectives (inside `jax.shard_map`): `all_to_all`, `all_gather`,
`psum_scatter`, `psum`, `ppermute`, `pmean`, `all_gather_invariant`, `ragged_all_to_all`, with
`jax.lax` signatures; `compress_collectives` makes a function's own `jax.lax` collectives
zipccl_jax's (adoption in one line); `use_defaults` sets their default `compress`/`capacity` once;
`export_disabled_checks` lets `jax.export` serialize compressed code; `use_algorithm` pins the
two-level algorithm, `use_levels` declares a mesh axis that spans hosts; `info()` describes the build.
Strategy behind `compress="auto"`: `calibrate`, `Profile`, `load_profile`,
`use_profile`, `observe`, `explain`, `decisions`.
Introspection: `stats`, `totals`, `hlo_wire_bytes`.
docs/ARCHITECTURE.md draws the layers and which module is the door of each.
"""

from zipccl_jax import _compat

_compat.check_supported()  # before anything else touches jax: a clear error naming both versions

from zipccl_jax import format  # noqa: E402 (after the version check)
from zipccl_jax.accounting import (CallSiteStats, hlo_collectives, hlo_wire_bytes, reset_stats,
                                   set_runtime_stats, stats, totals)
from zipccl_jax.strategy.calibration import calibrate
from zipccl_jax.capacity import padded_capacity
from zipccl_jax.codec import decode, encode, max_encoded_bytes
from zipccl_jax._ffi import export_disabled_checks
from zipccl_jax.collectives import (all_gather, all_gather_invariant, all_to_all, pmean, ppermute,
                                    psum, psum_scatter)
from zipccl_jax.defaults import get_defaults, use_defaults
from zipccl_jax.strategy.levels import use_algorithm, use_levels
from zipccl_jax._info import info
from zipccl_jax.observation import observe
from zipccl_jax.strategy.profile import Profile, get_profile, load_profile, set_profile, use_profile
from zipccl_jax.ragged import ragged_all_to_all
from zipccl_jax.introspect import explain
from zipccl_jax.strategy import decisions
from zipccl_jax.transform import compress_collectives

__version__ = "0.1.0"

__all__ = [
    "encode", "decode", "max_encoded_bytes", "format", "info",
    "all_to_all", "all_gather", "psum_scatter", "psum", "ppermute", "pmean", "all_gather_invariant",
    "ragged_all_to_all", "compress_collectives", "use_algorithm", "use_levels", "use_defaults", "get_defaults", "export_disabled_checks",
    "padded_capacity", "CallSiteStats", "stats", "totals", "reset_stats", "set_runtime_stats",
    "hlo_collectives", "hlo_wire_bytes",
    "Profile", "calibrate", "explain", "decisions", "observe", "get_profile", "set_profile",
    "use_profile", "load_profile",
]
