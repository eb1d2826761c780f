#!/usr/bin/env python
"""What of a compressed collective XLA:GPU runs inside command buffers (CUDA graphs), compiled without a GPU.

    JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 JAX_PLATFORMS=cpu python benchmarks/gpu_command_buffers.py --json cb.json

Compiles each collective with `compress=True` over 8 devices of the described H100 of
benchmarks/gpu_schedule.py (driver 12.8 described: below 12.3 XLA keeps custom calls, collectives, loops and
conditionals out of command buffers), on each transport, in 1 and 3 pieces, under three settings of
`xla_gpu_enable_command_buffer`: XLA's defaults, FUSION,CUSTOM_CALL,COLLECTIVES, and those with
WHILE,CONDITIONAL. In jaxlib 0.11 the command buffers are made by a pass over the thunk sequence
(CommandBufferConversionPass), after the HLO is final, so the script reads the sequence XLA will run from
`xla_dump_to`'s `*thunk_sequence_after_thunk_passes.txt`. Per compile it reports the command buffers, the
zipccl custom calls inside and outside them, and the conditionals and loops outside them: each of those reads
its predicate on the host (ConditionalThunk, WhileThunk), one inside a command buffer is a CUDA graph
conditional node, run on the device. A custom call outside a command buffer is a launch from the host; XLA
leaves one out where it is incompatible (a handler without the command-buffer trait), where a run of
convertible thunks is shorter than `xla_gpu_graph_min_graph_size` (5), or where a neighbour is not enabled.
Nothing runs; no timing is measured.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import jax
from jax.sharding import Mesh

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_memory import N, OPS, setup  # noqa: E402
from gpu_schedule import h100_mesh  # noqa: E402

import zipccl_jax as zj  # noqa: E402
from zipccl_jax import _ffi  # noqa: E402

FLAGS = {  # label -> xla_gpu_enable_command_buffer (None: XLA's default set)
    "default": None,
    "collectives": "FUSION,CUSTOM_CALL,COLLECTIVES",
    "control flow": "FUSION,CUSTOM_CALL,COLLECTIVES,WHILE,CONDITIONAL",
}
_THUNK = re.compile(r"^(?P<indent> *)\d+: (?P<kind>k\w+)")
_HOST_WAITS = ("kConditional", "kWhile")


def thunk_tree(text: str) -> list[tuple[str, bool]]:
  """(kind, inside a command buffer) of every thunk of a dumped thunk sequence, nested ones included (a
  line's indentation nests it in the thunk above it; branch and body labels are not thunks)."""
  out, parents = [], []  # parents: (indentation, kind) of the thunks enclosing the current line
  for line in text.splitlines():
    m = _THUNK.match(line)
    if not m:
      continue
    depth = len(m.group("indent"))
    while parents and parents[-1][0] >= depth:
      parents.pop()
    out.append((m.group("kind"), any(kind == "kCommandBuffer" for _, kind in parents)))
    parents.append((depth, m.group("kind")))
  return out


def summarise(tree: list[tuple[str, bool]]) -> dict:
  """The counts the report gives for one thunk tree."""
  return {"command_buffers": sum(k == "kCommandBuffer" and not inside for k, inside in tree),
          "custom_calls": sum(k == "kCustomCall" for k, _ in tree),
          "custom_calls_outside": sum(k == "kCustomCall" and not inside for k, inside in tree),
          "host_waits_outside": sum(k in _HOST_WAITS and not inside for k, inside in tree),
          "host_waits_inside": sum(k in _HOST_WAITS and inside for k, inside in tree)}


def compile_thunks(f, spec, command_buffer: str | None) -> tuple[list[tuple[str, bool]], str]:
  """The thunk tree XLA:GPU runs for `f` at `spec` under `xla_gpu_enable_command_buffer=command_buffer`, and
  the compiled HLO text. A pass that changed nothing leaves only the sequence before the passes."""
  with tempfile.TemporaryDirectory() as d:
    opts = {"xla_dump_to": d}
    if command_buffer is not None:
      opts["xla_gpu_enable_command_buffer"] = command_buffer
    hlo = f.lower(spec).compile(compiler_options=opts).as_text()
    after = sorted(Path(d).glob("*thunk_sequence_after_thunk_passes.txt"))
    text = (after or sorted(Path(d).glob("*thunk_sequence.txt")))[-1].read_text()
  return thunk_tree(text), hlo


def measure(mesh: Mesh, op: str, transport: str, pieces: int, command_buffer: str | None,
            mib: float = 0.5) -> dict:
  """One compile of `op` with compress=True, `mib` MiB per device: summarise()'s counts, and whether every
  custom call in the compiled HLO is one of zipccl_jax's (the counts are of all custom-call thunks)."""
  smap, spec = setup(mesh, mib)
  body = lambda v: OPS[op][1](v, compress=True, transport=transport)
  with zj.use_algorithm(pieces=pieces):
    tree, hlo = compile_thunks(smap(body), spec, command_buffer)
  targets = re.findall(r'custom_call_target="([^"]+)"', hlo)
  return {**summarise(tree), "all_custom_calls_zipccl": all(t.startswith("zipccl_") for t in targets)}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--ops", default=",".join(OPS))
  ap.add_argument("--pieces", default="1,3", help="K values, comma-separated")
  ap.add_argument("--json", type=Path)
  a = ap.parse_args(argv)
  _ffi.register()
  if "CUDA" not in _ffi.extension().registrations():
    sys.exit("gpu_command_buffers: this zipccl_jax has no CUDA handlers (python -m zipccl_jax.info)")
  mesh = h100_mesh()
  out = []
  print(f"{'op':13s} {'transport':9s} {'K':>2s} {'flags':13s} {'buffers':>7s} {'calls':>5s} {'outside':>7s} "
        f"{'waits out':>9s} {'waits in':>8s}")
  for op in a.ops.split(","):
    for transport in ("padded", "ragged"):
      for k in (int(p) for p in a.pieces.split(",")):
        for label, flags in FLAGS.items():
          rec = {"op": op, "transport": transport, "pieces": k, "flags": label, "command_buffer": flags,
                 **measure(mesh, op, transport, k, flags)}
          out.append(rec)
          print(f"{op:13s} {transport:9s} {k:2d} {label:13s} {rec['command_buffers']:7d} {rec['custom_calls']:5d} "
                f"{rec['custom_calls_outside']:7d} {rec['host_waits_outside']:9d} {rec['host_waits_inside']:8d}")
  if a.json:
    a.json.write_text(json.dumps({"command": "python benchmarks/gpu_command_buffers.py " + " ".join(argv or sys.argv[1:]),
                                  "topology": f"{N} x H100 (described, driver 12.8, deviceless)",
                                  "jax": jax.__version__, "results": out}, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
