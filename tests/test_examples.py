"""Smoke tests of the training examples (examples/moe_flax, examples/dense_fsdp).

Each example trains a few steps on 8 virtual CPU devices, once with compression and once with
``--no-compress``, in subprocesses (the device count must be set before JAX is imported).  The tests check:
- the loss decreases;
- compressed and uncompressed runs give bit-identical losses (float32 bits) and final parameters;
- the collectives moved fewer bytes on the wire than their raw size, and both runs saw the same raw bytes;
- the multi-process mode (jax.distributed, 2 processes x 4 devices) reproduces the single-process run.
Budget: about a minute on 2 cores.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3
TIMEOUT = 300


def _run(example: str, tmp_path_factory, *extra: str) -> dict:
    out = tmp_path_factory.mktemp(example) / "result.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, str(ROOT / "examples" / example / "train.py"), "--steps", str(STEPS), "--quiet",
           "--json", str(out), *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, f"{' '.join(cmd)}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


def _bits(losses):
    return [struct.pack("<f", x).hex() for x in losses]


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return _run("moe_flax", tmp_path_factory), _run("moe_flax", tmp_path_factory, "--no-compress")


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return _run("dense_fsdp", tmp_path_factory), _run("dense_fsdp", tmp_path_factory, "--no-compress")


def _check_pair(compressed: dict, raw: dict) -> None:
    assert compressed["compress"] is True and raw["compress"] is False
    assert compressed["backend"] == raw["backend"] == "zipccl"
    for r in (compressed, raw):
        losses = r["losses"]
        assert len(losses) == STEPS
        assert all(l == l and 0 < l < 10 for l in losses), losses
        assert losses[-1] < losses[0], f"loss did not decrease: {losses}"
        assert [struct.pack("<f", x) for x in losses] == [struct.pack("<I", b) for b in r["loss_bits"]]
    # bit-identical losses and parameters with and without compression
    assert _bits(compressed["losses"]) == _bits(raw["losses"])
    assert compressed["loss_bits"] == raw["loss_bits"]
    assert compressed["params_sha256"] == raw["params_sha256"]
    # bytes: same logical traffic; compression moved fewer bytes
    assert compressed["raw_bytes"] == raw["raw_bytes"] > 0
    assert 0 < compressed["wire_bytes"] < compressed["raw_bytes"], compressed
    assert raw["wire_bytes"] >= raw["raw_bytes"], raw
    assert compressed["fallbacks"] >= 0 and raw["fallbacks"] >= 0


def test_moe_flax(moe):
    compressed, raw = moe
    _check_pair(compressed, raw)
    assert compressed["config"]["num_experts"] > 0
    assert compressed["mesh"] == {"data": 2, "expert": 4}


def test_dense_fsdp(dense):
    compressed, raw = dense
    _check_pair(compressed, raw)
    assert compressed["config"]["num_experts"] == 0


def test_moe_flax_multiprocess(moe, tmp_path_factory):
    """2 processes x 4 devices under jax.distributed reproduce the 1 x 8 run bit for bit."""
    single, _ = moe
    multi = _run("moe_flax", tmp_path_factory, "--spawn", "2", "--timeout", str(TIMEOUT - 30))
    assert multi["processes"] == 2
    assert multi["loss_bits"] == single["loss_bits"]
    assert multi["params_sha256"] == single["params_sha256"]
    assert multi["raw_bytes"] == single["raw_bytes"]
