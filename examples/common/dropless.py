"""Dropless expert-parallel MoE: ragged dispatch and combine (``--dispatch ragged``).

The capacity path (model.MoE) pads every (expert, source) pair to a fixed number of slots and drops the tokens
over it. Here every routed token reaches its expert, as in MaxText's sparse path and axlearn:

1. route (top-k, no capacity) and sort the T*k (token, choice) rows by expert: ``A = T*k`` rows, expert-major;
   ``group_sizes[e]`` rows for expert e;
2. all_gather the group sizes over the expert axis (jax.lax: E int32 per rank): ``sizes[s, e]`` (source
   rank s, expert e), so every rank can compute every offset of both exchanges without another collective;
3. dispatch: one ragged_all_to_all, ``E/n`` slices per destination (one per local expert), landing in the
   expert rank's buffer local-expert-major, source-minor (each local expert's rows contiguous);
4. the local experts with ``jax.lax.ragged_dot`` (rows past the groups stay zero);
5. combine: the ragged_all_to_all back, rows landing where they left the source's sorted buffer; unsort and
   weight by the gates.

With ``--dispatch-dtype float8_e4m3fn`` (or ``float8_e5m2``) the dispatch moves FP8 rows, each with its
float32 scale's 4 bytes appended (``quantize_rows``), as DeepSeek-V3-style training does; the combine and
every gradient stay in the compute dtype.

The receive buffer holds ``n*A`` rows (every token of every source could pick this rank's experts), so no
token is ever dropped. ``ragged_all_to_all`` is the Comm's: ``zipccl_jax.ragged_all_to_all`` (jax.lax's
semantics; compressed frames, or raw with ``--no-compress``; on CPU, which has no ragged-all-to-all, an exact
emulation).
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


def exclusive_cumsum(x, axis=-1):
    return jnp.cumsum(x, axis=axis) - x


def ragged_plan(sizes, me, n: int, e_local: int):
    """Offsets and sizes of the dispatch and of the combine, from ``sizes`` (n src, E) of every rank.

    Slice ``d*e_local + j`` of a sender goes to rank d, local expert j. Rank d lays its receive buffer out as
    local expert j major, source s minor: ``pos[d, j, s]``.
    """
    e = sizes.shape[1]
    per_dst = sizes.reshape(n, n, e_local)  # (src, dst, local expert)
    pos = exclusive_cumsum(per_dst.transpose(1, 2, 0).reshape(n, e_local * n), axis=1).reshape(n, e_local, n)
    start = exclusive_cumsum(sizes, axis=1)  # (src, E): where expert e's rows start in src's sorted buffer
    mine = sizes[me]  # (E,)
    to_me = per_dst[:, me, :]  # (src, local expert): rows each source sends me
    dispatch = dict(input_offsets=start[me], send_sizes=mine,
                    output_offsets=pos[:, :, me].reshape(e),  # pos[d, j, me] at d*e_local + j
                    recv_sizes=to_me.reshape(e))
    combine = dict(input_offsets=pos[me].T.reshape(e),  # pos[me, j, s] at s*e_local + j
                   send_sizes=to_me.reshape(e),
                   output_offsets=start.reshape(n, n, e_local)[:, me, :].reshape(e),
                   recv_sizes=mine)
    local_groups = jnp.sum(to_me, axis=0)  # (local expert,)
    return dispatch, combine, local_groups


# largest finite value of each FP8 dispatch format (the per-token scale maps a row's amax onto it)
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def quantize_rows(rows, dtype):
    """(A, D) -> (A, D + 4) FP8: each row divided by its scale ``amax / FP8_MAX``, rounded to `dtype`, then
    the scale's float32 bytes (the scale travels beside its row, in the same frame)."""
    dt = jnp.dtype(dtype)
    r = rows.astype(jnp.float32)
    amax = jnp.max(jnp.abs(r), axis=1, keepdims=True)
    scale = jnp.where(amax > 0, amax / FP8_MAX[dt.name], 1.0)
    scale_bytes = jax.lax.bitcast_convert_type(scale, dt).reshape(rows.shape[0], 4)
    return jnp.concatenate([(r / scale).astype(dt), scale_bytes], axis=1)


def dequantize_rows(h, d: int, dtype):
    """(M, D + 4) FP8 rows with their scales -> (M, D) `dtype` (rows never written: zeros)."""
    scale = jax.lax.bitcast_convert_type(h[:, d:], jnp.float32)  # (M,)
    return (h[:, :d].astype(jnp.float32) * scale[:, None]).astype(dtype)


def fp8_dispatch(ragged_all_to_all, rows, out_rows: int, dispatch: dict, combine: dict, *, dtype, axis_name,
                 name: str):
    """The dispatch in FP8 (per-token scales beside the payload); its gradient goes back in the rows' dtype
    through the combine layout (straight through the quantiser, as FP8 training recipes do)."""
    keys = ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")

    @jax.custom_vjp
    def send(rows, *idx):
        q = quantize_rows(rows, dtype)
        h = ragged_all_to_all(q, jnp.zeros((out_rows, q.shape[1]), q.dtype), **dict(zip(keys, idx[:4])),
                              axis_name=axis_name, name=name)
        return dequantize_rows(h, rows.shape[1], rows.dtype)

    def send_fwd(rows, *idx):
        return send(rows, *idx), (jnp.zeros((rows.shape[0], 0), rows.dtype), idx)

    def send_bwd(res, ct):
        rows0, idx = res
        back = ragged_all_to_all(ct, jnp.zeros((rows0.shape[0], ct.shape[1]), ct.dtype),
                                 **dict(zip(keys, idx[4:])), axis_name=axis_name, name=name + "/bwd")
        return (back,) + (None,) * 8

    send.defvjp(send_fwd, send_bwd)
    return send(rows, *(dispatch[k] for k in keys), *(combine[k] for k in keys))


class DroplessMoE(nn.Module):
    """Same parameters as model.MoE (router, w_in, w_out); tokens sorted by expert, ragged exchanges."""
    cfg: object
    expert_shards: int = 1
    expert_axis: str | None = None
    ragged_all_to_all: Callable | None = None  # comm.ragged_all_to_all inside shard_map

    @nn.compact
    def __call__(self, x):
        from .model import route, router_and_experts

        cfg = self.cfg
        b, s, d = x.shape
        n, k = self.expert_shards, cfg.top_k
        e_local = cfg.num_experts // n
        a = b * s * k  # (token, choice) rows
        xt = x.reshape(b * s, d)
        logits, w_in, w_out = router_and_experts(self, xt, e_local)
        idx, _, _, gate, aux, _ = route(logits, k, capacity=a)  # capacity t*k: nothing is dropped
        e, t, site = cfg.num_experts, b * s, "/".join(self.scope.path)

        expert = idx.reshape(a)  # row r = token r // k, choice r % k
        order = jnp.argsort(expert, stable=True)
        group_sizes = jnp.bincount(expert, length=e).astype(jnp.int32)
        rows = xt[order // k]  # (A, D) sorted by expert
        if n > 1:
            # E int32 per rank: not float data, so plain jax.lax (4*E*(n-1) bytes sent per device)
            sizes = jax.lax.all_gather(group_sizes, self.expert_axis)  # (n, E)
            me = jax.lax.axis_index(self.expert_axis)
            dispatch, combine, groups = ragged_plan(sizes, me, n, e_local)
            if cfg.dispatch_dtype:
                h = fp8_dispatch(self.ragged_all_to_all, rows, n * a, dispatch, combine, dtype=cfg.dispatch_dtype,
                                 axis_name=self.expert_axis, name=f"{site}/dispatch")
            else:
                h = self.ragged_all_to_all(rows, jnp.zeros((n * a, d), rows.dtype), **dispatch,
                                           axis_name=self.expert_axis, name=f"{site}/dispatch")
        else:
            h, groups = rows, group_sizes
        # out_sharding: under the trainer's explicit mesh (host init) ragged_dot cannot infer it
        h = nn.gelu(jax.lax.ragged_dot(h, w_in, groups, out_sharding=jax.typeof(h).sharding))
        y = jax.lax.ragged_dot(h, w_out, groups, out_sharding=jax.typeof(h).sharding)
        if n > 1:
            y = self.ragged_all_to_all(y, jnp.zeros((a, d), y.dtype), **combine, axis_name=self.expert_axis,
                                       name=f"{site}/combine")
        unsort = jnp.zeros((a,), jnp.int32).at[order].set(jnp.arange(a, dtype=jnp.int32), unique_indices=True)
        picked = y[unsort].reshape(t, k, d)
        out = jnp.einsum("tk,tkd->td", gate.astype(cfg.dtype), picked)
        self.sow("intermediates", "dropped", jnp.zeros((), jnp.float32))
        return out.reshape(b, s, d), aux
