"""Writes the fuzzers' seed inputs into tests/fuzz/corpus/{decode,roundtrip}/ (deterministic).

  python tests/fuzz/make_corpus.py        # with the zipccl_jax extension installed

decode/: one control byte (0: take the dtype from the frame) followed by a valid frame. The frames cover the
golden-vector inputs named in FORMAT.md (empty bfloat16, one 1.0, [0, 0, 1.5, -2], a 4096-element bfloat16 ramp,
float32 up-cast bfloat16 -> LOW16) and every block mode and decoder path (format version 2): HUFF with short
and long codes and with all 256 exponents plus zero, one to four segments and partial segments and steps, sparse
and all-zero-segment blocks, RAW, CONST, multi-block frames, each dtype, with and without the checksum.
roundtrip/: [ctl0][ctl1][element bytes] as roundtrip_fuzzer.cc describes (dtype bits 3: float8_e4m3fn).
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

from zipccl_jax import _zipccl
from zipccl_jax import format as fmt

HERE = Path(__file__).resolve().parent
BF16 = np.dtype(ml_dtypes.bfloat16)
CODES = {np.dtype(d): c for d, c in fmt.DTYPE_CODES.items()}
E4M3FN, E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)


def frame(x, checksum=False) -> bytes:
  x = np.ascontiguousarray(x)
  code = CODES[x.dtype]
  cap = _zipccl.max_encoded_bytes(x.size, code)
  out = np.zeros(cap, np.uint8)
  n = _zipccl.encode_host(x.view(np.uint8).reshape(-1), x.size, code, checksum, out)
  assert n <= cap
  return out[:n].tobytes()


def decode_seeds() -> dict[str, bytes]:
  rng = np.random.default_rng(20261122)
  g = lambda n, dt, s=1.0: (rng.standard_normal(n) * s).astype(np.float32).astype(dt)
  seeds = {
      "golden_empty_bf16": np.zeros(0, BF16),
      "golden_one_bf16": np.array([1.0], BF16),
      "golden_small_bf16": np.array([0, 0, 1.5, -2], BF16),
      "golden_ramp4096_bf16": np.linspace(-1, 1, 4096, dtype=np.float32).astype(BF16),
      "golden_upcast_f32_low16": g(3000, BF16).astype(np.float32),
      "gauss_f16_3000": g(3000, np.float16),
      "gauss_f32_2500": g(2500, np.float32),
      "gauss_bf16_40000_3segments": g(40000, BF16),
      "sparse_bf16_5000": np.where(rng.random(5000) < 0.5, 0, g(5000, np.float32)).astype(BF16),
      "zero_segment_bf16": np.concatenate([np.zeros(16384, BF16), g(2100, BF16)]),
      "raw_bits_bf16_600": rng.integers(0, 1 << 16, 600, dtype=np.uint16).view(BF16),
      "raw_bits_f32_300": rng.integers(0, 1 << 32, 300, dtype=np.uint32).view(np.float32),
      "const_bf16_5000": np.full(5000, 3.0, BF16),
      "const_f16_neg_zero": np.full(777, -0.0, np.float16),
      "nan_payloads_bf16": (np.uint16(0x7F80) | rng.integers(1, 128, 1000, dtype=np.uint16)
                            | (rng.integers(0, 2, 1000, dtype=np.uint16) << 15)).view(BF16),
      "twoblocks_const_huff_bf16": np.concatenate([np.zeros(65536, BF16), g(2100, BF16)]),
      "threeblocks_const_const_raw_f16": np.concatenate(
          [np.full(65536, 1.0, np.float16), np.full(65536, -2.0, np.float16),
           rng.integers(0, 1 << 16, 100, dtype=np.uint16).view(np.float16)]),
  }
  # Every exponent value in use plus zeros: codes of up to 11 bits.
  e = np.where(rng.random(6000) < 0.9, 127, rng.integers(0, 256, 6000))
  e[:256] = np.arange(256)
  m = rng.integers(0, 128, 6000)
  s = rng.integers(0, 2, 6000)
  v = ((s << 15) | (e << 7) | m).astype(np.uint16)
  v[256:400] = 0
  seeds["all_exponents_bf16_u16path"] = v.view(BF16)
  # One-byte floats: the symbol is the whole byte. Every bit pattern in a HUFF block, a zero segment, RAW,
  # CONST, two blocks, and one HUFF frame of each other float8 variant.
  fp8 = np.clip(np.round(rng.normal(12, 1.5, 9000)), 0, 15).astype(np.uint8) << 3
  fp8 |= rng.integers(0, 8, 9000, dtype=np.uint8) | (rng.integers(0, 2, 9000, dtype=np.uint8) << 7)
  fp8[:256] = np.arange(256)
  seeds["fp8_e4m3fn_all_patterns_huff"] = fp8.view(E4M3FN)
  seeds["fp8_e5m2_zero_segment"] = np.concatenate([np.zeros(16384, np.uint8), fp8[:3000]]).view(E5M2)
  seeds["fp8_e5m2_raw_bits_700"] = rng.integers(0, 256, 700, dtype=np.uint8).view(E5M2)
  seeds["fp8_e4m3fn_const_nan"] = np.full(900, 0x7F, np.uint8).view(E4M3FN)
  seeds["fp8_e4m3fn_twoblocks"] = np.concatenate([fp8, fp8[:100]] * 8)[:70000].view(E4M3FN)
  for dt in fmt.FP8_DTYPES[2:]:
    seeds[f"fp8_{dt.name.removeprefix('float8_')}_huff"] = fp8[:2500].view(dt)
  out = {}
  for name, x in seeds.items():
    out[name] = b"\x00" + frame(x)
    if name.startswith(("gauss", "golden_ramp", "twoblocks", "all_exponents", "fp8_e4m3fn_all")):
      out[name + "_checksum"] = b"\x00" + frame(x, checksum=True)
  return out


def roundtrip_seeds() -> dict[str, bytes]:
  rng = np.random.default_rng(7)
  out = {}
  for dt_bits, dt_name in ((0, "bf16"), (1, "f16"), (2, "f32")):
    for mode in range(4):
      for cap_mode in (0, 2):
        ctl0 = dt_bits | (mode << 3) | (cap_mode << 5) | (4 if mode == 1 else 0)
        data = rng.integers(0, 256, 2048 + 37 * mode, dtype=np.uint8).tobytes()
        out[f"{dt_name}_mode{mode}_cap{cap_mode}"] = bytes([ctl0, 17]) + data
    # long inputs: two blocks
    out[f"{dt_name}_long"] = bytes([0x80 | (1 << 3) | dt_bits, 5]) + rng.integers(
        0, 256, 1500, dtype=np.uint8).tobytes()
  out["tiny_capacity"] = bytes([(3 << 5) | (1 << 3), 20]) + bytes(range(64))
  out["empty"] = bytes([0, 0])
  rng = np.random.default_rng(8)  # float8_e4m3fn (dtype bits 3), apart so the seeds above stay as they were
  for mode in range(4):
    ctl0 = 3 | (mode << 3) | (4 if mode == 1 else 0)
    out[f"f8_mode{mode}"] = bytes([ctl0, 29]) + rng.integers(0, 256, 3000, dtype=np.uint8).tobytes()
  out["f8_long_overflow"] = bytes([0x80 | (2 << 5) | (1 << 3) | 3, 9]) + rng.integers(
      0, 256, 1500, dtype=np.uint8).tobytes()
  return out


def main() -> int:
  for sub, seeds in (("decode", decode_seeds()), ("roundtrip", roundtrip_seeds())):
    d = HERE / "corpus" / sub
    d.mkdir(parents=True, exist_ok=True)
    for old in d.iterdir():
      old.unlink()
    for name, blob in seeds.items():
      (d / name).write_bytes(blob)
    total = sum(len(b) for b in seeds.values())
    digest = hashlib.sha256(b"".join(seeds[k] for k in sorted(seeds))).hexdigest()[:12]
    print(f"{sub}: {len(seeds)} seeds, {total} bytes, sha256 {digest}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
