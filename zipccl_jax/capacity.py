"""Per-chunk capacity of the padded transport: expected ratios, `padded_capacity`, `capacity=`.

A coded chunk travels in exactly `C` bytes on the padded transport; a frame that does not fit
takes the raw fallback (see `_exchange`). This module turns the collectives' `capacity=`
option into that `C`.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from zipccl_jax import format as fmt

__all__ = ["EXPECTED_RATIO", "CODED_DTYPES", "padded_capacity", "resolve_capacity",
           "split_capacity", "piece_bounds", "piece_capacities"]

CODED_DTYPES = fmt.SUPPORTED_DTYPES
_BF16, _F16, _F32 = CODED_DTYPES[:3]


def _f8(name: str) -> np.dtype:
  return np.dtype(getattr(ml_dtypes, name))

# Expected coded size as a fraction of the raw bytes, with a margin (see
# padded_capacity). "activation": forward activations and parameters
# (near-Gaussian); "gradient": gradients and cotangents (heavier tails), used by
# psum_scatter, psum and every backward collective.
# One-byte floats: max over 64K-element chunks of shared/corpus and tests/data cast with
# per-tensor amax scaling (e4m3fn 0.864, e5m2 0.736, e4m3 0.861, e3m4 0.928, e8m0fnu 0.362;
# the fnuz variants as their fn siblings), rounded up; gradients get 0.02 more.
_F8_ACTIVATION = {"float8_e4m3fn": 0.87, "float8_e5m2": 0.74, "float8_e4m3fnuz": 0.87,
                  "float8_e5m2fnuz": 0.74, "float8_e4m3b11fnuz": 0.87, "float8_e4m3": 0.87,
                  "float8_e3m4": 0.93, "float8_e8m0fnu": 0.40}
EXPECTED_RATIO = {
    "activation": {_BF16: 0.70, _F16: 0.86, _F32: 0.85,
                   **{_f8(k): r for k, r in _F8_ACTIVATION.items()}},
    "gradient": {_BF16: 0.74, _F16: 0.88, _F32: 0.86,
                 **{_f8(k): min(1.0, r + 0.02) for k, r in _F8_ACTIVATION.items()}},
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

  ==============  =======================================  =======  ========
  dtype           measured (max over chunks)               act.     gradient
  ==============  =======================================  =======  ========
  bfloat16        Gaussian 0.664-0.670, activations and    0.70     0.74
                  params <= 0.69 (MoE expert_out 0.725),
                  activation grads <= 0.714, weight
                  grads <= 0.704 (lm_head 0.740)
  float16         Gaussian 0.845-0.857                     0.86     0.88
  float32         Gaussian 0.832, corpus <= 0.841          0.85     0.86
  float8_e4m3fn   corpus (amax-scaled) <= 0.864            0.87     0.89
  float8_e5m2     corpus (amax-scaled) <= 0.736            0.74     0.76
  ==============  =======================================  =======  ========

  The other float8 variants follow ``_F8_ACTIVATION``.

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
                    f"supported: {fmt.SUPPORTED_NAMES}")
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


def piece_bounds(m: int, pieces: int) -> list[tuple[int, int]]:
  """`[lo, hi)` column ranges of `pieces` near-equal pieces of an `m`-element chunk (the first
  ``m % pieces`` one element longer); `pieces` is clamped to [1, max(m, 1)]."""
  k = max(1, min(int(pieces), max(int(m), 1)))
  base, extra = divmod(int(m), k)
  out, lo = [], 0
  for i in range(k):
    hi = lo + base + (i < extra)
    out.append((lo, hi))
    lo = hi
  return out


def piece_capacities(capacity: int, m: int, pieces: int, dtype) -> list[tuple[int, int, int]]:
  """``(lo, hi, capacity)`` of each piece of a chunk of `m` elements coded in `pieces` frames.

  Each piece gets its share of the chunk's payload bytes (``capacity`` less the header and the
  per-block slack), plus a header and the slack of its own blocks, rounded up to 8 bytes::

    C_k = round_up_8(32 + ceil((C - 32 - 64 * blocks(m)) * m_k / m) + 64 * blocks(m_k))

  so K pieces cost about ``(K - 1) * 32`` bytes more than one frame. ``pieces == 1`` is
  ``[(0, m, capacity)]`` exactly.
  """
  dt = np.dtype(dtype)
  bounds = piece_bounds(m, pieces)
  if len(bounds) == 1:
    return [(0, int(m), int(capacity))]
  body = max(0, int(capacity) - fmt.FRAME_HEADER_BYTES - BLOCK_SLACK_BYTES * fmt.num_blocks(m))
  out = []
  for lo, hi in bounds:
    mk = hi - lo
    c = (fmt.FRAME_HEADER_BYTES + math.ceil(body * mk / m)
         + BLOCK_SLACK_BYTES * fmt.num_blocks(mk))
    c = min(-(-c // 8) * 8, fmt.max_encoded_bytes(mk, dt))
    out.append((lo, hi, int(max(c, fmt.FRAME_HEADER_BYTES))))
  return out
