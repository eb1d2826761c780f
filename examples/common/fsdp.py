"""FSDP with flat parameter buckets.

A bucket packs a group of parameter leaves into one flat fp32 vector, padded so that it splits evenly into
``n_shards`` shards (the PyTorch FSDP "flat parameter").  Each device keeps one fp32 shard (the master copy the
optimizer updates).  In the step the shard is cast to the communication dtype and gathered with one
``all_gather``; the gradient with respect to the gathered vector is reduced with one ``psum_scatter`` back to
the shard.  One collective per bucket keeps messages large, which is what compression needs.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Bucket:
    keys: tuple  # flattened-dict keys (path tuples), in packing order
    shapes: tuple  # per-leaf shapes, as seen inside one shard group
    n_shards: int

    @property
    def sizes(self):
        return tuple(math.prod(s) for s in self.shapes)

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    @property
    def padded(self) -> int:
        return -(-self.numel // self.n_shards) * self.n_shards

    @property
    def shard_size(self) -> int:
        return self.padded // self.n_shards

    def pack_np(self, flat: dict) -> np.ndarray:
        v = np.zeros(self.padded, np.float32)
        off = 0
        for k, n in zip(self.keys, self.sizes):
            v[off:off + n] = np.asarray(flat[k], np.float32).ravel()
            off += n
        return v

    def unpack(self, vec) -> dict:
        """Gathered flat vector (padded,) -> {key: leaf}. Traceable; the gradient is one concatenation.

        Differentiating plain slices would give one zero-padded full-length vector per leaf, summed: XLA fuses
        that chain into a loop that does (leaves x padded) work, which measured 12 ms per step on the MoE
        example's 45k-element bucket. The custom VJP writes each leaf's cotangent once instead.
        """
        leaves = _unpack(self, vec)
        return dict(zip(self.keys, leaves))

    def unpack_np(self, vec: np.ndarray) -> dict:
        out, off = {}, 0
        for k, s, n in zip(self.keys, self.shapes, self.sizes):
            out[k] = np.asarray(vec[off:off + n]).reshape(s)
            off += n
        return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _unpack(bucket: Bucket, vec):
    out, off = [], 0
    for s, n in zip(bucket.shapes, bucket.sizes):
        out.append(jax.lax.slice(vec, (off,), (off + n,)).reshape(s))
        off += n
    return tuple(out)


def _unpack_fwd(bucket, vec):
    return _unpack(bucket, vec), None


def _unpack_bwd(bucket, _, cts):
    flat = [ct.reshape(-1) for ct in cts]
    pad = bucket.padded - bucket.numel
    if pad:
        flat.append(jnp.zeros((pad,), flat[0].dtype))
    return (jnp.concatenate(flat),)


_unpack.defvjp(_unpack_fwd, _unpack_bwd)


def make_bucket(flat: dict, keys, n_shards: int, leading_split: int = 1) -> Bucket:
    """Bucket over ``keys``; ``leading_split`` divides every leaf's leading dim (expert parallelism)."""
    shapes = []
    for k in keys:
        s = tuple(np.shape(flat[k]))
        if leading_split > 1:
            assert s[0] % leading_split == 0, (k, s, leading_split)
            s = (s[0] // leading_split,) + s[1:]
        shapes.append(s)
    return Bucket(tuple(keys), tuple(shapes), n_shards)


def gather(comm, shard, axis_name, dtype, name=None):
    """fp32 shard (k,) -> gathered flat vector (n*k,) in the communication dtype."""
    return comm.all_gather(shard.astype(dtype), axis_name, axis=0, tiled=True, name=name)


def reduce_scatter(comm, grad, axis_name, name=None, capacity=None):
    """Gradient of the gathered vector (n*k,) -> this device's summed shard (k,), in grad's dtype."""
    return comm.psum_scatter(grad, axis_name, scatter_dimension=0, tiled=True, name=name, capacity=capacity)
