"""XXH32 (xxHash, 32-bit variant, seed 0 by default) in NumPy, written from its public specification.

The checksum of wire format version 2 is built on it (FORMAT.md "Checksum";
`reference.frame_checksum`). Only NumPy: the reference codec and the tests use
it without the compiled extension.
"""

from __future__ import annotations

import numpy as np

__all__ = ["xxh32"]

_P1, _P2, _P3, _P4, _P5 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1
_M32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
  return ((x << r) | (x >> (32 - r))) & _M32


def xxh32(data, seed: int = 0) -> int:
  """XXH32 of `data` (bytes-like or uint8 array) with `seed`."""
  buf = np.frombuffer(bytes(data), np.uint8)
  n = buf.size
  seed &= _M32
  p = 0
  if n >= 16:
    stripes = n // 16
    lanes = buf[:stripes * 16].view("<u4").reshape(stripes, 4).astype(np.uint64)
    lanes = ((lanes * _P2) & _M32).tolist()      # input * PRIME2 mod 2^32, vectorised
    acc = [(seed + _P1 + _P2) & _M32, (seed + _P2) & _M32, seed, (seed - _P1) & _M32]
    a0, a1, a2, a3 = acc
    for l0, l1, l2, l3 in lanes:
      a0 = (_rotl32((a0 + l0) & _M32, 13) * _P1) & _M32
      a1 = (_rotl32((a1 + l1) & _M32, 13) * _P1) & _M32
      a2 = (_rotl32((a2 + l2) & _M32, 13) * _P1) & _M32
      a3 = (_rotl32((a3 + l3) & _M32, 13) * _P1) & _M32
    h = (_rotl32(a0, 1) + _rotl32(a1, 7) + _rotl32(a2, 12) + _rotl32(a3, 18)) & _M32
    p = stripes * 16
  else:
    h = (seed + _P5) & _M32
  h = (h + n) & _M32
  while p + 4 <= n:
    word = int.from_bytes(buf[p:p + 4].tobytes(), "little")
    h = (_rotl32((h + word * _P3) & _M32, 17) * _P4) & _M32
    p += 4
  while p < n:
    h = (_rotl32((h + int(buf[p]) * _P5) & _M32, 11) * _P1) & _M32
    p += 1
  h ^= h >> 15
  h = (h * _P2) & _M32
  h ^= h >> 13
  h = (h * _P3) & _M32
  h ^= h >> 16
  return h
