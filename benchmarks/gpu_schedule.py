#!/usr/bin/env python
"""XLA:GPU's schedule of a compressed collective in K pieces, compiled without a GPU.

    JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 JAX_PLATFORMS=cpu python benchmarks/gpu_schedule.py --pieces 3

Compiles `zipccl_jax.<op>` over 8 devices of a described H100 topology (jax-cuda12-plugin's deviceless
compile: `jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=...)`), then prints
the entry computation's scheduled order of what matters for pipelining: the zipccl encode and decode
custom calls, the collectives' start (marked sync where XLA found nothing to overlap) and done, the
ragged-all-to-alls XLA runs synchronously, and the conditionals (a padded chain's decode or raw fallback;
the ragged all_to_all has none), and for each collective which of them XLA placed between its start and
its done (work overlapping that transfer; a done is listed by the start it completes, and a ragged
exchange of raw rows, the rows whose frames did not fit, is marked "raw rows"). Nothing runs; no timing
is measured.

Needs, in a venv of its own (the plugin makes every jax import on a machine without a GPU look for one):
`pip install ".[gpuaot]"` next to a zipccl_jax built with its CUDA handlers (the default build where a CUDA
toolkit is found; `python -m zipccl_jax.info` lists them). JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 lets the plugin
load without CUDA libraries; JAX_PLATFORMS=cpu keeps the default backend on the CPU. XLA_FLAGS apply and are
recorded in the JSON: JAX's GPU performance guide turns on XLA's latency-hiding scheduler
(``XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true``), which schedules these chains differently.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import zipccl_jax
from zipccl_jax import _ffi

# An H100 SXM as XLA's GpuTargetConfigProto text (hardware facts the compiler's cost models read). The driver
# is described because XLA drops custom calls, collectives, loops and conditionals from command buffers (CUDA
# graphs) when min(runtime, driver) < 12.3 (command_buffer_conversion_pass.cc), and an undescribed driver is 0.
H100 = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000 l2_cache_size: 52428800 clock_rate_ghz: 1.98
  device_memory_size: 84929347584 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 } registers_per_core_limit: 65536 registers_per_block_limit: 65536
  driver_version: "12.8.0"
}
runtime_version { major: 12 minor: 8 }
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 7 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""

_OPS = {
    "all_to_all": lambda v, **kw: zipccl_jax.all_to_all(v, "i", 0, 0, tiled=True, **kw),
    "all_gather": lambda v, **kw: zipccl_jax.all_gather(v, "i", tiled=True, **kw),
    "psum_scatter": lambda v, **kw: zipccl_jax.psum_scatter(v, "i", tiled=True, **kw),
    "ppermute": lambda v, **kw: zipccl_jax.ppermute(v, "i", [(i, (i + 1) % 8) for i in range(8)], **kw),
}
_SYNC = ("all-to-all", "all-gather", "collective-permute", "all-reduce")  # plain, not a start/done pair
_LINE = re.compile(r"^\s*(?:ROOT )?%(?P<name>[\w.\-]+) = .*? (?P<op>[a-z\-]+)\(")


def scheduled(hlo: str) -> list[tuple[str, str]]:
    """(kind, name) of the entry computation's encodes, decodes (those outside conditionals), collective
    starts/dones, synchronous collectives, conditionals and loops (a fallback), in the scheduled order (a
    scheduled module lists instructions in execution order). A done's name is the start it completes (several
    may be in flight). A ragged exchange of raw rows (its output operand a fresh buffer, where a frames
    exchange writes into the buffer a raw-row exchange filled) is marked "raw rows"."""
    out = []
    bodies = dict(re.findall(r"^%([\w.\-]+) .*?\{\n(.*?)^\}", hlo, re.M | re.S))  # computation -> its text
    entry = hlo[hlo.index("\nENTRY"):].splitlines()[1:]
    defs = {m.group("name"): line for line in entry if (m := _LINE.match(line))}
    for line in entry:
        m = _LINE.match(line)
        if not m:
            continue
        op = m.group("op")
        if op.startswith("ragged-all-to-all") and not op.endswith("-done") and not _fills(line, defs):
            op += " (raw rows)"
        called = re.search(r"calls=%([\w.\-]+)", line) if op == "fusion" else None
        if called:  # XLA:GPU wraps a custom call reading a slice of its operand in a fusion (no copy)
            line = bodies.get(called.group(1), "")
            op = "custom-call"
        if op == "custom-call" and "zipccl_encode" in line:
            out.append(("encode", m.group("name")))
        elif op == "custom-call" and "zipccl_decode" in line:
            out.append(("decode", m.group("name")))
        elif op.endswith("-done"):
            out.append((op, _operands(line)[0]))
        elif op.startswith("ragged-all-to-all") and "-start" not in op:  # run synchronously
            out.append((op.replace("ragged-all-to-all", "ragged-all-to-all (sync)"), m.group("name")))
        elif op in _SYNC:  # XLA turns an async pair with nothing between start and done into this
            out.append((op + " (sync)", m.group("name")))
        elif "-start" in op:  # XLA marks a collective it found nothing to overlap with sync
            out.append((op.replace("-start", "-start" + (" (sync)" if '"is_sync":true' in line
                                                         else " (async)")), m.group("name")))
        elif op in ("conditional", "while"):
            out.append((op, m.group("name")))
    return out


def _operands(line: str) -> list[str]:
    """The instruction names among a HLO line's operands."""
    m = _LINE.match(line)
    args = line[m.end():]
    return re.findall(r"%([\w.\-]+)", args[:args.index(")")])


def _fills(line: str, defs: dict) -> bool:
    """Whether a ragged exchange writes into another ragged exchange's result (its output operand, through
    bitcasts and copies): a frames exchange into the raw rows' buffer."""
    name = _operands(line)[1]
    while name in defs:
        op = _LINE.match(defs[name]).group("op")
        if op.startswith("ragged-all-to-all"):
            return True
        if op not in ("bitcast", "copy", "get-tuple-element") and not op.startswith("copy-"):
            return False
        name = _operands(defs[name])[0]
    return False


def overlaps(seq):
    """{collective start: [encodes, decodes and conditionals scheduled before its done]}; a synchronous
    all-to-all, all-gather, collective-permute or all-reduce: [] (nothing runs beside it)."""
    open_, out = {}, {}
    for kind, name in seq:
        if "-start" in kind:
            open_[("raw rows " if "raw rows" in kind else "") + name] = []
        elif kind.split(" ")[0] in _SYNC:  # a transfer with nothing beside it
            out[f"{kind.split(' ')[0]} {name}"] = []
        elif kind.endswith("-done"):  # the start it completes (recordings before: the oldest open one)
            start = next((s for s in open_ if s.split(" ")[-1] == name), next(iter(open_), None))
            if start is not None:
                out[start] = open_.pop(start)
        else:
            for work in open_.values():
                work.append(f"{kind} {name}")
    return out


def ragged_pipelined(ov, pieces: int) -> bool:
    """Whether `overlaps` of a ragged call in `pieces` shows the pipeline `strategy.programs.overlap_pattern`
    costs for it: no encode while a ragged exchange is in flight, and each of the first pieces - 1 decodes
    while exactly one frames exchange is (a decode beside two concurrent exchanges hides behind neither's
    whole time). An exchange of raw rows in flight beside them is allowed: it moves only the rows that did
    not fit (none, where all fit), and the model charges its latency apart."""
    frames = [w for start, ws in ov.items() if start.startswith("ragged") for w in ws]
    anywhere = [w for start, ws in ov.items() if "ragged" in start for w in ws]
    decodes = [w for w in frames if w.startswith("decode")]
    return (not any(w.startswith("encode") for w in anywhere)
            and len(decodes) == len(set(decodes)) == pieces - 1)


def h100_mesh() -> Mesh:
    """The 8 described H100s (`H100`, one host), as a mesh over axis "i"."""
    from jax.experimental import topologies
    topo = topologies.get_topology_desc("h100x8", "cuda", target_config=H100, topology="1x1x8")
    return Mesh(np.array(topo.devices), ("i",))


def compiled_hlo(mesh: Mesh, op: str, pieces: int, transport: str, elems: int,
                 options: dict | None = None) -> str:
    """The compiled (scheduled) HLO of `op` with compress=True in `pieces` pieces on `transport`, for 8 rows
    of `elems` bfloat16 per device; `options`: XLA debug options for this compile (e.g.
    ``{"xla_gpu_enable_latency_hiding_scheduler": True}``)."""
    def body(v):
        with zipccl_jax.use_algorithm(pieces=pieces):
            return _OPS[op](v, compress=True, transport=transport)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    spec = jax.ShapeDtypeStruct((8 * 8, elems), jnp.bfloat16, sharding=NamedSharding(mesh, P("i")))
    return f.lower(spec).compile(compiler_options=options).as_text()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", choices=sorted(_OPS), default="all_to_all")
    ap.add_argument("--pieces", type=int, default=3)
    ap.add_argument("--elems", type=int, default=1 << 20, help="bfloat16 elements per row (8 rows/device)")
    ap.add_argument("--transport", default="padded", choices=("padded", "ragged"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    _ffi.register()
    if "CUDA" not in _ffi.extension().registrations():
        sys.exit("gpu_schedule: this zipccl_jax has no CUDA handlers (python -m zipccl_jax.info)")
    hlo = compiled_hlo(h100_mesh(), args.op, args.pieces, args.transport, args.elems)
    seq = scheduled(hlo)
    ov = overlaps(seq)
    for kind, name in seq:
        print(f"{kind:32s} {name}")
    print("overlapping each transfer:")
    for start, work in ov.items():
        print(f"  {start}: {', '.join(work) or '-'}")
    if args.transport == "ragged":
        print(f"pipelined (decode k-1 during exchange k): {ragged_pipelined(ov, args.pieces)}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "xla_flags": os.environ.get("XLA_FLAGS", ""),
                                         "schedule": seq, "overlaps": ov}, indent=1) + "\n")


if __name__ == "__main__":
    main()
