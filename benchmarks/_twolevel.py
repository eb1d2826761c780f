"""``collectives.py --mesh HxL``: collectives over a two-level mesh, H processes ("hosts") x L CPU devices.

Each process runs in its own network namespace of a ``_netns.Fabric``: traffic between the L devices of one
process (XLA:CPU moves it through gloo over TCP too) stays on that host's unshaped loopback, and only traffic
between processes crosses the tbf-shaped link. The mesh is ``("host", "local") = (H, L)``, host = process.

Per case (collective x payload) and rate, every variant of the collective over ``("host", "local")`` is timed
``--reps`` times after ``--warmup``, interleaved (one repetition of every variant, then the next, in an order
shuffled every repetition and the same on every process: `collectives.rep_order`), with a barrier before each;
a repetition counts its slowest process. One JSON record per (case, rate, variant):
``mesh``, ``axes``, ``collective``, ``algorithm`` ("flat" or "hierarchical"), ``compress`` (True, False,
"auto"), ``plan`` (what "auto" chose, per call site), ``median_s``, ``spread_s`` (interquartile range),
``rep_times_s``, ``bit_identical`` (against ``reference``: jax.lax on the bit patterns for data movement; for
psum_scatter the same algorithm with compress=False, since each algorithm documents its own summation order),
the link probe, the machine load and the allocator.
"""
from __future__ import annotations

import contextlib
import importlib
import sys
import time
from pathlib import Path

import _netns
import _stats

AXES = ("host", "local")
# The default cases of a two-level run: one payload per collective (`--cases` picks others from CASES).
DEFAULT_CASES = ("all_to_all:moe_dispatch", "all_gather:params_moe_experts", "psum_scatter:grads_moe_experts")
# Cases of the two-level run only (`--cases`): a data-parallel gradient psum (every rank a full-size
# gradient, as psum_scatter's payload), two-level as psum_scatter's programs followed by all_gather's.
MESH_CASES = [("psum", "grads_moe_experts", "lm_grad_moe_experts", "bfloat16", (2097152,))]
PORT = 12355  # inside fresh private namespaces every port is free


def parse_mesh(spec: str) -> tuple[int, int]:
    """'2x4' -> (2, 4): hosts (processes) x local devices per process."""
    try:
        h, l = (int(t) for t in spec.lower().split("x"))
    except ValueError:
        raise ValueError(f"--mesh must look like HxL (e.g. 2x4), got {spec!r}") from None
    if h < 1 or l < 1:
        raise ValueError(f"--mesh needs H >= 1 and L >= 1, got {spec!r}")
    return h, l


# ----------------------------------------------------------------------------------------------- variants
def _uint_like(dtype):
    import jax.numpy as jnp
    return {2: jnp.uint16, 4: jnp.uint32}[jnp.dtype(dtype).itemsize]


def _call(coll: str, axes=AXES):
    """f(module, v, **kw): the collective over `axes` with the benchmark's fixed layout arguments."""
    if coll == "all_to_all":
        return lambda m, v, **kw: m.all_to_all(v, axes, 0, 0, tiled=True, **kw)
    if coll == "all_gather":
        return lambda m, v, **kw: m.all_gather(v, axes, axis=0, tiled=True, **kw)
    if coll == "psum_scatter":
        return lambda m, v, **kw: m.psum_scatter(v, axes, scatter_dimension=0, tiled=True, **kw)
    if coll == "psum":
        return lambda m, v, **kw: m.psum(v, axes, **kw)
    raise ValueError(coll)


# The same collective written over ONE mesh axis ("i": the h * L + l devices of the tuple mesh, in its
# order) declared as hosts of L devices (zipccl_jax.use_levels), as users write `expert` or `fsdp`: the
# two-level program with the host level coded, flat compressed (the control: one mesh axis against two,
# the same program), and compress="auto" (psum stays flat over one axis under shard_map's default
# check_vma, so it has none). Each must give the bits of its tuple twin.
ONE_AXIS = "i"
ONE_AXIS_OPS = ("all_to_all", "all_gather", "psum_scatter")


# What "auto" runs, by the algorithm it chose: the variant tracing the same program (same phases, modes,
# capacities and transport), so the two medians differ by noise only. A flat choice is flat_auto's program.
_SAME_PROGRAM = {"hierarchical(host:r,local:r)": "hierarchical_raw",
                 "hierarchical(host:c,local:r)": "hierarchical_compressed",
                 "hierarchical(host:c,local:c)": "hierarchical_all_compressed"}


def variants(coll: str, zc, site: str, per_host: int | None = None) -> dict[str, dict]:
    """name -> {'algorithm', 'compress', 'reference', 'body'} for one collective over AXES (call site `site`),
    and with `per_host`, the one-axis variants (``one_axis`` True: their body runs over ONE_AXIS).

    ``lax_bits`` is jax.lax on the bit patterns (XLA:CPU widens BF16 collectives to F32 on the wire, so lax on
    BF16 itself is no fair baseline); for psum_scatter it is an all_to_all of the bits plus a local float32
    sum, for psum ``jax.lax.psum`` itself, and no reference (a reduction's order is not the library's).
    """
    import jax.numpy as jnp
    from jax import lax

    call = _call(coll)

    def lax_bits(v):
        if coll == "psum":
            return lax.psum(v, AXES)
        u = lax.bitcast_convert_type(v, _uint_like(v.dtype))
        if coll != "psum_scatter":
            return lax.bitcast_convert_type(call(lax, u), v.dtype)
        n = lax.psum(1, AXES)
        r = lax.bitcast_convert_type(lax.all_to_all(u.reshape(n, -1), AXES, 0, 0, tiled=True), v.dtype)
        return jnp.sum(r.astype(jnp.float32), axis=0).astype(v.dtype)

    data_ref = "lax_bits" if coll not in ("psum_scatter", "psum") else None
    out = {"lax_bits": {"algorithm": "flat", "compress": False, "reference": None, "body": lax_bits}}
    use = getattr(zc, "use_algorithm", None)  # zipccl_jax.hierarchical (two-level collectives)
    pinned = (lambda alg, levels=None: use(alg, levels)) if use else (lambda *a: contextlib.nullcontext())

    # zipccl's own programs, raw included: the reductions' fixed order (else raw is jax.lax's call, and
    # the two-level raw program is no candidate of "auto")
    order = (lambda: zc.use_defaults(fixed_order=True)) if use else contextlib.nullcontext

    def body(mode, alg, levels=None):
        def f(v):
            with pinned(alg, levels), order():  # the algorithm is chosen at trace time, inside the body
                return call(zc, v, compress=mode, name=site)
        return f

    for name, mode in (("flat_raw", False), ("flat_compressed", True), ("flat_auto", "auto")):
        out[name] = {"algorithm": "flat", "compress": mode, "reference": data_ref or "flat_raw",
                     "body": body(mode, "flat")}
    out["flat_raw"]["reference"] = data_ref
    if use is None:
        return out
    for name, levels in (("hierarchical_raw", {"host": False, "local": False}),
                         ("hierarchical_compressed", {"host": True, "local": False}),
                         ("hierarchical_all_compressed", {"host": True, "local": True})):
        out[name] = {"algorithm": "hierarchical", "compress": levels, "body": body(True, "hierarchical", levels),
                     "reference": data_ref or ("hierarchical_raw" if name != "hierarchical_raw" else None)}
    # "auto": compress="auto" and the algorithm from the cost model (reference set once it has chosen)
    out["auto"] = {"algorithm": "auto", "compress": "auto", "reference": data_ref, "body": body("auto", "auto")}
    if per_host is None or coll not in ONE_AXIS_OPS:
        return out
    call1 = _call(coll, ONE_AXIS)

    def body1(mode, alg, levels=None):
        def f(v):
            with pinned(alg, levels), order(), zc.use_levels({ONE_AXIS: per_host}):
                return call1(zc, v, compress=mode, name=site + "/one_axis")
        return f

    host_coded = {"host": True, "local": False}
    out["one_axis_compressed"] = {"algorithm": "hierarchical", "compress": host_coded, "one_axis": True,
                                  "body": body1(True, "hierarchical", host_coded),
                                  "reference": "hierarchical_compressed"}  # the tuple's bits
    out["one_axis_flat_compressed"] = {"algorithm": "flat", "compress": True, "one_axis": True,  # the control
                                       "body": body1(True, "flat"), "reference": data_ref or "flat_compressed"}
    out["one_axis_auto"] = {"algorithm": "auto", "compress": "auto", "one_axis": True, "reference": data_ref,
                            "body": body1("auto", "auto")}
    return out


# ----------------------------------------------------------------------------------------------- worker
def _mesh_and_sharding(h: int, l: int):
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    devs = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    grid = np.array(devs, dtype=object).reshape(h, l)
    for i in range(h):  # the "host" axis must be the process axis, or the shaped link splits nothing
        assert {d.process_index for d in grid[i]} == {i}, f"row {i} of the mesh spans processes: {grid[i]}"
    mesh = Mesh(grid, AXES)
    one = Mesh(grid.reshape(-1), (ONE_AXIS,))  # device h * L + l at rank h * L + l, as over the tuple
    return mesh, NamedSharding(mesh, P(AXES)), NamedSharding(one, P(ONE_AXIS))


def _local_payload(case, rank: int, h: int, l: int, args):
    """This process's share of the global operand: its L devices' payloads, concatenated along axis 0."""
    import numpy as np
    from collectives import load_payload

    n = h * l
    return np.concatenate([load_payload(case, rank * l + j, n, args.corpus, args.max_elems) for j in range(l)])


def worker_mesh(args) -> None:
    import jax
    import numpy as np

    h, l = parse_mesh(args.mesh)
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", l)
    jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=h, process_id=args.rank,
                               initialization_timeout=120)
    _netns.bind_gloo(args.gloo_host)
    from jax.experimental import multihost_utils

    import collectives as bench
    import zipccl_jax as zc
    zs = importlib.import_module("zipccl_jax.strategy")

    rank = args.rank
    mesh, shard, shard1 = _mesh_and_sharding(h, l)
    ctl = _netns.ControlDir(Path(args.ctl))

    def sm(body, one_axis=False):
        on = shard1 if one_axis else shard
        return jax.jit(jax.shard_map(body, mesh=on.mesh, in_specs=on.spec, out_specs=on.spec))

    def log(*a):
        if rank == 0:
            print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)

    def anywhere(flag: bool) -> bool:
        return bool(multihost_utils.process_allgather(np.array([flag])).any())

    bar_fn = sm(lambda v: jax.lax.psum(v, AXES))
    bar_in = jax.make_array_from_process_local_data(shard, np.ones((l,), np.float32))
    bar_fn(bar_in).block_until_ready()

    def barrier():
        bar_fn(bar_in).block_until_ready()

    if args.cases:  # names or substrings, as in the flat run
        cases = bench.select_cases(bench.CASES + MESH_CASES, args.cases)
    else:
        cases = [c for c in bench.CASES if f"{c[0]}:{c[1]}" in DEFAULT_CASES]
    prepared = []
    for case in cases:
        coll = case[0]
        gx = jax.make_array_from_process_local_data(shard, _local_payload(case, rank, h, l, args))
        # the same device buffers as an array over the one-axis mesh (no copy)
        gx1 = jax.make_array_from_single_device_arrays(gx.shape, shard1, [s.data for s in gx.addressable_shards])
        vs = variants(coll, zc, f"{coll}:{case[1]}", per_host=l)
        for v in vs.values():
            v["fn"] = sm(v["body"], v.get("one_axis", False))
            v["x"] = gx1 if v.get("one_axis") else gx
        prepared.append((case, gx, vs))
        log(f"prepared {coll}:{case[1]} global {gx.shape} {gx.dtype} variants {sorted(vs)}")

    link_bytes = bench.calibration_sizes([(case[0], int(gx.size // (h * l)) * gx.dtype.itemsize)
                                          for case, gx, _ in prepared], h * l)
    log(f"calibration sizes (bytes one device sends in the flat raw collective): {list(link_bytes)}")

    def phase(go) -> list[dict]:
        prof, calib_error = _calibrate(zc, mesh, link_bytes, args.reps, log)
        # the model's links-only prediction (benchmarks/model_check.py) reads a second profile, measured at
        # sizes no case has, so that no prediction is compared with the calibration of its own call
        overlap = sorted(set(args.held_out_bytes) & set(link_bytes) - set(bench.CALIBRATE_LINK_BYTES))
        if overlap:  # a case's own size: its prediction would read its own measurement
            raise ValueError(f"--held-out-bytes {overlap}: a case's own size")
        records, held = [], None
        for case, gx, vs in prepared:
            if held is None or args.held_out_per_case:  # per case: no other case runs between the two
                held, _ = _calibrate(zc, mesh, args.held_out_bytes, args.reps, log)
            records += _time_case(case, gx, vs, go, prof, calib_error, sm, zc, zs, barrier, anywhere, args, log,
                                  held)
        return records

    _netns.worker_phases(ctl, rank, args.phase_timeout, barrier, phase)
    jax.distributed.shutdown()


def _calibrate(zc, mesh, link_bytes, reps, log):
    """A profile measured at this rate over AXES and, where the library measures levels, over each axis
    (for compress="auto"), at `link_bytes`, with the run's own repetitions; (None, reason) when it fails.

    `reps` as the variants get: at 2 x 4, calibrate's default of 7 left its medians of the hierarchical
    all_gather 15-26% above the run's own medians of the same programs (choosing flat raw, 1.11-1.16x the
    best variant); 15 brought them within 6%, where the variants themselves differ by 8%."""
    try:
        t0 = time.perf_counter()
        prof = zc.calibrate(mesh, AXES, profile=zc.Profile(), link_bytes=link_bytes, reps=reps, activate=False)
        log(f"calibrated at {list(link_bytes)} in {time.perf_counter() - t0:.0f} s")
        return prof, None
    except Exception as e:  # noqa: BLE001 - recorded in every record, auto then runs on the default profile
        log("calibrate failed:", type(e).__name__, e)
        return None, f"{type(e).__name__}: {str(e)[:300]}"


def _profile_summary(prof) -> dict | None:
    """What "auto" decided with: the link models per axis and the codec models (per device), and
    the calibration's fit notes, so that a record's estimates can be checked against its timings."""
    if prof is None:
        return None
    d = prof.to_dict()
    cal = d.get("meta", {}).get("calibration", {})
    return {"links": d["links"], "codec": d["codec"], "codec_in_situ": d.get("codec_in_situ", {}),
            "fits": cal.get("fits"),
            "in_situ": cal.get("in_situ"), "net_s": cal.get("net_s"), "bytes": cal.get("bytes"),
            "dispatch_s": cal.get("dispatch_s"), "slowest_rep_s": cal.get("slowest_rep_s"),
            "slowest_median_s": cal.get("slowest_median_s")}


def _time_case(case, gx, vs, go, prof, calib_error, sm, zc, zs, barrier, anywhere, args, log,
               held=None) -> list[dict]:
    import collectives as bench
    import numpy as np
    from jax.experimental import multihost_utils

    coll, payload, tensor, dtype, _ = case
    plans = {}
    for name, v in vs.items():  # "auto" variants decide again under this rate's profile
        if v["compress"] == "auto":
            zs.reset_decisions()
            with zc.use_profile(prof if prof is not None else zc.get_profile()):
                v["fn"] = sm(v["body"], v.get("one_axis", False))
                v["fn"].lower(v["x"]).compile()
            ds = zc.decisions()
            plans[name] = [d.summary() for d in ds.values()]
            levels = [d for s_, d in ds.items() if s_.endswith(" [levels]")]
            if name in ("auto", "one_axis_auto"):  # the algorithm the model chose decides the reference
                v["chosen"] = levels[0].algorithm if levels else "flat"
                v["same_as"] = "flat_auto" if v["chosen"] == "flat" else _SAME_PROGRAM.get(v["chosen"])
                if coll in ("psum_scatter", "psum"):
                    v["reference"] = "flat_raw" if v["chosen"] == "flat" else "hierarchical_raw"
    outs = {name: np.asarray(v["fn"](v["x"]).addressable_data(0)).view(np.uint8) for name, v in vs.items()}
    identical = {name: (None if v["reference"] is None else
                        not anywhere(not np.array_equal(outs[name], outs[v["reference"]])))
                 for name, v in vs.items()}
    times = {name: [] for name in vs}
    order = list(vs)
    for rep in range(args.warmup + args.reps):
        # interleaved (drift hits every variant alike), shuffled: no variant always runs after the same one
        for name in bench.rep_order(order, rep):
            v = vs[name]
            barrier()
            t0 = time.perf_counter()
            v["fn"](v["x"]).block_until_ready()
            if rep >= args.warmup:
                times[name].append(time.perf_counter() - t0)
    names = sorted(vs)
    allt = multihost_utils.process_allgather(np.array([times[n] for n in names]))  # (procs, variants, reps)
    slowest = allt.max(axis=0)
    load = _stats.machine_load()
    records = []
    for i, name in enumerate(names):
        reps = [float(t) for t in slowest[i]]
        v = vs[name]
        records.append({
            "mesh": args.mesh, "axes": [ONE_AXIS] if v.get("one_axis") else list(AXES), "collective": coll,
            "payload": payload, "dtype": dtype,
            "tensor": tensor if args.corpus else "synthetic_gaussian", "global_shape": list(gx.shape),
            "rate_gbit": go["rate_gbit"], "link_MBps": go.get("link_MBps"),
            "link_MBps_probes": go.get("link_MBps_probes"), "variant": name,
            "algorithm": v.get("chosen", "flat" if v["algorithm"] == "auto" else v["algorithm"]).split("(")[0],
            "compress": any(v["compress"].values()) if isinstance(v["compress"], dict) else v["compress"],
            "levels": v["compress"] if isinstance(v["compress"], dict) else None,
            "plan": plans.get(name), "chosen": v.get("chosen"), "same_program_as": v.get("same_as"),
            **_stats.summary(reps), "rep_times_s": reps, "bit_identical": identical[name],
            "reference": v["reference"], "calibrate_error": calib_error if name in plans else None,
            "profile": _profile_summary(prof) if name in plans else None,
            "model_profile": _profile_summary(held) if name == "auto" else None, **load,
        })
    log(f"{_netns.rate_label(go['rate_gbit']):>9} {coll}:{payload} " +
        " ".join(f"{r['variant']}={r['median_s'] * 1e3:.1f}±{r['spread_s'] * 1e3:.1f}ms" for r in records))
    return records


# ----------------------------------------------------------------------------------------------- launcher
def derive(records: list[dict]) -> None:
    """Add per-record ratios against flat_compressed and the best variant of the same case and rate (the
    best of the zipccl variants and lax_bits), paired repetition by repetition."""
    groups: dict = {}
    for r in records:
        groups.setdefault((r["rate_gbit"], r["collective"], r["payload"]), []).append(r)
    for rs in groups.values():
        by = {r["variant"]: r for r in rs}
        best = min(rs, key=lambda r: r["median_s"])
        for r in rs:
            r["best_variant"] = best["variant"]
            r["over_best"] = _stats.paired_ratio(r["rep_times_s"], best["rep_times_s"])
            if "flat_compressed" in by:
                r["over_flat_compressed"] = _stats.paired_ratio(r["rep_times_s"], by["flat_compressed"]["rep_times_s"])
            if r.get("same_program_as") in by:  # the run-to-run noise of one program, for scale
                r["over_same_program"] = _stats.paired_ratio(r["rep_times_s"], by[r["same_program_as"]]["rep_times_s"])


def summary_table(records: list[dict]) -> str:
    lines = [f"{'rate':>9} {'collective:payload':<34} {'variant':<28} {'median ms':>10} {'spread':>8} "
             f"{'/flat_comp':>10} {'/best':>7} bit-identical"]
    for r in records:
        fc = r.get("over_flat_compressed", {}).get("ratio")
        lines.append(f"{_netns.rate_label(r['rate_gbit']):>9} {r['collective'] + ':' + r['payload']:<34} "
                     f"{r['variant']:<28} {r['median_s'] * 1e3:>10.1f} {r['spread_s'] * 1e3:>8.1f} "
                     f"{'-' if fc is None else format(fc, '.3f'):>10} {r['over_best']['ratio']:>7.3f} "
                     f"{r['bit_identical']}" + (f" (runs {r['same_program_as']}'s program: "
                                                 f"{r['over_same_program']['ratio']:.3f} of its median)"
                                                 if "over_same_program" in r else ""))
    return "\n".join(lines)


def launch_mesh(args) -> list[dict]:
    h, l = parse_mesh(args.mesh)
    rates = _netns.parse_rates(args.rates)
    if args.no_netns and any(r is not None for r in rates):
        raise SystemExit("--no-netns runs on the unshaped host loopback; use --rates unshaped")
    allocator, preload = _netns.resolve_allocator(args.allocator, measuring=not args.no_netns)
    with _netns.run_dir("zccl_mesh_", args.keep_logs) as (tmp, held):
        fabric = None
        if not args.no_netns:
            fabric = held.enter_context(_netns.open_netns(lambda: _netns.Fabric(h)))
            fabric.set_rate(rates[0])
            hosts = [fabric.address(i) for i in range(h)]
            port = PORT
        else:
            hosts, port = ["127.0.0.1"] * h, _netns.free_port()
        ctl = _netns.ControlDir(tmp / "ctl")
        env = _netns.worker_env(preload=preload)
        common = ["--mesh", args.mesh, "--coordinator", f"{hosts[0]}:{port}", "--ctl", str(ctl.path),
                  "--reps", str(args.reps), "--warmup", str(args.warmup), "--phase-timeout", str(args.timeout)]
        common += ["--corpus", str(Path(args.corpus).resolve())] if args.corpus else []
        common += ["--max-elems", str(args.max_elems)] if args.max_elems else []
        common += ["--cases", args.cases] if args.cases else []
        common += ["--held-out-bytes", ",".join(map(str, args.held_out_bytes))]
        common += ["--held-out-per-case"] if args.held_out_per_case else []
        script = str(Path(__file__).resolve().parent / "collectives.py")
        argvs = [[sys.executable, script, "--worker", "--rank", str(i), "--gloo-host", hosts[i]] + common
                 for i in range(h)]
        print(f"launching {h} processes x {l} devices "
              f"({'fabric ' + fabric.switch if fabric else 'host loopback, no namespaces'}); logs in {tmp}",
              flush=True)
        workers = held.enter_context(_netns.Workers(argvs, netns=fabric, logdir=tmp, env=env,
                                                    timeout_s=args.timeout, cwd=str(Path(script).parent.parent)))

        def finish(recs: list[dict]) -> list[dict]:
            for rec in recs:
                rec["allocator"] = allocator
                if allocator != "tcmalloc":
                    rec["allocator_warning"] = _netns.GLIBC_WARNING
            derive(recs)
            return recs

        def probe():
            return (_netns.measure_fabric_MBps(fabric, nbytes=args.link_probe_mb << 20)
                    if fabric is not None and h > 1 and args.link_probe_mb else None)

        return _netns.sweep(ctl, workers, h, rates, fabric.set_rate if fabric else None, probe,
                            "host-to-host TCP", finish)
