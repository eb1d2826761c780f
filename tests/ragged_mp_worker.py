"""One rank of the multi-process ragged exchange test (started by tests/mp_launch.py).

Every rank builds the same random cases (tests/test_ragged.py: two slices per destination, empty and full
slices, gaps, random bits), places its local shards, runs the exchanges in one jitted shard_map over all
devices of all processes and compares the shards it holds with the NumPy model of jax.lax's documented
semantics, bit for bit. Prints one line ``RESULT {json}``; exits 0 when every check passed.
"""
from __future__ import annotations

import sys

from mp_launch import report, start_worker


def main() -> int:
  a = start_worker()

  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from test_ragged import AXIS, BF16, model_ragged_all_to_all, random_case, variants

  n = jax.device_count()
  mesh = jax.make_mesh((n,), (AXIS,))
  sharding = NamedSharding(mesh, P(AXIS))
  checks = {}
  for seed, dtype, payload in ((0, BF16, "gaussian"), (1, np.float32, "gaussian"), (2, BF16, "bits")):
    case = random_case(seed, n=n, spd=2, rows=10, dtype=dtype, payload=payload)
    want = np.stack(model_ragged_all_to_all(*[list(x) for x in case]))
    args = [jax.make_array_from_callback(x.shape, sharding, lambda idx, x=x: x[idx]) for x in case]
    for name, fn in variants().items():
      body = lambda *xs, fn=fn: fn(*(x[0] for x in xs))[None]
      got = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))(*args)
      u = {2: np.uint16, 4: np.uint32}[np.dtype(dtype).itemsize]
      checks[f"{name}/seed{seed}"] = all(
          np.array_equal(np.asarray(s.data).view(u), want[s.index].view(u)) for s in got.addressable_shards)
  ok = all(checks.values())
  report({"rank": a.rank, "devices": n, "ok": ok, "checks": checks})
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())  # an exception prints its traceback (the launcher shows stderr) and exits 1
