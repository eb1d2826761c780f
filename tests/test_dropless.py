"""The dropless MoE example (``examples/moe_flax --dispatch ragged``): ragged dispatch and combine.

- its expert-parallel, FSDP-sharded gradients equal those of the unsharded model (same check as
  tests/test_examples.py, with the ragged dispatch on both sides);
- compressed and ``--no-compress`` runs give bit-identical losses and parameters, no token is dropped, and
  the collective table lists the ragged dispatch / combine call sites and their transposes;
- the same with ``--dispatch-dtype float8_e4m3fn`` (FP8 dispatch, per-token scales beside the payload).
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


@pytest.fixture(scope="module")
def fp8_pair(tmp_path_factory):
    extra = ("--dispatch", "ragged", "--dispatch-dtype", "float8_e4m3fn")
    return (_run("moe_flax", tmp_path_factory, *extra), _run("moe_flax", tmp_path_factory, *extra, "--no-compress"))


def test_fp8_dispatch_bit_identical_without_compression(fp8_pair, ragged_pair):
    """FP8 dispatch (per-token scales beside the payload, combine in bf16): compressed == --no-compress, and
    it is a different run from the bf16 dispatch (the quantisation is real)."""
    compressed, raw = fp8_pair
    assert compressed["config"]["dispatch_dtype"] == "float8_e4m3fn"
    assert compressed["loss_bits"] == raw["loss_bits"]
    assert compressed["params_sha256"] == raw["params_sha256"]
    assert compressed["losses"][-1] < compressed["losses"][0]
    assert compressed["loss_bits"] != ragged_pair[0]["loss_bits"]
    sites = {s["name"]: s for s in compressed["call_sites"]}
    # the FP8 dispatch sends 1 + 4/D bytes per element instead of 2 (D = 64)
    assert sites["block0/moe/dispatch"]["raw_bytes"] * 128 == sites["block0/moe/combine"]["raw_bytes"] * 68
    assert sites["block0/moe/dispatch"]["dtype"] == "float8_e4m3fn" and sites["block0/moe/combine"]["dtype"] == "bfloat16"
