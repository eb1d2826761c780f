"""Pipelining: a coded chunk as K independent encode -> collective -> decode chains (_pieces).

On 8 virtual CPU devices every K gives the bits of K = 1 (data movement: jax.lax's bits), including
chunks whose size K does not divide and pieces that overflow into their own raw fallback. The CUDA
lowering (no GPU needed) is parsed as StableHLO: K chains, and no chain's custom call or collective
reads a value computed by another chain, but psum_scatter's, which run one after another (memory). The
model picks K = 1 on CPU and K > 1 for a large message on a GPU profile, and explain() reports it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import zipccl_jax
from zipccl_jax import capacity, strategy
from zipccl_jax.strategy import programs

N = 8
BF16 = ml_dtypes.bfloat16
pytestmark = pytest.mark.skipif(jax.device_count() < N, reason="needs 8 devices")
COLLECTIVE_OPS = ("stablehlo.all_to_all", "stablehlo.all_gather", "stablehlo.ragged_all_to_all",
                  "stablehlo.all_reduce", "stablehlo.collective_permute")


def _mesh():
  return jax.make_mesh((N,), ("i",))


def _bits(a):
  a = np.asarray(a)
  return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


# op -> (zipccl body, jax.lax twin or None for reductions, out_specs)
RING = [(i, (i + 1) % 8) for i in range(8)]
PARTIAL = [(0, 1), (2, 5), (3, 4)]
CASES = {
    "all_to_all": (lambda v, **kw: zipccl_jax.all_to_all(v, "i", 0, 1, tiled=True, **kw),
                   lambda v: lax.all_to_all(v, "i", 0, 1, tiled=True), P("i")),
    "all_gather": (lambda v, **kw: zipccl_jax.all_gather(v, "i", axis=1, tiled=True, **kw),
                   lambda v: lax.all_gather(v, "i", axis=1, tiled=True), P("i")),
    "all_gather_axis0": (lambda v, **kw: zipccl_jax.all_gather(v, "i", tiled=True, **kw),
                         lambda v: lax.all_gather(v, "i", tiled=True), P("i")),  # x (16, m) as one row
    "psum_scatter": (lambda v, **kw: zipccl_jax.psum_scatter(v, "i", tiled=True, **kw), None,
                     P("i")),
    "psum": (lambda v, **kw: zipccl_jax.psum(v, "i", **kw), None, P()),
    "ppermute": (lambda v, **kw: zipccl_jax.ppermute(v, "i", RING, **kw),
                 lambda v: lax.ppermute(v, "i", RING), P("i")),
    "ppermute_partial": (lambda v, **kw: zipccl_jax.ppermute(v, "i", PARTIAL, **kw),
                         lambda v: lax.ppermute(v, "i", PARTIAL), P("i")),  # ranks 0, 2, 3, 6, 7 get zeros
}


def _run(mesh, fn, x, out_spec, pieces=None, **kw):
  def body(v):
    with zipccl_jax.use_algorithm(pieces=pieces):
      return fn(v, **kw)
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=out_spec))
  return np.asarray(f(jax.device_put(x, NamedSharding(mesh, P("i")))))


def _data(cols, seed=0, adversarial_rows=()):
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal((N * 16, cols), np.float32) * 0.02).astype(BF16)
  u = x.view(np.uint16)
  u[0, :8] = [0x7FC1, 0xFFA3, 0x8000, 0x0000, 0x7F80, 0xFF80, 0x0001, 0x8003]  # bits, not values
  for r in adversarial_rows:  # random bit patterns: these frames overflow the capacity
    u[r] = rng.integers(0, 1 << 16, size=cols, dtype=np.uint16)
  return x


@pytest.mark.parametrize("op", ["all_to_all", "all_gather", "ppermute_partial"])
def test_vmap_over_examples_that_do_and_do_not_fall_back(op):
  """Padded, in 3 pieces, under `jax.vmap`: example 0 codes, example 1 overflows and takes the raw
  fallback (`_pieces.unless_fallback`: a loop whose flag is then per example); each gets jax.lax's
  bits."""
  mesh = _mesh()
  fn, twin, _ = CASES[op]
  x = np.stack([_data(1001, seed=2), _data(1001, seed=3, adversarial_rows=range(N * 16))])

  def run(body):
    f = jax.jit(jax.shard_map(jax.vmap(body), mesh=mesh, in_specs=P(None, "i"),
                              out_specs=P(None, "i")))
    return np.asarray(f(jax.device_put(x, NamedSharding(mesh, P(None, "i")))))

  def coded(v):
    with zipccl_jax.use_algorithm(pieces=3):
      return fn(v, compress=True, transport="padded")

  want = run(lambda v: lax.bitcast_convert_type(twin(lax.bitcast_convert_type(v, np.uint16)), BF16))
  assert np.array_equal(_bits(run(coded)), _bits(want))


@pytest.mark.parametrize("transport", ["padded", "ragged"])
@pytest.mark.parametrize("op", list(CASES))
def test_every_k_gives_the_same_bits(op, transport):
  """K = 1, 2, 3 (chunks of 2 x 1001 / 16 x 1001 elements: 3 does not divide them), compressed, on
  both transports; data movement also against jax.lax on the bit patterns, reductions against their
  raw fixed-order program. The data movement codes in every piece (no call falls back: pieces of
  101-element rows overflowed their share of the capacity, and the raw fallback hid the coded path)."""
  mesh = _mesh()
  fn, twin, spec = CASES[op]
  x = _data(1001, adversarial_rows=(5,) if op.startswith("psum") else ())  # a piece of row 5 goes raw
  ref = _run(mesh, fn, x, spec, pieces=1, compress=True, transport=transport)
  if twin is not None:
    want = _run(mesh, lambda v: lax.bitcast_convert_type(
        twin(lax.bitcast_convert_type(v, np.uint16)), BF16), x, spec)
    assert np.array_equal(_bits(ref), _bits(want))
  else:
    assert np.array_equal(_bits(ref), _bits(_run(mesh, fn, x, spec, compress=False, fixed_order=True)))
  for k in (2, 3):
    zipccl_jax.reset_stats()
    prev = zipccl_jax.set_runtime_stats(True)
    try:
      got = _run(mesh, fn, x, spec, pieces=k, compress=True, transport=transport)
      jax.effects_barrier()
    finally:
      zipccl_jax.set_runtime_stats(prev)
    assert np.array_equal(_bits(got), _bits(ref)), (op, k)
    if twin is not None:
      assert [st.fallbacks for st in zipccl_jax.stats().values()] == [0], (op, k)


@pytest.mark.parametrize("op", ["all_to_all", "all_gather", "all_gather_axis0", "ppermute",
                                "ppermute_partial"])
def test_ragged_pipelined_pieces_with_raw_rows_give_the_lax_bits(op):
  """The ragged transport's pipelined pieces (`_pieces.pipelined_pieces`: each piece's raw rows first,
  its frames into the same buffer, decode k ordered behind exchange k + 1) with rows whose pieces do
  not fit and travel raw, NaN payloads and signed zeros: jax.lax's bits for K = 1..4, and under
  jax.vmap."""
  mesh = _mesh()
  fn, twin, spec = CASES[op]
  x = _data(1001, seed=4, adversarial_rows=(3, 40, 77))
  x.view(np.uint16)[3, 500:] = 0  # row 3: its later pieces code small, its first goes raw
  lax_twin = lambda v: lax.bitcast_convert_type(twin(lax.bitcast_convert_type(v, np.uint16)), BF16)  # noqa: E731
  want = _run(mesh, lax_twin, x, spec)
  for k in (1, 2, 3, 4):
    got = _run(mesh, fn, x, spec, pieces=k, compress=True, transport="ragged")
    assert np.array_equal(_bits(got), _bits(want)), (op, k)
  xs = np.stack([x, _data(1001, seed=5)])

  def run(body):
    f = jax.jit(jax.shard_map(jax.vmap(body), mesh=mesh, in_specs=P(None, "i"),
                              out_specs=P(None, "i") if spec == P("i") else P()))
    return np.asarray(f(jax.device_put(xs, NamedSharding(mesh, P(None, "i")))))

  def coded(v):
    with zipccl_jax.use_algorithm(pieces=3):
      return fn(v, compress=True, transport="ragged")

  assert np.array_equal(_bits(run(coded)), _bits(run(lax_twin)))


@pytest.mark.parametrize("op", ["all_to_all", "all_gather", "ppermute", "ppermute_partial"])
def test_a_piece_that_overflows_falls_back_alone(op):
  """Random bits in a few rows: their pieces take the raw fallback, the others decode; the bits are
  jax.lax's either way."""
  mesh = _mesh()
  fn, twin, spec = CASES[op]
  x = _data(96, seed=1, adversarial_rows=(3, 40))
  x.view(np.uint16)[3, 48:] = 0  # row 3: its second half codes small
  want = _run(mesh, lambda v: lax.bitcast_convert_type(
      twin(lax.bitcast_convert_type(v, np.uint16)), BF16), x, spec)
  for k in (1, 2, 3):
    got = _run(mesh, fn, x, spec, pieces=k, compress=True)
    assert np.array_equal(_bits(got), _bits(want)), (op, k)


def test_piece_capacities_split_the_chunk():
  cap = capacity.padded_capacity(1000, BF16)
  assert capacity.piece_capacities(cap, 1000, 1, BF16) == [(0, 1000, cap)]
  parts = capacity.piece_capacities(cap, 1000, 3, BF16)
  assert [(lo, hi) for lo, hi, _ in parts] == [(0, 334), (334, 667), (667, 1000)]
  assert all(c % 8 == 0 or c == capacity.fmt.max_encoded_bytes(hi - lo, BF16) for lo, hi, c in parts)
  assert sum(c for *_, c in parts) <= cap + 3 * (32 + 64 + 8)
  assert capacity.piece_bounds(2, 5) == [(0, 1), (1, 2)]  # at most one piece per element


# --------------------------------------------------------------------------------------------------------- #
# The CUDA lowering: K independent chains
# --------------------------------------------------------------------------------------------------------- #

def _walk(op):
  yield op
  for region in op.regions:
    for block in region.blocks:
      for inner in block.operations:
        yield from _walk(inner.operation)


def _body_ops(module):
  """The operations of the shard_map body (inside @main's sdy.manual_computation)."""
  main = next(op for op in module.body.operations
              if op.operation.name == "func.func" and op.attributes["sym_name"].value == "main")
  # jax 0.11+ follows the manual computation with an sdy.sharding_constraint on its result
  ops = [o for o in main.regions[0].blocks[0].operations
         if o.operation.name not in ("func.return", "sdy.sharding_constraint")]
  while len(ops) == 1 and ops[0].operation.regions:
    ops = [o for o in ops[0].regions[0].blocks[0].operations
           if o.operation.name not in ("sdy.return", "stablehlo.return")]
  return [o.operation for o in ops]


def _chains(module):
  """Per zipccl op (a top-level op of the body holding a zipccl custom call or a collective, also
  inside its regions): its label and the encode ops among its ancestors (values used inside regions
  count, so a conditional reads what its branches capture)."""
  ops = _body_ops(module)
  producer = {}
  for i, op in enumerate(ops):
    for res in op.results:
      producer[res.get_name()] = i
  direct = []
  for op in ops:
    used = {v.get_name() for inner in _walk(op) for v in inner.operands}
    direct.append({producer[u] for u in used if u in producer})
  labels = []
  for op in ops:
    lab = []
    for inner in _walk(op):
      if inner.name == "stablehlo.custom_call":
        lab.append(str(inner.attributes["call_target_name"]).strip('"'))
      elif inner.name in COLLECTIVE_OPS:
        lab.append(inner.name)
    labels.append(lab)
  ancestors = []
  for i in range(len(ops)):  # ops are in program order: ancestors come first
    anc = set(direct[i])
    for j in direct[i]:
      anc |= ancestors[j]
    ancestors.append(anc)
  encodes = [i for i, lab in enumerate(labels) if lab == ["zipccl_encode"]]
  out = []
  for i, lab in enumerate(labels):
    if lab:
      out.append((lab, {j for j in ancestors[i] | {i} if j in encodes}))
  return out, encodes


def _cuda_module(op, pieces, transport):
  mesh = _mesh()
  fn, _, spec = CASES[op]
  x = _data(2048)

  def body(v):
    with zipccl_jax.use_algorithm(pieces=pieces):
      return fn(v, compress=True, transport=transport)

  prev = zipccl_jax.set_runtime_stats(False)
  try:
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=spec))
    lowered = f.trace(jax.device_put(x, NamedSharding(mesh, P("i")))).lower(
        lowering_platforms=("cuda",))
  finally:
    zipccl_jax.set_runtime_stats(prev)
  return lowered.compiler_ir("stablehlo")


@pytest.mark.parametrize("op,transport", [("all_to_all", "padded"), ("all_to_all", "ragged"),
                                          ("all_gather", "padded"), ("ppermute", "padded")])
def test_cuda_lowering_has_k_independent_chains(op, transport):
  k = 3
  chains, encodes = _chains(_cuda_module(op, k, transport))
  assert len(encodes) == k, chains
  if op == "ppermute":  # chained, not independent: transfer k+1 waits for transfer k (a barrier on
    # its frame), else XLA combines the permutes into one; decode k never waits for a later encode
    # (the call's fallback conditional, its raw permute, reads every chain's flag)
    prefixes = [set(sorted(encodes)[:i + 1]) for i in range(k)]
    for what, want in (("stablehlo.collective_permute", prefixes + [set(encodes)]),
                       ("zipccl_decode_into", prefixes)):
      sets = [enc for lab, enc in chains if lab == [what]]
      assert sorted(sets, key=len) == want, (what, chains)
    return
  if transport == "padded":
    # decode k writes into decode k-1's result (`codec.decode_frames_into`), so it reads the first k+1
    # encodes. Encodes and transfers are independent for a one-row operand; of several rows
    # (all_to_all) piece k's columns are sliced once piece k-1's frames exist (a column slice of
    # several rows is a copy, `_pieces.decode_pieces`), so they read the first k+1 encodes too. No
    # encode or transfer reads a decode. The call's one fallback (a loop holding only the raw
    # collective, no decode) reads every chain.
    prefixes = [set(sorted(encodes)[:i + 1]) for i in range(k)]
    sent = prefixes if op == "all_to_all" else [{e} for e in encodes]
    canon = lambda sets: sorted(sorted(e) for e in sets)  # noqa: E731
    assert canon(e for lab, e in chains if lab == ["zipccl_encode"]) == canon(sent), chains
    assert canon(e for lab, e in chains if lab == ["zipccl_decode_into"]) == canon(prefixes), chains
    colls = [e for lab, e in chains if any(c in lab for c in COLLECTIVE_OPS)]
    assert canon(colls) == canon(sent + [set(encodes)]), chains
    assert all(len(lab) == 1 for lab, _ in chains), chains  # no region holds a decode and a collective
    return
  # ragged: no conditional; the pieces are pipelined (`_pieces.pipelined_pieces`): frames exchange j
  # (j >= 1) and its raw-row exchange wait for exchange j-1 and decode j-2, so each reads the first
  # j+1 encodes; decode j reads exchange j+1's operands (the first j+2 encodes), the last decode
  # every encode. Each piece's size exchange, and piece 0's raw rows and frames, read its own encode
  # alone, and no encode reads anything coded.
  prefixes = [set(sorted(encodes)[:i + 1]) for i in range(k)]
  canon = lambda sets: sorted(sorted(e) for e in sets)  # noqa: E731
  decodes = [enc for lab, enc in chains if "zipccl_decode" in lab]
  assert canon(decodes) == canon(prefixes[1:] + [prefixes[-1]]), chains
  shared = [enc for lab, enc in chains if len(enc) > 1 and "zipccl_decode" not in lab]
  assert all(lab == ["stablehlo.ragged_all_to_all"] or lab == ["ragged_all_to_all"]
             for lab, enc in chains if len(enc) > 1 and "zipccl_decode" not in lab), chains
  assert canon(shared) == canon(prefixes[1:] * 2), chains  # raw rows, then frames
  own = [enc for lab, enc in chains if len(enc) == 1 and "zipccl_decode" not in lab
         and any(c in lab for c in COLLECTIVE_OPS)]
  assert {next(iter(e)) for e in own} == set(encodes), chains


@pytest.mark.parametrize("transport", ["padded", "ragged"])
def test_cuda_lowering_of_psum_scatter_runs_pieces_in_sequence(transport):
  """psum_scatter's pieces run one after another (`_reduce.reduce_rows`, for memory: one piece's frames
  and rows alive at a time): piece k+1's encode reads what piece k's sum computed, so each encode has
  every earlier one among its ancestors."""
  k = 3
  chains, encodes = _chains(_cuda_module("psum_scatter", k, transport))
  assert len(encodes) == k
  sets = [enc for lab, enc in chains if lab == ["zipccl_encode"]]
  assert sorted(sets, key=len) == [set(sorted(encodes)[:i + 1]) for i in range(k)], chains


@pytest.mark.parametrize("transport", ["padded", "ragged"])
def test_psum_scatter_pieces_of_nans_give_the_raw_bits(transport):
  """Every element a NaN (random payloads, quiet and signalling, both signs): each sum adds NaNs, whose
  result x86 takes from whichever operand the compiler put first. The coded sums, per piece, and the
  raw fixed-order program's, over the whole row, are different computations; `ordered_sum` pins the
  first NaN in rank order, so their bits agree for every K."""
  mesh = _mesh()
  fn, _, spec = CASES["psum_scatter"]
  rng = np.random.default_rng(7)
  u = (rng.integers(1, 1 << 7, size=(N * 16, 3 * 64), dtype=np.uint16) | 0x7F80
       | (rng.integers(0, 2, size=(N * 16, 3 * 64), dtype=np.uint16) << 15))
  x = u.view(BF16)
  want = _bits(_run(mesh, fn, x, spec, compress=False, fixed_order=True))
  for k in (1, 2, 3, 4):
    got = _bits(_run(mesh, fn, x, spec, pieces=k, compress=True, transport=transport))
    assert np.array_equal(got, want), k


@pytest.mark.parametrize("transport", ["padded", "ragged"])
def test_psum_scatter_pieces_under_vmap(transport):
  """Under jax.vmap each piece's start depends on a batched sum (a gather slices the columns): the bits
  are still the raw fixed-order program's."""
  mesh = _mesh()
  x = _data(101)[:, None, :].repeat(3, axis=1)   # (N * 16, 3 batch, 101)
  x.view(np.uint16)[:, 1] ^= 0x0001                # the batch's examples differ

  def run(pieces, **kw):
    def body(v):
      with zipccl_jax.use_algorithm(pieces=pieces):
        return jax.vmap(lambda u: zipccl_jax.psum_scatter(u, "i", tiled=True, **kw), in_axes=1, out_axes=1)(v)
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    return _bits(f(jax.device_put(x, NamedSharding(mesh, P("i")))))

  want = run(None, compress=False, fixed_order=True)
  assert np.array_equal(run(3, compress=True, transport=transport), want)


def test_xla_keeps_psum_scatter_pieces_in_sequence():
  """What orders the pieces is a zero XLA must not prove zero (`_exchange.zero_after`: the minimum of an
  unsigned value and 0). Were XLA's algebraic simplifier to fold it, the pieces' dynamic slices would
  become static and every encode could run first again. Checked on the optimized HLO XLA compiles here,
  with the running jax (the GPU pipeline shares the simplifier; benchmarks/gpu_memory.py measures the
  memory it then needs)."""
  mesh = _mesh()
  x = jax.device_put(_data(101), NamedSharding(mesh, P("i")))

  def optimized(pieces):
    def body(v):
      with zipccl_jax.use_algorithm(pieces=pieces):
        return zipccl_jax.psum_scatter(v, "i", tiled=True, compress=True)
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))).lower(x).compile().as_text()

  assert "dynamic-slice(" not in optimized(1)
  assert "dynamic-slice(" in optimized(3) and " minimum(" in optimized(3)


def test_ordered_sum_pins_the_first_nan():
  """The sum's NaN is the first NaN in row order, wherever the other NaNs are: in float32 its bits
  exactly; in bfloat16 its sign (XLA:CPU's rounding to bfloat16 writes the canonical quiet payload)."""
  from zipccl_jax import _reduce
  f32 = np.zeros((4, 3), np.uint32)
  f32[1] = [0xFFA00003, 0x7FC00001, 0x3F800000]   # a negative signalling NaN, a positive quiet one, 1.0
  f32[3] = [0x7FC00005, 0xFF800001, 0x7FC00009]   # NaNs of the other signs
  got = np.asarray(jax.jit(lambda r: _reduce.ordered_sum(r, r.dtype))(f32.view(np.float32))).view(np.uint32)
  assert list(got) == [0xFFA00003, 0x7FC00001, 0x7FC00009], [hex(g) for g in got]
  bf = (f32 >> 16).astype(np.uint16)
  got = np.asarray(jax.jit(lambda r: _reduce.ordered_sum(r, r.dtype))(bf.view(BF16))).view(np.uint16)
  assert np.isnan(got.view(BF16).astype(np.float32)).all() and list(got >> 15) == [1, 0, 0], got


def test_cuda_lowering_of_psum_chains_per_phase():
  """psum (reduce-scatter + all-gather) in 2 pieces: the reduce-scatter's piece k (its encode, transfer
  and decode, which writes into decode k-1's result) reads the first k+1 encodes (its rows' columns
  are sliced in turn, `_pieces.decode_pieces`); a gather chain reads the sums, which depend on every
  reduce-scatter chain (the reduction itself)."""
  chains, encodes = _chains(_cuda_module("psum", 2, "padded"))
  assert len(encodes) == 4  # 2 reduce-scatter + 2 all-gather encodes
  first = sorted(encodes)[:2]
  decodes = [enc for lab, enc in chains if "zipccl_decode_into" in lab]
  rs = [e for e in decodes if e <= set(first)]
  assert sorted(rs, key=len) == [{first[0]}, set(first)], decodes
  colls = [enc for lab, enc in chains if any(c in lab for c in COLLECTIVE_OPS) and enc <= set(first)]
  # the reduce-scatter's two transfers, then its fallback (a loop holding the raw collective)
  assert sorted(colls, key=len) == [{first[0]}, set(first), set(first)], chains


def test_k1_lowering_is_one_chain():
  chains, encodes = _chains(_cuda_module("all_to_all", None, "padded"))
  assert len(encodes) == 1


# --------------------------------------------------------------------------------------------------------- #
# The model's K
# --------------------------------------------------------------------------------------------------------- #

def test_model_k_is_one_on_cpu_and_grows_on_gpu_for_large_messages():
  m = 8 << 20  # 8M bfloat16 per chunk
  cpu = strategy.decide("all_to_all", BF16, m, axis_size=N, compress=True, platform="cpu",
                        log=False)
  assert cpu.pieces == 1
  gpu = strategy.decide("all_to_all", BF16, m, axis_size=N, compress=True, platform="gpu",
                        log=False)
  assert gpu.pieces > 1 and f"K={gpu.pieces} (model:" in gpu.reason, gpu
  assert gpu.est_compressed_s < strategy.decide(
      "all_to_all", BF16, m, axis_size=N, compress=True, platform="gpu", pieces=1,
      log=False).est_compressed_s
  small = strategy.decide("all_to_all", BF16, 4096, axis_size=N, compress=True, platform="gpu",
                          log=False)
  assert small.pieces == 1  # below one 64K block per piece
  ragged = strategy.decide("all_to_all", BF16, m, axis_size=N, compress=True, platform="gpu",
                           transport="ragged", log=False)
  # the ragged pieces are priced (pipelined from RAGGED_PIPELINED_FROM on) but K = 1 is kept, for
  # memory; pinned, the pipelined K is faster and predicted so
  assert ragged.pieces == 1 and programs.RAGGED_MEMORY in ragged.reason, ragged
  pinned = strategy.decide("all_to_all", BF16, m, axis_size=N, compress=True, platform="gpu",
                           transport="ragged", pieces=4, log=False)
  assert pinned.pieces == 4 and pinned.est_compressed_s < ragged.est_compressed_s, (pinned, ragged)
  auto = strategy.decide("all_to_all", BF16, m, axis_size=N, compress="auto", platform="gpu",
                         log=False)
  assert auto.compress and auto.transport == "padded" and auto.pieces == gpu.pieces


def test_psum_scatter_runs_in_sequential_pieces_off_cpu():
  """Off CPU psum_scatter takes MEMORY_PIECES pieces, one after another (no overlap: each piece's stages
  summed); on CPU, or a chunk of fewer codec blocks, fewer; a pin wins."""
  m = 8 << 20
  gpu = strategy.decide("psum_scatter", BF16, m, axis_size=N, compress=True, platform="gpu", log=False)
  assert gpu.pieces == programs.MEMORY_PIECES and "sequential, for memory" in gpu.reason, gpu
  ragged = strategy.decide("psum_scatter", BF16, m, axis_size=N, compress=True, platform="gpu",
                           transport="ragged", log=False)
  assert ragged.pieces == programs.MEMORY_PIECES
  assert strategy.decide("psum_scatter", BF16, m, axis_size=N, compress=True, platform="cpu",
                         log=False).pieces == 1
  assert strategy.decide("psum_scatter", BF16, 2 * 65536, axis_size=N, compress=True, platform="gpu",
                         log=False).pieces == 2
  assert strategy.decide("psum_scatter", BF16, m, axis_size=N, compress=True, platform="gpu", pieces=2,
                         log=False).pieces == 2
  stages = [((4.0, 0.1), (6.0, 0.2), (2.0, 0.1), 0.0)]
  k, t, _ = programs.choose_pieces(stages, 1 << 20, "gpu", op="psum_scatter")
  assert k == programs.MEMORY_PIECES and t == pytest.approx(programs.pipeline_time(stages, k, False))


def test_pipeline_time_model():
  stages = [((4.0, 0.1), (6.0, 0.2), (2.0, 0.1), 0.0)]  # encode, transfer, decode; raw rows
  assert programs.pipeline_time(stages, 1, True) == pytest.approx(12.4)
  assert programs.pipeline_time(stages, 1, False) == pytest.approx(12.4)
  # K = 2: one piece through all stages (6.4), then the slowest stage once more (3.2)
  assert programs.pipeline_time(stages, 2, True) == pytest.approx(6.4 + 3.2)
  assert programs.pipeline_time(stages, 2, False) == pytest.approx(12.8)
  k, t, cands = programs.choose_pieces(stages, 1 << 20, "gpu")
  fastest = min(c[1] for c in cands)
  assert k > 1 and t == fastest  # the fastest K; no margin (min_gain applies once, against raw)
  assert all(c[1] > fastest for c in cands if c[0] < k)  # a tie keeps the fewer pieces
  # ragged: K = 1 kept (memory), every K priced: below the first pipelined K in turn (slower than
  # K = 1), from it pipelined (faster where the codec is as slow as the wire)
  heavy = [((8.0, 0.01), (8.0, 0.01), (8.0, 0.01), 0.01)]  # ragged: a raw-row latency a piece
  for op, first in programs.RAGGED_PIPELINED_FROM.items():
    k, t, cands = programs.choose_pieces(heavy, 1 << 20, "gpu", transport="ragged", op=op)
    assert k == 1 and t == cands[0][1] and len(cands) == programs.MAX_PIECES, (op, cands)
    assert all((c < t) == (i >= first) for i, c in cands[1:]), (op, cands)
    assert programs.choose_pieces(heavy, 1 << 20, "gpu", 4, transport="ragged", op=op)[0] == 4
  assert programs.choose_pieces(stages, 1 << 20, "cpu")[0] == 1
  assert programs.choose_pieces(stages, 1 << 20, "cpu", pinned=3)[0] == 3


def test_explain_reports_k():
  mesh = _mesh()
  strategy.reset_decisions()
  _run(mesh, CASES["all_gather"][0], _data(64), P("i"), pieces=2, compress=True, name="ag_k2")
  d = strategy.decisions()["ag_k2"]
  assert d.pieces == 2 and "K=2 (use_algorithm" in d.reason
  assert "compressed K=2" in zipccl_jax.explain() and "pieces" in zipccl_jax.explain("ag_k2")
  st = zipccl_jax.stats()["ag_k2"]
  cap = capacity.padded_capacity(16 * 64, BF16)
  parts = capacity.piece_capacities(cap, 16 * 64, 2, BF16)
  assert st.wire_bytes == (N - 1) * sum(c for *_, c in parts)


SCHEDULES = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "results").glob(
    "gpu_schedule_*_padded*.json"))


@pytest.mark.parametrize("path", SCHEDULES, ids=lambda p: p.stem)
def test_pipeline_formula_follows_the_compiled_schedule(path):
  """The model's overlap (`programs.overlap_pattern`, which `pipeline_time` sums) is what XLA:GPU
  scheduled: per transfer, in order, the encodes and decodes placed between its start and done (a
  synchronous collective: none), from deviceless 8 x H100 compiles of the padded transport in K
  pieces (recorded by `JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 JAX_PLATFORMS=cpu python
  benchmarks/gpu_schedule.py --op OP --pieces K --json ...` with jax 0.11.2 + jax-cuda12-plugin).
  The call's one fallback (a loop, `_pieces.unless_fallback`; no conditional) comes after every
  decode."""
  rec = json.loads(path.read_text())
  k, op = rec["args"]["pieces"], rec["args"]["op"]
  got = tuple((sum(w.startswith("encode") for w in work), sum(w.startswith("decode") for w in work))
              for start, work in rec["overlaps"].items() if not start.startswith("all-reduce"))
  assert got == programs.overlap_pattern(k, op), (path.name, got)
  kinds = [kind for kind, _ in rec["schedule"]]
  assert "conditional" not in kinds and kinds.count("while") == 1 and kinds[-1] == "while", kinds
  assert kinds.count("decode") == k and kinds.count("encode") == k


def test_every_scheduled_pattern_has_its_compiled_schedule():
  """Each (op, K) of `programs.SCHEDULED` comes from a recorded schedule (the test above compares
  them), and every K the strategy may pick on a GPU is in the table."""
  recorded = {(json.loads(p.read_text())["args"]["op"], json.loads(p.read_text())["args"]["pieces"])
              for p in SCHEDULES}
  for op, by_k in programs.SCHEDULED.items():
    assert set(by_k) == set(range(2, programs.MAX_PIECES + 1)), op
    assert {(op, k) for k in by_k} <= recorded, op


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_schedule  # noqa: E402  (the schedule's reading, shared with the deviceless compiles)

RAGGED_SCHEDULES = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "results").glob(
    "gpu_schedule_*_ragged*.json"))


@pytest.mark.parametrize("path", RAGGED_SCHEDULES, ids=lambda p: p.stem)
def test_ragged_schedules_are_the_pipeline_the_model_costs(path):
  """The deviceless 8 x H100 schedules of all_to_all, all_gather and ppermute in K = 2..8 pieces on the
  ragged transport (the GPU default; recorded as the padded ones, `--transport ragged`): every encode
  and decode, no conditional or loop (no host round trip), and the pipeline exactly where the model
  costs one (`programs.overlap_pattern`: from `RAGGED_PIPELINED_FROM` pieces, decode k-1 during
  frames exchange k, no encode during any exchange) with XLA's default scheduler and with the
  latency-hiding one (``_lhs``: JAX's GPU performance guide sets it). tests/test_deviceless_gpu.py
  compiles every K afresh, at several sizes."""
  rec = json.loads(path.read_text())
  k, op = rec["args"]["pieces"], rec["args"]["op"]
  kinds = [kind for kind, _ in rec["schedule"]]
  assert "conditional" not in kinds and "while" not in kinds
  assert kinds.count("encode") == k and kinds.count("decode") == k
  costed = sum(d for _, d in programs.overlap_pattern(k, op, "ragged")) == k - 1
  got = gpu_schedule.ragged_pipelined(rec["overlaps"], k)
  assert got == costed, (path.name, got, costed)


def test_every_ragged_k_the_model_may_pick_has_its_compiled_schedule():
  recorded = {(json.loads(p.read_text())["args"]["op"], json.loads(p.read_text())["args"]["pieces"])
              for p in RAGGED_SCHEDULES}
  for op in programs.RAGGED_PIPELINED_FROM:
    assert {(op, k) for k in range(2, programs.MAX_PIECES + 1)} <= recorded, op


def test_ragged_pipeline_time_is_the_pattern_laid_out():
  """Ragged, pipelined: t(K) = K e + w + (K-1) max(w, d) + d + K latency per phase (each piece's
  raw-row exchange in turn); an op not pipelined there (psum's phases), every stage in turn."""
  stages = [((3.0, 0.1), (8.0, 0.2), (6.0, 0.1), 0.2)]  # a ragged phase: its raw rows' latency
  e, w, d, lat = 3.0 / 4 + 0.1, 8.0 / 4 + 0.2, 6.0 / 4 + 0.1, 0.2
  assert programs.pipeline_time(stages, 4, True, "ppermute", "ragged") == pytest.approx(
      4 * e + w + 3 * max(w, d) + d + 4 * lat)
  assert programs.overlap_pattern(4, "ppermute", "ragged") == ((0, 0), (0, 1), (0, 1), (0, 1))
  assert programs.overlap_pattern(2, "ppermute", "ragged") == ((0, 0), (0, 1))
  assert programs.overlap_pattern(3, "psum", "ragged") == ((0, 0),) * 3
  e3, w3, d3 = 3.0 / 3 + 0.1, 8.0 / 3 + 0.2, 6.0 / 3 + 0.1
  assert programs.pipeline_time(stages, 3, True, "psum", "ragged") == pytest.approx(
      3 * (e3 + w3 + d3 + lat))
  assert programs.pipeline_time(stages, 3, False, "ppermute", "ragged") == pytest.approx(
      3 * (e3 + w3 + d3 + lat))  # no overlap (CPU): the raw-row exchanges all the same
  assert programs.pipeline_time(stages, 1, True, "ppermute", "ragged") == pytest.approx(
      3.1 + 8.2 + 6.1 + lat)


def test_psums_second_phase_is_priced_padded_on_the_ragged_transport():
  """psum's coded program on the ragged transport: its first phase sends ragged frames (expected
  size, a raw-row exchange a piece), its second, the all_gather of the reduced chunks, stays padded
  (capacity, no raw-row exchange), as `coded_time` prices the call."""
  from zipccl_jax.strategy.codec_cost import CodecModel
  from zipccl_jax.strategy.links import LinkModel
  codec, link, n = CodecModel(1e9, 2e9, 0.0, 0.0), LinkModel(1e-3, 1e9), 8
  phases = programs.structure("psum", n)
  cap, frame = 3000, 2000
  ragged = programs.pipeline_stages([link] * 2, phases, [codec] * 2, cap, 4000, n, transport="ragged",
                                    op="psum", exp_frame=frame)
  padded = programs.pipeline_stages([link] * 2, phases, [codec] * 2, cap, 4000, n)
  assert [st[3] for st in ragged] == [1e-3, 0.0] and [st[3] for st in padded] == [0.0, 0.0]
  assert ragged[1] == padded[1]  # phase 2: the padded stages, capacity and all
  assert ragged[0][1][0] == pytest.approx(padded[0][1][0] * frame / cap)
  # K pieces add K raw-row latencies for phase 1 only (psum's pieces run in turn on ragged)
  for k in (2, 4):
    assert programs.pipeline_time(ragged, k, True, "psum", "ragged") - programs.pipeline_time(
        [ragged[0][:3] + (0.0,), ragged[1]], k, True, "psum", "ragged") == pytest.approx(k * 1e-3)


def test_pipeline_time_is_the_pattern_laid_out():
  """t(K) = e + (K-1) max(w, e) + max(w, (K-1) d) + d per phase; t(1) = e + w + d; without overlap
  K (e + w + d)."""
  stages = [((3.0, 0.1), (8.0, 0.2), (6.0, 0.1), 0.0)]
  e, w, d = 3.0 / 4 + 0.1, 8.0 / 4 + 0.2, 6.0 / 4 + 0.1
  assert programs.pipeline_time(stages, 4, True) == pytest.approx(
      e + 3 * max(w, e) + max(w, 3 * d) + d)
  assert programs.pipeline_time(stages, 1, True) == pytest.approx(3.1 + 8.2 + 6.1)
  assert programs.pipeline_time(stages, 4, False) == pytest.approx(4 * (e + w + d))
