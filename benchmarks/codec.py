"""Codec benchmark: zipccl against zstd-1, lz4, blosc2 and zipnn on real training tensors.

Every codec runs single-threaded, in this process, on the same bytes, in the same run, so their ratios and
speeds compare directly on a shared, noisy machine. A speed is the best of --reps repetitions (timeit's rule:
this machine is a shared VM whose speed swings 2x from one second to the next, and the fastest repetition is
the one least disturbed), measured the same way for every codec: --reps passes over all tensors, each timing
every codec 3 times back to back. The aggregate row is byte-weighted (total bytes /
total time, total bytes / total compressed bytes). --stat median reports medians instead.

    python benchmarks/codec.py --corpus ../shared/corpus            # the whole corpus
    python benchmarks/codec.py                                      # the slices bundled in tests/data
    python benchmarks/codec.py --corpus DIR --json out.json --codecs zipccl,zstd1

zipccl is timed through the extension's host entry points (the same C++ driver the CPU FFI handler
calls, without XLA's dispatch), writing into reused buffers as the handler does into XLA's; the peers run
through their Python bindings as users call them. Every round trip is checked bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


# ---- inputs ------------------------------------------------------------------
def load_corpus(corpus: Path | None):
  """[(name, dtype_name, raw_bytes(np.uint8), elem_view)] from a corpus dir or tests/data."""
  items = []
  if corpus is not None:
    manifest = json.loads((corpus / "manifest.json").read_text())
    for m in manifest:
      arr = np.load(corpus / "tensors" / m["file"])
      items.append((m["name"], m["dtype"], arr))
  else:
    for f in sorted((REPO / "tests" / "data").glob("*.npy")):
      arr = np.load(f)
      dtype = "bfloat16" if ".bf16" in f.name else "float32" if ".fp32" in f.name else None
      if dtype:
        items.append((f.name.split(".")[0], dtype, arr))
  if not items:
    sys.exit("no tensors found: pass --corpus DIR (a directory with manifest.json and tensors/)")
  out = []
  for name, dtype, arr in items:
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    out.append((name, dtype, raw))
  return out


def exponent_ideal(raw: np.ndarray, dtype: str) -> float:
  """Ratio if the exponent were coded at its entropy and sign + mantissa stored raw."""
  if dtype == "bfloat16":
    e, width = (raw.view(np.uint16) >> 7) & 0xFF, 16
  else:
    e, width = (raw.view(np.uint32) >> 23) & 0xFF, 32
  p = np.bincount(e.astype(np.int64), minlength=256) / e.size
  p = p[p > 0]
  h = float(-(p * np.log2(p)).sum())
  return width / (width - 8 + h)


# ---- codecs --------------------------------------------------------------------
class Codec:
  name = ""

  def compress(self, raw: np.ndarray, dtype: str):
    raise NotImplementedError

  def decompress(self, blob, raw: np.ndarray, dtype: str) -> np.ndarray:
    raise NotImplementedError


class Zipccl(Codec):
  def __init__(self, checksum=False):
    from zipccl_jax import _ffi, format as fmt
    self.ext, self.fmt, self.checksum = _ffi.extension(), fmt, checksum
    self.name = "zipccl+xxh32" if checksum else "zipccl"
    self._out, self._dst = {}, {}

  def _code(self, dtype):
    return self.fmt.DTYPE_BF16 if dtype == "bfloat16" else self.fmt.DTYPE_F32

  def compress(self, raw, dtype):
    width = 2 if dtype == "bfloat16" else 4
    n = raw.size // width
    cap = self.fmt.FRAME_HEADER_BYTES + self.fmt.num_blocks(n) * 12 + raw.size
    out = self._out.get(cap)
    if out is None:
      out = self._out[cap] = np.empty(cap, np.uint8)
    nbytes = self.ext.encode_host(raw, n, self._code(dtype), self.checksum, out)
    return out[:nbytes]

  def decompress(self, blob, raw, dtype):
    # Decode into a reused buffer, as the FFI handler does into XLA's pooled
    # buffers; a fresh allocation would time the kernel's page faults instead.
    width = 2 if dtype == "bfloat16" else 4
    dst = self._dst.get(raw.size)
    if dst is None:
      dst = self._dst[raw.size] = np.empty_like(raw)
    self.ext.decode_host(blob, self._code(dtype), raw.size // width, dst)
    return dst


class Zstd1(Codec):
  name = "zstd-1"

  def __init__(self):
    import zstandard
    self.c = zstandard.ZstdCompressor(level=1, threads=0)
    self.d = zstandard.ZstdDecompressor()

  def compress(self, raw, dtype):
    return self.c.compress(raw.data)

  def decompress(self, blob, raw, dtype):
    return np.frombuffer(self.d.decompress(blob, max_output_size=raw.size), np.uint8)


class Lz4(Codec):
  name = "lz4"

  def __init__(self):
    import lz4.block
    self.m = lz4.block

  def compress(self, raw, dtype):
    return self.m.compress(raw.data, store_size=False)

  def decompress(self, blob, raw, dtype):
    return np.frombuffer(self.m.decompress(blob, uncompressed_size=raw.size), np.uint8)


class Blosc2(Codec):
  name = "blosc2-shuf-zstd1"

  def __init__(self):
    import blosc2
    blosc2.set_nthreads(1)
    self.b = blosc2

  def compress(self, raw, dtype):
    width = 2 if dtype == "bfloat16" else 4
    return self.b.compress2(raw.data, typesize=width, clevel=1, filter=self.b.Filter.SHUFFLE,
                            codec=self.b.Codec.ZSTD, nthreads=1)

  def decompress(self, blob, raw, dtype):
    return np.frombuffer(self.b.decompress2(blob), np.uint8)


class Zipnn(Codec):
  name = "zipnn"

  def __init__(self):
    import warnings
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      import zipnn
    self.z = {d: zipnn.ZipNN(input_format="byte", bytearray_dtype=d, threads=1)
              for d in ("bfloat16", "float32")}

  def compress(self, raw, dtype):
    # zipnn 0.5.4 compresses its input in place: give it a copy.
    return self.z[dtype].compress(bytearray(raw.tobytes()))

  def decompress(self, blob, raw, dtype):
    return np.frombuffer(bytes(self.z[dtype].decompress(blob)), np.uint8)


CODECS = {"zipccl": Zipccl, "zipccl+xxh32": lambda: Zipccl(checksum=True), "zstd1": Zstd1,
          "lz4": Lz4, "blosc2": Blosc2, "zipnn": Zipnn}


# ---- measurement ---------------------------------------------------------------
STAT = {"best": min, "median": statistics.median}


WARM = 3  # back-to-back repetitions per pass: the first warms caches for the others


def run(items, codecs, reps, stat="best"):
  """Times every (tensor, codec) WARM times back to back per pass, over `reps` passes.

  Spreading a pair's repetitions over several passes of the whole set, rather than all back to
  back, keeps one slow second of this shared VM from spoiling all of them.
  """
  enc_t, dec_t, sizes = {}, {}, {}
  for rep in range(reps):
    for name, dtype, raw in items:
      for codec in codecs:
        key = (name, dtype, codec.name)
        for _ in range(WARM):
          t0 = time.perf_counter()
          blob = codec.compress(raw, dtype)
          t1 = time.perf_counter()
          back = codec.decompress(blob, raw, dtype)
          t2 = time.perf_counter()
          enc_t.setdefault(key, []).append(t1 - t0)
          dec_t.setdefault(key, []).append(t2 - t1)
        if rep == 0:
          if not np.array_equal(np.asarray(back, np.uint8).reshape(-1), raw):
            raise SystemExit(f"{codec.name} did not round-trip {name} bit-exactly")
          sizes[key] = len(blob)
  rows = []
  for name, dtype, raw in items:
    ideal = exponent_ideal(raw, dtype)
    for codec in codecs:
      key = (name, dtype, codec.name)
      rows.append(dict(tensor=name, dtype=dtype, codec=codec.name, bytes=int(raw.size),
                       compressed=int(sizes[key]), ratio=raw.size / sizes[key], ideal=ideal,
                       enc_s=STAT[stat](enc_t[key]), dec_s=STAT[stat](dec_t[key])))
  return rows


def summarise(rows):
  """Byte-weighted aggregate per (codec, dtype)."""
  agg = {}
  for r in rows:
    a = agg.setdefault((r["codec"], r["dtype"]), dict(bytes=0, compressed=0, enc_s=0.0, dec_s=0.0,
                                                       enc_gbps=[], dec_gbps=[], n=0))
    a["bytes"] += r["bytes"]
    a["compressed"] += r["compressed"]
    a["enc_s"] += r["enc_s"]
    a["dec_s"] += r["dec_s"]
    a["enc_gbps"].append(r["bytes"] / r["enc_s"] / 1e9)
    a["dec_gbps"].append(r["bytes"] / r["dec_s"] / 1e9)
    a["n"] += 1
  out = []
  for (codec, dtype), a in agg.items():
    out.append(dict(codec=codec, dtype=dtype, tensors=a["n"], ratio=a["bytes"] / a["compressed"],
                    enc_gbps=a["bytes"] / a["enc_s"] / 1e9, dec_gbps=a["bytes"] / a["dec_s"] / 1e9,
                    enc_gbps_median=statistics.median(a["enc_gbps"]),
                    dec_gbps_median=statistics.median(a["dec_gbps"])))
  return out


def print_tables(rows, summary, verbose):
  if verbose:
    print(f"{'tensor':28s} {'dtype':8s} {'codec':18s} {'ratio':>6s} {'%ideal':>7s} "
          f"{'enc GB/s':>9s} {'dec GB/s':>9s}")
    for r in rows:
      print(f"{r['tensor']:28s} {r['dtype']:8s} {r['codec']:18s} {r['ratio']:6.3f} "
            f"{100 * r['ratio'] / r['ideal']:6.1f}% {r['bytes'] / r['enc_s'] / 1e9:9.2f} "
            f"{r['bytes'] / r['dec_s'] / 1e9:9.2f}")
    print()
  ref = {s["dtype"]: s for s in summary if s["codec"] == "zstd-1"}
  print("| codec | dtype | tensors | ratio (byte-weighted) | encode GB/s | decode GB/s | "
        "encode / zstd-1 | decode / zstd-1 |")
  print("|---|---|---:|---:|---:|---:|---:|---:|")
  for s in sorted(summary, key=lambda s: (s["dtype"], -s["ratio"])):
    z = ref.get(s["dtype"])
    re = f"{s['enc_gbps'] / z['enc_gbps']:.2f}x" if z else "-"
    rd = f"{s['dec_gbps'] / z['dec_gbps']:.2f}x" if z else "-"
    print(f"| {s['codec']} | {s['dtype']} | {s['tensors']} | {s['ratio']:.3f} | "
          f"{s['enc_gbps']:.2f} | {s['dec_gbps']:.2f} | {re} | {rd} |")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--corpus", type=Path, help="corpus dir with manifest.json and tensors/")
  ap.add_argument("--codecs", default="zipccl,zipccl+xxh32,zstd1,lz4,blosc2,zipnn",
                  help="comma-separated subset of: " + ",".join(CODECS))
  ap.add_argument("--reps", type=int, default=3,
                  help=f"passes over all tensors; each times every codec {WARM} times back to back")
  ap.add_argument("--stat", choices=sorted(STAT), default="best",
                  help="how repetitions combine into one time (default: best)")
  ap.add_argument("--json", type=Path, help="write per-tensor rows and the summary here")
  ap.add_argument("-v", "--verbose", action="store_true", help="print the per-tensor table")
  args = ap.parse_args(argv)

  items = load_corpus(args.corpus)
  codecs = []
  for key in args.codecs.split(","):
    if key not in CODECS:
      ap.error(f"unknown codec {key!r}; choose from {', '.join(CODECS)}")
    try:
      codecs.append(CODECS[key]())
    except ImportError as e:
      sys.exit(f"codec {key} needs its package: {e} (pip install '.[bench]')")
  rows = run(items, codecs, args.reps, args.stat)
  summary = summarise(rows)
  print_tables(rows, summary, args.verbose)
  if args.json:
    args.json.write_text(json.dumps(dict(rows=rows, summary=summary), indent=1))
  return rows, summary


if __name__ == "__main__":
  os.environ.setdefault("OMP_NUM_THREADS", "1")
  main()
