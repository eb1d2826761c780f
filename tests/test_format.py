"""zipccl_jax/format.py mirrors the compiled extension's wire constants and size bound."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import zipccl_jax as zj
from zipccl_jax import format as fmt

from zipccl_jax import _zipccl as ext  # noqa: E402  (a missing build must fail, not skip)

BF16 = np.dtype(ml_dtypes.bfloat16)

# constants format.py defines that the extension does not export: their FORMAT.md values
SPEC_ONLY = {
    "BLOCK_ELEMS": 65536, "SEGMENT_ELEMS": 16384, "SEG_DIR_ENTRY_BYTES": 4, "NUM_SYMBOLS": 257,
    "MODE_RAW": 0, "MODE_CONST": 1, "MODE_HUFF": 2,
    # header field offsets and the per-block bytes (FORMAT.md)
    "FRAME_BYTES_OFFSET": 16, "FRAME_BYTES_WIDTH": 8, "PER_BLOCK_BYTES": 12,
}


def _int_constants():
  return {k: v for k, v in vars(fmt).items()
          if k.isupper() and isinstance(v, int) and not isinstance(v, bool)}


def test_every_constant_matches_extension():
  consts = ext.format_constants()
  mine = _int_constants()
  for name, value in consts.items():
    assert name in mine, f"format.py lacks {name} (extension has {value})"
    assert mine[name] == value, f"{name}: format.py {mine[name]} != extension {value}"
  unchecked = set(mine) - set(consts) - set(SPEC_ONLY)
  assert not unchecked, f"constants neither exported by the extension nor pinned here: {unchecked}"
  for name, value in SPEC_ONLY.items():
    assert mine[name] == value, name


def test_values_follow_format_md():
  assert fmt.MAGIC.to_bytes(4, "little") == b"ZCCL"
  assert fmt.VERSION == 2 and fmt.FRAME_HEADER_BYTES == 32 and fmt.BLOCK_HEADER_BYTES == 8
  assert fmt.BLOCK_ELEMS == 1 << fmt.BLOCK_LOG2 and fmt.SEGMENT_ELEMS == 1 << fmt.SEGMENT_LOG2
  assert (fmt.SEGMENT_LOG2, fmt.LANES, fmt.UNIT_BITS) == (14, 32, 16)    # FORMAT.md "HUFF blocks"
  assert fmt.BLOCK_ELEMS % fmt.SEGMENT_ELEMS == 0 and fmt.SEGMENT_ELEMS % fmt.LANES == 0
  assert fmt.NUM_SYMBOLS == fmt.ZERO_SYMBOL + 1 == 257
  assert fmt.MAX_CODE_LEN == 11 and fmt.CHECKSUM_SEED == 0
  assert (fmt.DTYPE_BF16, fmt.DTYPE_F16, fmt.DTYPE_F32) == (1, 2, 3)
  fp8 = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz",
         "float8_e4m3", "float8_e3m4", "float8_e8m0fnu"]          # FORMAT.md's dtype table, codes 4-11
  assert fmt.DTYPE_CODES == {BF16: 1, np.dtype(np.float16): 2, np.dtype(np.float32): 3,
                             **{np.dtype(getattr(ml_dtypes, n)): 4 + i for i, n in enumerate(fp8)}}
  assert fmt.SUPPORTED_NAMES == "bfloat16, float16, float32, " + ", ".join(fp8)
  assert fmt.FP8_DTYPES == tuple(np.dtype(getattr(ml_dtypes, n)) for n in fp8)


SIZES = [0, 1, 2, 2047, 2048, 65535, 65536, 65537, 1_000_003, (1 << 31) + 5, (1 << 40) + 1]


@pytest.mark.parametrize("dtype", [BF16, np.float16, np.float32, *fmt.FP8_DTYPES],
                         ids=lambda d: np.dtype(d).name)
def test_max_encoded_bytes_matches_extension(dtype):
  code = fmt.dtype_code(dtype)
  w = np.dtype(dtype).itemsize
  for n in SIZES:
    got = fmt.max_encoded_bytes(n, dtype)
    assert got == ext.max_encoded_bytes(n, code), (n, dtype)
    nb = -(-n // 65536)
    assert got == 32 + 12 * nb + n * w                     # FORMAT.md "Size bound"
    assert zj.max_encoded_bytes(n, dtype) == got
  assert fmt.max_encoded_bytes(1024, "bfloat16") == 2092   # the docstring example


def test_max_encoded_bytes_rejects_bad_input():
  with pytest.raises(ValueError, match=">= 0"):
    fmt.max_encoded_bytes(-1, BF16)
  with pytest.raises(TypeError, match="bfloat16, float16, float32"):
    fmt.max_encoded_bytes(10, np.int32)
  with pytest.raises(TypeError, match="bfloat16, float16, float32"):
    fmt.dtype_code(np.float64)


def test_num_blocks():
  assert [fmt.num_blocks(n) for n in (0, 1, 65536, 65537, 3 * 65536)] == [0, 1, 1, 2, 3]
