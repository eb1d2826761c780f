"""Records what the collectives lower to, for the behaviour-preserving refactor of issue 14.

For every collective (all_to_all, all_gather incl. to="invarying"/"reduced", psum_scatter, psum,
ppermute incl. a partial and an empty perm), forward and `jax.grad`, `compress` True / False /
"auto", this traces a jitted `jax.shard_map` over 8 devices and records, per case:

* the lowered StableHLO text (no debug info: no source locations) for CPU (`transport="auto"`,
  which lowers the padded transport there) and for CUDA with `transport="padded"` and
  `transport="ragged"` (`jax.jit(f).trace(x).lower(lowering_platforms=("cuda",))`, which
  needs no GPU);
* the collectives of the CPU lowering's HLO text as `zipccl_jax.hlo_collectives` reads them
  (op, shape, group size, bytes sent, inside the raw-fallback scope or not);
* the `explain()` table and the `stats()` records of the case's call sites;
* the error type and message, if tracing raises.

Normalisation (`normalise`), the only difference tolerated: nothing is rewritten in the HLO or
the explain table. The StableHLO text carries no locations or scope names; the HLO-dialect
text, which carries `metadata={op_name=... source_file=... source_line=...}`, is not stored,
only what `hlo_collectives` extracts from it (op, result shape, group size, bytes, and whether
the op_name contains the raw-fallback scope). Error messages are stored as they are.

Usage (from the repository root, in the installed venv)::

  python tests/snapshot_api.py --write   # (re)records tests/data/refactor_snapshot.json
  python tests/snapshot_api.py           # compares; exit status 1 and a diff on change

tests/test_refactor_snapshot.py runs the comparison under pytest.
"""

from __future__ import annotations

import difflib
import json
import os
import pathlib
import sys

_DEVICE_FLAG = "--xla_force_host_platform_device_count"
if _DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICE_FLAG}=8".strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import zipccl_jax as zc  # noqa: E402
from zipccl_jax import strategy  # noqa: E402

GOLDEN_DIR = pathlib.Path(__file__).with_name("data")  # the golden: golden_path(), below
N = 8
ROWS, COLS = 8, 1024  # per device: chunks of 1024 bfloat16 elements (2 KiB)
RING = tuple((i, (i + 1) % N) for i in range(N))


def _ops():
  """name -> (per-device collective body, out_specs)."""
  return {
      "all_to_all": (lambda x, kw: zc.all_to_all(x, "i", 0, 1, tiled=True, **kw), P("i")),
      "all_to_all_untiled": (lambda x, kw: zc.all_to_all(x, "i", 0, 0, **kw), P("i")),
      "all_gather": (lambda x, kw: zc.all_gather(x, "i", axis=1, **kw), P("i")),
      "all_gather_tiled": (lambda x, kw: zc.all_gather(x, "i", tiled=True, **kw), P("i")),
      "all_gather_invarying": (lambda x, kw: zc.all_gather(x, "i", to="invarying", **kw), P()),
      "all_gather_reduced": (lambda x, kw: zc.all_gather(x, "i", to="reduced", **kw),
                             P(reduced={"i"})),
      "psum_scatter": (lambda x, kw: zc.psum_scatter(x, "i", scatter_dimension=0, tiled=True,
                                                     **kw), P("i")),
      "psum": (lambda x, kw: zc.psum(x, "i", **kw), P()),
      "ppermute": (lambda x, kw: zc.ppermute(x, "i", RING, **kw), P("i")),
      "ppermute_partial": (lambda x, kw: zc.ppermute(x, "i", ((0, 1), (2, 3)), **kw), P("i")),
      "ppermute_empty": (lambda x, kw: zc.ppermute(x, "i", (), **kw), P("i")),
  }


def _extra_cases():
  """(case name, op, options, check_vma, dtype, grad) beyond the main matrix."""
  return [
      ("psum/no_vma/True/grad", "psum", dict(compress=True), False, jnp.bfloat16, True),
      ("psum/no_vma/auto/grad", "psum", dict(compress="auto"), False, jnp.bfloat16, True),
      ("all_to_all/pair_capacity/grad", "all_to_all",
       dict(compress=True, capacity=(0.8, "observed")), True, jnp.bfloat16, True),
      ("all_gather/int_capacity/grad", "all_gather",
       dict(compress=True, capacity=(1600, 1700)), True, jnp.bfloat16, True),
      ("psum_scatter/named/auto/grad", "psum_scatter", dict(compress="auto", name="rs_site"),
       True, jnp.bfloat16, True),
      ("all_to_all/f32/auto/grad", "all_to_all", dict(compress="auto"), True, jnp.float32, True),
      ("psum/no_vma/auto_slow_link/grad", "psum", dict(compress="auto", slow_link=True), False,
       jnp.bfloat16, True),
      ("all_to_all/observed/auto_slow_link/grad", "all_to_all",
       dict(compress="auto", capacity="observed", slow_link=True), True, jnp.bfloat16, True),
      ("all_to_all/f16/True/fwd", "all_to_all", dict(compress=True), True, jnp.float16, False),
  ] + [(f"{op}/int32/auto/fwd", op, dict(compress="auto"), True, jnp.int32, False)
       for op in ("all_to_all", "all_gather", "psum_scatter", "psum", "ppermute")] + [
      ("psum/int32/True/fwd", "psum", dict(compress=True), True, jnp.int32, False),
  ]


def _slow_link_profile():
  """A profile whose link (10 MB/s per device) makes `compress="auto"` compress these sizes."""
  from zipccl_jax.strategy.links import LinkModel
  return zc.Profile(links={"*": {"*": LinkModel(1e-5, 1e7)}})


def _build(op, opts, check_vma, dtype, grad, transport):
  mesh = jax.make_mesh((N,), ("i",))
  body, out_spec = _ops()[op]
  kw = dict(opts, transport=transport)
  f = jax.shard_map(lambda x: body(x, kw), mesh=mesh, in_specs=P("i"), out_specs=out_spec,
                    check_vma=check_vma)
  if grad:
    def loss(x):
      y = f(x).astype(jnp.float32)
      if op == "all_gather_reduced":  # a reduced value has no rule for `*`
        return jnp.sum(y)
      return jnp.sum(y * y)  # not linear: the forward pass stays in the program
    fn = jax.grad(loss)
  else:
    fn = f
  x = jax.ShapeDtypeStruct((N * ROWS, COLS), dtype, sharding=NamedSharding(mesh, P("i")))
  return fn, x


def _stats_records():
  out = {}
  for k, s in sorted(zc.stats().items()):
    d = dict(vars(s))
    d["shape"] = list(d["shape"])
    out[k] = d
  return out


def _record_case(op, opts, check_vma, dtype, grad):
  opts = dict(opts)
  if opts.pop("slow_link", False):
    with zc.use_profile(_slow_link_profile()):
      return _record_case(op, opts, check_vma, dtype, grad)
  rec = {}
  for label, transport, platforms in (("cpu", "auto", ("cpu",)),
                                      ("cuda_padded", "padded", ("cuda",)),
                                      ("cuda_ragged", "ragged", ("cuda",))):
    zc.reset_stats()
    strategy.reset_decisions()
    try:
      fn, x = _build(op, opts, check_vma, dtype, grad, transport)
      lowered = jax.jit(fn).trace(x).lower(lowering_platforms=platforms)
      rec[label] = {"stablehlo": lowered.as_text()}
      if label == "cpu":
        rec[label]["collectives"] = zc.hlo_collectives(lowered.as_text(dialect="hlo"),
                                                       num_devices=N)
    except Exception as e:  # the error is part of the behaviour
      rec[label] = {"error": f"{type(e).__name__}: {e}"}
    rec[label]["explain"] = zc.explain()
    rec[label]["stats"] = _stats_records()
  return rec


def record() -> dict:
  """Every case -> its record (see the module docstring)."""
  cases = {}
  for op in _ops():
    for compress in (True, False, "auto"):
      for grad in (False, True):
        name = f"{op}/{compress}/{'grad' if grad else 'fwd'}"
        cases[name] = _record_case(op, dict(compress=compress), True, jnp.bfloat16, grad)
  for op in _ops():
    for grad in (False, True):
      name = f"{op}/auto_slow_link/{'grad' if grad else 'fwd'}"
      cases[name] = _record_case(op, dict(compress="auto", slow_link=True), True, jnp.bfloat16,
                                 grad)
  for name, op, opts, check_vma, dtype, grad in _extra_cases():
    cases[name] = _record_case(op, opts, check_vma, dtype, grad)
  return cases


def normalise(cases: dict) -> dict:
  """Identity today: the stored texts need no rewriting (see the module docstring)."""
  return cases


def _lines(cases: dict) -> list[str]:
  return json.dumps(cases, indent=1, sort_keys=True).splitlines()


def compare(got: dict, want: dict) -> str:
  """'' if equal after `normalise`, else a unified diff (first 400 lines)."""
  a, b = _lines(normalise(want)), _lines(normalise(got))
  if a == b:
    return ""
  diff = list(difflib.unified_diff(a, b, "golden", "now", lineterm="", n=2))
  return "\n".join(line[:300] for line in diff[:400])


def golden_path(version: str = jax.__version__) -> pathlib.Path:
  """The golden of a jax minor release. The StableHLO text is jax's and changes between its releases (jax
  0.11: the mesh declared twice, @mesh and @mesh_0; collectives with mesh-axes replica groups; an
  sdy.sharding_constraint after the manual computation), so each supported minor has its own golden, recorded
  from the same code: refactor_snapshot.json (jax 0.10, the issue-14 baseline) and
  refactor_snapshot.jax-0.<minor>.json. What does not depend on jax (the collectives XLA runs and their bytes,
  explain(), stats()) must agree with jax 0.10's golden (`jax_independent`)."""
  major, minor = version.split(".")[:2]
  if (major, minor) == ("0", "10"):
    return GOLDEN_DIR / "refactor_snapshot.json"
  return GOLDEN_DIR / f"refactor_snapshot.jax-{major}.{minor}.json"


GOLDEN = golden_path()
BASELINE = golden_path("0.10")


def jax_independent(cases: dict) -> dict:
  """`cases` without what jax itself writes: the StableHLO text and error messages (whose words are jax's);
  an error stays recorded as its type."""
  out = {}
  for name, rec in cases.items():
    out[name] = {}
    for label, r in rec.items():
      r = {k: v for k, v in r.items() if k != "stablehlo"}
      if "error" in r:
        r["error"] = r["error"].split(":")[0]
      out[name][label] = r
  return out


def main(argv) -> int:
  got = record()
  if "--write" in argv:
    GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(got)} cases to {GOLDEN}")
    return 0
  diff = compare(got, json.loads(GOLDEN.read_text()))
  print(diff or f"{len(got)} cases match {GOLDEN}")
  return 1 if diff else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
