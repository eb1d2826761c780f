"""Smoke tests of the training examples (examples/moe_flax, examples/dense_fsdp).

Each example trains a few steps on 8 virtual CPU devices, once with compression and once with
``--no-compress``, in subprocesses (the device count must be set before JAX is imported).  The tests check:
- the loss decreases;
- compressed and uncompressed runs give bit-identical losses (float32 bits) and final parameters;
- the collectives moved fewer bytes on the wire than their raw size, and both runs saw the same raw bytes;
- the multi-process mode (jax.distributed, 2 processes x 4 devices) reproduces the single-process run;
- the expert-parallel, FSDP-sharded gradients equal those of the unsharded model (float32, compressed).
Budget: about a minute of CPU time on 2 cores.
"""
from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest

from example_run import ROOT, TIMEOUT, loss_bits as _bits, run_example

STEPS = 3


def _run(example: str, tmp_path_factory, *extra: str) -> dict:
    return run_example(ROOT / "examples" / example / "train.py", tmp_path_factory.mktemp(example),
                       "--steps", str(STEPS), "--quiet", *extra)


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
    """2 processes x 4 devices under jax.distributed reproduce the 1 x 8 run bit for bit, also when the first
    step calibrates the capacities (observations merged across the processes, then capacity='observed')."""
    single, _ = moe
    multi = _run("moe_flax", tmp_path_factory, "--spawn", "2", "--timeout", str(TIMEOUT - 30),
                 "--calibrate-steps", "1")
    assert multi["processes"] == 2
    assert multi["loss_bits"] == single["loss_bits"]
    assert multi["params_sha256"] == single["params_sha256"]
    assert multi["raw_bytes"] == single["raw_bytes"]
    cal = multi["calibrated"]
    assert multi["calibration_steps"] == 1 and cal["steps"] == STEPS - 1
    # One early step is a poor sample (the first step's dispatch codes better than later ones): some calls
    # overflow their observed capacity and resend raw, which must not change a bit of the training.
    assert cal["wire_bytes"] > 0 and cal["fallbacks"] >= 0
    observed = {s["name"]: s["capacity"] for s in multi["call_sites"] if s["compressed"]}
    default = {s["name"]: s["capacity"] for s in single["call_sites"] if s["compressed"]}
    assert observed.keys() == default.keys() and observed != default  # the capacities did change


GRAD_CHECK = r"""
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
sys.path.insert(0, sys.argv[1])
import jax, jax.numpy as jnp, numpy as np, optax
from flax import traverse_util
from jax.sharding import NamedSharding, PartitionSpec as P
from common import data, trainer
from common.comm import Comm
from common.model import Config, Transformer

cfg = Config(dtype=jnp.float32, n_layers=1, num_experts=8, top_k=2)
mesh = jax.make_mesh((2, 4), ("data", "expert"))
plan = (trainer.BucketPlan("expert", lambda k: k[-1] in ("w_in", "w_out"), shard_axes=("data",),
                           group_axis="expert"),
        trainer.BucketPlan("dense", lambda k: True, shard_axes=("data", "expert")))
per_dev, n = 2, 8
tokens_np = next(data.Batches(data.load_corpus(1 << 20), per_dev * n, cfg.seq_len, seed=1))
gt = per_dev * n * cfg.seq_len
with jax.set_mesh(mesh):
    buckets, params, specs = trainer.init_state(cfg, mesh, plan, seed=0)
    comm = Comm("zipccl", compress="on")
    sgd = optax.sgd(1.0)  # new = old - grad
    step = trainer.make_step(cfg, mesh, plan, buckets, specs, comm, sgd, global_tokens=gt, aux_coef=0.0,
                             reduce_dtype=jnp.float32, expert_axis="expert")
    old = {k: np.asarray(v) for k, v in params.items()}
    tokens = jax.device_put(tokens_np, NamedSharding(mesh, P(("data", "expert"))))
    new, _, m = step(params, sgd.init(params), tokens)
    grads = {k: old[k] - np.asarray(new[k]) for k in old}
    loss = float(np.sum(np.asarray(m["ce"], np.float64)) / gt)

# reference: the unsharded model (all experts on one device), each device's batch routed on its own
model = Transformer(cfg)
full = jax.jit(model.init)(jax.random.key(0, impl="rbg"), jnp.zeros((1, cfg.seq_len), jnp.int32))["params"]

def ref_loss(p):
    def one(t):
        logits, _ = model.apply({"params": p}, t[:, :-1])
        return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, t[:, 1:]))
    return jnp.sum(jax.vmap(one)(jnp.asarray(tokens_np).reshape(n, per_dev, -1))) / gt

ref, g = jax.jit(jax.value_and_grad(ref_loss))(full)
assert abs(loss - float(ref)) < 1e-5, (loss, float(ref))
flat = {k: np.asarray(v) for k, v in traverse_util.flatten_dict(g).items()}
for bp in plan:
    b = buckets[bp.name]
    groups = mesh.shape[bp.group_axis] if bp.group_axis else 1
    want = np.stack([b.pack_np({k: np.split(flat[k], groups)[i] if groups > 1 else flat[k] for k in b.keys})
                     for i in range(groups)])
    err = np.max(np.abs(want - grads[bp.name])) / np.max(np.abs(want))
    assert err < 1e-4, (bp.name, err)
    print(bp.name, "relative error", err)
print("ok", loss, float(ref))
"""


def test_moe_gradients_match_unsharded_model():
    """Expert-parallel dispatch/combine + FSDP gather/reduce-scatter (compressed) give the gradients of the
    plain single-device model."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, "-c", GRAD_CHECK, str(ROOT / "examples")], cwd=ROOT / "examples",
                          env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert "ok" in proc.stdout


def test_fsdp_unpack_gradient_is_the_concatenated_cotangents():
    """The bucket's custom VJP gives, bit for bit, what differentiating the slices gives."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    sys.path.insert(0, str(ROOT / "examples"))
    from common import fsdp

    flat = {("a",): np.zeros((3, 5)), ("b",): np.zeros((7,)), ("c",): np.zeros((2, 2, 2))}
    bucket = fsdp.make_bucket(flat, sorted(flat), n_shards=4)  # 30 elements, padded to 32
    assert bucket.padded == 32
    rng = np.random.default_rng(0)
    vec = jnp.asarray(rng.standard_normal(bucket.padded), jnp.bfloat16)
    w = {k: jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for k, s in zip(bucket.keys, bucket.shapes)}

    def loss(unpack, v):
        return sum(jnp.sum((leaf * w[k]).astype(jnp.float32)) for k, leaf in unpack(v).items())

    def sliced(v):  # the plain slices the custom VJP replaces
        out, off = {}, 0
        for k, s, n in zip(bucket.keys, bucket.shapes, bucket.sizes):
            out[k] = jax.lax.slice(v, (off,), (off + n,)).reshape(s)
            off += n
        return out

    got = jax.jit(jax.grad(lambda v: loss(bucket.unpack, v)))(vec)
    want = jax.jit(jax.grad(lambda v: loss(sliced, v)))(vec)
    assert got.dtype == want.dtype and got.shape == (bucket.padded,)
    assert np.array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    assert not np.any(np.asarray(got, np.float32)[bucket.numel:])  # the padding gets no gradient


def test_the_demo_reports_what_compression_bought(tmp_path):
    """Without --quiet, a compressed run trains the same steps again with --no-compress and with --backend lax and
    says: bit-identical or not, bytes on the wire against raw, time per step against both, and on CPU why."""
    out = tmp_path / "demo.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "moe_flax" / "train.py"), "--steps", "2",
                        "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "bit-identical to --no-compress (zipccl_jax, compress=False): yes" in p.stdout, p.stdout
    assert "bit-identical to jax.lax (--backend lax): " in p.stdout
    assert "bytes on the wire: " in p.stdout and "% saved)" in p.stdout
    assert "ms with --no-compress" in p.stdout and "ms with jax.lax" in p.stdout
    assert "on CPU the devices share this machine's cores" in p.stdout
    import json
    cmp = json.loads(out.read_text())["comparison"]
    assert cmp["no_compress"]["losses_bit_identical"] and cmp["no_compress"]["params_bit_identical"]


@pytest.mark.parametrize("example,args,message", [
    ("moe_flax", ["--steps", "0"], "train.py: error: --steps must be >= 1, got 0"),
    ("moe_flax", ["--mesh", "2y4"], "train.py: error: --mesh must be AxB"),
    ("dense_fsdp", ["--steps", "-1"], "train.py: error: --steps must be >= 1, got -1"),
    ("moe_nnx", ["--experts", "6"], "train.py: error: --experts must be a positive multiple of the 'expert' axis (4)"),
    ("moe_nnx", ["--steps", "0"], "train.py: error: --steps must be >= 1, got 0"),
    ("moe_nnx", ["--steps", "x"], "train.py: error: argument --steps: invalid int value: 'x'"),
])
def test_bad_flags_are_refused_in_one_line(example, args, message):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    p = subprocess.run([sys.executable, str(ROOT / "examples" / example / "train.py"), *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), p.stderr
