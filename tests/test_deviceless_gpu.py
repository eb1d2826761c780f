"""XLA:GPU's own compile of the compressed collectives, without a GPU (issue 34's bars, read fresh).

A JAX CUDA plugin compiles for 8 H100s described to it (`benchmarks/gpu_schedule.py`'s `H100`, driver
12.8), with `JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 JAX_PLATFORMS=cpu`. Nothing runs: these tests read what XLA
built: its schedule (the order a stream runs), its thunk sequence after the command-buffer pass (what runs
inside CUDA graphs), and its memory analysis. `.ci/gpu_rehearsal.sh` runs them in the GPU image's stack
(Python 3.12, jax 0.11.2 + jax-cuda13-plugin, the kit's wheel) with ZIPCCL_REQUIRE_DEVICELESS=1, where they
must run; elsewhere, without a plugin, they skip.
"""
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_RUNS = (os.environ.get("JAX_PLATFORMS") == "cpu" and importlib.util.find_spec("jax_plugins") is not None
         and any(importlib.util.find_spec(f"jax_plugins.xla_cuda{v}") for v in (12, 13)))
_WHY = "needs a JAX CUDA plugin and JAX_PLATFORMS=cpu for a deviceless compile (.ci/gpu_rehearsal.sh)"
if os.environ.get("ZIPCCL_REQUIRE_DEVICELESS") and not _RUNS:
  raise RuntimeError(_WHY)  # where CI runs them, they must not skip
pytestmark = pytest.mark.skipif(not _RUNS, reason=_WHY)

if _RUNS:
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import gpu_command_buffers as cb  # noqa: E402
  import gpu_memory  # noqa: E402
  import gpu_schedule  # noqa: E402
  import jax  # noqa: E402

  from zipccl_jax import _ffi  # noqa: E402
  from zipccl_jax.strategy import programs  # noqa: E402

OPS = ("all_to_all", "all_gather", "psum_scatter", "ppermute", "psum")
SCHEDULE_ELEMS = 1 << 20  # bfloat16 per row, 8 rows per device: the recorded schedules' 16 MiB


@pytest.fixture(scope="module")
def mesh():
  _ffi.register()
  if "CUDA" not in _ffi.extension().registrations():
    pytest.fail("this zipccl_jax has no CUDA handlers: the deviceless compile would have no kernels to place")
  return gpu_schedule.h100_mesh()


@pytest.mark.parametrize("pieces", [1, 3])
def test_all_to_all_on_the_default_transport_waits_on_the_host_nowhere(mesh, pieces):
  """The compressed all_to_all on the GPU's default transport (ragged) has no conditional and no loop
  anywhere, under XLA's default command-buffer flags; with collectives allowed in command buffers
  (FUSION,CUSTOM_CALL,COLLECTIVES) every one of its custom calls runs inside one."""
  for flags in ("default", "collectives"):
    got = cb.measure(mesh, "all_to_all", "ragged", pieces, cb.FLAGS[flags])
    assert got["all_custom_calls_zipccl"] and got["custom_calls"] == 2 * pieces, got
    assert got["host_waits_outside"] == 0 and got["host_waits_inside"] == 0, (flags, got)
  assert got["custom_calls_outside"] == 0 and got["command_buffers"] == 1, got


@pytest.mark.parametrize("transport", ["padded", "ragged"])
@pytest.mark.parametrize("op", OPS)
def test_command_buffers_hold_every_custom_call_and_branch(mesh, op, transport):
  """With loops and conditionals allowed in command buffers too, XLA puts every zipccl custom call and
  every fallback (a padded call's conditional or loop) inside one CUDA graph, where a branch is a graph
  conditional node decided on the device: no launch and no host wait of ours is left outside. XLA checks
  each handler's command-buffer trait (`ffi::IsCommandBufferCompatible` of its registration's metadata):
  a handler without it stays outside."""
  for pieces in (1, 3):
    got = cb.measure(mesh, op, transport, pieces, cb.FLAGS["control flow"])
    assert got["all_custom_calls_zipccl"] and got["custom_calls"] > 0, got
    assert got["custom_calls_outside"] == 0 and got["host_waits_outside"] == 0, (pieces, got)
    assert got["command_buffers"] == 1, (pieces, got)


@pytest.mark.parametrize("op", ["all_to_all", "all_gather", "ppermute"])
def test_decode_overlaps_transfer_as_the_model_says(mesh, op):
  """A fresh compile of the padded transport in K = 2..8 pieces schedules, per transfer, the encodes and
  decodes `programs.overlap_pattern` says (the pipeline the model prices), and in 3 pieces some decode
  runs during a transfer."""
  for k in range(2, programs.MAX_PIECES + 1):
    hlo = gpu_schedule.compiled_hlo(mesh, op, k, "padded", SCHEDULE_ELEMS)
    ov = gpu_schedule.overlaps(gpu_schedule.scheduled(hlo))
    got = tuple((sum(w.startswith("encode") for w in work), sum(w.startswith("decode") for w in work))
                for start, work in ov.items() if not start.startswith("all-reduce"))
    assert got == programs.overlap_pattern(k, op), (op, k, got)
    if k == 3:
      assert any(d for _, d in got), (op, got)


def _ragged_pipelined(mesh, op, k, elems, options=None):
  """Whether the ragged transport in k pieces compiles to the pipeline the model costs
  (`gpu_schedule.ragged_pipelined`), with no conditional or loop."""
  seq = gpu_schedule.scheduled(gpu_schedule.compiled_hlo(mesh, op, k, "ragged", elems, options))
  assert [kind for kind, _ in seq].count("decode") == k
  assert not any(kind in ("conditional", "while") for kind, _ in seq), seq
  return gpu_schedule.ragged_pipelined(gpu_schedule.overlaps(seq), k)


_LHS = {"xla_gpu_enable_latency_hiding_scheduler": True}


@pytest.mark.parametrize("elems", [1 << 16, SCHEDULE_ELEMS], ids=["64Ki", "1Mi"])
@pytest.mark.parametrize("op", sorted(programs.RAGGED_PIPELINED_FROM) if _RUNS else [])
def test_ragged_pieces_pipeline_where_the_model_says(mesh, op, elems):
  """The ragged transport's pieces (`_pieces.pipelined_pieces`), K = 2..8: from
  `programs.RAGGED_PIPELINED_FROM[op]` pieces on (2 for every op), the pipeline
  `programs.overlap_pattern` costs (decode k-1 while frames exchange k is in flight, each of the
  first K-1 decodes inside exactly one, no encode inside any exchange), under XLA's default
  scheduler, and under the latency-hiding one (JAX's GPU performance guide turns it on) at the
  fewest pieces, 4 and 8 (where its decodes once ran beside raw-row exchanges instead; every K was
  compiled so for docs/gpu.md), on every JAX this runs on (jax 0.11.2 in CI's rehearsal, 0.12 by
  .ci/deviceless_newest.sh)."""
  first = programs.RAGGED_PIPELINED_FROM[op]
  got = {k: _ragged_pipelined(mesh, op, k, elems) for k in range(2, programs.MAX_PIECES + 1)}
  assert all(got[k] for k in got if k >= first), (op, elems, got)
  if elems == 1 << 16:  # the latency-hiding compiles are the slow ones: one size
    for k in sorted({first, 4, programs.MAX_PIECES}):
      assert _ragged_pipelined(mesh, op, k, elems, _LHS), (op, k, elems)


@pytest.mark.parametrize("transport", ["padded", "ragged"])
@pytest.mark.parametrize("op", OPS)
def test_extra_temp_within_the_bar(mesh, op, transport):
  """XLA's memory analysis, 64 MiB of bfloat16 per device, at the K the strategy picks on a GPU: the
  compressed call's temp over jax.lax's is at most 1.3 x the call's size (the larger of operand and
  result), and within the frames it sends and receives."""
  smap, spec = gpu_memory.setup(mesh, 64)
  base = gpu_memory.analyse(smap(gpu_memory.OPS[op][0]), spec)
  got = gpu_memory.compressed(smap, spec, op, transport, None, base)
  assert got["extra_over_size"] <= 1.3 and got["within_frames"], got


def test_recorded_command_buffer_report_is_this_compile(mesh):
  """The recorded command-buffer table of this jax (benchmarks/results/gpu_command_buffers_h100x8*.json,
  the docs' tables: jax 0.11.2 and 0.12.0.1) is what this jax compiles."""
  recs = [json.loads(p.read_text())
          for p in sorted((ROOT / "benchmarks" / "results").glob("gpu_command_buffers_h100x8*.json"))]
  rec = next((r for r in recs if r["jax"] == jax.__version__), None)
  if rec is None:
    pytest.skip(f"no table recorded with jax {jax.__version__} (recorded: {[r['jax'] for r in recs]})")
  for row in rec["results"][::7]:  # a sample: every compile takes about a second
    got = cb.measure(mesh, row["op"], row["transport"], row["pieces"], row["command_buffer"])
    assert got == {k: row[k] for k in got}, row
