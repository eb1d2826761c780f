"""Training loop shared by the MoE and the dense FSDP examples.

Parameters live in flat fp32 buckets (see fsdp.py), each a global array of shape (groups, padded) sharded
``P(group_axis, shard_axes)``: ``groups`` is the number of expert-parallel ranks for the expert bucket and 1
otherwise.  One ``jax.shard_map`` computes the gradients:

    gather (all_gather, comm dtype) -> forward/backward (MoE all_to_all) -> psum_scatter [-> psum]

and the fp32 optimizer update runs on the shards outside it (elementwise, no communication).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util
from jax.sharding import NamedSharding, PartitionSpec as P

from . import data as data_lib
from . import fsdp, report
from .comm import Comm
from .model import Config, Transformer


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    name: str
    select: object  # key(path tuple) -> bool
    shard_axes: tuple  # axes the bucket is FSDP-sharded (gathered / reduce-scattered) over
    group_axis: str | None = None  # expert-parallel axis splitting every leaf's leading dim
    psum_axes: tuple = ()  # replica axes the shard gradient is all-reduced over (HSDP)


def add_common_args(p: argparse.ArgumentParser, *, mesh: str, layers: int, experts: int) -> None:
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=20)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--batch-per-device", type=int, default=4, help="sequences per device per step")
    g.add_argument("--lr", type=float, default=3e-3)
    g.add_argument("--aux-coef", type=float, default=0.01, help="MoE load-balancing loss weight")
    g.add_argument("--corpus-bytes", type=int, default=4 << 20, help="bytes of stdlib sources to train on")
    g = p.add_argument_group("model")
    g.add_argument("--seq-len", type=int, default=64)
    g.add_argument("--d-model", type=int, default=64)
    g.add_argument("--layers", type=int, default=layers)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--d-ff", type=int, default=128)
    g.add_argument("--experts", type=int, default=experts, help="0: dense feed-forward")
    g.add_argument("--top-k", type=int, default=2)
    g.add_argument("--capacity-factor", type=float, default=1.25)
    g.add_argument("--moe-every", type=int, default=1)
    g.add_argument("--dispatch", default="capacity", choices=["capacity", "ragged"],
                   help="MoE dispatch: capacity (padded all_to_all, tokens over capacity dropped) or ragged "
                        "(dropless: tokens sorted by expert, ragged_all_to_all, jax.lax.ragged_dot)")
    g.add_argument("--dispatch-dtype", default=None, choices=["float8_e4m3fn", "float8_e5m2"],
                   help="with --dispatch ragged: dispatch FP8 rows with per-token float32 scales beside them "
                        "(combine and gradients stay in --dtype)")
    g.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="activation, parameter-gather and all_to_all dtype")
    g.add_argument("--reduce-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="dtype of the gradient psum_scatter / psum")
    g = p.add_argument_group("parallelism and communication")
    g.add_argument("--mesh", default=mesh, help="AxB device mesh (product = number of devices)")
    g.add_argument("--compress", default="on", choices=["on", "auto", "off"],
                   help="zipccl_jax compress= mode: on (True, default), auto, off (False)")
    g.add_argument("--no-compress", dest="compress", action="store_const", const="off",
                   help="same as --compress off: zipccl_jax with compress=False (raw bytes, same reduction order)")
    g.add_argument("--capacity", default=None, metavar="F[,B]",
                   help="padded capacity per chunk as a fraction of its raw bytes, optionally a second value "
                        "for the transposed (gradient) collectives; default: zipccl_jax's")
    g.add_argument("--backend", default="zipccl", choices=["zipccl", "lax"],
                   help="zipccl: zipccl_jax collectives (default). lax: plain jax.lax baseline")
    g.add_argument("--grad-capacity", type=float, default=0.78, metavar="F",
                   help="capacity of the gradient psum_scatter / psum chunks as a fraction of their raw bytes. "
                        "Gradients code worse than parameters and activations: with zipccl_jax's default capacity "
                        "about a third of these chunks overflowed and were resent raw; 0.78 (default) gave no "
                        "overflow in 100 steps. 0: zipccl_jax's default")
    g.add_argument("--calibrate-steps", type=int, default=0, metavar="K",
                   help="train the first K steps under zipccl_jax.observe() (recording every call site's largest "
                        "frame), then recompile with capacity='observed': each call site's padded capacity becomes "
                        "its largest observed frame plus --capacity-margin. Needs --compress on or auto")
    g.add_argument("--capacity-margin", type=float, default=0.10, metavar="F",
                   help="safety margin on observed frames for --calibrate-steps (fraction; default 0.10: early "
                        "steps code better than later ones, and a frame over its capacity is resent raw)")
    g.add_argument("--transport", default=None, choices=["auto", "padded", "ragged"],
                   help="zipccl_jax transport (default: zipccl_jax's 'auto', padded on CPU and ragged on GPU)")
    g = p.add_argument_group("output")
    g.add_argument("--json", default=None, metavar="FILE", help="write losses and byte counts to FILE")
    g.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    g.add_argument("--no-compare", dest="compare", action="store_false",
                   help="skip the comparison after a compressed run (the same steps again with --no-compress and "
                        "with --backend lax: bit-identical or not, bytes, time per step)")
    g.add_argument("--profile", default=None, metavar="DIR",
                   help="write a jax.profiler trace of steps 2.. (process 0 only) to DIR")


def config_from_args(args) -> Config:
    if args.dispatch_dtype and args.dispatch != "ragged":
        raise SystemExit("--dispatch-dtype needs --dispatch ragged")
    return Config(seq_len=args.seq_len, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                  d_ff=args.d_ff, num_experts=args.experts, top_k=args.top_k,
                  capacity_factor=args.capacity_factor, moe_every=args.moe_every, dtype=jnp.dtype(args.dtype),
                  dispatch=args.dispatch, dispatch_dtype=args.dispatch_dtype)


def parse_capacity(s: str | None):
    if not s:
        return None
    try:
        v = tuple(float(x) for x in s.split(","))
    except ValueError:
        raise ValueError(f"--capacity must be F or F,B (fractions of the raw bytes), got {s!r}") from None
    if len(v) > 2 or not all(0 < x for x in v):
        raise ValueError(f"--capacity must be F or F,B with fractions > 0, got {s!r}")
    return v[0] if len(v) == 1 else v


def parse_mesh(s: str) -> tuple[int, int]:
    try:
        a, b = (int(v) for v in s.lower().split("x"))
    except ValueError:
        raise ValueError(f"--mesh must be AxB (two positive ints, e.g. 2x4), got {s!r}") from None
    if a < 1 or b < 1:
        raise ValueError(f"--mesh must be AxB (two positive ints, e.g. 2x4), got {s!r}")
    return a, b


# --------------------------------------------------------------------------------------------------------
# state


def init_state(cfg: Config, mesh, plan, seed: int):
    """Initialise the full model on the host and pack it into sharded fp32 buckets."""
    model = Transformer(cfg)
    tokens = jnp.zeros((1, cfg.seq_len), jnp.int32)
    cpu = jax.local_devices()[0]
    with jax.default_device(cpu):
        # the 'rbg' PRNG compiles the initialisers in about half the time of threefry (seconds on 2 cores)
        variables = jax.jit(model.init)(jax.random.key(seed, impl="rbg"), tokens)
    flat = {k: np.asarray(v) for k, v in traverse_util.flatten_dict(variables["params"]).items()}
    keys = sorted(flat)
    assigned = set()
    buckets, arrays, specs = {}, {}, {}
    for bp in plan:
        sel = [k for k in keys if bp.select(k) and k not in assigned]
        assigned.update(sel)
        groups = mesh.shape[bp.group_axis] if bp.group_axis else 1
        n_shards = math.prod(mesh.shape[a] for a in bp.shard_axes)
        b = fsdp.make_bucket(flat, sel, n_shards, leading_split=groups)
        host = np.stack([b.pack_np({k: np.split(flat[k], groups, axis=0)[g] if groups > 1 else flat[k]
                                    for k in sel}) for g in range(groups)])
        spec = P(bp.group_axis, bp.shard_axes)
        sharding = NamedSharding(mesh, spec)
        arrays[bp.name] = jax.make_array_from_callback(host.shape, sharding, lambda idx, h=host: h[idx])
        buckets[bp.name], specs[bp.name] = b, spec
    missing = set(keys) - assigned
    assert not missing, f"parameters in no bucket: {sorted(missing)}"
    return buckets, arrays, specs


def params_digest(buckets, arrays) -> str:
    """sha256 over the fp32 bytes of every parameter bucket (all shards, all processes)."""
    from jax.experimental import multihost_utils
    h = hashlib.sha256()
    for name in sorted(arrays):
        x = arrays[name]
        if not x.is_fully_addressable:
            x = multihost_utils.process_allgather(x, tiled=True)
        h.update(name.encode())
        h.update(np.ascontiguousarray(np.asarray(x, np.float32)).tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------------
# step


def make_step(cfg: Config, mesh, plan, buckets, specs, comm: Comm, optimizer, *, global_tokens: int,
              aux_coef: float, reduce_dtype, expert_axis: str | None, grad_capacity: float | None = None):
    axes = tuple(mesh.axis_names)
    n_dev = mesh.size
    expert_shards = mesh.shape[expert_axis] if expert_axis else 1
    model = Transformer(cfg, expert_shards=expert_shards, expert_axis=expert_axis, all_to_all=comm.all_to_all,
                        ragged_all_to_all=comm.ragged_all_to_all)

    def size(axes_):
        return math.prod(mesh.shape[a] for a in axes_)

    def local(params, tokens):
        gathered = {}
        for bp in plan:
            shard = params[bp.name][0]
            gathered[bp.name] = (fsdp.gather(comm, shard, bp.shard_axes, cfg.dtype, name=f"fsdp/{bp.name}/gather")
                                 if size(bp.shard_axes) > 1 else shard.astype(cfg.dtype))

        def loss_fn(gathered):
            flat = {}
            for bp in plan:
                flat.update(buckets[bp.name].unpack(gathered[bp.name]))
            tree = traverse_util.unflatten_dict(flat)
            (logits, aux), state = model.apply({"params": tree}, tokens[:, :-1], mutable=["intermediates"])
            ce = jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]))
            drops = jax.tree.leaves(state.get("intermediates", {}))
            dropped = jnp.mean(jnp.stack(drops)) if drops else jnp.zeros((), jnp.float32)
            return ce / global_tokens + aux_coef * aux / n_dev, (ce, aux, dropped)

        (_, (ce, aux, dropped)), grads = jax.value_and_grad(loss_fn, has_aux=True)(gathered)
        out = {}
        for bp in plan:
            g = grads[bp.name].astype(reduce_dtype)
            if size(bp.shard_axes) > 1:
                g = fsdp.reduce_scatter(comm, g, bp.shard_axes, name=f"fsdp/{bp.name}/grad_scatter",
                                        capacity=grad_capacity)
            if size(bp.psum_axes) > 1:  # replicas of the shard (HSDP)
                g = comm.psum(g, bp.psum_axes, name=f"fsdp/{bp.name}/grad_psum", capacity=grad_capacity)
            out[bp.name] = g.astype(jnp.float32)[None]
        return ce[None], aux[None], dropped[None], out

    grads_fn = jax.shard_map(local, mesh=mesh, in_specs=(specs, P(axes)),
                             out_specs=(P(axes), P(axes), P(axes), specs))

    def step(params, opt_state, tokens):
        ce, aux, dropped, grads = grads_fn(params, tokens)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        # per-device metrics, replicated so every process can read them; summed on the host in a fixed order
        # (an on-device sum would follow the all-reduce order, which differs between process layouts)
        metrics = {k: jax.sharding.reshard(v, P()) for k, v in (("ce", ce), ("aux", aux), ("dropped", dropped))}
        return params, opt_state, metrics

    return jax.jit(step, donate_argnums=(0, 1))


# --------------------------------------------------------------------------------------------------------
# driver


def check_args(args) -> None:
    """One line (SystemExit) for a flag no run can use, before anything is built."""
    for flag, ok, want in (
            ("--steps", args.steps >= 1, ">= 1"), ("--batch-per-device", args.batch_per_device >= 1, ">= 1"),
            ("--seq-len", args.seq_len >= 2, ">= 2"), ("--layers", args.layers >= 1, ">= 1"),
            ("--heads", args.heads >= 1 and args.d_model % args.heads == 0, "a divisor of --d-model"),
            ("--d-model", args.d_model >= 1, ">= 1"), ("--d-ff", args.d_ff >= 1, ">= 1"),
            ("--experts", args.experts >= 0, ">= 0"), ("--moe-every", args.moe_every >= 1, ">= 1"),
            ("--top-k", args.experts == 0 or 1 <= args.top_k <= args.experts, "in 1..--experts"),
            ("--capacity-factor", args.capacity_factor > 0, "> 0"), ("--lr", math.isfinite(args.lr), "finite"),
            ("--calibrate-steps", args.calibrate_steps >= 0, ">= 0"),
            ("--grad-capacity", args.grad_capacity >= 0, ">= 0 (0: zipccl_jax's default)"),
            ("--capacity-margin", args.capacity_margin >= 0, ">= 0")):
        if not ok:
            refuse(f"{flag} must be {want}, got {getattr(args, flag[2:].replace('-', '_'))}")
    if args.corpus_bytes <= args.seq_len + 1:
        refuse(f"--corpus-bytes must be more than --seq-len + 1, got {args.corpus_bytes}")
    try:
        parse_capacity(args.capacity)
        parse_mesh(args.mesh)
    except ValueError as e:
        refuse(str(e))


def refuse(message: str):
    """Exits with one line, as argparse refuses a flag: `train.py: error: ...`."""
    raise SystemExit(f"{pathlib.Path(sys.argv[0]).name}: error: {message}")


def run(args, *, name: str, plan, expert_axis: str | None, axis_names: tuple[str, str]) -> dict:
    check_args(args)
    shape = parse_mesh(args.mesh)
    if math.prod(shape) != jax.device_count():
        raise SystemExit(f"--mesh {args.mesh} needs {math.prod(shape)} devices, have {jax.device_count()}")
    mesh = jax.make_mesh(shape, axis_names)
    with jax.set_mesh(mesh):
        result = _run(args, mesh, name=name, plan=plan, expert_axis=expert_axis)
        if report.wanted(args, args.backend, args.compress != "off"):
            result["comparison"] = report.compare(result, lambda **o: _run(
                report.rerun_args(args, **o), mesh, name=name, plan=plan, expert_axis=expert_axis))
    if args.json and jax.process_index() == 0:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return result


def _run(args, mesh, *, name: str, plan, expert_axis: str | None) -> dict:
    from tqdm import tqdm

    cfg = config_from_args(args)
    if expert_axis and cfg.num_experts % mesh.shape[expert_axis]:
        refuse(f"--experts must be a multiple of the expert axis ({mesh.shape[expert_axis]}), got {cfg.num_experts}")
    lead = jax.process_index() == 0
    show = lead and not args.quiet

    comm = Comm(args.backend, compress=args.compress, capacity=parse_capacity(args.capacity),
                transport=args.transport)
    corpus = data_lib.load_corpus(args.corpus_bytes)
    batch = args.batch_per_device * mesh.size
    global_tokens = batch * cfg.seq_len
    batches = data_lib.Batches(corpus, batch, cfg.seq_len, args.seed)
    data_sharding = NamedSharding(mesh, P(tuple(mesh.axis_names)))

    def device_batch():
        host = next(batches)
        return jax.make_array_from_callback(host.shape, data_sharding, lambda idx: host[idx])

    buckets, params, specs = init_state(cfg, mesh, plan, args.seed)
    optimizer = optax.adam(args.lr)
    opt_state = jax.jit(optimizer.init)(params)

    def build_step(grad_capacity):
        return make_step(cfg, mesh, plan, buckets, specs, comm, optimizer, global_tokens=global_tokens,
                         aux_coef=args.aux_coef, reduce_dtype=jnp.dtype(args.reduce_dtype),
                         expert_axis=expert_axis, grad_capacity=grad_capacity)

    step = build_step(args.grad_capacity or None)
    n_params = sum(b.numel * (mesh.shape[bp.group_axis] if bp.group_axis else 1) for bp, b in
                   zip(plan, (buckets[bp.name] for bp in plan)))
    if show:
        print(f"{name}: {n_params / 1e6:.2f}M params, mesh {dict(mesh.shape)}, {jax.process_count()} process(es), "
              f"backend={comm.backend} compress={comm.compress}, corpus {corpus.size / 1e6:.1f} MB of stdlib "
              f"sources ({data_lib.corpus_digest(corpus)}), {global_tokens} tokens/step", flush=True)

    calib = args.calibrate_steps if comm.backend == "zipccl" and comm.compress is not False else 0
    if not 0 <= calib < args.steps and calib:
        raise SystemExit(f"--calibrate-steps {calib} must be smaller than --steps {args.steps}")
    observing = None
    if calib:
        import zipccl_jax
        profile = zipccl_jax.get_profile().copy()
        profile.margin = args.capacity_margin
        zipccl_jax.set_profile(profile)
        observing = zipccl_jax.observe()  # traced and run inside: every coded message is measured once more
        observing.__enter__()

    tokens = device_batch()
    t0 = time.perf_counter()
    comm.start()
    compiled = step.lower(params, opt_state, tokens).compile()
    compile_s = time.perf_counter() - t0
    hlo_sent = hlo_sent_bytes(compiled, mesh)
    phases = []  # byte accounting of the calibration steps (their program differs from the later one)

    losses, times, cpu_times, aux, dropped = [], [], [], [], []
    bar = tqdm(range(args.steps), desc=name, disable=not show, file=sys.stderr, dynamic_ncols=True)
    profiling = False
    for i in bar:
        if calib and i == calib:
            # leave observe() (merges the observations of all processes), then recompile with them
            observing.__exit__(None, None, None)
            phases.append(collective_bytes(comm, mesh, calib))
            comm.capacity = "observed"
            step = build_step("observed")
            comm.start()
            compiled = step.lower(params, opt_state, tokens).compile()
            hlo_sent = hlo_sent_bytes(compiled, mesh)
        if i:
            tokens = device_batch()
        if i == 1 and args.profile and jax.process_index() == 0:
            jax.profiler.start_trace(args.profile, create_perfetto_trace=True)
            profiling = True
        t0, c0 = time.perf_counter(), time.process_time()
        params, opt_state, m = compiled(params, opt_state, tokens)
        m = {k: np.asarray(v, np.float64) for k, v in m.items()}  # blocks
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)  # all threads of this process: immune to other processes' load
        loss = float(np.float32(np.sum(m["ce"]) / global_tokens))
        losses.append(loss)
        aux.append(float(np.mean(m["aux"])))
        dropped.append(float(np.mean(m["dropped"])))
        bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{global_tokens / times[-1]:,.0f}")
    bar.close()
    if profiling:
        jax.profiler.stop_trace()

    steady = times[1:] or times
    step_s = float(np.mean(steady)) if steady else float("nan")
    result = {
        "example": name,
        "losses": losses,
        "loss_bits": [np.float32(x).view(np.uint32).item() for x in losses],
        "aux_losses": aux,
        "dropped_fraction": dropped,
        "params_sha256": params_digest(buckets, params),
        "params": n_params,
        "compile_s": compile_s,
        "first_step_s": times[0] if times else None,
        "step_time_s": step_s,
        "step_times_s": times,
        "step_cpu_s": cpu_times,
        "tokens_per_step": global_tokens,
        "tokens_per_s": global_tokens / step_s,
        "backend": comm.backend,
        "compress": comm.compress,
        "transport": comm.transport,
        "mesh": dict(mesh.shape),
        "processes": jax.process_count(),
        "config": {k: (str(v) if k == "dtype" else v) for k, v in dataclasses.asdict(cfg).items()},
    }
    result["calibration_steps"] = args.calibrate_steps  # as asked: a timing window skips them in every variant
    if calib:
        after = collective_bytes(comm, mesh, args.steps - calib)
        before = phases[0]
        result.update(after)
        result["calibrated"] = {"raw_bytes": after["raw_bytes"], "wire_bytes": after["wire_bytes"],
                                "fallbacks": after["fallbacks"], "steps": args.steps - calib}
        for k in ("raw_bytes", "wire_bytes", "fallbacks"):
            result[k] = before[k] + after[k]
        result["calibration_phase"] = {k: before[k] for k in ("raw_bytes", "wire_bytes", "fallbacks")}
    else:
        result.update(collective_bytes(comm, mesh, args.steps))
    result["hlo_sent_bytes_per_device_step"] = hlo_sent
    if show:
        print_summary(result)
    return result


def hlo_sent_bytes(compiled, mesh) -> int | None:
    """Cross-check: bytes one device sends per step, from the compiled HLO collectives (raw-fallback branches
    excluded).  XLA:CPU widens raw bf16 all-to-alls to f32, so raw bf16 traffic counts double here."""
    try:
        import zipccl_jax
        return int(zipccl_jax.hlo_wire_bytes(compiled.as_text(), num_devices=mesh.size))
    except Exception:  # noqa: BLE001  (zipccl_jax missing or older: the cross-check is optional)
        return None


def collective_bytes(comm: Comm, mesh, steps: int) -> dict:
    """Bytes of every collective of the run (forward and backward), summed over devices and steps.

    raw_bytes: what jax.lax would have sent; wire_bytes: what was sent (padded coded payloads, plus the raw
    resend of a call that fell back); fallbacks: device executions of a call site that took the raw path.
    """
    jax.effects_barrier()  # off CPU the runtime fallback counters are debug callbacks
    sites = comm.site_table()
    local = np.array([s["fallbacks"] for s in sites], np.int64)
    if jax.process_count() > 1 and sites:
        from jax.experimental import multihost_utils
        local = np.asarray(multihost_utils.process_allgather(local)).reshape(-1, len(sites)).sum(0)
    for s, f in zip(sites, local):
        s["fallbacks"] = int(f)
    calls = steps * mesh.size
    raw = sum(calls * s["raw_bytes"] for s in sites)
    wire = sum(calls * s["wire_bytes"] + s["fallbacks"] * s["raw_bytes"] for s in sites)
    return {"raw_bytes": int(raw), "wire_bytes": int(wire), "fallbacks": int(sum(s["fallbacks"] for s in sites)),
            "bytes_source": "zipccl_jax.stats" if comm.backend == "zipccl" else "examples byte model (jax.lax)",
            "call_sites": sites}


def print_summary(r: dict) -> None:
    raw, wire = r["raw_bytes"], r["wire_bytes"]
    print(f"collectives per step: {len(r['call_sites'])} call sites (backward included)")
    for s in r["call_sites"]:
        ratio = s["raw_bytes"] / s["wire_bytes"] if s["wire_bytes"] else float("nan")
        print(f"  {s['name']:<34} {s['op']:<13} raw {s['raw_bytes']:>9,d} B  wire {s['wire_bytes']:>9,d} B "
              f"({ratio:.3f}x)  fallbacks {s['fallbacks']}")
    print(f"collective bytes over {len(r['losses'])} steps x {math.prod(r['mesh'].values())} devices: raw {raw / 1e6:.3f} MB, wire {wire / 1e6:.3f} MB "
          f"({raw / wire if wire else float('nan'):.3f}x, {100 * (1 - wire / raw) if raw else 0:.1f}% saved), "
          f"fallbacks {r['fallbacks']}")
    if r.get("calibrated"):
        c = r["calibrated"]
        print(f"  after {r['calibration_steps']} calibration steps (capacity='observed'): raw {c['raw_bytes'] / 1e6:.3f} MB, "
              f"wire {c['wire_bytes'] / 1e6:.3f} MB ({c['raw_bytes'] / c['wire_bytes'] if c['wire_bytes'] else float('nan'):.3f}x), "
              f"fallbacks {c['fallbacks']}")
    if r.get("hlo_sent_bytes_per_device_step") is not None:
        print(f"  cross-check from the compiled HLO: {r['hlo_sent_bytes_per_device_step']:,d} B sent per device "
              f"per step")
    print(f"step time {r['step_time_s'] * 1e3:.1f} ms (compile {r['compile_s']:.2f} s, first step "
          f"{r['first_step_s'] * 1e3:.0f} ms), {r['tokens_per_s']:,.0f} tokens/s; loss {r['losses'][0]:.4f} -> "
          f"{r['losses'][-1]:.4f}")
