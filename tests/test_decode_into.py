"""`codec.decode_frames_into`: frames decoded into columns of a given array (the padded
transport's pieces decode into one result this way, `zipccl_jax._pieces.decode_pieces`). Bits are
compared as uint views."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from zipccl_jax import codec

DTYPES = [jnp.bfloat16, jnp.float16, jnp.float32, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]


def _bits(a):
  a = np.asarray(a)
  return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _data(dtype, shape, seed):
  """Gaussian values and the specials a codec keeps: NaN payloads, +-0, subnormals, Infs."""
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal(shape) * 0.02).astype(np.float32).astype(dtype)
  u = _bits(x).copy()
  w = u.dtype.itemsize * 8
  special = {16: [0x7FC1, 0xFFC3, 0x8000, 0x0001, 0x7F80],
             32: [0x7FC00001, 0x80000000, 1, 0x7F800000], 8: [0x7F, 0x80, 0x01, 0x7E]}[w]
  if np.dtype(dtype) == np.float16:
    special = [0x7E01, 0xFE03, 0x8000, 0x0001, 0x7C00]
  u.reshape(-1)[:len(special)] = special
  return u.view(np.dtype(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_frames_land_in_their_columns_and_nothing_else_moves(dtype):
  frames, n, row, col = 3, 70_000, 90_001, 12_345  # more than one codec block; an odd column
  x = _data(dtype, (frames, n), 1)
  into = _data(dtype, (frames, row), 2)
  payload, _ = codec.encode_frames(jnp.asarray(x), capacity=int(codec.max_encoded_bytes(n, dtype)))
  into_cols = jax.jit(lambda i, p: codec.decode_frames_into(i, p, col=col, elems=n))
  got = into_cols(jnp.asarray(into), payload)
  want = _bits(into).copy()
  want[:, col:col + n] = _bits(x)
  assert np.array_equal(_bits(got), want)


def test_skip_status_and_a_rejected_frame():
  x = _data(jnp.bfloat16, (3, 5000), 3)
  into = np.full((3, 6000), 7, np.uint16).view(jnp.bfloat16)
  payload, _ = codec.encode_frames(jnp.asarray(x), capacity=12_000)
  payload = payload.at[1, 40].set(payload[1, 40] ^ 0x10)  # frame 1 damaged (its blocks' sizes)
  got, status = codec.decode_frames_into(jnp.asarray(into), payload, col=1000, elems=5000,
                                         skip=jnp.array([False, False, True]), return_status=True)
  got, status = _bits(got), np.asarray(status)
  assert status[0] == 0 and status[1] != 0 and status[2] == 0
  assert np.array_equal(got[0, 1000:], _bits(x)[0])
  assert (got[1, 1000:] == codec.REJECTED_FILL_BITS[np.dtype(jnp.bfloat16)]).all()
  assert (got[2, 1000:] == 0).all() and (got[:, :1000] == 7).all()
  with pytest.raises((jax.errors.JaxRuntimeError, ValueError), match="zipccl decode"):
    np.asarray(codec.decode_frames_into(jnp.asarray(into), payload, col=1000, elems=5000))


def test_the_operand_is_unchanged_when_used_afterwards():
  """The custom call aliases `into`; XLA copies it first when it is still needed (a value, not a
  buffer)."""
  x = _data(jnp.float32, (2, 4000), 4)
  payload, _ = codec.encode_frames(jnp.asarray(x), capacity=20_000)

  def f(i, p):
    return codec.decode_frames_into(i, p, col=0, elems=4000), i + 0

  into = jnp.zeros((2, 4000), jnp.float32)
  got, again = jax.jit(f)(into, payload)
  assert np.array_equal(_bits(got), _bits(x)) and not _bits(again).any()


def test_vmap_decodes_each_example_into_its_own_array():
  x = _data(jnp.bfloat16, (2, 3, 3000), 5)
  payload = jnp.stack([codec.encode_frames(jnp.asarray(x[b]), capacity=8000)[0] for b in range(2)])
  into = jnp.asarray(_data(jnp.bfloat16, (2, 3, 3500), 6))
  got = jax.vmap(lambda i, p: codec.decode_frames_into(i, p, col=500, elems=3000))(into, payload)
  want = _bits(into).copy()
  want[:, :, 500:] = _bits(x)
  assert np.array_equal(_bits(got), want)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(col=-1, elems=10), ValueError, "col must be >= 0"),
    (dict(col=0, elems=True), TypeError, "elems must be an int"),
    (dict(col=2.0, elems=10), TypeError, "col must be an int"),
    (dict(col=95, elems=10), ValueError, r"columns \[col, col \+ elems\) = \[95, 105\)"),
])
def test_bad_columns_raise_naming_the_argument(kwargs, error, match):
  payload, _ = codec.encode_frames(jnp.zeros((2, 10), jnp.bfloat16), capacity=256)
  with pytest.raises(error, match=match):
    codec.decode_frames_into(jnp.zeros((2, 100), jnp.bfloat16), payload, **kwargs)


def test_bad_operands_raise_at_trace_time():
  payload, _ = codec.encode_frames(jnp.zeros((2, 10), jnp.bfloat16), capacity=256)
  with pytest.raises(ValueError, match="into must have shape"):
    codec.decode_frames_into(jnp.zeros((3, 100), jnp.bfloat16), payload, col=0, elems=10)
  with pytest.raises(TypeError, match="payload must be uint8"):
    codec.decode_frames_into(jnp.zeros((2, 100), jnp.bfloat16), payload.astype(jnp.int8), col=0,
                             elems=10)
  with pytest.raises(TypeError):
    codec.decode_frames_into(jnp.zeros((2, 100), jnp.int32), payload, col=0, elems=10)
