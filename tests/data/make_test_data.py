#!/usr/bin/env python
"""Regenerates tests/data: corpus slices (*.npy) and golden frames (golden.json).

    python tests/data/make_test_data.py [--corpus DIR] [--golden-only]

- Corpus slices: small contiguous slices of the training-tensor corpus (DIR
  defaults to $CORPUS_ROOT, else ../shared/corpus next to the repository), so
  the tests never need the corpus itself. `*.bf16.npy` hold bfloat16 bit
  patterns as uint16, as in the corpus; `*.fp32.npy` hold float32.
- Golden vectors: the inputs that FORMAT.md's "Golden vectors" section names,
  plus a few more (checksum, float16, float32, special values, a CONST + HUFF
  multi-block frame, and the HUFF-vs-RAW size tie of encoder rule 2), with the
  frames produced by the NumPy reference encoder (`zipccl_jax.reference`),
  which follows FORMAT.md. When the compiled extension is importable, every
  frame is checked against the C++ encoder too and the script fails on any
  difference.

Re-running it must leave golden.json unchanged unless the format changed (and
then FORMAT.md's version must change too).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import sys

import ml_dtypes
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))  # the source tree's zipccl_jax.reference, even if not installed

from zipccl_jax import format as fmt  # noqa: E402
from zipccl_jax import reference as ref  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)

# name -> (corpus file, offset in elements, element count, what it exercises)
SLICES = {
    "param_mlp_dense": ("lm_param_mlp_dense.bf16.npy", 1048576, 2 * 65536 + 777,
                        "dense bf16 weight; 3 blocks, the last partial"),
    "act_mlp_post_gelu": ("lm_act_L2_mlp_post_gelu.bf16.npy", 2097152, 32768,
                          "bf16 forward activation"),
    "grad_lm_head": ("lm_grad_lm_head.bf16.npy", 524288, 32768,
                     "heavy-tailed bf16 gradient (excess kurtosis ~500)"),
    "act_moe_dispatch": ("lm_act_L4_moe_dispatch.bf16.npy", (1280 + 600) * 256, 81920,
                         "MoE dispatch buffer, expert 1 rows 600..920: capacity-padding zero rows "
                         "from row 677 (a HUFF block with ZEROs, then an all-zero CONST block)"),
    "act_moe_expert_out": ("lm_act_L4_moe_expert_out.bf16.npy", (1280 + 640) * 256, 32768,
                           "MoE expert output with constant (bias-only) rows from row 678"),
    "grad_embedding": ("lm_grad_embedding.bf16.npy", 262144, 32768,
                       "embedding gradient, ~89% exact zeros"),
    "grad_attn_fp32": ("lm_grad_attn.fp32.npy", 786432, 32768, "fp32 gradient"),
    "grad_embedding_fp32": ("lm_grad_embedding.fp32.npy", 262144, 32768,
                            "fp32 embedding gradient, ~89% exact zeros"),
}


def _corpus_dir(arg: str | None) -> pathlib.Path:
  if arg:
    return pathlib.Path(arg)
  if os.environ.get("CORPUS_ROOT"):
    return pathlib.Path(os.environ["CORPUS_ROOT"])
  return REPO.parent / "shared" / "corpus"


def _bits(x: np.ndarray) -> np.ndarray:
  return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def make_slices(corpus: pathlib.Path) -> list[dict]:
  tensors = corpus / "tensors" if (corpus / "tensors").is_dir() else corpus
  out = []
  for name, (src, offset, count, note) in SLICES.items():
    arr = np.load(tensors / src, mmap_mode="r").reshape(-1)
    part = np.array(arr[offset:offset + count])
    assert part.size == count, (name, part.size)
    suffix = ".bf16.npy" if src.endswith(".bf16.npy") else ".fp32.npy"
    fname = name.removesuffix("_fp32") + suffix
    np.save(HERE / fname, part)
    x = part.view(BF16) if suffix == ".bf16.npy" else part
    out.append(dict(
        name=name, file=fname, source=src, offset=offset, count=count,
        dtype="bfloat16" if suffix == ".bf16.npy" else "float32", note=note,
        sha256=hashlib.sha256(part.tobytes()).hexdigest()[:16],
        zero_fraction=round(float(np.mean(_bits(x) == 0)), 4),
        reference_frame_bytes=len(ref.encode(x))))
    print(f"  {fname:32s} {count:7d} elements, ratio {x.nbytes / out[-1]['reference_frame_bytes']:.3f}")
  return out


def _tie_walk(top: int, target: str, want_delta: int) -> np.ndarray:
  """A 2048-element bf16 block, exponent symbols 0..top-1, whose HUFF coding is RAW size +
  want_delta, found by a deterministic walk that skews a flat histogram one element at a time."""
  m = 2048
  counts = np.zeros(fmt.NUM_SYMBOLS, np.int64)
  counts[:top] = m // top
  counts[0] += m - int(counts.sum())
  rng = np.random.default_rng(20261122)
  raw_size = fmt.BLOCK_HEADER_BYTES + 2 * m
  for _ in range(20000):
    sym = np.repeat(np.arange(fmt.NUM_SYMBOLS), counts).astype(np.uint16)
    raw = (np.arange(m) * 37 % 256).astype(np.uint8).reshape(-1, 1)
    u = ref.merge_symbols(sym, raw, fmt.DTYPE_BF16)
    if len(ref._huff_block(u, fmt.DTYPE_BF16)) == raw_size + want_delta:
      return u.view(BF16)
    src = rng.integers(top // 2, top)
    if counts[src] > 1:
      counts[src] -= 1
      counts[rng.integers(0, top // 4)] += 1
  raise RuntimeError(f"no block for {target} found")


def _tie_inputs() -> dict[str, np.ndarray]:
  """Encoder rule 2's strict `<`: a block whose HUFF coding is exactly RAW size (-> RAW) and
  one whose coding is one byte smaller (-> HUFF). Units come in pairs of bytes, and all but
  one element (the first, +0: ZERO) have a raw byte, so the table's size sets the parity: 256
  symbols (a table of 131 bytes) reach RAW, 255 (130 bytes) reach RAW - 1."""
  return {"huff_raw_tie_bf16": _tie_walk(256, "huff_raw_tie_bf16", 0),
          "huff_one_byte_under_raw_bf16": _tie_walk(255, "huff_one_byte_under_raw_bf16", -1)}


def golden_inputs() -> list[tuple[str, np.ndarray, bool, str]]:
  rng = np.random.default_rng(2026)
  special = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x0001, 0x807F,
                      0x0080, 0x3F80, 0xBF80, 0x7F7F, 0xFF7F, 0x0040, 0x8001], np.uint16)
  cases = [
      ("empty_bf16", np.zeros(0, BF16), False, "FORMAT.md: the empty bfloat16 array"),
      ("one_bf16", np.array([1.0], BF16), False, "FORMAT.md: one bfloat16 1.0 (CONST block)"),
      ("small_bf16", np.array([0, 0, 1.5, -2], BF16), False,
       "FORMAT.md: [0, 0, 1.5, -2] in bfloat16 (RAW: too short for HUFF to pay off)"),
      ("ramp_bf16_4096", np.linspace(-4, 4, 4096, dtype=np.float32).astype(BF16), False,
       "FORMAT.md: a 4096-element bfloat16 ramp (one segment of 128 steps)"),
      ("upcast_f32_1000", rng.normal(size=1000).astype(BF16).astype(np.float32), False,
       "FORMAT.md: float32 up-cast bfloat16 values (HUFF + LOW16)"),
      ("zeros_mixed_bf16_192", np.tile(np.array([0, 0, 1.5, -2, 0, 1.5], BF16), 32), False,
       "HUFF with the ZERO symbol (3 symbols, 1-3 bit codes; 6 steps of 32 lanes, a unit each)"),
      ("small_bf16_checksum", np.array([0, 0, 1.5, -2], BF16), True, "CHECKSUM flag + XXH32"),
      ("ramp_f16_300", np.linspace(-2, 2, 300, dtype=np.float32).astype(np.float16), False,
       "float16 HUFF"),
      ("normal_f32_300", rng.normal(size=300).astype(np.float32), False,
       "float32 HUFF without LOW16 (3 raw bytes)"),
      ("special_bf16", special.view(BF16), False, "±0, ±Inf, NaN payloads, subnormals, extremes"),
      ("random_bits_f16_64", rng.integers(0, 1 << 16, 64, dtype=np.uint16).view(np.float16),
       False, "random bits: RAW fallback"),
      ("const_then_huff_bf16", np.concatenate(
          [np.full(65536, -0.5, BF16), np.linspace(-1, 1, 100, dtype=np.float32).astype(BF16)]),
       False, "two blocks: CONST then HUFF (block directory with 2 entries)"),
  ]
  for name, x in _tie_inputs().items():
    cases.append((name, x, False, "encoder rule 2: HUFF only if strictly smaller than RAW"))
  return cases + _fp8_inputs()


def _fp8_inputs() -> list[tuple[str, np.ndarray, bool, str]]:
  """One-byte dtypes: the symbol is rotl8 of the whole byte, ZERO for +0, no raw bytes."""
  rng = np.random.default_rng(2027)
  e4, e5 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)

  def amax(n, dt, zeros=0.0):  # per-tensor amax scaling, as FP8 training casts
    x = rng.normal(size=n)
    x[rng.random(n) < zeros] = 0
    return (x * (float(ml_dtypes.finfo(dt).max) / np.abs(x).max())).astype(dt)

  every = np.arange(256, dtype=np.uint8)
  cases = [
      ("fp8_e4m3fn_all_patterns", every.view(e4), False,
       "every float8_e4m3fn bit pattern once (NaNs, ±0, subnormals): RAW"),
      ("fp8_e5m2_all_patterns_huff",
       np.concatenate([_bits(amax(2500, e5)), every]).view(e5), False,
       "every float8_e5m2 bit pattern (±Inf, NaNs, ±0, subnormals) inside a HUFF block"),
      ("fp8_e4m3fn_amax_3000", amax(3000, e4, zeros=0.25), False,
       "float8_e4m3fn, amax-scaled Gaussian with 25% zeros: HUFF, one segment, no raw region"),
      ("fp8_e5m2_amax_checksum", amax(700, e5), True, "float8_e5m2 HUFF + CHECKSUM"),
      ("fp8_e5m2_const_neg_inf", np.full(100, 0xFC, np.uint8).view(e5), False,
       "float8_e5m2 CONST -Inf (value zero-extended from one byte)"),
      ("fp8_e4m3fn_const_then_huff", np.concatenate(
          [np.full(65536, 0x80, np.uint8).view(e4), amax(3000, e4)]), False,
       "two blocks: CONST -0, then HUFF"),
  ]
  for name in ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float8_e4m3",
               "float8_e3m4", "float8_e8m0fnu"):
    dt = np.dtype(getattr(ml_dtypes, name))
    skewed = np.concatenate([np.repeat(every[::17], 100), every]).view(dt)
    cases.append((f"fp8_{name.removeprefix('float8_')}_skewed", skewed, False,
                  f"{name}: every bit pattern, HUFF"))
  return cases


def _segments(x: np.ndarray) -> list[list]:
  """Run-length form [[hex of one element, repeat], ...] so long constant runs stay small."""
  b = _bits(x.reshape(-1))
  if b.size == 0:
    return []
  starts = np.flatnonzero(np.concatenate([[True], b[1:] != b[:-1]]))
  lens = np.diff(np.append(starts, b.size))
  segs = []
  for s, n in zip(starts.tolist(), lens.tolist()):
    h = x.reshape(-1)[s:s + 1].tobytes().hex()
    if n == 1 and segs and segs[-1][1] == 1:
      segs[-1][0] += h
    else:
      segs.append([h, n])
  return segs


def _load_extension():
  """The compiled extension: the source tree's if built in place, else an installed one."""
  try:
    from zipccl_jax import _zipccl
    return _zipccl
  except ImportError:
    pass
  import glob
  import importlib.util
  for entry in sys.path[1:]:
    if not entry or pathlib.Path(entry).resolve() == REPO:
      continue
    for so in sorted(glob.glob(os.path.join(entry, "zipccl_jax", "_zipccl*.so"))):
      spec = importlib.util.spec_from_file_location("zipccl_jax._zipccl", so)
      mod = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(mod)
      return mod
  return None


def make_golden() -> dict:
  _zipccl = _load_extension()
  if _zipccl is None:
    print("  (extension not importable: golden frames not cross-checked against C++)")
  vectors = []
  for name, x, checksum, note in golden_inputs():
    frame = ref.encode(x, checksum=checksum)
    back = ref.decode(frame, shape=x.shape, dtype=x.dtype)
    assert np.array_equal(_bits(back), _bits(x)), name
    if _zipccl is not None:
      out = np.zeros(fmt.max_encoded_bytes(x.size, x.dtype), np.uint8)
      nb = _zipccl.encode_host(np.ascontiguousarray(x).reshape(-1).view(np.uint8), x.size,
                               fmt.dtype_code(x.dtype), checksum, out)
      if out[:nb].tobytes() != frame:
        raise SystemExit(f"golden vector {name}: C++ and reference frames differ")
    modes = [("RAW", "CONST", "HUFF")[b["mode"]] + ("+LOW16" if b["flags"] else "")
             for b in ref.frame_info(frame)["blocks"]]
    vectors.append(dict(name=name, dtype=x.dtype.name, shape=list(x.shape), checksum=checksum,
                        note=note, block_modes=modes, input_segments=_segments(x),
                        frame_hex=frame.hex()))
    print(f"  {name:32s} {x.size:6d} elements -> {len(frame)} bytes")
  return dict(format_version=fmt.VERSION, generator="tests/data/make_test_data.py",
              vectors=vectors)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--corpus", help="corpus directory (holding tensors/)")
  ap.add_argument("--golden-only", action="store_true", help="keep the existing slices")
  args = ap.parse_args()
  golden_path = HERE / "golden.json"
  old = json.loads(golden_path.read_text()) if golden_path.exists() else {}
  print("golden vectors:")
  golden = make_golden()
  if args.golden_only:  # the slices stay; their reference frame sizes follow the format
    golden["corpus_slices"] = old.get("corpus_slices", [])
    for sl in golden["corpus_slices"]:
      part = np.load(HERE / sl["file"])
      x = part.view(BF16) if sl["file"].endswith(".bf16.npy") else part
      sl["reference_frame_bytes"] = len(ref.encode(x))
  else:
    print("corpus slices:")
    golden["corpus_slices"] = make_slices(_corpus_dir(args.corpus))
  golden_path.write_text(json.dumps(golden, indent=1) + "\n")
  total = sum(p.stat().st_size for p in HERE.iterdir() if p.is_file())
  print(f"wrote {golden_path} ({total / 1e6:.2f} MB in tests/data)")


if __name__ == "__main__":
  main()
