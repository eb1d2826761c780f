#!/usr/bin/env python
"""Raw vs compressed collectives on a real, rate-limited network.

The launcher (run as root) creates a private network namespace, brings its loopback up and shapes it with
``tc qdisc ... tbf`` at each requested rate, and runs N worker processes (one CPU device each) inside it under
``jax.distributed``. The workers stay up for the whole sweep; between phases the launcher changes the qdisc.
Only 127.0.0.1 inside that namespace is used. Everything is bounded by a timeout, the children are killed and
the namespace is deleted however the run ends.

Per case (collective x payload) and rate, the workers time, median over repetitions after warm-up (variants
interleaved), with a barrier before each repetition and the slowest rank counted:

* ``raw_s``        ``jax.lax.<collective>`` on the tensor as is (what a user calls);
* ``raw_bits_s``   the same data movement on the bits (uint16/uint32 bit-cast; psum_scatter as all_to_all of
                   the bits plus a local sum). XLA:CPU widens BF16 collectives to F32 on the wire, so this is
                   the honest raw baseline on CPU;
* ``uncompressed_s`` ``zipccl_jax.<collective>(..., compress=False)`` (its raw path; for psum_scatter the same
                   fixed-order reduction as the compressed one, so it is the reference result there);
* ``compressed_s`` ``zipccl_jax.<collective>(..., compress=True)`` (or ``--compressed-impl MODULE``), with the
                   library's default padded capacity;
* ``calibrated_s`` the same with ``capacity=`` calibrated per call site from the observed frame sizes (largest
                   frame over all ranks x (1 + ``--calibration-margin``));
* ``auto_s``       ``compress="auto"`` (null before ``zipccl_jax.strategy`` existed): at every rate
                   ``zipccl_jax.calibrate`` measures link and codec on the workers, and each case is traced again
                   with that profile plus its frame sizes observed once (``auto_choice``: raw or compressed);
* ``codec_s``      encode + decode alone on the same chunks, no collective (``codec_share`` = codec_s /
                   compressed_s).

Beside them, ``model``: what ``zipccl_jax.model`` predicts for the case from a profile calibrated at that
rate at sizes no case has (``model_profile``, ``HELD_OUT_LINK_BYTES``; raw and compressed seconds, their ratio,
``auto``'s choice), and ``model_over_measured``: its compressed / raw over the measured ``compressed_s`` / best
raw (column ``model/c``). ``model_in_sample`` is the same from ``auto``'s profile (``profile``), calibrated at
the cases' own sizes too.

Wire bytes are bytes one device sends per call (``zipccl_jax.hlo_wire_bytes``' model: all_to_all
and psum_scatter S(n-1)/n, all_gather S(n-1) for an operand of S bytes). ``wire_bytes_raw`` is the logical
figure for the tensor's own dtype (it equals the HLO figure of the bit-cast raw collective,
``wire_bytes_raw_bits_hlo``; ``wire_bytes_raw_hlo`` shows XLA:CPU's widening). ``wire_bytes_compressed`` is
parsed from the compiled HLO of the compressed call, without its raw-fallback branch
(``wire_bytes_compressed_fallback`` includes it).

    python benchmarks/collectives.py --rates 0.5,1,2.5,10,unshaped --corpus /work/shared/corpus \\
        --json results/collectives.json --plot results/collectives.png
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _netns  # noqa: E402
import model_check  # noqa: E402  (zipccl_jax's model of each case, from the rate's calibrated profile)

# (collective, payload, corpus tensor, dtype, synthetic per-rank shape)
CASES = [
    ("all_to_all", "moe_dispatch", "lm_act_L4_moe_dispatch", "bfloat16", (8, 1280, 256)),
    ("all_to_all", "moe_combine", "lm_act_L4_moe_expert_out", "bfloat16", (8, 1280, 256)),
    ("all_to_all", "moe_dispatch_grad", "lm_actgrad_L4_moe_dispatch", "bfloat16", (8, 1280, 256)),
    ("all_to_all", "moe_combine_grad", "lm_actgrad_L4_moe_combine", "bfloat16", (8, 1280, 256)),
    ("all_gather", "params_moe_experts", "lm_param_moe_experts", "bfloat16", (2097152,)),
    ("psum_scatter", "grads_moe_experts", "lm_grad_moe_experts", "bfloat16", (2097152,)),
    ("psum_scatter", "grads_attn", "lm_grad_attn", "float32", (1572864,)),
]
WORKER_PORT = 12355  # inside a fresh private namespace every port is free


# ----------------------------------------------------------------------------------------------- payloads
def load_payload(case, rank: int, nproc: int, corpus: str | None, max_elems: int | None):
    """Per-rank local input of a case, as a numpy array (bfloat16 via ml_dtypes, or float32)."""
    import ml_dtypes
    import numpy as np

    coll, _payload, tensor, dtype, syn_shape = case
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    if corpus:
        manifest = json.loads((Path(corpus) / "manifest.json").read_text())
        entry = next((t for t in manifest if t["name"] == tensor and t["dtype"] == dtype), None)
        if entry is None:
            raise FileNotFoundError(f"{tensor} ({dtype}) is not in {corpus}/manifest.json")
        x = np.load(Path(corpus) / "tensors" / entry["file"])
        x = x.view(ml_dtypes.bfloat16) if entry["storage"] == "uint16" else x.astype(np.float32, copy=False)
        assert list(x.shape) == entry["shape"], (tensor, x.shape, entry["shape"])
    else:
        rng = np.random.default_rng(1234 + rank)
        x = (rng.standard_normal(syn_shape, dtype=np.float32) * 0.02).astype(np_dtype)

    if coll == "all_to_all":
        if x.ndim < 2 or x.shape[0] % nproc:
            x = x.reshape(-1)[: (x.size // nproc) * nproc].reshape(nproc, -1)
        if max_elems and x.size > max_elems:
            keep = max(1, max_elems // (x.size // x.shape[1]))
            x = x[:, :keep]
        if corpus:  # same tensor on every rank, but different rows in each chunk
            x = np.roll(x, rank * max(1, x.shape[1] // nproc), axis=1)
    else:
        x = x.reshape(-1)
        if coll == "all_gather":  # rank r holds shard r of the full tensor
            n = x.size // nproc
            if max_elems:
                n = min(n, max(1, max_elems // nproc))
            x = x[: n * nproc].reshape(nproc, n)[rank]
        else:  # psum_scatter: every rank holds a full-size gradient
            n = x.size // nproc
            if max_elems:
                n = min(n, max(1, max_elems // nproc))
            x = x[: n * nproc]
            if corpus:
                x = np.roll(x, rank * max(1, n // 3))
    return np.ascontiguousarray(x)


# ----------------------------------------------------------------------------------------------- worker
def _uint_like(dtype):
    import jax.numpy as jnp
    return {2: jnp.uint16, 4: jnp.uint32}[jnp.dtype(dtype).itemsize]


def build_fns(coll: str, nproc: int, impl, calibrated_capacity: int | None = None):
    """Per-shard bodies (for shard_map) of the variants of one collective. ``calibrated`` (compress=True with
    a per-call-site capacity from the observed frame sizes) exists when calibrated_capacity is given."""
    import jax.numpy as jnp
    from jax import lax

    ax = "x"
    if coll == "all_to_all":
        raw = lambda v: lax.all_to_all(v, ax, 0, 0, tiled=True)  # noqa: E731

        def raw_bits(v):
            u = lax.bitcast_convert_type(v, _uint_like(v.dtype))
            return lax.bitcast_convert_type(lax.all_to_all(u, ax, 0, 0, tiled=True), v.dtype)

        def comp(v, mode, **kw):
            return impl.all_to_all(v, ax, 0, 0, tiled=True, compress=mode, **kw)
    elif coll == "all_gather":
        raw = lambda v: lax.all_gather(v, ax, axis=0, tiled=True)  # noqa: E731

        def raw_bits(v):
            u = lax.bitcast_convert_type(v, _uint_like(v.dtype))
            return lax.bitcast_convert_type(lax.all_gather(u, ax, axis=0, tiled=True), v.dtype)

        def comp(v, mode, **kw):
            return impl.all_gather(v, ax, axis=0, tiled=True, compress=mode, **kw)
    elif coll == "psum_scatter":
        raw = lambda v: lax.psum_scatter(v, ax, scatter_dimension=0, tiled=True)  # noqa: E731

        def raw_bits(v):
            u = lax.bitcast_convert_type(v, _uint_like(v.dtype)).reshape(nproc, -1)
            r = lax.bitcast_convert_type(lax.all_to_all(u, ax, 0, 0, tiled=True), v.dtype)
            return jnp.sum(r.astype(jnp.float32), axis=0).astype(v.dtype)

        def comp(v, mode, **kw):  # zipccl's fixed-order programs, raw included (its bits: the reference)
            return impl.psum_scatter(v, ax, scatter_dimension=0, tiled=True, compress=mode,
                                     fixed_order=True, **kw)
    else:
        raise ValueError(coll)
    fns = {"raw": raw, "raw_bits": raw_bits}
    if impl is not None:
        fns["compressed"] = lambda v: comp(v, True)
        fns["auto"] = lambda v: comp(v, "auto")
        fns["uncompressed"] = lambda v: comp(v, False)  # reference result (same reduction order)
        if calibrated_capacity:
            fns["calibrated"] = lambda v: comp(v, True, capacity=int(calibrated_capacity))
    return fns


def build_codec_fn(coll: str, nproc: int, codec, capacity_fn):
    """encode + decode alone (jitted, local device) on the chunks the compressed collective codes: one frame
    per destination, each decoded once (all_to_all, psum_scatter), or one frame that every rank decodes nproc
    times (all_gather). Returns (roundtrip(capacity) -> jitted fn, sizes(x) -> (default padded capacity,
    exact frame sizes))."""
    import jax
    import jax.numpy as jnp

    kind = "gradient" if coll == "psum_scatter" else "activation"

    def frames(x):
        return x.reshape(1, -1) if coll == "all_gather" else x.reshape(nproc, -1)

    def roundtrip(capacity: int):
        @jax.jit
        def f(x):
            fx = frames(x)
            payload, _ = codec.encode_frames(fx, capacity=capacity)
            if coll == "all_gather":
                payload = jnp.tile(payload, (nproc, 1))
            return codec.decode_frames(payload, shape=fx.shape[1:], dtype=x.dtype)
        return f

    def sizes(x):
        _, nbytes = jax.jit(codec.encode_frames)(frames(x))  # exact frame sizes, no capacity limit
        return capacity_fn(frames(x).shape[1], x.dtype, kind=kind), nbytes

    return roundtrip, sizes


class _Worker:
    """One worker process: jax.distributed over all workers, the mesh ("x",) of one CPU device per process, and
    the helpers every case uses."""

    def __init__(self, args):
        import jax
        import numpy as np

        jax.config.update("jax_platforms", "cpu")
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.nproc,
                                   process_id=args.rank, initialization_timeout=120)
        from jax.experimental import multihost_utils
        from jax.sharding import NamedSharding, PartitionSpec as P

        self.jax, self.np, self.allgather = jax, np, multihost_utils.process_allgather
        self.args, self.rank, self.nproc = args, args.rank, args.nproc
        assert jax.local_device_count() == 1, f"expected one CPU device per process, got {jax.local_devices()}"
        self.mesh = jax.make_mesh((self.nproc,), ("x",))
        self.shard, self.spec = NamedSharding(self.mesh, P("x")), P("x")
        self.local_dev = jax.local_devices()[0]
        self.zc = None  # zipccl_jax, when its codec and HLO accounting load (load_impls)

    def sm(self, body):
        return self.jax.jit(self.jax.shard_map(body, mesh=self.mesh, in_specs=self.spec, out_specs=self.spec))

    def glob(self, a):
        return self.jax.make_array_from_process_local_data(self.shard, a)

    def log(self, *a):
        if self.rank == 0:
            print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)

    def start_barrier(self) -> None:
        """First cross-process collective: a modest all_to_all (never start with a tiny psum_scatter)."""
        jax, np = self.jax, self.np
        warm = self.sm(lambda v: jax.lax.all_to_all(v, "x", 0, 0, tiled=True))
        warm(self.glob(np.zeros((self.nproc, 16384), np.float32))).block_until_ready()
        self._bar = (self.sm(lambda v: jax.lax.psum(v, "x")), self.glob(np.ones((1,), np.float32)))

    def barrier(self) -> None:
        fn, x = self._bar
        fn(x).block_until_ready()

    def anywhere(self, flag: bool) -> bool:
        return bool(self.allgather(self.np.array([flag])).any())

    def hlo_bytes(self, compiled, fallback=False):
        if self.zc is None:
            return None
        return int(self.zc.hlo_wire_bytes(compiled.as_text(), include_fallback=fallback, num_devices=self.nproc))


def _load_impls(w: _Worker):
    """(the compressed implementation or None, why not, zipccl_jax.codec or None); sets w.zc."""
    impl = codec = None
    impl_error = None
    try:
        impl = importlib.import_module(w.args.compressed_impl)
        for name in ("all_to_all", "all_gather", "psum_scatter"):
            getattr(impl, name)
    except Exception as e:  # noqa: BLE001 - report, do not hide: records carry the reason
        impl, impl_error = None, f"{w.args.compressed_impl}: {type(e).__name__}: {e}"
        w.log("compressed path unavailable:", impl_error)
    try:
        zc = importlib.import_module("zipccl_jax")
        codec = importlib.import_module("zipccl_jax.codec")
        codec.encode_frames, codec.decode_frames, zc.hlo_wire_bytes, zc.padded_capacity  # noqa: B018
        w.zc = zc
    except Exception as e:  # noqa: BLE001
        codec = None
        w.log("zipccl_jax codec/collectives unavailable (no codec_s, no HLO wire bytes):", type(e).__name__, e)
    return impl, impl_error, codec


def _codec_info(w: _Worker, coll: str, x, codec, margin: float, info: dict):
    """Frame sizes, overflow and the calibrated capacity of one case into `info`; returns (the codec alone at
    the capacity the coded path runs with, the calibrated capacity)."""
    np = w.np
    roundtrip, sizes = build_codec_fn(coll, w.nproc, codec, w.zc.padded_capacity)
    lx = w.jax.device_put(x, w.local_dev)
    cap, nb = sizes(lx)
    nb = np.asarray(nb).astype(np.int64)
    info["frame_capacity"] = int(cap)
    info["codec_bytes_local"] = int(nb.sum())
    # an overflowing chunk sends every rank down the raw fallback (compressed_s then includes it)
    info["overflow"] = w.anywhere(bool((nb > cap).any()))
    # per-call-site capacity calibrated from the observed frame sizes (all ranks), plus a margin
    biggest = int(w.allgather(np.array([nb.max()])).max())
    calibrated = -(-int(biggest * (1 + margin)) // 8) * 8
    info["calibrated_capacity"] = calibrated
    # codec alone at the capacity the coded path runs with (the calibrated one if the default overflows)
    codec_fn = roundtrip(calibrated if info["overflow"] else int(cap))
    codec_fn(lx).block_until_ready()
    return codec_fn, calibrated


def _prepare_case(w: _Worker, case, impl, codec, zs, auto_prof):
    """(case, x, gx, fns, codec_fn, info) of one case: its variants compiled, their HLO wire bytes, and the
    coded results checked bit for bit once."""
    np = w.np
    coll, payload, tensor, dtype, _ = case
    x = load_payload(case, w.rank, w.nproc, w.args.corpus, w.args.max_elems)
    gx = w.glob(x)
    info = {"errors": {}}
    codec_fn, calibrated = None, None
    if codec is not None and dtype in ("bfloat16", "float32"):
        codec_fn, calibrated = _codec_info(w, coll, x, codec, w.args.calibration_margin, info)
    bodies = build_fns(coll, w.nproc, impl, calibrated)
    if auto_prof is not None and "auto" in bodies:  # per-call-site capacity from observed frame sizes
        auto_prof.sites = {}
        with zs.observe(auto_prof):
            w.sm(bodies["auto"])(gx).block_until_ready()
        info["auto_body"], info["auto_sites"] = bodies["auto"], dict(auto_prof.sites)
    fns = {}
    for name, body in bodies.items():
        f = w.sm(body)
        compiled = f.lower(gx).compile()
        info[f"wire_{name}"] = w.hlo_bytes(compiled)
        if name in ("compressed", "auto", "calibrated"):
            info[f"wire_{name}_fallback"] = w.hlo_bytes(compiled, fallback=True)
        fns[name] = f
    # Correctness, once: the compressed result against the same data movement on bits, or (psum_scatter)
    # against compress=False, which performs the same documented fixed-order reduction.
    for name in ("compressed", "calibrated"):
        if name in fns:
            a = np.asarray(fns[name](gx).addressable_data(0))
            b = np.asarray(fns["raw_bits" if coll != "psum_scatter" else "uncompressed"](gx).addressable_data(0))
            info[f"bit_identical_{name}"] = not w.anywhere(not np.array_equal(a.view(np.uint8), b.view(np.uint8)))
    w.log(f"prepared {coll}:{payload} per-rank {x.shape} {dtype} variants {sorted(fns)}"
          f"{' +codec' if codec_fn else ''}")
    return case, x, gx, fns, codec_fn, info


# calibrate()'s default sizes, kept in every run so the fitted slopes span small messages too
CALIBRATE_LINK_BYTES = (256 << 10, 4 << 20)
# The sizes of the profile the model predicts from (`model`): none is a case's own (model_check.HELD_OUT_SIZES)
HELD_OUT_LINK_BYTES = model_check.HELD_OUT_SIZES
# psum (the two-level run's): its programs are psum_scatter's of the operand and all_gather's of the result,
# each sending S (n-1)/n, so it is calibrated where psum_scatter is
_SENT_KIND = {"all_to_all": "all-to-all", "all_gather": "all-gather", "psum_scatter": "reduce-scatter",
              "psum": "reduce-scatter"}


def calibration_sizes(operands, n: int) -> tuple[int, ...]:
    """calibrate()'s `link_bytes` for a run: its defaults plus, per (collective, bytes of one device's operand)
    in `operands`, the bytes one device sends in the flat raw collective over `n` devices. The profile's link
    models interpolate between measured sizes, so measuring at the calls' own sizes makes the estimates "auto"
    compares exact there (a line through two far sizes missed a per-byte step of the two-level all_gather
    between them, and "auto" ran flat raw at 1.11-1.14x the best variant)."""
    from zipccl_jax.accounting import sent_bytes
    return tuple(sorted(set(CALIBRATE_LINK_BYTES)
                        | {sent_bytes(_SENT_KIND[coll], int(nbytes), n) for coll, nbytes in operands}))


def _retrace_auto(w: _Worker, prepared, auto_prof, zs):
    """Measures the link at this rate (zipccl_jax.calibrate, all ranks at once, agreed, at the defaults' and the
    cases' sizes), then traces each case's compress="auto" again with that profile and the frame sizes observed
    at preparation; returns the profile. The model's prediction (`model`) comes from a second, held-out
    calibration at sizes no case has (`HELD_OUT_LINK_BYTES`, `model_profile`), so it is not read back from a
    measurement of the call it predicts."""
    sizes = calibration_sizes([(item[0][0], item[1].nbytes) for item in prepared], w.nproc)
    auto_prof = zs.calibrate(w.mesh, "x", profile=auto_prof, link_bytes=sizes, activate=False)
    held = zs.calibrate(w.mesh, "x", profile=zs.Profile(), link_bytes=HELD_OUT_LINK_BYTES, activate=False)
    for case, x, gx, fns, codec_fn, info in prepared:
        if "auto_body" in info:
            auto_prof.sites = info["auto_sites"]
            zs.strategy.reset_decisions()
            with zs.use_profile(auto_prof):
                f = w.sm(info["auto_body"])
                compiled = f.lower(gx).compile()
            fns["auto"] = f
            info["wire_auto"] = w.hlo_bytes(compiled)
            info["auto_choice"] = ["compressed" if d.compress else "raw" for d in zs.decisions().values()]
            w.log(f"auto {case[0]}:{case[1]}: " + "; ".join(d.summary() for d in zs.decisions().values()))
        if info.get("frame_capacity"):
            info["model"] = model_check.flat_case(held, case[0], case[1], case[3], x.nbytes,
                                                  info["frame_capacity"], w.nproc)
            info["model_in_sample"] = model_check.flat_case(auto_prof, case[0], case[1], case[3], x.nbytes,
                                                            info["frame_capacity"], w.nproc)
            info["profile"] = auto_prof.to_dict()  # what `auto` used
            info["model_profile"] = held.to_dict()  # what the prediction used
    return auto_prof


def rep_order(names: list, rep: int) -> list:
    """The variants' order in repetition `rep`: calibrate's (`zipccl_jax.strategy.calibration.rep_order`, seeded with
    `rep`, the same on every process). Shuffled, not rotated: a rotation keeps every variant's predecessor but
    at the wrap, and on the 2 x 4 testbed `auto`, right after the both-levels-coded variant, measured
    1.028-1.091 of the variant running its very program (psum_scatter, four runs of five); shuffled,
    0.927-1.030 in three runs, both sides of 1."""
    from zipccl_jax.strategy.calibration import rep_order as shuffled  # jax only once a worker has set XLA_FLAGS
    return shuffled(names, rep)


def _time_variants(w: _Worker, runs: dict, gx) -> tuple[list, object]:
    """Every variant's time per repetition after warm-up, interleaved (drift hits every variant alike) in a
    shuffled order (`rep_order`), with a barrier before each: (variant names, (nproc, variants, reps) seconds of
    every rank)."""
    args = w.args
    times = {n: [] for n in runs}
    for rep in range(args.warmup + args.reps):
        for name in rep_order(list(runs), rep):
            f = runs[name]
            w.barrier()
            t0 = time.perf_counter()
            f(gx).block_until_ready()
            dt = time.perf_counter() - t0
            if rep >= args.warmup:
                times[name].append(dt)
    names = sorted(times)
    return names, w.allgather(w.np.array([times[n] for n in names], dtype=w.np.float64))


def _time_case(w: _Worker, item, go: dict, impl, impl_error) -> dict:
    """One case's record at this rate: medians of the slowest rank per repetition, wire bytes, checks."""
    case, x, gx, fns, codec_fn, info = item
    coll, payload, tensor, dtype, _ = case
    args, nproc, np = w.args, w.nproc, w.np
    runs = dict(fns)
    if codec_fn is not None:
        lx = w.jax.device_put(x, w.local_dev)
        runs["codec"] = lambda _g, _f=codec_fn, _l=lx: _f(_l)
    names, allt = _time_variants(w, runs, gx)
    slowest = allt.max(axis=0)  # a collective is done when its slowest rank is
    med = {n: float(statistics.median(slowest[i])) for i, n in enumerate(names)}
    codec_total = w.allgather(np.array([info.get("codec_bytes_local", -1)]))
    # bytes one device sends (hlo_wire_bytes' model): all_to_all / psum_scatter S(n-1)/n, all_gather S(n-1)
    logical = x.nbytes * (nproc - 1) if coll == "all_gather" else x.nbytes * (nproc - 1) // nproc
    w.log(f"{_netns.rate_label(go['rate_gbit']):>9} {coll}:{payload} " +
          " ".join(f"{n}={med[n] * 1e3:.1f}ms" for n in names))
    return {
        "collective": coll, "payload": payload, "dtype": dtype, "rate_gbit": go["rate_gbit"],
        "raw_s": med["raw"], "compressed_s": med.get("compressed"), "auto_s": med.get("auto"),
        "wire_bytes_raw": int(logical),
        "wire_bytes_compressed": info.get("wire_compressed"),
        # extras
        "tensor": tensor if args.corpus else "synthetic_gaussian",
        "shape_per_rank": list(x.shape), "n_processes": nproc, "reps": args.reps,
        "link_MBps": go.get("link_MBps"), "link_MBps_probes": go.get("link_MBps_probes"),
        "raw_bits_s": med["raw_bits"], "codec_s": med.get("codec"),
        "wire_bytes_raw_hlo": info.get("wire_raw"),
        "wire_bytes_raw_bits_hlo": info.get("wire_raw_bits"),
        "wire_bytes_compressed_fallback": info.get("wire_compressed_fallback"),
        "wire_bytes_auto": info.get("wire_auto"), "auto_choice": info.get("auto_choice"),
        "frame_capacity": info.get("frame_capacity"),
        "codec_ratio": (x.nbytes * nproc / float(codec_total.sum())
                        if (codec_total > 0).all() else None),
        "overflow": info.get("overflow"),
        "bit_identical": info.get("bit_identical_compressed"),
        "uncompressed_s": med.get("uncompressed"), "calibrated_s": med.get("calibrated"),
        "calibrated_capacity": info.get("calibrated_capacity"),
        "wire_bytes_calibrated": info.get("wire_calibrated"),
        "bit_identical_calibrated": info.get("bit_identical_calibrated"),
        "compressed_impl": args.compressed_impl if impl is not None else None,
        "errors": dict(info["errors"], **({"compressed": impl_error} if impl_error else {})),
        "model": info.get("model"), "model_in_sample": info.get("model_in_sample"),
        "profile": info.get("profile"), "model_profile": info.get("model_profile"),
        "rank_times_s": {n: [[round(t, 6) for t in row] for row in allt[:, i, :].tolist()]
                         for i, n in enumerate(names)},
    }


def select_cases(cases, spec: str | None) -> list:
    """The cases `--cases` names: each comma-separated item is a whole 'collective:payload' (exactly that case:
    'all_to_all:moe_dispatch' is not also 'all_to_all:moe_dispatch_grad') or else a substring of it; None or
    '' is every case."""
    if not spec:
        return list(cases)
    names = [f"{c[0]}:{c[1]}" for c in cases]
    items = spec.split(",")
    return [c for c, name in zip(cases, names)
            if any(item == name or (item not in names and item in name) for item in items)]


def worker_main(args) -> None:
    w = _Worker(args)
    impl, impl_error, codec = _load_impls(w)
    w.start_barrier()
    # compress="auto" is timed whenever the compressed implementation loads: zipccl_jax.calibrate measures link
    # and codec at every rate, and each case's "auto" is traced again with that profile and its observed frames.
    zs = importlib.import_module("zipccl_jax") if impl is not None else None
    auto_prof = zs.Profile() if zs is not None else None
    cases = select_cases(CASES, args.cases)
    prepared = [_prepare_case(w, case, impl, codec, zs, auto_prof) for case in cases]

    def phase(go) -> list[dict]:
        nonlocal auto_prof
        if auto_prof is not None:
            auto_prof = _retrace_auto(w, prepared, auto_prof, zs)
        return [_time_case(w, item, go, impl, impl_error) for item in prepared]

    _netns.worker_phases(_netns.ControlDir(Path(args.ctl)), w.rank, args.phase_timeout, w.barrier, phase)
    w.jax.distributed.shutdown()


# ----------------------------------------------------------------------------------------------- launcher
def best_raw_s(rec: dict) -> float:
    """The fastest raw alternative: jax.lax as called, lax on the bits, or zipccl_jax with compress=False."""
    return min(v for v in (rec["raw_s"], rec.get("raw_bits_s"), rec.get("uncompressed_s")) if v is not None)


def derived(rec: dict) -> dict:
    """Ratios computed from a record (added to the JSON)."""
    best = best_raw_s(rec)

    def ratio(a, b):
        return a / b if a is not None and b else None

    c, cal, auto = rec.get("compressed_s"), rec.get("calibrated_s"), rec.get("auto_s")
    return {
        "best_raw_s": best,
        "speedup": ratio(rec["raw_s"], c),                      # vs jax.lax as called
        "speedup_vs_best_raw": ratio(best, c),
        "compressed_over_best_raw": ratio(c, best),
        "calibrated_over_best_raw": ratio(cal, best),
        "speedup_calibrated_vs_best_raw": ratio(best, cal),
        "wire_ratio": ratio(rec["wire_bytes_raw"], rec.get("wire_bytes_compressed")),
        "wire_ratio_calibrated": ratio(rec["wire_bytes_raw"], rec.get("wire_bytes_calibrated")),
        "codec_share": ratio(rec.get("codec_s"), c),
        "auto_over_best": ratio(auto, min(v for v in (best, c, cal) if v)) if auto else None,
        # zipccl_jax.model's prediction of compressed / raw from this rate's calibrated profile, over the
        # measured ratio (1.0: exact)
        "model_over_measured": ratio((rec.get("model") or {}).get("compressed_over_raw"), ratio(c, best)),
    }


def plot(records: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({r["rate_gbit"] for r in records if r["rate_gbit"] is not None})
    unshaped_x = (max(rates) * 4) if rates else 1.0

    def xpos(r):
        return unshaped_x if r is None else r

    keys = []
    for r in records:
        k = (r["collective"], r["payload"], r["dtype"])
        if k not in keys:
            keys.append(k)
    panels = ((("speedup_vs_best_raw", "-", "o", ""), ("speedup_calibrated_vs_best_raw", "--", "s", " calibrated")),
              (("speedup", "-", "o", ""),))
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5), sharey=True)
    titles = ("vs the best raw path (lax on bit-cast, zipccl compress=False, lax)\n"
              "solid: default capacity, dashed: calibrated capacity, dotted: compress='auto'",
              "vs jax.lax as called (XLA:CPU widens BF16 to F32 on the wire)")
    for ax, fields, title in zip(axes, panels, titles):
        for i, k in enumerate(keys):
            color = f"C{i % 10}"
            for field, ls, mk, suffix in fields:
                pts = sorted((xpos(r["rate_gbit"]), r[field]) for r in records
                             if (r["collective"], r["payload"], r["dtype"]) == k and r.get(field))
                if pts:
                    ax.plot(*zip(*pts), marker=mk, linestyle=ls, color=color,
                            label=f"{k[0]} {k[1]} ({k[2]}){suffix}" if suffix == "" or ax is axes[0] else None)
            apts = sorted((xpos(r["rate_gbit"]), best_raw_s(r) / r["auto_s"]) for r in records
                          if (r["collective"], r["payload"], r["dtype"]) == k and r.get("auto_s"))
            if apts and ax is axes[0]:
                ax.plot(*zip(*apts), marker="x", linestyle=":", color=color)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(1 / 0.74, color="grey", linestyle="--", linewidth=0.8, label="1.35x (time 0.74x raw)")
        ax.set_xscale("log")
        ax.set_xticks(rates + [unshaped_x])
        ax.set_xticklabels([f"{t:g}" for t in rates] + ["unshaped"])
        ax.minorticks_off()
        ax.set_xlabel("loopback link rate (Gbit/s, tc tbf)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("speedup = raw time / compressed time")
    axes[0].legend(fontsize=6, loc="upper right", ncol=1)
    n = records[0]["n_processes"] if records else "?"
    fig.suptitle(f"zipccl_jax compressed collectives, {n} processes x 1 CPU device, jax.distributed over gloo")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_table(records: list[dict]) -> str:
    cols = (("wire", "wire_ratio"), ("c/lax", None), ("c/best", "compressed_over_best_raw"),
            ("cal.wire", "wire_ratio_calibrated"), ("cal/best", "calibrated_over_best_raw"),
            ("auto/best", "auto_over_best"), ("codec%", "codec_share"), ("model/c", "model_over_measured"))
    lines = [f"{'rate':>9} {'collective:payload':<34} {'dtype':<8} " + " ".join(f"{c:>9}" for c, _ in cols)]
    for r in records:
        vals = []
        for c, key in cols:
            v = (r["compressed_s"] / r["raw_s"] if r.get("compressed_s") else None) if key is None else r.get(key)
            if v is not None and c == "codec%":
                v *= 100
            vals.append("-" if v is None else format(v, ".0f" if c == "codec%" else ".3f"))
        lines.append(f"{_netns.rate_label(r['rate_gbit']):>9} {r['collective'] + ':' + r['payload']:<34} "
                     f"{r['dtype']:<8} " + " ".join(f"{v:>9}" for v in vals))
    return "\n".join(lines)


def launch(args) -> list[dict]:
    rates = _netns.parse_rates(args.rates)
    if args.no_netns and any(r is not None for r in rates):
        raise SystemExit("--no-netns runs on the unshaped host loopback; use --rates unshaped")
    with _netns.run_dir("zccl_bench_", args.keep_logs) as (tmp, held):
        ns = None
        if not args.no_netns:
            ns = held.enter_context(_netns.open_netns(_netns.NetNS))
            ns.set_rate(rates[0])
        port = WORKER_PORT if ns is not None else _netns.free_port()
        ctl = _netns.ControlDir(tmp / "ctl")
        allocator, preload = _netns.resolve_allocator(args.allocator, measuring=not args.no_netns)
        env = _netns.worker_env(preload=preload)
        if importlib.util.find_spec("zipccl_jax") is None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        common = ["--port", str(port), "--nproc", str(args.nproc), "--ctl", str(ctl.path),
                  "--reps", str(args.reps), "--warmup", str(args.warmup),
                  "--calibration-margin", str(args.calibration_margin), "--phase-timeout", str(args.timeout),
                  "--compressed-impl", args.compressed_impl] + (["--time-auto"] if args.time_auto else [])
        if args.corpus:
            common += ["--corpus", str(Path(args.corpus).resolve())]
        if args.max_elems:
            common += ["--max-elems", str(args.max_elems)]
        if args.cases:
            common += ["--cases", args.cases]
        argvs = [[sys.executable, str(Path(__file__).resolve()), "--worker", "--rank", str(i)] + common
                 for i in range(args.nproc)]
        where = f"netns {ns.name}" if ns else "host loopback (no namespace)"
        print(f"launching {args.nproc} workers in {where}; logs in {tmp}", flush=True)
        workers = held.enter_context(_netns.Workers(argvs, netns=ns, logdir=tmp, env=env, timeout_s=args.timeout,
                                                    cwd=str(REPO)))

        def finish(recs: list[dict]) -> list[dict]:
            load = os.getloadavg()[0]  # the machine is shared: record how busy it was
            for rec in recs:
                rec.update(derived(rec))
                rec["loadavg_1min"] = load
                rec["allocator"] = allocator
            return recs

        def probe():
            return _netns.measure_loopback_MBps(ns, nbytes=args.link_probe_mb << 20) if args.link_probe_mb else None

        return _netns.sweep(ctl, workers, args.nproc, rates, ns.set_rate if ns else None, probe,
                            "loopback TCP measured", finish)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="0.5,1,2.5,10,unshaped",
                   help="comma-separated link rates in Gbit/s, 'unshaped' for no shaping")
    p.add_argument("--corpus", default=None, help="corpus directory (manifest.json + tensors/); "
                                                  "synthetic Gaussian payloads when omitted")
    p.add_argument("--json", default=None, help="write the list of records here")
    p.add_argument("--plot", default=None, help="write a PNG of speedup vs link rate here")
    p.add_argument("--nproc", type=int, default=4, help="worker processes (one CPU device each)")
    p.add_argument("--reps", type=int, default=None,
                   help="timed repetitions per variant (median reported); default 11, 31 with --mesh (their "
                        "bars compare near-tied variants and `auto` with the variant running its program: "
                        "with 5, one program's medians at 5-12 ms differed by up to 10%%; with 21 at --mesh, "
                        "by up to 9%%, psum_scatter at IQR 15%%)")
    p.add_argument("--warmup", type=int, default=1, help="untimed repetitions per variant and rate")
    p.add_argument("--cases", default=None,
                   help="comma-separated 'collective:payload' names (exact) or substrings of them to run")
    p.add_argument("--max-elems", type=int, default=None, help="cap the elements per rank (smoke tests)")
    p.add_argument("--compressed-impl", default="zipccl_jax",
                   help="module with all_to_all/all_gather/psum_scatter(..., compress=...) (default zipccl_jax)")
    p.add_argument("--calibration-margin", type=float, default=0.02,
                   help="calibrated capacity = largest observed frame x (1 + margin)")
    p.add_argument("--time-auto", action="store_true",
                   help="no effect (compress='auto' is always timed); kept for old command lines")
    p.add_argument("--timeout", type=float, default=None,
                   help="hard limit for the whole run, seconds (default 900; 2400 with --held-out-per-case)")
    p.add_argument("--link-probe-mb", type=int, default=16,
                   help="MB sent over the loopback to measure each rate (0: skip)")
    p.add_argument("--no-netns", action="store_true",
                   help="no namespace, no shaping: workers use the host loopback (for smoke tests, no root)")
    p.add_argument("--keep-logs", action="store_true", help="keep worker logs after a successful run")
    p.add_argument("--allocator", default="auto", choices=_netns.ALLOCATORS,
                   help="malloc of the workers: tcmalloc (auto: required for shaped runs) or glibc (see _netns.py)")
    p.add_argument("--held-out-bytes", default=None, metavar="B,B,...",
                   help="--mesh: the sizes (bytes one device sends) of the held-out calibration the links-only "
                        "prediction reads; default HELD_OUT_LINK_BYTES. Each must differ from every case's")
    p.add_argument("--held-out-per-case", action="store_true",
                   help="--mesh: measure the held-out calibration again just before each case (no drift between "
                        "the prediction's calibration and the case; each adds about a calibration's time)")
    p.add_argument("--mesh", default=None, metavar="HxL",
                   help="two-level run: H processes ('hosts', one network namespace each, only traffic between "
                        "them shaped) x L CPU devices, collectives over ('host', 'local'); see _twolevel.py")
    # worker-side
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--ctl", help=argparse.SUPPRESS)
    p.add_argument("--phase-timeout", type=float, default=900.0, help=argparse.SUPPRESS)
    p.add_argument("--coordinator", help=argparse.SUPPRESS)
    p.add_argument("--gloo-host", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.reps is None:
        args.reps = 31 if args.mesh else 11
    if args.held_out_bytes is not None and not args.mesh:  # the flat run's prediction reads HELD_OUT_LINK_BYTES
        p.error("--held-out-bytes: only with --mesh")
    args.held_out_bytes = parse_held_out(args.held_out_bytes, p.error)
    if args.held_out_per_case and not args.mesh:
        p.error("--held-out-per-case: only with --mesh")
    if args.timeout is None:  # a 2 x 4 run: 490 s; with a calibration before each case, 1100 s
        args.timeout = 2400.0 if args.held_out_per_case else 900.0
    return args


def parse_held_out(text: str | None, error) -> tuple[int, ...]:
    """`--held-out-bytes`: ascending distinct sizes > 0, at least two (a link model needs two)."""
    if text is None:
        return HELD_OUT_LINK_BYTES
    try:
        sizes = tuple(int(v) for v in text.split(","))
    except ValueError:
        error(f"--held-out-bytes: integers separated by commas, got {text!r}")
    if len(sizes) < 2 or any(b <= a for a, b in zip(sizes, sizes[1:])) or sizes[0] <= 0:
        error(f"--held-out-bytes: two or more ascending sizes > 0, got {text!r}")
    return sizes


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.mesh:
        import _twolevel
        if args.plot:
            raise SystemExit("--plot is not available with --mesh")
    if args.worker:
        try:
            _twolevel.worker_mesh(args) if args.mesh else worker_main(args)
        except BaseException:
            traceback.print_exc()
            sys.stdout.flush()
            os._exit(1)  # do not hang in jax.distributed's atexit shutdown when peers are gone
        return 0
    t0 = time.time()
    if args.mesh:
        records = _twolevel.launch_mesh(args)
        print(_twolevel.summary_table(records))
        print(f"(median and spread (IQR) over {args.reps} interleaved repetitions, slowest process; /flat_comp, "
              f"/best: ratio of medians; {time.time() - t0:.0f} s)")
        _write(args, records, plot_fn=None)
        return 0
    records = launch(args)
    print(summary_table(records))
    print(f"(wire: raw/compressed wire bytes; c/lax, c/best: compressed time over jax.lax and over the best raw "
          f"path; cal.: calibrated capacity; codec%: encode+decode alone over compressed time; {args.nproc} "
          f"processes; {time.time() - t0:.0f} s)")
    _write(args, records, plot_fn=plot)
    return 0


def _write(args, records: list[dict], plot_fn) -> None:
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(records, indent=1))
    if args.plot:
        plot_fn(records, args.plot)


if __name__ == "__main__":
    sys.exit(main())
