#!/usr/bin/env python
"""Where each program of a 2 x 4 mesh's collective spends its time, per compiled XLA op, on CPU devices.

The links-only model (`benchmarks/model_check.py --two-levels`) costs a program as its wire plus its codec.
This measures what else a program runs. It jits each variant of each of the 2 x 4 runs' ops (`--ops`, the same
operand: `--shape` defaults to that case's global shape, Gaussian BF16, std 0.02) on a
("host", "local") = 2 x 4 mesh of virtual CPU devices in one process. With no network there, a
collective is a copy plus the wait for its peers. It traces `--steps` steps of each with jax.profiler, and
sums every compiled op's thunk time. The figures are milliseconds per device and step, in three classes:
  codec       zipccl's FFI calls (zipccl_encode, zipccl_decode);
  collective  all-to-all, all-gather, ... (each includes the wait for the slowest peer);
  other       everything else XLA runs: fusions, concatenates, copies (the program's data movement).
Ops that only hold others (conditional, while, call) are not counted, so nothing is counted twice. The eight
devices share this machine's cores, so every op runs slower than alone, as in the 2 x 4 runs (8 processes on
the same cores). Wall time per step: median and IQR over `--reps` interleaved untraced repetitions. Every
program's output is checked bit for bit against its raw program's (the reductions run zipccl's fixed order,
as in the 2 x 4 runs: flat against flat raw, two-level against two-level raw; the others against flat raw).

    python benchmarks/program_passes.py --reps 21 --steps 10 --json benchmarks/results/program_passes_avx2.json
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

import zipccl_jax as zc  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _stats  # noqa: E402
from _twolevel import AXES, _call  # noqa: E402

# The 2 x 4 runs' default cases: the global operand of each op (benchmarks/results/mesh_2x4_all_ops_*.json)
SHAPES = {"all_to_all": "64,1280,256", "all_gather": "2097152", "psum_scatter": "16777216", "psum": "16777216"}
REDUCTIONS = ("psum_scatter", "psum")
# model_check's names for the 2 x 4 variants -> (zipccl_jax.use_algorithm's algorithm, levels, compress)
PROGRAMS = {"flat raw": ("flat", None, False),
            "flat compressed": ("flat", None, True),
            "hierarchical host:raw local:raw": ("hierarchical", {"host": False, "local": False}, True),
            "hierarchical host:compressed local:raw": ("hierarchical", {"host": True, "local": False}, True),
            "hierarchical host:compressed local:compressed": ("hierarchical", {"host": True, "local": True}, True)}
HOLDERS = ("conditional", "while", "call")  # ops whose thunk time is that of the ops they hold
COLLECTIVES = ("all-to-all", "all-gather", "all-reduce", "reduce-scatter", "collective-permute")
# `%name = type opcode(`; a tuple type is one parenthesised group
_OP = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(?:\([^)]*\)|\S+)\s+([a-z][\w\-]*)\(")


def program(mesh, op: str, variant: str, fixed_order: bool | None = None):
    """`variant` of `op`, jitted over `mesh`; a reduction runs zipccl's fixed order (as the 2 x 4 runs) unless
    `fixed_order` is False (jax.lax's reduce-scatter where a phase is raw)."""
    alg, levels, compress = PROGRAMS[variant]
    call = _call(op)
    fixed = op in REDUCTIONS if fixed_order is None else fixed_order
    order = (lambda: zc.use_defaults(fixed_order=True)) if fixed else contextlib.nullcontext

    def body(v):  # a fresh context per trace: a context manager is entered once
        with zc.use_algorithm(alg, levels), order():
            return call(zc, v, compress=compress, name=f"program_passes/{op}/{variant}")

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(AXES), out_specs=P(AXES)))


def op_classes(hlo_text: str) -> dict[str, str]:
    """{instruction name: class} of every op of a compiled module (`HOLDERS` left out)."""
    out = {}
    for line in hlo_text.splitlines():
        m = _OP.match(line)
        if not m or m.group(2) in HOLDERS or m.group(2) in ("parameter", "constant", "get-tuple-element",
                                                              "tuple", "bitcast"):
            continue
        op = m.group(2)
        out[m.group(1)] = ("codec" if op == "custom-call" and 'custom_call_target="zipccl_' in line else
                           "collective" if op.split("-start")[0].split("-done")[0] in COLLECTIVES else "other")
    return out


def traced(f, x, steps: int, classes: dict[str, str], devices: int) -> dict:
    """Per device and step: milliseconds per class, and the ten costliest ops."""
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(steps):
                f(x).block_until_ready()
        pb = next(Path(d).rglob("*.xplane.pb"))
        data = jax.profiler.ProfileData.from_serialized_xspace(pb.read_bytes())
    per_op = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            for ev in line.events:
                if ev.name in classes:
                    per_op[ev.name] += ev.duration_ns
    scale = 1e-6 / (steps * devices)  # ns summed over devices and steps -> ms per device and step
    by_class = collections.Counter()
    for name, ns in per_op.items():
        by_class[classes[name]] += ns * scale
    return {"ms_per_device": {c: by_class.get(c, 0.0) for c in ("codec", "collective", "other")},
            "ops": [{"op": name, "class": classes[name], "ms_per_device": ns * scale}
                    for name, ns in per_op.most_common(10)]}


def measure(mesh, op: str, shape: tuple, reps: int, steps: int) -> list[dict]:
    """Every variant of `op` on a `shape` operand: bits checked, wall time, thunk time per class."""
    x = jnp.asarray((np.random.default_rng(0).standard_normal(shape, np.float32) * 0.02), jnp.bfloat16)
    fns = {v: program(mesh, op, v) for v in PROGRAMS}
    bits = {v: np.asarray(lax.bitcast_convert_type(f(x), jnp.uint16)) for v, f in fns.items()}
    for v in fns:  # lossless: every variant's bits are its raw program's
        ref = "hierarchical host:raw local:raw" if op in REDUCTIONS and v.startswith("hier") else "flat raw"
        assert np.array_equal(bits[v], bits[ref]), (op, v, ref)
    wall = {v: [] for v in fns}
    for _ in range(reps):
        for v, f in fns.items():
            t = time.perf_counter()
            f(x).block_until_ready()
            wall[v].append(time.perf_counter() - t)
    rows = []
    for v, f in fns.items():
        classes = op_classes(f.lower(x).compile().as_text())
        r = {"op": op, "shape": list(shape), "variant": v, "wall": _stats.summary(wall[v]),
             **traced(f, x, steps, classes, 8)}
        rows.append(r)
        c = r["ms_per_device"]
        print(f"{op:12s} {v:46s} wall {r['wall']['median_s'] * 1e3:7.2f} ms [IQR {r['wall']['spread_s'] * 1e3:5.2f}]"
              f"  per device: codec {c['codec']:6.2f}  collective {c['collective']:6.2f}  other {c['other']:6.2f} ms",
              flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)} (default: all)")
    p.add_argument("--shape", default=None, help="the global operand of every op (default: the 2 x 4 runs' case "
                                                 "of each op)")
    p.add_argument("--reps", type=int, default=15, help="untraced repetitions per program (wall time)")
    p.add_argument("--steps", type=int, default=5, help="traced steps per program")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o]
    if not ops or any(o not in SHAPES for o in ops):
        p.error(f"--ops takes a comma-separated list of {', '.join(SHAPES)}, got {args.ops!r}")
    shapes = {o: tuple(int(s) for s in (args.shape or SHAPES[o]).split(",")) for o in ops}
    if len(jax.devices()) < 8 or any(s[0] % 64 for s in shapes.values()):
        p.error(f"needs 8 CPU devices and a leading dimension divisible by 64, got {len(jax.devices())} "
                f"devices and shapes {shapes}")
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), AXES)
    rows = [r for o in ops for r in measure(mesh, o, shapes[o], args.reps, args.steps)]
    if args.json:
        meta = {"dtype": "bfloat16", "data": "Gaussian, std 0.02", "mesh": "2 x 4", "reps": args.reps,
                "steps": args.steps, "jax": jax.__version__, **_stats.machine_load()}
        Path(args.json).write_text(json.dumps({"meta": meta, "programs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
