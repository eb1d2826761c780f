"""The one seam through which the examples communicate.

Every collective of the models and of the FSDP helpers goes through a :class:`Comm`.  With
``backend="zipccl"`` (the default) each call is ``zipccl_jax.<op>(..., compress=compress)``; ``compress=False``
still runs zipccl_jax's code path (raw bytes, same reduction order), which is what makes compressed and
uncompressed runs bit-identical.  ``backend="lax"`` calls plain ``jax.lax`` and must be asked for explicitly:
the examples never fall back to it on their own.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

try:
    import zipccl_jax as _zipccl
    _ZIPCCL_ERROR: Exception | None = None
except Exception as e:  # noqa: BLE001  (reported when the zipccl backend is requested)
    _zipccl, _ZIPCCL_ERROR = None, e

OPS = ("all_to_all", "all_gather", "psum_scatter", "psum", "ppermute")


def _axis_size(axis_name) -> int:
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    return math.prod(jax.lax.axis_size(a) for a in names)


@dataclasses.dataclass
class CallSite:
    op: str
    axis_name: object
    shape: tuple
    dtype: str
    group: int
    raw_bytes: int  # logical bytes per device of the operand


class Comm:
    def __init__(self, backend: str = "zipccl", compress: bool = True):
        if backend not in ("zipccl", "lax"):
            raise ValueError(f"unknown backend {backend!r}")
        if backend == "zipccl":
            missing = [op for op in OPS[:4] if not hasattr(_zipccl, op)] if _zipccl else list(OPS)
            if _zipccl is None or missing:
                raise RuntimeError(
                    "the zipccl backend needs zipccl_jax with compressed collectives "
                    f"(missing: {missing}; import error: {_ZIPCCL_ERROR!r}). Install the package from the "
                    "repository root (pip install -e .) or pass --backend lax for the uncompressed jax.lax baseline.")
        if backend == "lax" and compress:
            compress = False  # jax.lax has nothing to compress
        self.backend, self.compress = backend, compress
        self.sites: list[CallSite] = []

    # -- bookkeeping (trace time) ----------------------------------------------------------------------
    def _record(self, op, x, axis_name):
        self.sites.append(CallSite(op, axis_name, tuple(x.shape), str(x.dtype), _axis_size(axis_name),
                                   int(np.prod(x.shape, dtype=np.int64)) * x.dtype.itemsize))

    def reset_sites(self):
        self.sites = []

    # -- collectives -----------------------------------------------------------------------------------
    def all_to_all(self, x, axis_name, split_axis, concat_axis, *, tiled=False):
        self._record("all_to_all", x, axis_name)
        if self.backend == "lax":
            return jax.lax.all_to_all(x, axis_name, split_axis, concat_axis, tiled=tiled)
        return _zipccl.all_to_all(x, axis_name, split_axis, concat_axis, tiled=tiled, compress=self.compress)

    def all_gather(self, x, axis_name, *, axis=0, tiled=False):
        self._record("all_gather", x, axis_name)
        if self.backend == "lax":
            return jax.lax.all_gather(x, axis_name, axis=axis, tiled=tiled)
        return _zipccl.all_gather(x, axis_name, axis=axis, tiled=tiled, compress=self.compress)

    def psum_scatter(self, x, axis_name, *, scatter_dimension=0, tiled=False):
        self._record("psum_scatter", x, axis_name)
        if self.backend == "lax":
            return jax.lax.psum_scatter(x, axis_name, scatter_dimension=scatter_dimension, tiled=tiled)
        return _zipccl.psum_scatter(x, axis_name, scatter_dimension=scatter_dimension, tiled=tiled,
                                    compress=self.compress)

    def psum(self, x, axis_name):
        self._record("psum", x, axis_name)
        if self.backend == "lax":
            return jax.lax.psum(x, axis_name)
        return _zipccl.psum(x, axis_name, compress=self.compress)
