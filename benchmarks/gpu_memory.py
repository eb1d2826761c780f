#!/usr/bin/env python
"""Device memory of the compressed collectives on XLA:GPU against jax.lax's, compiled without a GPU.

    JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 JAX_PLATFORMS=cpu python benchmarks/gpu_memory.py --json mem.json

Compiles each collective over 8 devices of a described H100 topology (the deviceless compile of
benchmarks/gpu_schedule.py: a JAX CUDA plugin, no GPU) for a bfloat16 message of --mib MiB per device, as
`jax.lax` and as `zipccl_jax` with `compress=True` on each transport, and reads XLA's memory analysis of the
compiled program (temp, argument, output bytes). The compressed program's extra temp is set against its
frames: the coded bytes one device sends plus those it receives, at the capacity the call used
(twice `zipccl_jax.stats()`' wire bytes: what one device sends per call, and as much received), and against
the call's size (the larger of operand and result bytes: the "/ size" column). On a real GPU the kit
(`.ci/gpu_check.sh`) measures a one-device all_to_all's temp and allocator peak (benchmarks/codec_gpu.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_schedule import H100, h100_mesh  # noqa: E402

import zipccl_jax as zj  # noqa: E402
from zipccl_jax import _ffi  # noqa: E402

N = 8
RING = [(i, (i + 1) % N) for i in range(N)]
OPS = {  # name -> (jax.lax call, zipccl_jax call)
    "all_to_all": (lambda v: jax.lax.all_to_all(v, "i", 0, 0, tiled=True),
                   lambda v, **kw: zj.all_to_all(v, "i", 0, 0, tiled=True, **kw)),
    "all_gather": (lambda v: jax.lax.all_gather(v, "i", tiled=True),
                   lambda v, **kw: zj.all_gather(v, "i", tiled=True, **kw)),
    "psum_scatter": (lambda v: jax.lax.psum_scatter(v, "i", tiled=True),
                     lambda v, **kw: zj.psum_scatter(v, "i", tiled=True, **kw)),
    "ppermute": (lambda v: jax.lax.ppermute(v, "i", RING), lambda v, **kw: zj.ppermute(v, "i", RING, **kw)),
    "psum": (lambda v: jax.lax.psum(v, "i"), lambda v, **kw: zj.psum(v, "i", **kw)),
}


def analyse(f, spec) -> dict:
  """XLA's memory analysis of the compiled program, and its conditionals and loops (each one a host round trip
  on XLA:GPU: ConditionalThunk copies the predicate to the host and waits for the stream)."""
  c = f.lower(spec).compile()
  ma = c.memory_analysis()
  return {"temp_bytes": ma.temp_size_in_bytes, "argument_bytes": ma.argument_size_in_bytes,
          "output_bytes": ma.output_size_in_bytes, "conditionals": c.as_text().count(" conditional("),
          "loops": c.as_text().count(" while(")}


def lax_ragged_all_to_all(v):
  """jax.lax.ragged_all_to_all moving what all_to_all moves: the ragged transport's own cost (XLA:GPU
  places a ragged-all-to-all's output in collective memory, S(1), and copies it out)."""
  n = N
  r = v.shape[0] // n
  sizes = jnp.full((n,), r, jnp.int32)
  here = jnp.full((n,), jax.lax.axis_index("i").astype(jnp.int32) * r, jnp.int32)
  return jax.lax.ragged_all_to_all(v, jnp.zeros_like(v), jnp.arange(n, dtype=jnp.int32) * r, sizes,
                                   here, sizes, axis_name="i")


# elements of one coded frame of each op, for `elems` per device (the collectives' chunk: psum's first phase)
CHUNK = {"all_to_all": lambda e: e // N, "all_gather": lambda e: e, "psum_scatter": lambda e: e // N,
         "psum": lambda e: e // N, "ppermute": lambda e: e}


def gpu_pieces(op: str, elems: int, transport: str) -> int:
  """The K a compressed call of `op` runs in on a GPU with the default profile: the strategy's own decision,
  asked for the GPU (here jax's backend is the CPU, whose K is always 1)."""
  d = zj.strategy.decide(op, jnp.bfloat16, CHUNK[op](elems), axis_size=N, axis_name="i", compress=True,
                         transport=transport, platform="gpu", log=False, message_elems=elems)
  return d.pieces


def setup(mesh: Mesh, mib: float, cols: int = 4096):
  """(smap, spec): `smap(body)` jits `body` in shard_map over `mesh`'s axis "i"; `spec` is a bfloat16 operand of
  `mib` MiB per device, rows of `cols` elements, a multiple of N rows per device."""
  rows = int(mib * 2**20) // 2 // cols // N * N
  spec = jax.ShapeDtypeStruct((N * rows, cols), jnp.bfloat16, sharding=NamedSharding(mesh, P("i")))
  return (lambda body: jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))), spec


def compressed(smap, spec, op: str, transport: str, pieces: int | None, base: dict) -> dict:
  """`op` with compress=True on `transport` in `pieces` pieces (None: the K the strategy picks on a GPU),
  analysed, against `base` (jax.lax's analysis): extra temp, frames, and extra temp over the call's size."""
  zj.reset_stats()
  k = pieces or gpu_pieces(op, int(np.prod(spec.shape)) // N, transport)
  with zj.use_algorithm(pieces=k):
    rec = analyse(smap(lambda v: OPS[op][1](v, compress=True, transport=transport, name=op)), spec)
  frames = 2 * zj.stats()[op].wire_bytes  # per device and call: what it sends, and as much received
  extra = rec["temp_bytes"] - base["temp_bytes"]
  size = max(rec["argument_bytes"], rec["output_bytes"])
  return {"op": op, "variant": transport, "pieces": k, **rec, "extra_temp_bytes": extra, "frame_bytes": frames,
          "within_frames": extra <= frames, "extra_over_size": round(extra / size, 3)}


def one_device(mib: float) -> list[dict]:
  """The kit's one-GPU memory probe (benchmarks/codec_gpu.py `memory_probe`: a compressed all_to_all over a
  one-device mesh, its row coded by `_exchange.code_own_row`), compiled for one described H100: why its
  padded temp is 2.7x the payload where eight devices need 0.70x."""
  from jax.experimental import topologies
  from zipccl_jax import _exchange
  topo = topologies.get_topology_desc("h100x1", "cuda", target_config=H100, topology="1x1x1")
  mesh = Mesh(np.array(topo.devices), ("i",))
  rows = int(mib * 2**20) // 2 // 1024
  spec = jax.ShapeDtypeStruct((rows, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("i")))
  out = []
  for transport in ("padded", "ragged"):
    for k in (1, 2):
      body = lambda v: zj.all_to_all(v, "i", 0, 0, tiled=True, compress=True, transport=transport)
      with _exchange.code_own_row(), zj.use_algorithm(pieces=k):
        rec = analyse(jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))), spec)
      out.append({"op": "all_to_all", "devices": 1, "variant": transport, "pieces": k, **rec})
      print(f"one device, all_to_all {transport:6s} K={k}: temp {rec['temp_bytes'] / 2**20:.1f} MiB "
            f"({rows * 2048 / 2**20:.0f} MiB payload)")
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--mib", type=float, default=64.0, help="MiB of bfloat16 per device")
  ap.add_argument("--ops", default=",".join(OPS))
  ap.add_argument("--pieces", type=int, default=None,
                  help="K, the pieces each compressed call is coded in (default: the K the strategy picks on a GPU "
                  "for the call: `strategy.decide(..., platform='gpu')`, since this process's backend is the CPU)")
  ap.add_argument("--one-device", action="store_true",
                  help="the GPU kit's one-device probe instead (all_to_all, its row coded, K = 1 and 2)")
  ap.add_argument("--json", type=Path)
  a = ap.parse_args(argv)
  _ffi.register()
  if "CUDA" not in _ffi.extension().registrations():
    sys.exit("gpu_memory: this zipccl_jax has no CUDA handlers (python -m zipccl_jax.info)")
  if a.one_device:
    res = one_device(a.mib)
    if a.json:
      a.json.write_text(json.dumps({"command": "python benchmarks/gpu_memory.py " + " ".join(argv or sys.argv[1:]),
                                    "topology": "1 x H100 (described, deviceless)", "jax": jax.__version__,
                                    "results": res}, indent=1) + "\n")
    return 0
  smap, spec = setup(h100_mesh(), a.mib)
  out = []
  print(f"{'op':13s} {'variant':8s} {'temp MiB':>9s} {'extra':>8s} {'frames':>8s} {'/ size':>6s} {'waits':>5s}  "
        f"(per device, {np.prod(spec.shape) // N * 2 / 2**20:.0f} MiB; size = the larger of operand and result)")
  for op in a.ops.split(","):
    base = analyse(smap(OPS[op][0]), spec)
    out.append({"op": op, "variant": "jax.lax", **base})
    print(f"{op:13s} {'jax.lax':8s} {base['temp_bytes'] / 2**20:9.1f} {'':8s} {'':8s} {'':6s} "
          f"{base['conditionals'] + base['loops']:5d}")
    if op == "all_to_all":
      ref = analyse(smap(lax_ragged_all_to_all), spec)
      out.append({"op": op, "variant": "jax.lax ragged_all_to_all", **ref})
      print(f"{op:13s} {'lax rag':8s} {ref['temp_bytes'] / 2**20:9.1f} {'':8s} {'':8s} {'':6s} "
            f"{ref['conditionals'] + ref['loops']:5d}")
    for transport in ("padded", "ragged"):
      rec = compressed(smap, spec, op, transport, a.pieces, base)
      out.append(rec)
      label = f"{transport} K={rec['pieces']}"
      print(f"{op:13s} {label:8s} {rec['temp_bytes'] / 2**20:9.1f} "
            f"{rec['extra_temp_bytes'] / 2**20:8.1f} {rec['frame_bytes'] / 2**20:8.1f} "
            f"{rec['extra_over_size']:6.2f} {rec['conditionals'] + rec['loops']:5d}")
  if a.json:
    a.json.write_text(json.dumps({"command": "python benchmarks/gpu_memory.py " + " ".join(argv or sys.argv[1:]),
                                  "topology": f"{N} x H100 (described, deviceless)", "jax": jax.__version__,
                                  "results": out}, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
