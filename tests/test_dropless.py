"""The dropless MoE example (``examples/moe_flax --dispatch ragged``): ragged dispatch and combine.

- its expert-parallel, FSDP-sharded gradients equal those of the unsharded model (same check as
  tests/test_examples.py, with the ragged dispatch on both sides);
- compressed and ``--no-compress`` runs give bit-identical losses and parameters, no token is dropped, and
  the collective table lists the ragged dispatch / combine call sites and their transposes.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from test_examples import GRAD_CHECK, ROOT, STEPS, TIMEOUT, _run

# jax.lax.ragged_dot does not batch over the group sizes ("vmap over any dim but 0 - NYI"), so the reference
# loops over the devices' batches instead of vmapping
RAGGED_GRAD_CHECK = (GRAD_CHECK.replace("top_k=2)", "top_k=2, dispatch=\"ragged\")")
                     .replace("jnp.sum(jax.vmap(one)(jnp.asarray(tokens_np).reshape(n, per_dev, -1)))",
                              "sum(one(t) for t in jnp.asarray(tokens_np).reshape(n, per_dev, -1))"))


def test_ragged_gradients_match_unsharded_model():
    assert RAGGED_GRAD_CHECK.count("dispatch=") == 1 and "jax.vmap(one)" not in RAGGED_GRAD_CHECK
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, "-c", RAGGED_GRAD_CHECK, str(ROOT / "examples")],
                          cwd=ROOT / "examples", env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert "ok" in proc.stdout


@pytest.fixture(scope="module")
def ragged_pair(tmp_path_factory):
    return (_run("moe_flax", tmp_path_factory, "--dispatch", "ragged"),
            _run("moe_flax", tmp_path_factory, "--dispatch", "ragged", "--no-compress"))


def test_ragged_dispatch_bit_identical_without_compression(ragged_pair):
    compressed, raw = ragged_pair
    assert compressed["config"]["dispatch"] == raw["config"]["dispatch"] == "ragged"
    for r in ragged_pair:
        assert len(r["losses"]) == STEPS and r["losses"][-1] < r["losses"][0], r["losses"]
        assert r["dropped_fraction"] == [0.0] * STEPS  # dropless
    assert compressed["loss_bits"] == raw["loss_bits"]
    assert compressed["params_sha256"] == raw["params_sha256"]
    # the collective table shows the ragged call sites, forward and transposed, coded in the compressed run
    for r, coded in ((compressed, True), (raw, False)):
        ragged = {s["name"]: s for s in r["call_sites"] if s["op"] == "ragged_all_to_all"}
        want = {f"block{i}/moe/{w}{b}" for i in range(2) for w in ("dispatch", "combine") for b in ("", "/bwd")}
        assert set(ragged) == want, sorted(ragged)
        assert all(s["compressed"] is coded and s["fallbacks"] == 0 for s in ragged.values()), ragged
