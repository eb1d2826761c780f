#!/usr/bin/env python
"""Passes the two-level and coded programs no longer run, each against the program that ran it, on CPU devices.

* **own row** (psum_scatter, flat compressed over the 2 x 4 tuple): the own row, which the coded exchange
  does not send, is read from the operand inside the fixed-order sum, and the sum runs in each branch of the
  fallback's conditional (`_reduce.ordered_sum`'s ``own``, `_exchange.exchange_rows`' ``own=False``). Before,
  the coded branch selected it into the decoded rows (`_exchange.with_own_row`) and the rows were summed
  after the conditional: one more pass over the n rows, which the conditional kept XLA from fusing.
* **reorder** (psum_scatter and all_gather, both levels coded): the reorder between the levels' layouts,
  which a coded fast phase materializes, as a concatenation of static row slices
  (`hierarchical.by_second`). Before, a transpose (`jnp.swapaxes`), which XLA:CPU emits element by element.
  The same reorder around jax.lax's reduce-scatter (psum_scatter, host coded, the local level raw, without
  ``fixed_order``: what `compress="auto"` runs), which XLA does not fuse into the collective either.
* **gather rows** (all_gather over two levels, the local level raw): the fast level gathers rows and
  `by_second` reorders them (`hierarchical._gather_fast`). Before, it gathered along axis 1, which XLA:CPU
  runs as a gather of rows and an element-wise transpose of the whole result.

Each pair runs the same operand as `benchmarks/program_passes.py` (the 2 x 4 runs' case of the op, Gaussian
BF16, std 0.02) on a ("host", "local") = 2 x 4 mesh of virtual CPU devices in one process, both programs
compiled beside each other, bits checked equal, then timed interleaved (`--reps`): medians, IQRs and the
paired ratio (today's over before, `_stats.paired_ratio`).

    python benchmarks/coded_passes_ab.py --reps 41 --json benchmarks/results/coded_passes_ab_avx2.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import program_passes as pp  # noqa: E402  (sets XLA_FLAGS for eight CPU devices before jax starts)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import _stats  # noqa: E402
from zipccl_jax import _exchange, _reduce, collectives, hierarchical  # noqa: E402

BOTH = "hierarchical host:compressed local:compressed"
HOST = "hierarchical host:compressed local:raw"
RAW = "hierarchical host:raw local:raw"
# (change, op, variant, fixed_order: None for program_passes' default, False for jax.lax's reduce-scatter)
PAIRS = (("own row", "psum_scatter", "flat compressed", None), ("reorder", "psum_scatter", BOTH, None),
         ("reorder", "all_gather", BOTH, None), ("reorder", "psum_scatter", HOST, False),
         ("gather rows", "all_gather", HOST, None), ("gather rows", "all_gather", RAW, None))


def _own_row_before(rows, axis_name, n, call):
  """psum_scatter's rows as the program before summed them: the own row selected into the decoded rows
  inside the conditional (`exchange_rows`' default), the sum after it."""
  def raw(r):
    return _exchange.raw_bits(lambda u: lax.all_to_all(u, axis_name, 0, 0, tiled=True,
                                                       axis_index_groups=call.groups), r)
  got = _exchange.exchange_rows(rows, axis_name=axis_name, n=n, capacity=call.capacity,
                                transport=call.transport, site=call.site, raw=lambda: raw(rows),
                                pieces=call.pieces)
  return _reduce.ordered_sum(got, rows.dtype)


def _gather_fast_before(phase, g):
  """The fast level's all_gather as the program before gathered it: along axis 1."""
  return phase("all_gather", g, "fast", axis=1, tiled=False)


BEFORE = {"own row": (collectives, "_reduce_scatter_rows", _own_row_before),
          "reorder": (hierarchical, "by_second", lambda a: jnp.swapaxes(a, 0, 1)),
          "gather rows": (hierarchical, "_gather_fast", _gather_fast_before)}


def compiled(mesh, op: str, variant: str, fixed_order, x, change: str, before: bool):
  """`program_passes.program`, compiled with the pass as today or (`before`) as it was."""
  module, name, old = BEFORE[change]
  today = getattr(module, name)
  setattr(module, name, old if before else today)
  try:
    return pp.program(mesh, op, variant, fixed_order).lower(x).compile()
  finally:
    setattr(module, name, today)


def measure(mesh, change: str, op: str, variant: str, fixed_order, reps: int, shape: str | None = None) -> dict:
  shape = tuple(int(s) for s in (shape or pp.SHAPES[op]).split(","))
  x = jnp.asarray(np.random.default_rng(0).standard_normal(shape, np.float32) * 0.02, jnp.bfloat16)
  fns = {"today": compiled(mesh, op, variant, fixed_order, x, change, False),
         "before": compiled(mesh, op, variant, fixed_order, x, change, True)}
  bits = [np.asarray(lax.bitcast_convert_type(f(x), jnp.uint16)) for f in fns.values()]
  assert np.array_equal(*bits), (change, op, variant)
  differ = fns["today"].as_text() != fns["before"].as_text()  # the pass is really gone from today's
  ts = {k: [] for k in fns}
  for _ in range(reps):
    for k, f in fns.items():
      t = time.perf_counter()
      f(x).block_until_ready()
      ts[k].append(time.perf_counter() - t)
  order = "jax.lax" if fixed_order is False else "fixed" if op in pp.REDUCTIONS else None
  r = {"change": change, "op": op, "variant": variant, "order": order, "shape": list(shape), "bit_identical": True,
       "programs_differ": differ,
       **{k: _stats.summary(v) for k, v in ts.items()}, **_stats.paired_ratio(ts["today"], ts["before"])}
  print(f"{change:11s} {op:12s} {variant:46s} {order or '':7s} today {r['today']['median_s'] * 1e3:6.2f} ms "
        f"[IQR {r['today']['spread_s'] * 1e3:5.2f}]  before {r['before']['median_s'] * 1e3:6.2f} ms "
        f"[IQR {r['before']['spread_s'] * 1e3:5.2f}]  ratio {r['ratio']:.3f} [IQR {r['ratio_spread']:.3f}]",
        flush=True)
  return r


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--reps", type=int, default=41, help="interleaved repetitions per pair")
  p.add_argument("--shape", default=None, help="the global operand of every pair (default: the 2 x 4 runs' case "
                                               "of each op; a leading dimension divisible by 64)")
  p.add_argument("--json", default=None)
  args = p.parse_args(argv)
  if len(jax.devices()) < 8:
    p.error(f"needs 8 CPU devices, got {len(jax.devices())}")
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), pp.AXES)
  rows = [measure(mesh, *pair, args.reps, args.shape) for pair in PAIRS]
  if args.json:
    meta = {"dtype": "bfloat16", "data": "Gaussian, std 0.02", "mesh": "2 x 4", "reps": args.reps,
            "jax": jax.__version__, **_stats.machine_load()}
    Path(args.json).write_text(json.dumps({"meta": meta, "pairs": rows}, indent=1))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
