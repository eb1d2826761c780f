#!/usr/bin/env python
"""What decoding and encoding ask of a GPU, per call, measured here without one (wire format v2 against v1).

A GPU codec's speed is bounded by its parallelism and its longest serial chain, and by how its memory
accesses coalesce. These are properties of the format and of the kernels' shape, so they can be measured on
any machine:

- v2: from real frames. Gaussian bfloat16 (std 0.02), float32 and float8_e4m3fn (amax-scaled) of each call
  size are encoded by the NumPy reference (zipccl_jax.reference), and `reference.layout_stats` reads from the
  frames the decode warps (one per HUFF segment), the longest chain of one lane in symbols (steps), and the
  16-bit units. The launches per call are the CUDA launch sequences (codec/cuda_launch.cuh) as the SIMT
  emulator records them (`cuda_host.encode_launches` / `decode_launches`, which run nothing).
- v1: from the same symbols and code lengths under version 1's layout (FORMAT.md "Versioning": 32 streams of
  2,048 elements per block, one decoding thread per stream, 4-byte refills at each thread's own offset), and
  its launch sequence at commit 47ec9e3 (hist, plan, scan, write, finish, zero tail; frame check, directory,
  scan, block decode, poison): analytic, not run.

Per call: `decode_warps` (independent decode work units), `chain_symbols` (symbols one lane decodes in
order), `chain_global_loads_per_symbol` (global loads a lane waits for on its chain of lookups, per symbol:
v1 refills its 64-bit buffer with a 4-byte load every 32 bits; v2 takes units from a register window
filled a window ahead, so none), `requests_per_symbol` (memory requests for coded bits per symbol: v1 one
per 4-byte refill of a lane, each at its own address; v2 one per window, 32 units in 64 contiguous bytes),
`launches` (kernels per encode / decode call).

    python benchmarks/codec_proxies.py --json benchmarks/results/codec_proxies.json    # ~2 min, 2 cores
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from zipccl_jax import format as fmt  # noqa: E402
from zipccl_jax import reference  # noqa: E402

V1_STREAM = 2048            # version 1: elements per stream, one decoding thread each
V1_REFILL_BITS = 32         # version 1: a thread's refill, one 4-byte load at its own offset
V1_LAUNCHES = {"encode": ["zipccl_hist", "zipccl_plan", "zipccl_scan", "zipccl_write", "zipccl_finish",
                          "zipccl_zero_tail"],
               "decode": ["zipccl_frame_check", "zipccl_dir", "zipccl_scan", "zipccl_decode_block",
                          "zipccl_poison"]}


def tensor(name: str, elems: int, seed: int = 0) -> np.ndarray:
  dt = np.dtype(getattr(ml_dtypes, name, name))
  x = np.random.default_rng(seed).standard_normal(elems, dtype=np.float32) * np.float32(0.02)
  if dt.itemsize == 1:
    x = x * np.float32(float(ml_dtypes.finfo(dt).max) / float(np.max(np.abs(x))))
  return x.astype(dt)


def launches(elems: int, dtype) -> dict:
  """The v2 launch sequences as the emulator records them (None without the compiled extension)."""
  try:
    from zipccl_jax import _ffi
    host = _ffi.extension().cuda_host
  except Exception:  # no build here: the counts are left out, not guessed
    return {"encode": None, "decode": None}
  code = fmt.dtype_code(dtype)
  cap = fmt.max_encoded_bytes(elems, dtype)
  return {"encode": [l[0] for l in host.encode_launches(1, elems, code, cap)],
          "decode": [l[0] for l in host.decode_launches(1, elems, code, False)]}


def proxies(name: str, call_bytes: int) -> dict:
  x = tensor(name, call_bytes // np.dtype(getattr(ml_dtypes, name, name)).itemsize)
  frame = reference.encode(x)
  st = reference.layout_stats(frame, dtype=x.dtype)
  bits = _total_bits(x, frame)
  sym = st["symbols"]
  huff_blocks = sym and -(-sym // fmt.BLOCK_ELEMS)
  seq = launches(x.size, x.dtype)
  v1 = {"decode_warps": huff_blocks, "chain_symbols": min(V1_STREAM, sym), "lanes_per_warp": 32,
        "chain_global_loads_per_symbol": bits / V1_REFILL_BITS / max(sym, 1),
        "requests_per_symbol": bits / V1_REFILL_BITS / max(sym, 1),
        "launches": {k: len(v) for k, v in V1_LAUNCHES.items()}, "source": "analytic (version 1 layout)"}
  v2 = {"decode_warps": st["warps"], "chain_symbols": st["chain_symbols"], "lanes_per_warp": fmt.LANES,
        "chain_global_loads_per_symbol": 0.0,
        "requests_per_symbol": st["units"] / fmt.LANES / max(sym, 1),
        "units_per_symbol": st["units"] / max(sym, 1),
        "launches": {k: (len(v) if v is not None else None) for k, v in seq.items()}, "launch_names": seq,
        "source": "measured from the frames (reference.layout_stats) and the emulator's launch records"}
  return {"dtype": name, "call_bytes": x.nbytes, "frame_bytes": len(frame), "ratio": x.nbytes / len(frame),
          "code_bits_per_symbol": bits / max(sym, 1), "v1": v1, "v2": v2}


def _total_bits(x: np.ndarray, frame: bytes) -> int:
  """Code bits of every HUFF block (its symbols' code lengths, by encoder rule 3): the same in both versions."""
  info = reference.frame_info(frame)
  code = fmt.dtype_code(x.dtype)
  u = x.reshape(-1).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])
  total = 0
  for b, blk in enumerate(info["blocks"]):
    if blk["mode"] == fmt.MODE_HUFF:
      ub = u[b * fmt.BLOCK_ELEMS:(b + 1) * fmt.BLOCK_ELEMS]
      sym, _ = reference.split_symbols(ub, code, bool(blk["flags"] & fmt.BLOCK_FLAG_LOW16))
      counts = np.bincount(sym, minlength=fmt.NUM_SYMBOLS)
      total += int((counts * reference.code_lengths(counts).astype(np.int64)).sum())
  return total


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sizes-mib", default="4,16,64", help="bfloat16 call sizes in MiB")
  p.add_argument("--json", default=None)
  a = p.parse_args(argv)
  rows = [proxies("bfloat16", int(float(s) * 2**20)) for s in a.sizes_mib.split(",")]
  rows += [proxies(d, 64 * 2**20) for d in ("float32", "float8_e4m3fn")]
  print(f"{'dtype':14s} {'MiB':>5s} {'ratio':>6s} | {'warps v1':>8s} {'v2':>6s} | {'chain v1':>8s} {'v2':>4s} | "
        f"{'chain loads/sym v1':>18s} {'v2':>4s} | {'requests/sym v1':>15s} {'v2':>6s} | launches enc/dec v1, v2")
  for r in rows:
    v1, v2 = r["v1"], r["v2"]
    print(f"{r['dtype']:14s} {r['call_bytes'] / 2**20:5.0f} {r['ratio']:6.3f} | {v1['decode_warps']:8d} "
          f"{v2['decode_warps']:6d} | {v1['chain_symbols']:8d} {v2['chain_symbols']:4d} | "
          f"{v1['chain_global_loads_per_symbol']:18.3f} {v2['chain_global_loads_per_symbol']:4.1f} | "
          f"{v1['requests_per_symbol']:15.4f} {v2['requests_per_symbol']:6.4f} | "
          f"{v1['launches']['encode']}/{v1['launches']['decode']}, {v2['launches']['encode']}/{v2['launches']['decode']}")
  if a.json:
    Path(a.json).write_text(json.dumps({"command": "python benchmarks/codec_proxies.py " + " ".join(
        argv if argv is not None else sys.argv[1:]), "rows": rows}, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
