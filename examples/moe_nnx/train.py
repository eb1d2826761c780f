"""Expert-parallel MoE Transformer in Flax NNX, its collectives compressed by zipccl_jax in one line.

    python examples/moe_nnx/train.py --steps 20                 # compressed
    python examples/moe_nnx/train.py --steps 20 --no-compress   # plain jax.lax: the same losses, bit for bit

The model is written the way one writes it without zipccl_jax: plain `jax.lax.all_to_all` (MoE dispatch
and combine over the 'expert' mesh axis) and `jax.lax.psum` (gradients) inside one `jax.shard_map`. The
function holding that shard_map is wrapped in `zipccl_jax.compress_collectives`, which runs each of those
collectives (and their transposes in the backward pass) as zipccl_jax's lossless compressed one.
Runs on 8 virtual CPU devices, mesh ('data' 2, 'expert' 4); prints each step's loss and the bytes saved.
"""
import argparse
import json
import math
import os

# 8 virtual CPU devices; must be set before jax is imported.
_flags = os.environ.get("XLA_FLAGS", "")
if "--xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import zipccl_jax  # noqa: E402

TOKENS = P(("data", "expert"))  # batch rows are split over every device


class Expert(nnx.Param):
  """Weights with a leading expert dimension: sharded over 'expert', each device holds its own experts."""


class MoE(nnx.Module):
  """Top-k routed experts with a per-expert capacity (GShard), expert-parallel over the 'expert' axis.

  Called inside shard_map: each device holds num_experts / n experts and T tokens. Tokens go to the
  device of their expert with one all_to_all and come back with a second one; both carry bfloat16.
  """

  def __init__(self, d, d_ff, num_experts, top_k, capacity_factor, rngs):
    self.router = nnx.Linear(d, num_experts, use_bias=False, rngs=rngs)  # float32: routing decides bits
    k1, k2 = jax.random.split(rngs.params())
    self.w_in = Expert(jax.random.normal(k1, (num_experts, d, d_ff)) * d ** -0.5)
    self.w_out = Expert(jax.random.normal(k2, (num_experts, d_ff, d)) * d_ff ** -0.5)
    self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor

  def __call__(self, x):
    b, s, d = x.shape
    t, e, k = b * s, self.num_experts, self.top_k
    n = jax.lax.axis_size("expert")
    e_local = e // n
    cap = max(1, math.ceil(self.capacity_factor * t * k / e))  # slots per expert and source device
    xt = x.reshape(t, d)
    probs = jax.nn.softmax(self.router(xt.astype(jnp.float32)))
    gate, idx = jax.lax.top_k(probs, k)  # (T, k)
    gate = gate / gate.sum(-1, keepdims=True)
    # Slot of each (token, choice) in its expert's buffer: all first choices before any second choice.
    onehot = jax.nn.one_hot(idx.T.reshape(-1), e, dtype=jnp.int32)  # (k T, E), choice-major
    pos = jnp.sum((jnp.cumsum(onehot, 0) - 1) * onehot, -1).reshape(k, t).T  # (T, k)
    keep = pos < cap  # a full expert drops the choice; the residual carries the token on
    slot = jnp.where(keep, idx * cap + pos, e * cap)  # dropped -> out of range
    token = jnp.full((e * cap,), t).at[slot.reshape(-1)].set(jnp.repeat(jnp.arange(t), k), mode="drop")
    buf = jnp.concatenate([xt, jnp.zeros((1, d), xt.dtype)])[token].reshape(e, cap, d)  # empty slots: 0
    # Dispatch: the chunk of experts [j e_local, (j+1) e_local) goes to device j of the 'expert' axis.
    buf = jax.lax.all_to_all(buf, "expert", 0, 0, tiled=True)  # (n sources x e_local, cap, d)
    h = buf.reshape(n, e_local, cap, d).transpose(1, 0, 2, 3).reshape(e_local, n * cap, d)
    h = jax.nn.gelu(jnp.einsum("etd,edf->etf", h, self.w_in.astype(x.dtype)))
    y = jnp.einsum("etf,efd->etd", h, self.w_out.astype(x.dtype))
    y = y.reshape(e_local, n, cap, d).transpose(1, 0, 2, 3).reshape(n * e_local, cap, d)
    y = jax.lax.all_to_all(y, "expert", 0, 0, tiled=True)  # combine: (e, cap, d) of this device's tokens
    picked = y.reshape(e * cap, d)[jnp.where(keep, slot, 0)]  # (T, k, d)
    out = jnp.einsum("tk,tkd->td", (gate * keep).astype(x.dtype), picked)
    # Switch load-balancing loss: fraction of first choices times mean probability, per expert.
    frac = jnp.mean(jax.nn.one_hot(idx[:, 0], e), axis=0)
    return out.reshape(b, s, d), e * jnp.sum(frac * probs.mean(0))


class Block(nnx.Module):
  def __init__(self, cfg, rngs):
    d, bf16 = cfg.d_model, jnp.bfloat16
    self.norm1 = nnx.RMSNorm(d, dtype=bf16, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(cfg.heads, d, dtype=bf16, use_bias=False, decode=False, rngs=rngs)
    self.norm2 = nnx.RMSNorm(d, dtype=bf16, rngs=rngs)
    self.moe = MoE(d, cfg.d_ff, cfg.experts, cfg.top_k, cfg.capacity_factor, rngs)

  def __call__(self, x, mask):
    x = x + self.attn(self.norm1(x), mask=mask)
    y, aux = self.moe(self.norm2(x))
    return x + y, aux


class Transformer(nnx.Module):
  def __init__(self, cfg, rngs):
    self.embed = nnx.Embed(256, cfg.d_model, dtype=jnp.bfloat16, rngs=rngs)  # bytes
    self.pos = nnx.Param(jax.random.normal(rngs.params(), (cfg.seq_len, cfg.d_model)) * 0.02)
    self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.layers)])
    self.norm = nnx.RMSNorm(cfg.d_model, dtype=jnp.bfloat16, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens) + self.pos[: tokens.shape[1]].astype(jnp.bfloat16)
    mask = nnx.make_causal_mask(tokens)
    aux = 0.0
    for block in self.blocks:
      x, a = block(x, mask)
      aux = aux + a
    return self.embed.attend(self.norm(x)).astype(jnp.float32), aux  # logits tied to the embedding


def make_grad_step(graphdef, mesh, aux_weight):
  """Loss and gradients: one shard_map holding every collective of the step (forward, backward, psum)."""

  def loss_fn(experts, dense, tokens):  # on one device, its own batch rows
    model = nnx.merge(graphdef, experts, dense)
    logits, aux = model(tokens[:, :-1])
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    return ce + aux_weight * aux, ce

  def per_device(experts, dense, tokens):
    grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)
    (_, ce), (g_experts, g_dense) = grad_fn(experts, dense, tokens)
    # Each device differentiated its own mean loss. The backward all_to_all already brought every
    # cotangent of an expert to its device, so expert gradients hold the sum over their 'expert' row
    # and add over 'data' only; dense gradients add over every device. Float32: XLA:CPU's all-reduce
    # and zipccl_jax's psum both add in ascending rank order, so the bits match with or without it.
    g_experts = jax.lax.psum(g_experts, "data")
    g_dense = jax.lax.psum(g_dense, ("data", "expert"))
    scale = lambda g: g / mesh.size  # noqa: E731  (the mean over all devices' losses)
    return ce[None], jax.tree.map(scale, g_experts), jax.tree.map(scale, g_dense)

  def grad_step(experts, dense, tokens):
    return jax.shard_map(per_device, mesh=mesh, in_specs=(P("expert"), P(), TOKENS),
                         out_specs=(TOKENS, P("expert"), P()), check_vma=False)(experts, dense, tokens)

  return grad_step


def batches(seq_len, batch, seed):
  """Byte windows of this file's own source: a deterministic corpus that needs no download."""
  with open(__file__, "rb") as f:
    corpus = np.frombuffer(f.read(), np.uint8).astype(np.int32)
  rng = np.random.default_rng(seed)
  while True:
    start = rng.integers(0, len(corpus) - seq_len - 1, batch)
    yield np.stack([corpus[i:i + seq_len + 1] for i in start])


class OneLineParser(argparse.ArgumentParser):
  """A refused flag is one line (`train.py: error: ... (see --help)`), not the whole usage."""

  def error(self, message):
    self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def check(cfg, ap, expert_axis=4):
  """Refuses, in one line, a flag no run can use (before anything is built)."""
  for flag, ok, want in (
      ("--steps", cfg.steps >= 1, ">= 1"), ("--batch-per-device", cfg.batch_per_device >= 1, ">= 1"),
      ("--seq-len", cfg.seq_len >= 2, ">= 2"), ("--layers", cfg.layers >= 1, ">= 1"),
      ("--d-ff", cfg.d_ff >= 1, ">= 1"), ("--d-model", cfg.d_model >= 1, ">= 1"),
      ("--heads", cfg.heads >= 1 and cfg.d_model % cfg.heads == 0, "a divisor of --d-model"),
      ("--experts", cfg.experts >= expert_axis and cfg.experts % expert_axis == 0,
       f"a positive multiple of the 'expert' axis ({expert_axis})"),
      ("--top-k", 1 <= cfg.top_k <= cfg.experts, "in 1..--experts"),
      ("--capacity-factor", cfg.capacity_factor > 0, "> 0")):
    if not ok:
      ap.error(f"{flag} must be {want}, got {getattr(cfg, flag[2:].replace('-', '_'))}")


def main(argv=None):
  ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--steps", type=int, default=20)
  ap.add_argument("--no-compress", dest="compress", action="store_false", help="plain jax.lax collectives")
  ap.add_argument("--json", help="write losses and bytes to this file")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--lr", type=float, default=3e-3)
  ap.add_argument("--batch-per-device", type=int, default=4)
  ap.add_argument("--seq-len", type=int, default=64)
  ap.add_argument("--d-model", type=int, default=64)
  ap.add_argument("--d-ff", type=int, default=128)
  ap.add_argument("--heads", type=int, default=4)
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--experts", type=int, default=8)
  ap.add_argument("--top-k", type=int, default=2)
  ap.add_argument("--capacity-factor", type=float, default=1.25)
  ap.add_argument("--aux-weight", type=float, default=0.01)
  cfg = ap.parse_args(argv)
  check(cfg, ap)

  mesh = jax.make_mesh((2, 4), ("data", "expert"))
  model = Transformer(cfg, nnx.Rngs(cfg.seed))
  # Expert weights apart from the rest: they are sharded over 'expert', the rest is replicated.
  graphdef, experts, dense = nnx.split(model, Expert, nnx.Param)
  experts = jax.device_put(experts, NamedSharding(mesh, P("expert")))
  dense = jax.device_put(dense, NamedSharding(mesh, P()))
  tx = optax.adam(cfg.lr)
  opt_state = tx.init((experts, dense))

  grad_step = make_grad_step(graphdef, mesh, cfg.aux_weight)
  if cfg.compress:
    # The one line: every jax.lax collective in the step becomes zipccl_jax's compressed one.
    grad_step = zipccl_jax.compress_collectives(grad_step, compress=True)
  zipccl_jax.set_runtime_stats(True)  # count bytes at run time in what is traced from now on
  grad_step = jax.jit(grad_step)

  # Adam in a program of its own: in one program with the collectives, XLA:CPU fused its float ops
  # differently next to zipccl_jax's collectives than next to jax.lax's, and the runs' losses parted
  # by a rounding within three steps. Apart, both runs update with the same compiled program.
  @jax.jit
  def update(params, opt_state, grads):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  losses = []
  data = batches(cfg.seq_len, cfg.batch_per_device * mesh.size, cfg.seed)
  for i in range(cfg.steps):
    tokens = jax.device_put(next(data), NamedSharding(mesh, TOKENS))
    ce, g_experts, g_dense = grad_step(experts, dense, tokens)  # ce: each device's loss
    (experts, dense), opt_state = update((experts, dense), opt_state, (g_experts, g_dense))
    loss = np.float32(np.mean(np.asarray(ce)))  # on the host: no reduction order to depend on
    losses.append(float(loss))
    print(f"step {i:4d}  loss {loss:.6f}  (bits {loss.view(np.uint32):08x})", flush=True)

  t = zipccl_jax.totals()  # bytes sent, summed over devices, call sites and steps
  if cfg.compress:
    saved = 1 - t["wire_bytes"] / max(t["raw_bytes"], 1)
    print(f"collectives: {t['raw_bytes']} raw bytes, {t['wire_bytes']} on the wire ({saved:.1%} saved), "
          f"{t['calls']} calls, {t['fallbacks']} raw fallbacks")
  else:
    print("collectives: plain jax.lax, uncompressed")
  if cfg.json:
    with open(cfg.json, "w") as f:
      json.dump(dict(losses=losses, compress=cfg.compress, raw_bytes=t["raw_bytes"],
                     wire_bytes=t["wire_bytes"], calls=t["calls"], fallbacks=t["fallbacks"]), f, indent=1)


if __name__ == "__main__":
  main()
