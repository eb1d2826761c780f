"""Per-chunk capacity of the padded transport: expected ratios, `padded_capacity`, `capacity=`.

A coded chunk travels in exactly `C` bytes on the padded transport; a frame that does not fit
takes the raw fallback (see `_exchange`). This module turns the collectives' `capacity=`
option into that `C`.
"""

from __future__ import annotations

import math

import numpy as np

from zipccl_jax import format as fmt

__all__ = ["EXPECTED_RATIO", "CODED_DTYPES", "padded_capacity", "resolve_capacity",
           "split_capacity"]

CODED_DTYPES = fmt.SUPPORTED_DTYPES
_BF16, _F16, _F32 = CODED_DTYPES

# Expected coded size as a fraction of the raw bytes, with a margin (see
# padded_capacity). "activation": forward activations and parameters
# (near-Gaussian); "gradient": gradients and cotangents (heavier tails), used by
# psum_scatter, psum and every backward collective.
EXPECTED_RATIO = {
    "activation": {_BF16: 0.70, _F16: 0.86, _F32: 0.85},
    "gradient": {_BF16: 0.74, _F16: 0.88, _F32: 0.86},
}
# Slack per 65536-element block, in bytes, beyond the ratio: covers the frame header and the
# per-block tables (fmt.PER_BLOCK_BYTES = 12 of them) of small chunks.
BLOCK_SLACK_BYTES = 64


def padded_capacity(n_elems: int, dtype, *, ratio: float | None = None,
                    kind: str = "activation") -> int:
  """Static per-chunk capacity ``C(n, dtype)`` in bytes for the padded transport.

  ::

    C = min(max_encoded_bytes(n, dtype),
            round_up_8(32 + ceil(ratio * n * itemsize) + 64 * ceil(n / 65536)))

  ``ratio`` defaults to ``EXPECTED_RATIO[kind][dtype]``, the codec's size as
  a fraction of the raw size plus a margin, measured per 64K-element chunk on
  Gaussian data and on shared/corpus:

  ============  =====================================  =======  ========
  dtype         measured (max over chunks)             act.     gradient
  ============  =====================================  =======  ========
  bfloat16      Gaussian 0.664-0.670, activations and  0.70     0.74
                params <= 0.69 (MoE expert_out 0.725),
                activation grads <= 0.714, weight
                grads <= 0.704 (lm_head 0.740)
  float16       Gaussian 0.845-0.857                   0.86     0.88
  float32       Gaussian 0.832, corpus <= 0.841        0.85     0.86
  ============  =====================================  =======  ========

  ``kind="gradient"`` is used by ``psum_scatter``, ``psum`` and all backward
  collectives. The ``64 * blocks`` term covers the header and per-block
  tables of small chunks. Chunks that code larger than ``C`` take the raw
  fallback, so a tighter ``C`` saves more wire bytes on typical data at the
  price of more fallbacks on atypical data; pass ``capacity=`` per call site
  to calibrate.

  >>> padded_capacity(1024, "bfloat16")
  1536
  """
  n = int(n_elems)
  dt = np.dtype(dtype)
  if dt not in CODED_DTYPES:
    raise TypeError(f"zipccl_jax: padded_capacity: dtype {dt.name} is not coded; "
                    "supported: bfloat16, float16, float32")
  if kind not in EXPECTED_RATIO:
    raise ValueError(f"zipccl_jax: kind must be one of {sorted(EXPECTED_RATIO)}, got {kind!r}")
  r = EXPECTED_RATIO[kind][dt] if ratio is None else float(ratio)
  if not r > 0:
    raise ValueError(f"zipccl_jax: capacity ratio must be > 0, got {r}")
  blocks = -(-n // fmt.BLOCK_ELEMS)
  c = fmt.FRAME_HEADER_BYTES + math.ceil(r * n * dt.itemsize) + BLOCK_SLACK_BYTES * blocks
  c = -(-c // 8) * 8
  return int(min(c, fmt.max_encoded_bytes(n, dt)))


def resolve_capacity(capacity, n: int, dtype, kind: str = "activation") -> int:
  """The byte capacity for an explicit `capacity=` (None, an int of bytes, a float ratio)."""
  if capacity is None:
    return padded_capacity(n, dtype, kind=kind)
  if isinstance(capacity, bool):
    raise TypeError(f"zipccl_jax: capacity must be an int, a float, 'observed' or None, got {capacity!r}")
  if isinstance(capacity, (int, np.integer)):
    c = int(capacity)
    if c < fmt.FRAME_HEADER_BYTES:
      raise ValueError(f"zipccl_jax: capacity must be >= {fmt.FRAME_HEADER_BYTES} bytes, got {c}")
    return min(c, fmt.max_encoded_bytes(n, dtype))
  if isinstance(capacity, (float, np.floating)):
    return padded_capacity(n, dtype, ratio=float(capacity))
  raise TypeError(f"zipccl_jax: capacity must be an int, a float, 'observed' or None, got {capacity!r}")


def split_capacity(capacity):
  """`capacity` -> (forward, backward): a pair sets the transposed collective's separately."""
  if isinstance(capacity, (tuple, list)):
    if len(capacity) != 2:
      raise ValueError("zipccl_jax: capacity pair must be (forward, backward)")
    return capacity[0], capacity[1]
  return capacity, capacity
