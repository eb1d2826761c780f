"""The CUDA codec calls take their scratch as an XLA-allocated result and are registered command-buffer
compatible (xla_ffi/handlers_cuda.cc, xla_ffi/cuda_scratch.h, zipccl_jax/codec.py `_codec_call`).

Checked here without a GPU, in the programs JAX lowers for CUDA: every zipccl custom call carries one more
result, `uint8[cuda_scratch_bytes]` with the size the extension computes from the very layout the handler
checks it against; the CPU lowering carries none; the registration asks XLA for the command-buffer trait.
tests/test_ffi_contract.py runs the handlers with that result (and no run-time allocation).
"""
from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import zipccl_jax as zj
from zipccl_jax import _ffi, codec

EXT = _ffi.extension()
AXIS = "x"
N = 8

# `%r:3 = stablehlo.custom_call @zipccl_encode(%a, ...) {...} : (tensor<...>, ...) -> (tensor<...>, ...)`
CALL = re.compile(r"stablehlo\.custom_call @(zipccl_encode|zipccl_decode)\(.*\} : \((.*)\) -> (.*)$")


def _dims(t: str) -> tuple[tuple[int, ...], str]:
  m = re.fullmatch(r"tensor<((?:\d+x)*)([a-z0-9A-Z]+)>", t.strip())
  assert m, t
  return tuple(int(d) for d in m.group(1).split("x") if d), m.group(2)


def _calls(text: str):
  """(target, operand types, result types) of every zipccl custom call in a StableHLO text."""
  out = []
  for line in text.splitlines():
    m = CALL.search(line.strip())
    if m:
      ops = [_dims(t) for t in re.findall(r"tensor<[^>]*>", m.group(2))]
      rets = [_dims(t) for t in re.findall(r"tensor<[^>]*>", m.group(3))]
      out.append((m.group(1), ops, rets))
  return out


def _expected_scratch(target, ops, rets) -> int:
  if target == "zipccl_encode":  # x (F, *s): frames of prod(s) elements
    (xshape, _), frames = ops[0], math.prod(rets[1][0])
    return EXT.cuda_scratch_bytes("encode", frames, math.prod(xshape) // max(frames, 1))
  (pshape, _), (oshape, _) = ops[0], rets[0]  # payload (*F, C) -> out (*F, *shape)
  frames = math.prod(pshape[:-1])
  return EXT.cuda_scratch_bytes("decode", frames, math.prod(oshape) // max(frames, 1))


def _check_scratch(text: str, batch: int = 1) -> int:
  calls = _calls(text)
  assert calls, text[:2000]
  for target, ops, rets in calls:
    (shape, dtype) = rets[-1]
    assert dtype == "ui8", (target, rets)
    assert math.prod(shape) == batch * _expected_scratch(target, ops, rets) > 0, (target, ops, rets)
  return len(calls)


def _smap(body):
  mesh = Mesh(np.array(jax.devices("cpu")[:N]), (AXIS,))
  return jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS))


def _x(rows=N * N, cols=4096):
  rng = np.random.default_rng(0)
  return jnp.asarray((rng.standard_normal((rows, cols)) * 0.5).astype(jnp.bfloat16))


def test_the_scratch_size_is_the_layouts_plus_alignment_slack():
  host = EXT.cuda_host
  for frames, n in ((1, 1), (3, 70001), (8, 65536), (2, 300000)):
    assert EXT.cuda_scratch_bytes("encode", frames, n) == host.encode_layout(frames, n)["scratch_bytes"] + 240
    assert EXT.cuda_scratch_bytes("decode", frames, n) == host.decode_layout(frames, n)["scratch_bytes"] + 240
  assert EXT.cuda_scratch_bytes("encode", 0, 5) == EXT.cuda_scratch_bytes("decode", 0, 5) == 0
  with pytest.raises(ValueError, match="encode' or 'decode"):
    EXT.cuda_scratch_bytes("count", 1, 1)


@pytest.mark.parametrize("op", ["all_to_all", "all_gather", "ppermute"])
def test_cuda_lowering_of_a_compressed_collective_carries_the_scratch_result(op):
  body = {
      "all_to_all": lambda v: zj.all_to_all(v, AXIS, 0, 0, tiled=True, compress=True),
      "all_gather": lambda v: zj.all_gather(v, AXIS, tiled=True, compress=True)[: v.shape[0]],
      "ppermute": lambda v: zj.ppermute(v, AXIS, [(i, (i + 1) % N) for i in range(N)], compress=True),
  }[op]
  traced = jax.jit(_smap(body)).trace(_x())
  cuda = traced.lower(lowering_platforms=("cuda",)).as_text()
  n = _check_scratch(cuda)
  assert {t for t, _, _ in _calls(cuda)} == {"zipccl_encode", "zipccl_decode"}, n
  # On CPU: the same calls, without the scratch (encode: payload and sizes; decode: out only).
  for target, ops, rets in _calls(traced.lower(lowering_platforms=("cpu",)).as_text()):
    assert len(rets) == (2 if target == "zipccl_encode" else 1), (target, rets)


def test_the_status_and_skip_variants_carry_it_last():
  x = _x(4, 3000)
  skip = jnp.array([False, True, False, False])

  def f(v, s):
    p, _ = codec.encode_frames(v, skip=s)
    return codec.decode_frames(p, shape=(3000,), dtype=v.dtype, skip=s, return_status=True)

  text = jax.jit(f).trace(x, skip).lower(lowering_platforms=("cuda",)).as_text()
  calls = _calls(text)
  assert [len(r) for _, _, r in calls] == [3, 3], calls  # encode: payload, nbytes, scratch; decode: out, status, scratch
  assert calls[1][2][1] == ((4,), "i32")
  assert len(calls[0][1]) == len(calls[1][1]) == 2  # the skip operand
  _check_scratch(text)
  out, status = jax.jit(f)(x, skip)  # and on CPU it runs as before
  assert (np.asarray(status) == 0).all() and (np.asarray(out[0]) == np.asarray(x[0])).all()


def test_vmap_batches_the_scratch_with_the_frames():
  x = jnp.zeros((3, 4, 5000), jnp.bfloat16)
  f = jax.vmap(lambda v: codec.decode_frames(codec.encode_frames(v)[0], shape=(5000,), dtype=v.dtype))
  text = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()
  for target, ops, rets in _calls(text):  # (3, S) with S the unbatched call's bytes
    shape, _ = rets[-1]
    unbatched = EXT.cuda_scratch_bytes("encode" if target == "zipccl_encode" else "decode", 4, 5000)
    assert shape == (3, unbatched), (target, rets)
    assert EXT.cuda_scratch_bytes(target[7:], 12, 5000) <= 3 * unbatched  # what the batched call needs


def test_one_program_lowers_for_both_platforms():
  """A multi-platform lowering keeps both calls, chosen by the platform when compiled."""
  x = _x(2, 1000)
  text = jax.jit(lambda v: codec.encode_frames(v)).trace(x).lower(
      lowering_platforms=("cpu", "cuda")).as_text()
  assert sorted(len(r) for _, _, r in _calls(text)) == [2, 3]


def test_registration_asks_for_the_command_buffer_trait(monkeypatch):
  from jaxlib import xla_client
  calls = []
  monkeypatch.setattr(jax.ffi, "register_ffi_target",
                      lambda name, fn, platform="cpu", **kw: calls.append((name, platform, kw)))
  monkeypatch.setattr(_ffi, "_registered", False)
  _ffi.register()
  trait = xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE
  for name, platform, kw in calls:
    assert kw == ({"traits": trait} if platform == "CUDA" else {}), (name, platform, kw)
  cuda = sorted(name for name, platform, _ in calls if platform == "CUDA")
  assert cuda == (["zipccl_decode", "zipccl_decode_into", "zipccl_encode"] if EXT.with_cuda else [])
  # the keyword reaches jaxlib in this jax (0.10.2 to 0.12 have it)
  import inspect
  assert "traits" in inspect.signature(xla_client.register_custom_call_target).parameters
