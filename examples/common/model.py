"""Decoder-only Transformer in flax.linen, with optional expert-parallel MoE feed-forward layers.

The same module tree serves two roles:
- on the host, with ``expert_shards=1``, to initialise the full parameters once (every process gets the
  same values from the same seed);
- inside ``jax.shard_map``, with ``expert_shards = mesh['expert']``, where each device holds
  ``num_experts / expert_shards`` experts and tokens travel to their experts and back with two
  ``all_to_all`` calls on the expert axis (dispatch and combine).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 256
    seq_len: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 128
    num_experts: int = 8  # 0: dense feed-forward everywhere
    top_k: int = 2
    capacity_factor: float = 1.25
    moe_every: int = 1  # every n-th layer is MoE (the last of each group of n)
    dtype: Any = jnp.bfloat16  # activation / communication dtype

    def is_moe(self, layer: int) -> bool:
        return self.num_experts > 0 and (layer + 1) % self.moe_every == 0


EXPERT_PARAMS = ("w_in", "w_out")  # leaves sharded over the expert axis (leading dim = expert)


def is_expert_key(path: tuple) -> bool:
    return path[-1] in EXPERT_PARAMS


class Attention(nn.Module):
    cfg: Config

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        h, dh = cfg.n_heads, cfg.d_model // cfg.n_heads
        qkv = nn.DenseGeneral((3, h, dh), use_bias=False, dtype=cfg.dtype, name="qkv")(x)
        q, k, v = qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]
        s = x.shape[1]
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / math.sqrt(dh)
        causal = jnp.tril(jnp.ones((s, s), bool))
        logits = jnp.where(causal, logits, jnp.finfo(jnp.float32).min)
        w = jax.nn.softmax(logits, axis=-1).astype(cfg.dtype)
        o = jnp.einsum("bhqk,bkhd->bqhd", w, v)
        return nn.DenseGeneral(cfg.d_model, axis=(-2, -1), use_bias=False, dtype=cfg.dtype, name="out")(o)


class MLP(nn.Module):
    cfg: Config

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        y = nn.gelu(nn.Dense(cfg.d_ff, use_bias=False, dtype=cfg.dtype, name="fc_in")(x))
        return nn.Dense(cfg.d_model, use_bias=False, dtype=cfg.dtype, name="fc_out")(y), jnp.zeros((), jnp.float32)


def route(logits, top_k: int, capacity: int):
    """GShard/Switch top-k routing with a per-expert capacity.

    logits: (T, E) fp32.  Returns, per (token, choice): the expert ``idx`` (T, k), the slot ``pos`` in that
    expert's capacity buffer (T, k), ``keep`` (False when the expert was full: the choice is dropped) and the
    renormalised gate (T, k); plus the Switch load-balancing loss and the dropped fraction.
    Priority: all first choices before any second choice, then token order.
    """
    t, e = logits.shape
    probs = jax.nn.softmax(logits, axis=-1)
    gate, idx = jax.lax.top_k(probs, top_k)  # (T, k)
    if top_k > 1:
        gate = gate / jnp.sum(gate, axis=-1, keepdims=True)
    choice = jax.nn.one_hot(idx, e, dtype=jnp.int32)  # (T, k, E)
    flat = choice.transpose(1, 0, 2).reshape(top_k * t, e)  # choice-major priority
    pos = (jnp.cumsum(flat, axis=0) - 1) * flat
    pos = jnp.sum(pos.reshape(top_k, t, e).transpose(1, 0, 2), axis=-1)  # (T, k) slot in the chosen expert
    keep = pos < capacity
    frac = jnp.mean(choice[:, 0, :].astype(jnp.float32), axis=0)  # top-1 load per expert
    aux = e * jnp.sum(frac * jnp.mean(probs, axis=0))
    dropped = 1.0 - jnp.mean(keep.astype(jnp.float32))
    return idx, pos, keep, gate, aux, dropped


class MoE(nn.Module):
    cfg: Config
    expert_shards: int = 1
    expert_axis: str | None = None
    all_to_all: Callable | None = None  # comm.all_to_all inside shard_map

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        b, s, d = x.shape
        t, e, n, k = b * s, cfg.num_experts, self.expert_shards, cfg.top_k
        e_local = e // n
        capacity = max(1, math.ceil(cfg.capacity_factor * t * k / e))
        xt = x.reshape(t, d)
        site = "/".join(self.scope.path)
        logits = nn.Dense(e, use_bias=False, dtype=jnp.float32, name="router")(xt.astype(jnp.float32))
        idx, pos, keep, gate, aux, dropped = route(logits, k, capacity)
        init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=-2, out_axis=-1)
        w_in = self.param("w_in", init, (e_local, d, cfg.d_ff)).astype(cfg.dtype)
        w_out = self.param("w_out", init, (e_local, cfg.d_ff, d)).astype(cfg.dtype)

        # dispatch buffer (E, C, D): slot (e, c) holds the token routed there, empty slots are zeros
        slot = jnp.where(keep, idx * capacity + pos, e * capacity)  # (T, k); dropped -> out of range
        token_of_slot = jnp.full((e * capacity,), t, jnp.int32).at[slot.reshape(-1)].set(
            jnp.repeat(jnp.arange(t, dtype=jnp.int32), k), mode="drop")
        xz = jnp.concatenate([xt, jnp.zeros((1, d), xt.dtype)])  # row t: the empty slot
        buf = xz[token_of_slot].reshape(e, capacity, d)
        if n > 1:  # dispatch: expert-major chunks go to the rank that owns them
            buf = self.all_to_all(buf, self.expert_axis, 0, 0, tiled=True, name=f"{site}/dispatch")
        # buf: (src rank, local expert, C, D) flattened -> each local expert sees the slots of every source
        h = buf.reshape(n, e_local, capacity, d).transpose(1, 0, 2, 3).reshape(e_local, n * capacity, d)
        h = nn.gelu(jnp.einsum("etd,edf->etf", h, w_in))
        y = jnp.einsum("etf,efd->etd", h, w_out)
        y = y.reshape(e_local, n, capacity, d).transpose(1, 0, 2, 3).reshape(e, capacity, d)
        if n > 1:  # combine: results go back to the rank that owns the tokens
            y = self.all_to_all(y, self.expert_axis, 0, 0, tiled=True, name=f"{site}/combine")
        picked = y.reshape(e * capacity, d)[jnp.where(keep, slot, 0)]  # (T, k, D)
        w = (gate * keep).astype(cfg.dtype)
        out = jnp.einsum("tk,tkd->td", w, picked)
        self.sow("intermediates", "dropped", dropped)
        return out.reshape(b, s, d), aux


class Block(nn.Module):
    cfg: Config
    moe: bool
    expert_shards: int = 1
    expert_axis: str | None = None
    all_to_all: Callable | None = None

    @nn.compact
    def __call__(self, x):
        x = x + Attention(self.cfg, name="attn")(nn.RMSNorm(dtype=self.cfg.dtype, name="ln1")(x))
        h = nn.RMSNorm(dtype=self.cfg.dtype, name="ln2")(x)
        if self.moe:
            y, aux = MoE(self.cfg, self.expert_shards, self.expert_axis, self.all_to_all, name="moe")(h)
        else:
            y, aux = MLP(self.cfg, name="mlp")(h)
        return x + y, aux


class Transformer(nn.Module):
    cfg: Config
    expert_shards: int = 1
    expert_axis: str | None = None
    all_to_all: Callable | None = None

    @nn.compact
    def __call__(self, tokens):
        cfg = self.cfg
        embed = nn.Embed(cfg.vocab, cfg.d_model, dtype=cfg.dtype, name="embed",
                         embedding_init=nn.initializers.normal(0.02))
        pos = self.param("pos", nn.initializers.normal(0.02), (cfg.seq_len, cfg.d_model))
        x = embed(tokens) + pos[: tokens.shape[1]].astype(cfg.dtype)
        aux = jnp.zeros((), jnp.float32)
        for i in range(cfg.n_layers):
            x, a = Block(cfg, cfg.is_moe(i), self.expert_shards, self.expert_axis, self.all_to_all,
                         name=f"block{i}")(x)
            aux = aux + a
        x = nn.RMSNorm(dtype=cfg.dtype, name="ln_f")(x)
        return embed.attend(x).astype(jnp.float32), aux
