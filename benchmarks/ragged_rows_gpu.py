#!/usr/bin/env python
"""XLA's ragged_all_to_all moving 64 MiB to itself on one GPU, as rows of different widths.

    python benchmarks/ragged_rows_gpu.py --json ragged_rows.json

Why the ragged transport moves its bytes in rows of 64 (`zipccl_jax._exchange._UNIT_BYTES`): the same 64 MiB
took 186 ms on an H200 as 1-byte rows and 25 ms as rows of 64 bytes or wider
(`benchmarks/results/ragged_rows_h200.json`). One device sends everything to itself (a one-device mesh), so this
times XLA's ragged-all-to-all kernel alone, not a link. Median of 7 calls after one warm-up, each call
synchronised; beside it, a jitted elementwise pass over the same bytes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

SHAPES = [((64 << 20,), "uint8"), ((16 << 20,), "uint32"), ((1 << 20, 64), "uint8"), ((1 << 18, 64), "uint32"),
          ((1 << 16, 256), "uint32"), ((8, 2 << 20), "uint32"), ((8, 4 << 20), "uint16")]


def timed_ms(f, x, reps: int = 7) -> list[float]:
  """Milliseconds of `reps` calls after one warm-up, each synchronised (host-timed: a call here is
  milliseconds, far above the launch and sync it includes)."""
  f(x).block_until_ready()
  ts = []
  for _ in range(reps):
    t = time.perf_counter()
    f(x).block_until_ready()
    ts.append((time.perf_counter() - t) * 1e3)
  return ts


def ragged_to_self(mesh, shape, dtype) -> list[float]:
  rows = shape[0]

  def body(v):
    one = lambda a: jnp.array([a], jnp.int32)
    return jax.lax.ragged_all_to_all(v, jnp.zeros_like(v), one(0), one(rows), one(0), one(rows), axis_name="i")

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P()))
  return timed_ms(f, jnp.ones(shape, dtype))


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--json")
  a = ap.parse_args(argv)
  dev = jax.devices()[0]
  mesh = Mesh(np.array([dev]), ("i",))
  elementwise = timed_ms(jax.jit(lambda v: v + jnp.uint8(1)), jnp.ones((64 << 20,), jnp.uint8))
  out = {"command": "python benchmarks/ragged_rows_gpu.py", "device_kind": dev.device_kind, "jax": jax.__version__,
         "elementwise_pass_ms": statistics.median(elementwise), "elementwise_samples_ms": elementwise,
         "ragged_to_self_ms": []}
  print(f"{dev.device_kind}: jitted elementwise pass over 64 MiB {out['elementwise_pass_ms']:.3f} ms")
  for shape, dt in SHAPES:
    samples = ragged_to_self(mesh, shape, dt)
    ms = statistics.median(samples)
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dt).itemsize
    out["ragged_to_self_ms"].append({"shape": list(shape), "dtype": dt, "row_bytes": row_bytes, "ms": ms,
                                     "samples_ms": samples})
    print(f"ragged_all_to_all to itself, {shape} {dt} ({row_bytes} bytes a row): {ms:.3f} ms "
          f"[{min(samples):.3f}-{max(samples):.3f}]")
  if a.json:
    with open(a.json, "w") as f:
      json.dump(out, f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
