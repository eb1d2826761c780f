"""How fast gloo's transfer patterns cross the 2 x 4 testbed's shaped link, beside one TCP stream.

    python benchmarks/link_patterns.py --json benchmarks/results/link_patterns_2x4.json   # root, ~1 min
    python benchmarks/link_patterns.py --phases --mib 1,2,4 --json OUT.json   # all_gather's two-level phases
    python benchmarks/link_patterns.py --local-group alone --json OUT.json    # the local level, as calibrate timed it
    python benchmarks/link_patterns.py --local-forms --json OUT.json          # the local all_gather's forms, ~15 s

Two hosts (a `_netns.Fabric`, tbf at `--rate` Gbit/s both ways) of four CPU devices each, under
`jax.distributed` as `collectives.py --mesh 2x4` runs them. Per size (MiB crossing each direction of the host
link), interleaved in a shuffled order with a barrier before each, `--reps` times:

* ``host all_gather, 4 pairs``: ``jax.lax.all_gather`` over ``host`` (what `calibrate` times for the host
  level): four two-rank groups at once, each pair exchanging one message (gloo's allgather of two ranks);
* ``host ppermute, 4 pairs``: the same four pairs swapping one message each;
* ``one pair ppermute``: devices (0, 0) and (1, 0) swapping one message, the others idle;
* ``flat ring all_gather``: ``jax.lax.all_gather`` over ``("host", "local")``: gloo's ring, whose edge between
  the hosts is one connection carrying ``n - 1`` shards as a pipeline (two half-chunks in flight);
* ``host all_to_all, 4 pairs``: ``jax.lax.all_to_all`` over ``host`` (calibrate's host-level all_to_all): the
  four pairs each swapping one row;
* ``flat all_to_all``: ``jax.lax.all_to_all`` over ``("host", "local")``: every device sends one row to each
  of the other host's four devices (sixteen messages a direction) while its three local rows stay on the host.

`--phases` times all_gather's two-level raw program instead, phase by phase (`_phase_patterns`): whether its
phases, each timed alone as a level's link, cost what they do together.
`--local-group alone|host` times the local level's all_gather and all_to_all as calibrate's local group
did (`_local_group`): its sizes, one shuffled group; with `host`, host-level transfers between them.
`--local-forms` times the local level's all_gather at calibrate's two largest sizes in the forms it has taken
(`_local_forms`): calibrate's link job before it kept the whole result (the first row kept, a copy of one row more
per device), the whole result, the two-level program's local phase, and bfloat16 (XLA:CPU widens it). The other
patterns keep their first row or byte, as calibrate did when their stored runs were made.

The link probe (`_netns.measure_fabric_MBps`, one TCP stream of 16 MiB) runs before and after, and the
same bytes move by plain TCP too (`tcp_both_ways`: Python sockets, 1, 4 and 16 connections, each carrying
both directions at once as gloo's pairs do), to tell gloo's patterns from the link's. What each
pattern reaches is why the cost model's links-only prediction costs a flat collective's crossings (the ring's
edge, the flat all_to_all's) at the probe's rate times the flat patterns' measured fill, and the host level's
collectives with calibrate's (`strategy.links.stream_link`, `model_check.stream_fill`,
`model_check._host_level`). Output: one line per pattern and size (median ms [IQR], MB/s per direction), and
with `--json` the records, the probes, the allocator and the machine load.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import _netns
import _stats
from model_check import HELD_OUT_SIZES  # the sizes calibrate times the levels at in the 2 x 4 runs

MiB = 1 << 20
HOSTS, LOCAL = 2, 4
PORT = 12356


# One side of `tcp_both_ways`: k connections, each sending n bytes while it receives n, reps times after a
# one-byte handshake; the client prints each repetition's seconds.
_TCP_PEER = r"""
import socket, sys, threading, time
role, addr, port, k, n, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), *map(int, sys.argv[4:7])
if role == "srv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, port))
    s.listen(64); print("ready", flush=True); cs = [s.accept()[0] for _ in range(k)]
else:
    cs = [socket.create_connection((addr, port)) for _ in range(k)]
buf = bytes(n)
def rx(c):
    got = 0
    while got < n:
        got += len(c.recv(min(1 << 20, n - got)))
out = []
for _ in range(reps):
    cs[0].sendall(b"s"); cs[0].recv(1)
    t0 = time.perf_counter()
    ts = [threading.Thread(target=f, args=(c,)) for c in cs for f in (lambda c: c.sendall(buf), rx)]
    [t.start() for t in ts]; [t.join() for t in ts]
    out.append(time.perf_counter() - t0)
if role == "cli":
    print(" ".join(f"{x:.6f}" for x in out), flush=True)
"""


def tcp_both_ways(fabric, k: int, nbytes: int, reps: int = 7, timeout_s: float = 120.0) -> dict:
    """`nbytes` each way between hosts 0 and 1 over `k` TCP connections (each both ways at once): the
    median of `reps` repetitions after a first, and MB/s a direction."""
    cmd = [sys.executable, "-c", _TCP_PEER]
    args = [fabric.address(1), str(PORT + 1), str(k), str(-(-nbytes // k)), str(reps + 1)]
    srv = subprocess.Popen(fabric.exec_prefix(1) + cmd + ["srv", *args], stdout=subprocess.PIPE, text=True)
    try:
        srv.stdout.readline()
        cli = subprocess.run(fabric.exec_prefix(0) + cmd + ["cli", *args], capture_output=True, text=True,
                             timeout=timeout_s, check=True)
        srv.wait(timeout=timeout_s)
    finally:
        if srv.poll() is None:
            srv.kill()
    summary = _stats.summary([float(t) for t in cli.stdout.split()][1:])
    return {"connections": k, "MiB_per_direction": nbytes / MiB, **summary,
            "MBps_per_direction": nbytes / summary["median_s"] / 1e6}


def _patterns(jax, lax, np, smap, put, mib: int) -> dict:
    d = mib * MiB  # bytes crossing each direction of the host link
    n = HOSTS * LOCAL
    both = ("host", "local")
    return {
        "host all_gather, 4 pairs": (smap(lambda c: lax.all_gather(c, "host", tiled=True)[:1]),
                                     put(np.zeros((1, d // LOCAL), np.uint8))),
        "host ppermute, 4 pairs": (smap(lambda c: lax.ppermute(c, "host", [(0, 1), (1, 0)])),
                                   put(np.zeros((1, d // LOCAL), np.uint8))),
        "one pair ppermute": (smap(lambda c: lax.ppermute(c, both, [(0, LOCAL), (LOCAL, 0)])),
                              put(np.zeros((1, d), np.uint8))),
        "flat ring all_gather": (smap(lambda c: lax.all_gather(c, both, tiled=True)[:1]),
                                 put(np.zeros((1, d // (n - 1)), np.uint8))),
        "host all_to_all, 4 pairs": (smap(lambda c: lax.all_to_all(c, "host", 0, 0, tiled=True)),
                                     put(np.zeros((HOSTS, d // LOCAL), np.uint8))),
        "flat all_to_all": (smap(lambda c: lax.all_to_all(c, both, 0, 0, tiled=True)),
                            put(np.zeros((n, d // (LOCAL * LOCAL)), np.uint8))),
    }


def _phase_patterns(jax, lax, np, smap, put, mib: int) -> dict:
    """`--phases`: all_gather's two-level raw program, phase by phase (each device's shard `d / 4` bytes, as
    the host level's all_gather pattern sends): each level's all_gather alone (the local one on the host
    phase's result, `2 d / 4` bytes a device), the two in one program, and the two with every device
    synchronised between them (a one-element psum over both levels that the local phase waits for), so
    that no device starts the local ring before the last host-level flow has ended. Then what the local
    phase costs inside a program that it does not alone: after that psum (not the program's first
    collective; less the psum alone, the lead-in a program pays once), and after a copy that writes its
    input (the program's own, fresh, as the host phase writes it); the host level's all_gather on rows,
    the shape calibrate and the default patterns time; that all_gather twice in one program (right after a
    transfer); and the phases in psum_scatter's order, local then host."""
    d = mib * MiB
    both = ("host", "local")

    def two(c, sync: bool):
        g = lax.all_gather(c, "host", tiled=True)
        if sync:
            g = after_sync(g)
        return lax.all_gather(g, "local", tiled=True)[:1]

    def after_sync(g):  # `g`, once a one-element psum over both levels has ended on every device
        g, _ = lax.optimization_barrier((g, lax.psum(g[:1].astype(np.uint32), both)))
        return g

    def copied(g):  # `g` written anew by the program (as the host phase writes the local phase's input)
        return lax.optimization_barrier(g[::-1])[::-1]

    return {
        "phases: host all_gather": (smap(lambda c: lax.all_gather(c, "host", tiled=True)[:1]),
                                    put(np.zeros((d // LOCAL,), np.uint8))),
        "phases: local all_gather": (smap(lambda c: lax.all_gather(c, "local", tiled=True)[:1]),
                                     put(np.zeros((HOSTS * d // LOCAL,), np.uint8))),
        "phases: host then local": (smap(lambda c: two(c, False)), put(np.zeros((d // LOCAL,), np.uint8))),
        "phases: host, sync, local": (smap(lambda c: two(c, True)), put(np.zeros((d // LOCAL,), np.uint8))),
        "phases: sync alone": (smap(lambda c: lax.psum(c[:1].astype(np.uint32), both).astype(np.uint8)),
                               put(np.zeros((d // LOCAL,), np.uint8))),
        "phases: sync then local": (smap(lambda c: lax.all_gather(after_sync(c), "local", tiled=True)[:1]),
                                    put(np.zeros((HOSTS * d // LOCAL,), np.uint8))),
        "phases: copy alone": (smap(lambda c: copied(c)[:1]), put(np.zeros((HOSTS * d // LOCAL,), np.uint8))),
        "phases: copy then local": (smap(lambda c: lax.all_gather(copied(c), "local", tiled=True)[:1]),
                                    put(np.zeros((HOSTS * d // LOCAL,), np.uint8))),
        "phases: host all_gather, rows": (smap(lambda c: lax.all_gather(c, "host", tiled=True)[:1]),
                                          put(np.zeros((1, d // LOCAL), np.uint8))),
        "phases: host twice": (smap(lambda c: lax.all_gather(lax.optimization_barrier(
            lax.all_gather(c, "host", tiled=True)[:1] + c), "host", tiled=True)[:1]),
                               put(np.zeros((1, d // LOCAL), np.uint8))),
        "phases: local then host": (smap(lambda c: lax.all_gather(lax.optimization_barrier(
            lax.all_gather(c, "local", tiled=True)[:1, :d // LOCAL]), "host", tiled=True)[:1]),
                                    put(np.zeros((1, 2 * d // LOCAL), np.uint8))),
    }


def _local_group(jax, lax, np, smap, put, company: str) -> dict:
    """`--local-group`: the local level's links as calibrate timed them before it timed them beside the programs,
    its all_gather and all_to_all at HELD_OUT_SIZES in one shuffled group (key: (name, 0 MiB crossing)); with
    `company` "host", the host level's all_gather of 1 MiB a direction beside them, so that local jobs follow
    network-bound ones as a two-level program's local phase follows its host phase."""
    jobs = {}
    for size in HELD_OUT_SIZES:
        per = -(-size // (LOCAL - 1))  # bytes per peer, as calibrate's `_link_job`
        jobs[(f"local all_gather, {size} B sent", 0)] = (
            smap(lambda c: lax.all_gather(c, "local", tiled=True)[:1]), put(np.zeros((1, per), np.uint8)))
        jobs[(f"local all_to_all, {size} B sent", 0)] = (
            smap(lambda c: lax.all_to_all(c, "local", 0, 0, tiled=True)), put(np.zeros((LOCAL, per), np.uint8)))
    if company == "host":  # as many host transfers as local sizes, so that about half the jobs cross the link
        for i in range(len(HELD_OUT_SIZES)):
            jobs[(f"host all_gather, 4 pairs ({i + 1})", 1)] = (
                smap(lambda c: lax.all_gather(c, "host", tiled=True)[:1]), put(np.zeros((1, MiB // LOCAL), np.uint8)))
    return jobs


def _local_forms(jax, lax, np, smap, put) -> dict:
    """`--local-forms`: the local level's all_gather at calibrate's two largest sizes, in the forms it
    takes: calibrate's link job (rows of uint8, the first row kept), the phase patterns' (a vector, its
    first byte kept), the whole result kept, the two-level program's local phase (its bfloat16 bits as
    uint16, the host phase's (2, ...) result gathered untiled, the whole result kept) and bfloat16 rows
    (XLA:CPU widens them), in one shuffled group."""
    import jax.numpy as jnp
    jobs = {}
    for size in HELD_OUT_SIZES[-2:]:
        per = -(-size // (LOCAL - 1))  # bytes per peer, as calibrate's `_link_job`
        rows = put(np.zeros((1, per), np.uint8))
        jobs[(f"calibrate's rows, first kept, {size} B", 0)] = (
            smap(lambda c: lax.all_gather(c, "local", tiled=True)[:1]), rows)
        jobs[(f"vector, first byte kept, {size} B", 0)] = (
            smap(lambda c: lax.all_gather(c, "local", tiled=True)[:1]), put(np.zeros((per,), np.uint8)))
        jobs[(f"rows, whole result, {size} B", 0)] = (smap(lambda c: lax.all_gather(c, "local", tiled=True)), rows)
        jobs[(f"program's phase (uint16 bits), {size} B", 0)] = (
            smap(lambda c: lax.all_gather(c, "local", axis=0, tiled=False)),
            put(np.zeros((HOSTS, per // (2 * HOSTS)), np.uint16)))
        jobs[(f"bfloat16 rows, whole result, {size} B", 0)] = (
            smap(lambda c: lax.all_gather(c, "local", tiled=True)), put(np.zeros((1, per // 2), jnp.bfloat16)))
    return jobs


def worker(args) -> None:
    import jax
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from zipccl_jax.strategy.calibration import rep_order  # calibrate's: the same order on every process

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", LOCAL)
    jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=HOSTS, process_id=args.rank,
                               initialization_timeout=120)
    _netns.bind_gloo(args.gloo_host)
    mesh = Mesh(np.array(jax.devices()).reshape(HOSTS, LOCAL), ("host", "local"))
    spec = P(("host", "local"))
    sharding = NamedSharding(mesh, spec)

    def smap(f):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))

    def put(rows):
        shape = (HOSTS * LOCAL * rows.shape[0],) + rows.shape[1:]
        full = np.broadcast_to(rows[None], (HOSTS * LOCAL,) + rows.shape).reshape(shape)
        return jax.make_array_from_callback(shape, sharding, lambda i: full[i])

    if args.local_forms:
        jobs = _local_forms(jax, lax, np, smap, put)
    elif args.local_group:
        jobs = _local_group(jax, lax, np, smap, put, args.local_group)
    else:
        patterns = _phase_patterns if args.phases else _patterns
        jobs = {(name, mib): job for mib in args.mib for name, job in patterns(jax, lax, np, smap, put, mib).items()}
    barrier = smap(lambda v: lax.psum(v, ("host", "local")))
    bx = put(np.ones((1, 1), np.float32))
    for f, x in jobs.values():
        for _ in range(2):
            jax.block_until_ready(f(x))
    times = {k: [] for k in jobs}
    for rep in range(args.reps):
        for key in rep_order(list(jobs), rep):
            jax.block_until_ready(barrier(bx))
            f, x = jobs[key]
            t0 = time.perf_counter()
            jax.block_until_ready(f(x))
            times[key].append(time.perf_counter() - t0)
    if args.rank == 0:
        recs = []
        for (name, mib), ts in times.items():
            summary = _stats.summary(ts)
            recs.append({"pattern": name, "MiB_per_direction": mib, **summary, "rep_times_s": ts,
                         "MBps_per_direction": mib * MiB / summary["median_s"] / 1e6 if mib else None})
        Path(args.out).write_text(json.dumps(recs))
    jax.distributed.shutdown()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=1.0, help="the host link's rate, Gbit/s each way")
    p.add_argument("--mib", default="1,4,16", help="MiB crossing each direction, comma-separated")
    p.add_argument("--reps", type=int, default=31)
    p.add_argument("--json", help="write the records here")
    p.add_argument("--phases", action="store_true",
                   help="time all_gather's two-level phases alone, together, and together with a sync between")
    p.add_argument("--local-group", choices=("alone", "host"),
                   help="time the local level's links as calibrate did (its sizes, one shuffled group), alone or "
                        "with host-level transfers beside them")
    p.add_argument("--local-forms", action="store_true",
                   help="time the local level's all_gather in calibrate's, the phase patterns' and the program's forms")
    p.add_argument("--timeout", type=float, default=600.0, help="hard limit for the workers, seconds")
    p.add_argument("--allocator", default="auto", choices=_netns.ALLOCATORS,
                   help="the workers' malloc (benchmarks/README.md; recorded)")
    for hidden in ("--worker", "--rank", "--coordinator", "--gloo-host", "--out"):
        p.add_argument(hidden, help=argparse.SUPPRESS, **({"action": "store_true"} if hidden == "--worker" else {}))
    args = p.parse_args(argv)
    try:
        args.mib = [int(t) for t in str(args.mib).split(",")]
    except ValueError:
        p.error(f"--mib takes whole MiB, comma-separated, got {args.mib!r}")
    if args.worker:
        args.rank = int(args.rank)
        worker(args)
        return 0
    if args.rate <= 0 or args.reps < 1 or min(args.mib) < 1:
        p.error("--rate must be > 0, --reps >= 1 and every --mib >= 1")
    allocator, preload = _netns.resolve_allocator(args.allocator)
    with _netns.run_dir("zccl_patterns_", False) as (tmp, held):
        fabric = held.enter_context(_netns.open_netns(lambda: _netns.Fabric(HOSTS)))
        fabric.set_rate(args.rate)
        before = _netns.measure_fabric_MBps(fabric)
        out = tmp / "records.json"
        common = ["--worker", "--coordinator", f"{fabric.address(0)}:{PORT}", "--reps", str(args.reps),
                  "--mib", ",".join(map(str, args.mib)), "--out", str(out)] + (["--phases"] if args.phases else []) + (
                      ["--local-group", args.local_group] if args.local_group else []) + (
                      ["--local-forms"] if args.local_forms else [])
        argvs = [[sys.executable, str(Path(__file__).resolve()), *common, "--rank", str(i), "--gloo-host",
                  fabric.address(i)] for i in range(HOSTS)]
        workers = held.enter_context(_netns.Workers(argvs, netns=fabric, logdir=tmp,
                                                    env=_netns.worker_env(preload=preload),
                                                    timeout_s=args.timeout, cwd=str(Path(__file__).parent)))
        workers.wait()
        after = _netns.measure_fabric_MBps(fabric)
        recs = json.loads(out.read_text())
        tcp = [tcp_both_ways(fabric, k, max(args.mib) * MiB) for k in (1, 4, 16)]
    probe = " and ".join(f"{m:.1f} MB/s {when}" if m else f"failed {when}" for m, when in ((before, "before"),
                                                                                         (after, "after")))
    print(f"link probe (one TCP stream, 16 MiB): {probe}")
    for t in tcp:
        print(f"plain TCP, both ways, {t['connections']:2d} connections, {t['MiB_per_direction']:.0f} MiB a direction: "
              f"{t['median_s'] * 1e3:8.2f} ms  {t['MBps_per_direction']:6.1f} MB/s")
    for r in recs:
        rate = f"  {r['MBps_per_direction']:6.1f} MB/s" if r["MBps_per_direction"] else ""
        print(f"{r['pattern']:26s} {r['MiB_per_direction']:3d} MiB a direction: {r['median_s'] * 1e3:8.2f} ms "
              f"[{r['spread_s'] * 1e3:.2f}]{rate}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "rate_gbit": args.rate, "probe_MBps_before": before, "probe_MBps_after": after,
            "allocator": allocator, "reps": args.reps, **_stats.machine_load(), "records": recs,
            "tcp_both_ways": tcp}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
