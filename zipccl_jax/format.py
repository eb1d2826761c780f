"""Wire-format constants and size bounds, mirrored from xla_ffi/codec/format.h.

tests/test_format.py checks every constant here against the compiled extension,
so the Python side can compute static shapes without calling into C++.
"""

from __future__ import annotations

import numpy as np
import ml_dtypes

MAGIC = 0x4C43435A  # b"ZCCL" read as a little-endian u32
VERSION = 2
FRAME_HEADER_BYTES = 32
DIR_ENTRY_BYTES = 4
BLOCK_HEADER_BYTES = 8
BLOCK_LOG2 = 16
BLOCK_ELEMS = 1 << BLOCK_LOG2
SEGMENT_LOG2 = 14                      # a HUFF block's segments: one GPU warp's work
SEGMENT_ELEMS = 1 << SEGMENT_LOG2      # 16,384 elements
LANES = 32                             # lane l of a segment codes elements 32 t + l
UNIT_BITS = 16                         # a lane's bits are read 16 at a time
SEG_DIR_ENTRY_BYTES = 4                # u16 seg_units, u16 seg_nnz
MAX_CODE_LEN = 11
NUM_SYMBOLS = 257
ZERO_SYMBOL = 256
FLAG_CHECKSUM = 0x01
BLOCK_FLAG_LOW16 = 0x01
CHECKSUM_SEED = 0
MODE_RAW, MODE_CONST, MODE_HUFF = 0, 1, 2
# The header's u64 little-endian `frame_bytes` field occupies bytes [FRAME_BYTES_OFFSET,
# FRAME_BYTES_OFFSET + FRAME_BYTES_WIDTH); an overflowed frame stores its needed size there.
FRAME_BYTES_OFFSET = 16
FRAME_BYTES_WIDTH = 8
# Bytes each 65536-element block adds to a frame beyond its data: directory entry + block header.
PER_BLOCK_BYTES = DIR_ENTRY_BYTES + BLOCK_HEADER_BYTES
# The bits of the quiet NaN that fills a rejected frame's output row (decode with a status
# result), per dtype; the same on CPU and CUDA.
REJECTED_FILL_BF16 = 0x7FC0
REJECTED_FILL_F16 = 0x7E00
REJECTED_FILL_F32 = 0x7FC00000

DTYPE_BF16, DTYPE_F16, DTYPE_F32 = 1, 2, 3
# One-byte floats (FORMAT.md "Symbols": the symbol is the whole byte, no raw bytes).
DTYPE_F8E4M3FN, DTYPE_F8E5M2 = 4, 5
DTYPE_F8E4M3FNUZ, DTYPE_F8E5M2FNUZ, DTYPE_F8E4M3B11FNUZ = 6, 7, 8
DTYPE_F8E4M3, DTYPE_F8E3M4, DTYPE_F8E8M0FNU = 9, 10, 11
DTYPE_CODES = {
    np.dtype(ml_dtypes.bfloat16): DTYPE_BF16,
    np.dtype(np.float16): DTYPE_F16,
    np.dtype(np.float32): DTYPE_F32,
    np.dtype(ml_dtypes.float8_e4m3fn): DTYPE_F8E4M3FN,
    np.dtype(ml_dtypes.float8_e5m2): DTYPE_F8E5M2,
    np.dtype(ml_dtypes.float8_e4m3fnuz): DTYPE_F8E4M3FNUZ,
    np.dtype(ml_dtypes.float8_e5m2fnuz): DTYPE_F8E5M2FNUZ,
    np.dtype(ml_dtypes.float8_e4m3b11fnuz): DTYPE_F8E4M3B11FNUZ,
    np.dtype(ml_dtypes.float8_e4m3): DTYPE_F8E4M3,
    np.dtype(ml_dtypes.float8_e3m4): DTYPE_F8E3M4,
    np.dtype(ml_dtypes.float8_e8m0fnu): DTYPE_F8E8M0FNU,
}
SUPPORTED_DTYPES = tuple(DTYPE_CODES)
SUPPORTED_NAMES = ", ".join(dt.name for dt in SUPPORTED_DTYPES)
FP8_DTYPES = tuple(dt for dt in SUPPORTED_DTYPES if dt.itemsize == 1)
# Rejected-frame fill of the one-byte floats: a NaN each (the fnuz types have only 0x80).
REJECTED_FILL_F8E4M3FN, REJECTED_FILL_F8E5M2, REJECTED_FILL_F8FNUZ = 0x7F, 0x7E, 0x80
REJECTED_FILL_F8E4M3, REJECTED_FILL_F8E3M4, REJECTED_FILL_F8E8M0FNU = 0x7C, 0x78, 0xFF
REJECTED_FILL = {  # dtype code -> the bits of every element of a rejected frame
    DTYPE_BF16: REJECTED_FILL_BF16, DTYPE_F16: REJECTED_FILL_F16, DTYPE_F32: REJECTED_FILL_F32,
    DTYPE_F8E4M3FN: REJECTED_FILL_F8E4M3FN, DTYPE_F8E5M2: REJECTED_FILL_F8E5M2,
    DTYPE_F8E4M3FNUZ: REJECTED_FILL_F8FNUZ, DTYPE_F8E5M2FNUZ: REJECTED_FILL_F8FNUZ,
    DTYPE_F8E4M3B11FNUZ: REJECTED_FILL_F8FNUZ, DTYPE_F8E4M3: REJECTED_FILL_F8E4M3,
    DTYPE_F8E3M4: REJECTED_FILL_F8E3M4, DTYPE_F8E8M0FNU: REJECTED_FILL_F8E8M0FNU,
}
# dtype -> rejected-frame fill bits (what codec.REJECTED_FILL_BITS re-exports)
REJECTED_FILL_BITS = {dt: REJECTED_FILL[code] for dt, code in DTYPE_CODES.items()}


def dtype_code(dtype, *, arg: str = "dtype") -> int:
  """The format's dtype byte; TypeError naming `arg` for anything unsupported."""
  dt = np.dtype(dtype)
  try:
    return DTYPE_CODES[dt]
  except KeyError:
    what = f"dtype={dt.name} is" if arg == "dtype" else f"{arg} has dtype {dt.name}, which is"
    raise TypeError(
        f"zipccl_jax: {what} not coded; the codec codes {SUPPORTED_NAMES} "
        "(send other dtypes through jax.lax directly)") from None


def num_blocks(n_elems: int) -> int:
  return (int(n_elems) + BLOCK_ELEMS - 1) >> BLOCK_LOG2


def max_encoded_bytes(n_elems: int, dtype) -> int:
  """Largest frame, in bytes, for `n_elems` elements of `dtype` (all blocks RAW).

  That is raw size + 32 bytes + 12 bytes per 65536 elements (<= 0.01% for
  bfloat16 beyond one block).

  >>> max_encoded_bytes(1024, "bfloat16")
  2092
  """
  n = int(n_elems)
  if n < 0:
    raise ValueError(f"zipccl_jax: n_elems must be >= 0, got {n}")
  width = np.dtype(dtype).itemsize
  dtype_code(dtype)
  return FRAME_HEADER_BYTES + num_blocks(n) * PER_BLOCK_BYTES + n * width
