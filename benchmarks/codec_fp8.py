#!/usr/bin/env python
"""zipccl on FP8 tensors: compression ratio and encode/decode speed of float8_e4m3fn and float8_e5m2
against the bfloat16 path on the same tensors, measured in the same run.

Each tensor is cast to FP8 with per-tensor amax scaling (the largest |x| maps to the dtype's largest finite
value, as FP8 training recipes do per tensor) and, for the baseline, to bfloat16. Inputs: the corpus
tensors (`--corpus DIR`, a directory with manifest.json and tensors/; FP32 and BF16 tensors alike) or the
slices bundled in tests/data, plus fresh random tensors (Gaussian, Student-t with 4 degrees of freedom, and
a capacity-padded MoE dispatch buffer with 40% zero rows) that nothing was tuned on.

Timing: the extension's host entry points (the C++ driver the CPU FFI handler calls), single-threaded, into
reused buffers. One repetition codes every tensor once per dtype, interleaving the dtypes, so a noisy
second of the shared machine hits all of them; the table gives the median over --reps repetitions of the
aggregate speed (total bytes / total time) with its min-max spread. Speeds are in GB/s of uncoded input
bytes (FP8 has half the bytes of bfloat16 per element, so Gelem/s is also given). Ratios are byte-weighted
(total raw bytes / total frame bytes). Every round trip is checked bit for bit.

    python benchmarks/codec_fp8.py --corpus /work/shared/corpus --reps 9 --json benchmarks/results/codec_fp8.json
    python benchmarks/codec_fp8.py --reps 3            # tests/data slices + random tensors
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from zipccl_jax import _zipccl as ext
from zipccl_jax import format as fmt

REPO = Path(__file__).resolve().parents[1]
DTYPES = {name: np.dtype(getattr(ml_dtypes, name)) for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")}


def _as_f32(a: np.ndarray, dtype: str) -> np.ndarray:
  if dtype == "bfloat16":
    a = a.view(ml_dtypes.bfloat16)
  return np.asarray(a, np.float32).reshape(-1)


def load_tensors(corpus: Path | None) -> dict[str, np.ndarray]:
  """name -> float32 values, then the random tensors."""
  out = {}
  if corpus is not None:
    for m in json.loads((corpus / "manifest.json").read_text()):
      out[f"{m['name']}.{m['dtype']}"] = _as_f32(np.load(corpus / "tensors" / m["file"]), m["dtype"])
  else:
    for f in sorted((REPO / "tests" / "data").glob("*.npy")):
      out[f.name.removesuffix(".npy")] = _as_f32(np.load(f), "bfloat16" if ".bf16" in f.name else "f32")
  rng = np.random.default_rng(1123)
  out["random_gauss"] = rng.normal(size=1 << 21).astype(np.float32)
  out["random_student_t4"] = rng.standard_t(4, size=1 << 21).astype(np.float32)
  rows = rng.normal(size=(8192, 256)).astype(np.float32)
  rows[rng.random(8192) < 0.4] = 0
  out["random_dispatch_padded"] = rows.reshape(-1)
  return {k: v for k, v in out.items() if np.any(v)}


def cast(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
  if dtype.itemsize == 1:  # per-tensor amax scaling into the FP8 range
    x = x * np.float32(float(ml_dtypes.finfo(dtype).max) / float(np.max(np.abs(x))))
  return x.astype(dtype)


class Coder:
  """One tensor in one dtype, with its buffers allocated once."""

  def __init__(self, x: np.ndarray):
    self.raw = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    self.n, self.code = x.size, fmt.dtype_code(x.dtype)
    self.out = np.zeros(fmt.max_encoded_bytes(x.size, x.dtype), np.uint8)
    self.back = np.zeros_like(self.raw)
    self.nbytes = self.encode()
    self.decode()
    if not np.array_equal(self.back, self.raw):
      raise SystemExit(f"round trip of a {x.dtype.name} tensor is not bit-exact")

  def encode(self) -> int:
    return ext.encode_host(self.raw, self.n, self.code, False, self.out)

  def decode(self) -> None:
    ext.decode_host(self.out[:self.nbytes], self.code, self.n, self.back)


def _timed(fn) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def measure(tensors: dict[str, np.ndarray], reps: int) -> tuple[list[dict], list[dict]]:
  coders = {(name, d): Coder(cast(x, dt)) for name, x in tensors.items() for d, dt in DTYPES.items()}
  per_tensor = []
  for (name, d), c in coders.items():
    elems = c.raw.view({1: np.uint8, 2: np.uint16}[DTYPES[d].itemsize])
    per_tensor.append(dict(tensor=name, dtype=d, elems=c.n, frame_bytes=int(c.nbytes),
                           ratio=round(c.raw.size / c.nbytes, 4),
                           zeros=round(float(np.mean(elems == 0)), 4)))
  enc = {d: [] for d in DTYPES}
  dec = {d: [] for d in DTYPES}
  for _ in range(reps):
    for name in tensors:
      for d in DTYPES:
        c = coders[(name, d)]
        enc[d].append(_timed(c.encode))
        dec[d].append(_timed(c.decode))
  summary = []
  for d, dt in DTYPES.items():
    mine = [c for (_, dd), c in coders.items() if dd == d]
    raw_b = sum(c.raw.size for c in mine)
    elems = sum(c.n for c in mine)
    k = len(tensors)
    enc_rep = [sum(enc[d][r * k:(r + 1) * k]) for r in range(reps)]  # seconds per repetition
    dec_rep = [sum(dec[d][r * k:(r + 1) * k]) for r in range(reps)]
    row = dict(dtype=d, tensors=k, raw_bytes=raw_b, elems=elems,
               frame_bytes=sum(int(c.nbytes) for c in mine),
               ratio=round(raw_b / sum(int(c.nbytes) for c in mine), 4), reps=reps)
    for what, times in (("encode", enc_rep), ("decode", dec_rep)):
      gbps = sorted(raw_b / t / 1e9 for t in times)
      row[f"{what}_GBps_median"] = round(statistics.median(gbps), 3)
      row[f"{what}_GBps_min"] = round(gbps[0], 3)
      row[f"{what}_GBps_max"] = round(gbps[-1], 3)
      row[f"{what}_Gelems_median"] = round(statistics.median(gbps) * elems / raw_b, 3)
    summary.append(row)
  return summary, per_tensor


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--corpus", type=Path, default=None, help="corpus directory (manifest.json, tensors/)")
  p.add_argument("--reps", type=int, default=9)
  p.add_argument("--json", default=None)
  args = p.parse_args(argv)
  tensors = load_tensors(args.corpus)
  summary, per_tensor = measure(tensors, args.reps)
  print(f"{'tensor':40s} " + " ".join(f"{d:>14s}" for d in DTYPES))
  for name in tensors:
    ratios = {r["dtype"]: r["ratio"] for r in per_tensor if r["tensor"] == name}
    print(f"{name:40s} " + " ".join(f"{ratios[d]:14.3f}" for d in DTYPES))
  print(f"\n{'dtype':14s} {'ratio':>7s} {'encode GB/s (min-max)':>24s} {'decode GB/s (min-max)':>24s} "
        f"{'enc Gel/s':>9s} {'dec Gel/s':>9s}")
  for r in summary:
    print(f"{r['dtype']:14s} {r['ratio']:7.3f} "
          f"{r['encode_GBps_median']:8.3f} ({r['encode_GBps_min']:.3f}-{r['encode_GBps_max']:.3f}) "
          f"{r['decode_GBps_median']:8.3f} ({r['decode_GBps_min']:.3f}-{r['decode_GBps_max']:.3f}) "
          f"{r['encode_Gelems_median']:9.3f} {r['decode_Gelems_median']:9.3f}")
  if args.json:
    Path(args.json).write_text(json.dumps(dict(
        command="python benchmarks/codec_fp8.py" + (f" --corpus {args.corpus}" if args.corpus else "")
        + f" --reps {args.reps}", scaling="per-tensor amax", summary=summary, per_tensor=per_tensor),
        indent=1) + "\n")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
