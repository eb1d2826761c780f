"""The one seam through which the examples communicate.

Every collective of the models and of the FSDP helpers goes through a :class:`Comm`.  With
``backend="zipccl"`` (the default) each call is ``zipccl_jax.<op>(..., compress=mode, name=site)``:

- ``compress=True``  codes every message (the default of the examples);
- ``compress="auto"`` lets zipccl_jax decide per call (raw when compression would not pay);
- ``compress=False`` sends raw bytes through zipccl_jax's own code path, with the same fixed reduction order
  (every call runs under ``use_defaults(fixed_order=True)``: without it a raw reduction is ``jax.lax``'s own),
  which is what makes compressed and uncompressed runs bit-identical.

``backend="lax"`` calls plain ``jax.lax`` (an uncompressed baseline whose reductions follow XLA's order) and
must be asked for explicitly: the examples never fall back to it on their own.

Byte accounting, for both backends, is zipccl_jax's one model, ``zipccl_jax.accounting.sent_bytes`` (bytes one
device sends per call: all_to_all and reduce-scatter ``S (n-1)/n``, all_gather ``S (n-1)``, all-reduce
``2 S (n-1)/n`` for an operand of ``S`` bytes).
"""
from __future__ import annotations

import collections
import math

import jax

try:
    import zipccl_jax as _zipccl
    from zipccl_jax.accounting import sent_bytes as _sent_bytes
    _ZIPCCL_ERROR: Exception | None = None
except Exception as e:  # noqa: BLE001  (reported when the zipccl backend is requested)
    _zipccl, _sent_bytes, _ZIPCCL_ERROR = None, None, e

OPS = ("all_to_all", "all_gather", "psum_scatter", "psum")
MODES = {"on": True, "auto": "auto", "off": False}


def _axis_size(axis_name) -> int:
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    return math.prod(jax.lax.axis_size(a) for a in names)


def zipccl_available() -> bool:
    return _zipccl is not None and all(hasattr(_zipccl, op) for op in OPS)


class Comm:
    """Collectives with jax.lax signatures plus ``name`` (the call site, for the byte statistics) and
    ``capacity`` (zipccl_jax's padded bytes per chunk; overrides the Comm-wide one)."""

    def __init__(self, backend: str = "zipccl", compress="on", capacity=None, transport=None):
        if backend not in ("zipccl", "lax"):
            raise ValueError(f"unknown backend {backend!r}")
        mode = MODES.get(compress, compress) if isinstance(compress, str) else compress
        if mode not in (True, False, "auto"):
            raise ValueError(f"compress must be one of {list(MODES)}, got {compress!r}")
        if backend == "zipccl" and not zipccl_available():
            missing = [op for op in OPS if not hasattr(_zipccl, op)] if _zipccl else list(OPS)
            raise RuntimeError(
                "the zipccl backend needs zipccl_jax with its compressed collectives "
                f"(missing: {missing}; import error: {_ZIPCCL_ERROR!r}). Install the package from the repository "
                "root (`pip install .`), or pass --backend lax for the uncompressed jax.lax baseline.")
        if backend == "lax":
            mode = False  # jax.lax has nothing to compress
        self.backend, self.compress, self.capacity, self.transport = backend, mode, capacity, transport
        self._lax_sites: dict[str, tuple[str, int]] = {}  # lax backend: name -> (op, bytes sent per call)
        self._names = collections.Counter()

    # -- call sites ----------------------------------------------------------------------------------
    def _site(self, op: str, name: str | None) -> str:
        base = name or op
        self._names[base] += 1
        k = self._names[base]
        return base if k == 1 else f"{base}#{k}"

    def start(self) -> None:
        """Forget earlier statistics; call before tracing the step."""
        self._lax_sites.clear()
        self._names.clear()
        if self.backend == "zipccl":
            _zipccl.reset_stats()
            _zipccl.set_runtime_stats(True)  # count fallbacks at run time

    def _lax(self, op, x, axis_name, site, mult=1):
        n = _axis_size(axis_name)
        self._lax_sites[site] = (op, mult * _sent_bytes(op, x.size * x.dtype.itemsize, n))

    @staticmethod
    def _fixed_order():
        """zipccl_jax's fixed-order reductions on every path, raw included, so that a compressed run and a
        --no-compress run are bit-identical (read when a call is traced, and kept by its transpose: the
        psum_scatter of an all_gather's gradient too)."""
        return _zipccl.use_defaults(fixed_order=True)

    def _kw(self, site, capacity=None):
        kw = {"compress": self.compress, "name": site}
        capacity = self.capacity if capacity is None else capacity
        if capacity is not None and self.compress is not False:
            kw["capacity"] = capacity
        if self.transport is not None:
            kw["transport"] = self.transport
        return kw

    # -- collectives ---------------------------------------------------------------------------------
    def all_to_all(self, x, axis_name, split_axis, concat_axis, *, tiled=False, name=None, capacity=None):
        site = self._site("all_to_all", name)
        if self.backend == "lax":
            self._lax("all_to_all", x, axis_name, site, mult=2)  # + the transposed all_to_all in jax.grad
            return jax.lax.all_to_all(x, axis_name, split_axis, concat_axis, tiled=tiled)
        with self._fixed_order():
            return _zipccl.all_to_all(x, axis_name, split_axis, concat_axis, tiled=tiled,
                                      **self._kw(site, capacity))

    def all_gather(self, x, axis_name, *, axis=0, tiled=False, name=None, capacity=None):
        site = self._site("all_gather", name)
        if self.backend == "lax":
            self._lax("all_gather", x, axis_name, site)
            return jax.lax.all_gather(x, axis_name, axis=axis, tiled=tiled)
        with self._fixed_order():
            return _zipccl.all_gather(x, axis_name, axis=axis, tiled=tiled, **self._kw(site, capacity))

    def psum_scatter(self, x, axis_name, *, scatter_dimension=0, tiled=False, name=None, capacity=None):
        site = self._site("psum_scatter", name)
        if self.backend == "lax":
            self._lax("psum_scatter", x, axis_name, site)
            return jax.lax.psum_scatter(x, axis_name, scatter_dimension=scatter_dimension, tiled=tiled)
        with self._fixed_order():
            return _zipccl.psum_scatter(x, axis_name, scatter_dimension=scatter_dimension, tiled=tiled,
                                        **self._kw(site, capacity))

    def psum(self, x, axis_name, *, name=None, capacity=None):
        site = self._site("psum", name)
        if self.backend == "lax":
            self._lax("psum", x, axis_name, site)
            return jax.lax.psum(x, axis_name)
        with self._fixed_order():
            return _zipccl.psum(x, axis_name, **self._kw(site, capacity))

    def ragged_all_to_all(self, operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
                          axis_name, name=None, capacity=None):
        """jax.lax.ragged_all_to_all's semantics. The lax backend runs zipccl_jax's raw path
        (compress=False): jax.lax.ragged_all_to_all on GPU/TPU, an exact emulation on CPU, which has none."""
        site = self._site("ragged_all_to_all", name)
        args = (operand, output, input_offsets, send_sizes, output_offsets, recv_sizes)
        if self.backend == "lax":
            if _zipccl is None or not hasattr(_zipccl, "ragged_all_to_all"):
                return jax.lax.ragged_all_to_all(*args, axis_name=axis_name)
            rows = min(operand.shape[0], output.shape[0])  # sizes are data: zipccl_jax's balanced model
            self._lax("all_to_all", operand[:rows], axis_name, site, mult=2)  # + its transpose in jax.grad
            return _zipccl.ragged_all_to_all(*args, axis_name=axis_name, compress=False)
        kw = self._kw(site, capacity)
        kw.pop("transport", None)  # its frames always take the ragged transport
        return _zipccl.ragged_all_to_all(*args, axis_name=axis_name, **kw)

    # -- statistics ----------------------------------------------------------------------------------
    def site_table(self) -> list[dict]:
        """Per call site (backward collectives included): op, bytes one device sends per call raw and on the
        wire, and the fallbacks counted on this process's devices so far."""
        if self.backend == "lax":
            return [dict(name=k, op=op, raw_bytes=b, wire_bytes=b, compressed=False, fallbacks=0)
                    for k, (op, b) in self._lax_sites.items()]
        return [dict(name=s.name, op=s.op, raw_bytes=s.raw_bytes, wire_bytes=s.wire_bytes,
                     compressed=bool(s.compressed), fallbacks=int(s.fallbacks), dtype=s.dtype,
                     shape=list(s.shape), capacity=s.capacity)
                for s in _zipccl.stats().values()]
