"""One mesh axis across hosts (`zipccl_jax.use_levels`): all_gather, psum_scatter and all_to_all over a
single axis ``"i"`` of 8 virtual CPU devices declared as 2 hosts of 4 run the two-level programs of a
``("host", "local")`` mesh, their phases collectives over the levels' ``axis_index_groups`` of ``"i"``
(all_to_all's exchanges over every rank over ``"i"`` itself).

Every variant gives the bits of the same variant over the tuple mesh (the same data at the same ranks),
``auto`` decides from the profile's links of the levels, and bad declarations raise at once.
"""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import zipccl_jax
from zipccl_jax import strategy
from zipccl_jax.strategy import levels as two_level
from zipccl_jax.strategy.links import LinkModel
from zipccl_jax.strategy.profile import Profile

H, L = 2, 4
N = H * L
AXES = ("host", "local")
BF16 = ml_dtypes.bfloat16
pytestmark = pytest.mark.skipif(jax.device_count() < N, reason="needs 8 devices")
VARIANTS = [("flat", None, False), ("flat", None, True)] + [
    ("hierarchical", {"host": cs, "local": cf}, None) for cs, cf in itertools.product((False, True), repeat=2)]


def _profile():
  """A slow host level, a fast local one, and the flat tuple as slow as the host level."""
  p = Profile()
  p.links = {"host": {"*": LinkModel(1e-4, 3e7)}, "local": {"*": LinkModel(1e-5, 3e9)},
             "host,local": {"*": LinkModel(2e-4, 3e7)}}
  return p


def _payload(shape, seed=0):
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal(shape, np.float32) * 0.02).astype(BF16)
  u = x.reshape(-1).view(np.uint16)
  u[rng.choice(u.size, 8, replace=False)] = [0x7FC1, 0xFFA3, 0x8000, 0, 0x7F80, 0xFF80, 1, 0x8003]
  return x


def _run(one_axis, body, x):
  """`body` on the one-axis mesh ("i",) or on the (host, local) mesh, rank h * L + l holding block h * L + l."""
  devices = np.array(jax.devices()[:N])
  mesh, spec = ((Mesh(devices, ("i",)), P("i")) if one_axis
                else (Mesh(devices.reshape(H, L), AXES), P(AXES)))
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
  return np.asarray(f(jax.device_put(x, NamedSharding(mesh, spec))))


def _variant(op, alg, levels, compress, one_axis):
  axis = "i" if one_axis else AXES

  def body(v):
    mode = compress if alg == "flat" else True
    with two_level.use_algorithm(alg, levels), zipccl_jax.use_levels({"i": L}):
      if op == "all_gather":
        return zipccl_jax.all_gather(v, axis, tiled=True, compress=mode)[None]
      if op == "all_to_all":
        return zipccl_jax.all_to_all(v, axis, 0, 0, tiled=True, compress=mode)
      return zipccl_jax.psum_scatter(v[0], axis, tiled=True, compress=mode, fixed_order=True)[None]
  return body


@pytest.mark.parametrize("alg,levels,compress", VARIANTS, ids=lambda v: str(v))
@pytest.mark.parametrize("op", ["all_gather", "psum_scatter", "all_to_all"])
def test_every_variant_is_the_tuple_programs_bits(op, alg, levels, compress):
  x = _payload({"psum_scatter": (N, N * 512), "all_to_all": (N * N * 512,)}.get(op, (N * 2048,)))
  zipccl_jax.reset_stats()
  got = _run(True, _variant(op, alg, levels, compress, True), x)
  assert not any(s.fallbacks for s in zipccl_jax.stats().values())  # the coded paths ran
  want = _run(False, _variant(op, alg, levels, compress, False), x)
  assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), (op, alg, levels, compress)
  if op == "all_gather":  # data movement: jax.lax's bits
    assert np.array_equal(got.reshape(N, -1).view(np.uint16),
                          np.broadcast_to(x.reshape(1, -1), (N, x.size)).view(np.uint16))
  if op == "all_to_all":  # rank d's block from rank s is rank s's block for d
    blocks = x.reshape(N, N, -1)
    assert np.array_equal(got.reshape(N, N, -1).view(np.uint16), blocks.transpose(1, 0, 2).view(np.uint16))


@pytest.mark.parametrize("levels", [{"host": True, "local": False}, {"host": True, "local": True},
                                    {"host": False, "local": False}], ids=["mixed", "rounds_coded", "rounds_raw"])
def test_all_to_all_over_one_axis_runs_its_exchanges_over_the_axis(levels):
  """HLO of the one-axis all_to_all: the mixed slots go over all 8 ranks of "i" and the tails over each
  host's group; the rounds are collective-permutes from (h, l) to (h + 1, l + s), the own host's rows an
  all_to_all over each host's group."""
  x = _payload((N * N * 512,))
  mesh = Mesh(np.array(jax.devices()[:N]), ("i",))

  def body(v):
    with two_level.use_algorithm("hierarchical", levels), zipccl_jax.use_levels({"i": L}):
      return zipccl_jax.all_to_all(v, "i", 0, 0, tiled=True)

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
  text = f.lower(jax.device_put(x, NamedSharding(mesh, P("i")))).as_text()
  host = "replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]>"
  if levels["host"] and not levels["local"]:
    whole = ("replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]>",  # jax 0.12: the axis by name
             'replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = "i">')
    assert any(w in text for w in whole) and host in text
    assert "collective_permute" not in text
  else:
    for s in range(L):  # round (1, s): device (0, l) sends to (1, (l + s) % L), rank 4 + (l + s) % L
      pairs = ", ".join(f"[{l}, {L + (l + s) % L}]" for l in range(L))
      assert pairs in text, (s, pairs)
    assert host in text  # the own host's rows (and the coded rounds' flag sum)


def test_jax_refuses_a_grouped_psum_under_check_vma():
  """Why the coded rounds' overflow flag over one axis is an all_gather over each host's group
  (`_by_rounds.exchange_rounds`): jax's psum over axis_index_groups raises NotImplementedError in a
  shard_map with check_vma (jax 0.10.2 to 0.12), where the tuple form's psum over `fast` is fine."""
  mesh = Mesh(np.array(jax.devices()[:N]), ("i",))
  groups = [[h * L + l for l in range(L)] for h in range(H)]
  f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "i", axis_index_groups=groups), mesh=mesh,
                            in_specs=P("i"), out_specs=P("i")))
  with pytest.raises(NotImplementedError):
    f(jnp.ones((N,), jnp.int32))


def test_the_slow_phase_codes_over_hosts_the_fast_one_inside_them():
  """HLO: the coded all_gather runs over groups of H ranks (one per local index, u8 frames), the raw
  one over the L ranks of each host (u16)."""
  x = _payload((N * 4096,))
  devices = np.array(jax.devices()[:N])
  mesh = Mesh(devices, ("i",))

  def body(v):
    with two_level.use_algorithm("hierarchical", {"host": True, "local": False}), \
         zipccl_jax.use_levels({"i": L}):
      return zipccl_jax.all_gather(v, "i", tiled=True)[None]

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
  text = f.lower(jax.device_put(x, NamedSharding(mesh, P("i")))).as_text()
  assert "replica_groups = dense<[[0, 4], [1, 5], [2, 6], [3, 7]]>" in text  # slow: (h, l) for each l
  assert "replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]>" in text      # fast: one host
  colls = [c for c in zipccl_jax.hlo_collectives(f.lower(jax.device_put(
      x, NamedSharding(mesh, P("i")))).compile().as_text(), num_devices=N)
           if c["op"] == "all-gather" and not c["fallback"]]
  by_group = {}
  for c in colls:
    by_group.setdefault(c["group_size"], set()).add(c["shape"].split("[")[0].lstrip("("))
  assert "u8" in by_group[H] and by_group[L] == {"u16"}, colls


def test_auto_decides_from_the_levels_links_and_explains():
  x = _payload((N * 65536,))
  strategy.reset_decisions()
  with zipccl_jax.use_profile(_profile()):
    def body(v):
      with zipccl_jax.use_levels({"i": L}):
        return zipccl_jax.all_gather(v, "i", tiled=True, name="ag")[None]
    out = _run(True, body, x)
  assert np.array_equal(out.reshape(N, -1).view(np.uint16),
                        np.broadcast_to(x.reshape(1, -1), (N, x.size)).view(np.uint16))
  ds = zipccl_jax.decisions()
  assert ds["ag [levels]"].algorithm.startswith("hierarchical(host:c"), ds["ag [levels]"]
  assert ds["ag/host"].compress and ds["ag/host"].axis_size == H
  assert not ds["ag/local"].compress and ds["ag/local"].axis_size == L


def test_auto_runs_all_to_all_over_one_axis_as_over_the_tuple():
  """MoE dispatch written over one "expert" axis across hosts: auto's choice and bits are the tuple's."""
  x = _payload((N * N * 4096,))
  got = {}
  with zipccl_jax.use_profile(_profile()):
    for one_axis in (True, False):
      strategy.reset_decisions()

      def body(v):
        with zipccl_jax.use_levels({"i": L}):
          return zipccl_jax.all_to_all(v, "i" if one_axis else AXES, 0, 0, tiled=True, name="a2a")
      got[one_axis] = (_run(one_axis, body, x), zipccl_jax.decisions()["a2a [levels]"].algorithm)
  assert got[True][1] == got[False][1] and got[True][1].startswith("hierarchical(host:c"), got
  assert np.array_equal(got[True][0].view(np.uint16), got[False][0].view(np.uint16))


def test_undeclared_or_unknown_levels_stay_flat():
  x = _payload((N * 1024,))
  for declare in (False, True):  # declared, but the profile has no links for the levels: flat too
    strategy.reset_decisions()

    def body(v):
      if declare:
        with zipccl_jax.use_levels({"i": L}):
          return zipccl_jax.all_gather(v, "i", tiled=True, name="ag")[None]
      return zipccl_jax.all_gather(v, "i", tiled=True, name="ag")[None]
    _run(True, body, x)
    assert "ag [levels]" not in zipccl_jax.decisions()


@pytest.mark.parametrize("per_host,levels,match", [
    ({"i": 1}, ("host", "local"), "per_host"), ({"i": 2.0}, ("host", "local"), "per_host"),
    ({"i": True}, ("host", "local"), "per_host"), (["i"], ("host", "local"), "per_host"),
    ({"i": 4}, ("host", "host"), "levels"), ({"i": 4}, ("host",), "levels"),
])
def test_bad_declarations_raise_naming_the_argument(per_host, levels, match):
  with pytest.raises(ValueError, match=match):
    with zipccl_jax.use_levels(per_host, levels):
      pass


def test_hosts_that_do_not_divide_the_axis_raise_at_trace_time():
  x = _payload((N * 1024,))

  for pin in ("hierarchical", "auto"):  # also where the profile has no links for the levels
    def body(v):
      with two_level.use_algorithm(pin), zipccl_jax.use_levels({"i": 3}):
        return zipccl_jax.all_gather(v, "i", tiled=True)[None]
    with pytest.raises(ValueError, match="3 devices per host on axis 'i'"):
      _run(True, body, x)


@pytest.mark.parametrize("op", ["all_gather", "all_to_all"])
def test_grad_through_the_one_axis_programs_is_the_tuples(op):
  x = _payload((N, N * 2048 if op == "all_to_all" else 2048)).astype(np.float32)
  w = np.random.default_rng(5).standard_normal((N, N * 2048)).astype(np.float32)

  def grad(one_axis):
    axis = "i" if one_axis else AXES

    def body(v, w):
      def f(v):
        with two_level.use_algorithm("hierarchical", {"host": True, "local": False}), \
             zipccl_jax.use_levels({"i": L}), zipccl_jax.use_defaults(fixed_order=True):
          if op == "all_to_all":  # its transpose is the all_to_all back, over the same levels
            return jnp.sum(zipccl_jax.all_to_all(v[0], axis, 0, 0, tiled=True) * w[0])
          return jnp.sum(zipccl_jax.all_gather(v[0], axis, tiled=True) * w[0])
      return jax.grad(f)(v)

    devices = np.array(jax.devices()[:N])
    mesh, spec = ((Mesh(devices, ("i",)), P("i")) if one_axis
                  else (Mesh(devices.reshape(H, L), AXES), P(AXES)))
    g = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, spec), out_specs=spec))
    put = lambda a: jax.device_put(a, NamedSharding(mesh, spec))
    return np.asarray(g(put(x), put(w)))

  assert np.array_equal(grad(True).view(np.uint32), grad(False).view(np.uint32))


def test_under_vmap_a_declared_axis_is_flat():
  """jax.vmap of a call over a declared axis runs the flat call (jax cannot batch the phases' grouped
  exchanges), whose bits are the flat program's."""
  x = np.stack([_payload((N, N * 256), s) for s in (6, 7)]).astype(np.float32)  # (2, N, N * 256)
  mesh = Mesh(np.array(jax.devices()[:N]), ("i",))
  spec = P(None, "i")

  def run(declare):
    def one(v):
      with two_level.use_algorithm("auto"), zipccl_jax.use_levels({"i": L} if declare else {"j": L}):
        return zipccl_jax.psum_scatter(v[0], "i", tiled=True, compress=True)[None]
    f = jax.jit(jax.shard_map(jax.vmap(one), mesh=mesh, in_specs=spec, out_specs=spec))
    return np.asarray(f(jax.device_put(x, NamedSharding(mesh, spec))))

  with zipccl_jax.use_profile(_profile()):
    assert np.array_equal(run(True).view(np.uint32), run(False).view(np.uint32))


def _psum_run(one_axis, body, x, vma):
  devices = np.array(jax.devices()[:N])
  mesh, spec = ((Mesh(devices, ("i",)), P("i")) if one_axis
                else (Mesh(devices.reshape(H, L), AXES), P(AXES)))
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=P(None) if vma else spec,
                            check_vma=vma))
  return np.asarray(f(jax.device_put(x, NamedSharding(mesh, spec))))


LEVEL_PATTERNS = [{"host": cs, "local": cf} for cs, cf in itertools.product((False, True), repeat=2)]


@pytest.mark.parametrize("levels", LEVEL_PATTERNS,
                         ids=lambda v: f"host_{'c' if v['host'] else 'r'}_local_{'c' if v['local'] else 'r'}")
def test_psum_without_check_vma_is_the_tuple_programs_bits(levels):
  """psum over a declared axis (check_vma off): its four phases over the levels' groups, the bits of the
  same variant over the tuple mesh, for a size n does not divide."""
  x = _payload((N, 7 * 53))

  def body(one_axis):
    def f(v):
      with two_level.use_algorithm("hierarchical", levels), zipccl_jax.use_levels({"i": L}):
        return zipccl_jax.psum(v[0], "i" if one_axis else AXES, fixed_order=True)[None]
    return f
  got = _psum_run(True, body(True), x, False)
  want = _psum_run(False, body(False), x, False)
  assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), levels


def test_psum_with_check_vma_stays_flat():
  """With check_vma, jax types a psum's result invariant over the axis, which grouped gathers cannot give
  (no collective over the whole axis ends the program): psum over a declared axis runs flat, and auto
  decides as without levels; psum_scatter over it still runs two-level."""
  x = _payload((N, 8 * 65536))
  strategy.reset_decisions()
  with zipccl_jax.use_profile(_profile()):
    def body(v):
      with zipccl_jax.use_levels({"i": L}):
        return zipccl_jax.psum(v[0], "i", name="dp")[None]

    def scatter(v):
      with zipccl_jax.use_levels({"i": L}):
        return zipccl_jax.psum_scatter(v[0], "i", tiled=True, name="rs")[None]
    _psum_run(True, body, x, True)
    _run(True, scatter, x)
  ds = zipccl_jax.decisions()
  assert "dp [levels]" not in ds and "dp" in ds
  assert ds["rs [levels]"].algorithm.startswith("hierarchical"), ds["rs [levels]"]
