#!/usr/bin/env python
"""zipccl on a GPU host: GB/s of the CUDA kernels per dtype, and compressed collectives against jax.lax per size.

Kernels: `zipccl_jax.encode` / `decode` of one tensor (Gaussian values, std 0.02; float8 with per-tensor amax
scaling) per coded dtype, jitted, on the first device; GB/s of raw (uncoded) bytes per call, against a
jitted device copy of the same bytes (`x + 0` as bits: one read, one write) timed in the same repetitions.
Device-timed kernels (`kernels_device`, the figures to quote): per dtype and call size (bfloat16 at 4, 16,
64 and 256 MB, the other dtypes at 64 MB), one jitted `fori_loop` runs K rounds of back-to-back calls over
R distinct inputs (R x size >= 128 MB, so L2 cannot hold them), each call's result carried to the next
round; the time per call is the slope between K = 2 and K = 10 rounds (host dispatch and synchronisation
cancel), per repetition, the same for a device copy (bits XOR the round index: a real read and write).
Plumbing (`bench_plumbing`): a compressed all_to_all of the step's payload on one device, its row coded,
against its codec alone and a device copy: what the collective adds to the codec, in ms.
Collectives: all_to_all, all_gather, ppermute, psum_scatter and psum over all devices of the platform
(one `shard_map` axis), `compress=True` against `jax.lax` on the same bfloat16 data (data movement on its
bits; the reductions against jax.lax's own psum), for each per-device size. Every variant is timed --reps
times, interleaved with its baseline (drift hits both alike); each figure is the median with [p25-p75] of
the repetitions, and each ratio the ratio of medians with [p25-p75] of the per-repetition ratios
(benchmarks/_stats.py). A call is timed from dispatch to `block_until_ready`, so small calls include the
launch latency. Every result is checked: round trips and data movement bit for bit, the compressed
reductions against compress=False, fixed_order=True (the documented order; within one rounding of jax.lax).

    python benchmarks/codec_gpu.py --json benchmarks/results/codec_gpu.json     # on a GPU host
    python benchmarks/codec_gpu.py --platform cpu --quick                     # smoke: the same code on CPU

Without a CUDA device it says so and exits with status 2, unless --platform cpu is given.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import machine_load, paired_ratio, quantile, summary  # noqa: E402

DTYPES = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2")
OPS = ("all_to_all", "all_gather", "ppermute", "psum_scatter", "psum")
NO_CUDA = ("codec_gpu.py: no CUDA device visible to JAX (jax.devices('cuda') is empty). Run it on a GPU host "
           "with jax[cuda12] (or another CUDA plugin) installed, or pass --platform cpu for the smoke mode.")


def _times(fns, reps: int) -> list[list[float]]:
  """Seconds per call of each fn, `reps` interleaved rounds (one call of every fn per round), after one
  warm-up call each (compilation)."""
  for fn in fns:
    fn()
  out = [[] for _ in fns]
  for _ in range(reps):
    for i, fn in enumerate(fns):
      t0 = time.perf_counter()
      fn()
      out[i].append(time.perf_counter() - t0)
  return out


def _gbps(nbytes: int, times: list[float]) -> dict:
  """GB/s of nbytes per call: median and [p25-p75] (the quartiles of the times, inverted)."""
  return {"gb_per_s": nbytes / quantile(times, 0.5) / 1e9, "p25_gb_per_s": nbytes / quantile(times, 0.75) / 1e9,
          "p75_gb_per_s": nbytes / quantile(times, 0.25) / 1e9}


def _tensor(jnp, np, name: str, elems: int, seed: int):
  import ml_dtypes
  dt = np.dtype(getattr(ml_dtypes, name, name))
  x = np.random.default_rng(seed).standard_normal(elems, dtype=np.float32) * np.float32(0.02)
  if dt.itemsize == 1:
    x = x * np.float32(float(ml_dtypes.finfo(dt).max) / float(np.max(np.abs(x))))
  return x.astype(dt)


def bench_kernels(jax, jnp, np, zj, dev, dtypes, call_bytes: int, reps: int) -> list[dict]:
  import ml_dtypes
  out = []
  for name in dtypes:
    elems = call_bytes // np.dtype(getattr(ml_dtypes, name, name)).itemsize
    x_host = _tensor(jnp, np, name, elems, seed=len(name))
    raw = x_host.nbytes
    x = jax.device_put(x_host, dev)
    u = jnp.dtype({1: "uint8", 2: "uint16", 4: "uint32"}[x_host.itemsize])
    enc = jax.jit(zj.encode)
    dec = jax.jit(lambda p: zj.decode(p, shape=x_host.shape, dtype=x_host.dtype))
    copy = jax.jit(lambda v: jax.lax.bitcast_convert_type(v, u) + jnp.zeros((), u))  # one read, one write
    payload, nbytes = enc(x)
    back = np.asarray(dec(payload))
    exact = bool(np.array_equal(back.view(u), x_host.view(u)))
    t_enc, t_dec, t_copy = _times([lambda: jax.block_until_ready(enc(x)),
                                   lambda: jax.block_until_ready(dec(payload)),
                                   lambda: jax.block_until_ready(copy(x))], reps)
    for kernel, times in (("encode", t_enc), ("decode", t_dec)):
      vs = paired_ratio(t_copy, times)  # copy time / kernel time: the kernel's speed as a fraction of a copy's
      out.append({"kernel": kernel, "dtype": name, "elems": elems, "raw_bytes": raw,
                  "frame_bytes": int(nbytes), "ratio": raw / int(nbytes), **summary(times), **_gbps(raw, times),
                  "copy_gb_per_s": _gbps(raw, t_copy)["gb_per_s"], "vs_copy": vs["ratio"],
                  "vs_copy_p25": vs["ratio_p25"], "vs_copy_p75": vs["ratio_p75"], "bit_exact": exact})
  return out


DEVICE_TIMING = ("device-timed: one jitted fori_loop of K rounds x R back-to-back calls on R distinct inputs "
                 "(R x call bytes >= 128 MB), seconds per call = slope of the loop's wall time between K = 2 "
                 "and K = 10 (dispatch and sync cancel), per repetition; median and [p25-p75] of the slopes")


def _device_loops(jax, jnp, fn, xs):
  """A jitted loop: `rounds` times, fn on every x of xs (a tuple), the results carried; returns the carry."""
  def run(rounds, carry):
    def body(i, c):
      # x through an optimization barrier with the round index: the call depends on the round, so XLA
      # cannot hoist it out of the loop (the barrier costs nothing at run time)
      return tuple(fn(jax.lax.optimization_barrier((x, i))[0], i) for x in xs)
    return jax.lax.fori_loop(0, rounds, body, carry)
  return jax.jit(run)


def bench_kernels_device(jax, jnp, np, zj, dev, cases, reps: int, working_set: int = 128 << 20) -> list[dict]:
  """Device time per call of encode, decode and a copy: `cases` of (dtype name, call bytes); see DEVICE_TIMING."""
  import ml_dtypes
  out = []
  for name, call_bytes in cases:
    dt = np.dtype(getattr(ml_dtypes, name, name))
    elems = call_bytes // dt.itemsize
    r = max(2, -(-working_set // (elems * dt.itemsize)))
    u = jnp.dtype({1: "uint8", 2: "uint16", 4: "uint32"}[dt.itemsize])
    hosts = [_tensor(jnp, np, name, elems, seed=17 * k + len(name)) for k in range(r)]
    xs = tuple(jax.device_put(h, dev) for h in hosts)
    enc = jax.jit(zj.encode)
    frames = tuple(enc(x) for x in xs)
    payloads = tuple(f[0] for f in frames)
    exact = all(np.array_equal(np.asarray(zj.decode(p, shape=h.shape, dtype=h.dtype)).view(u), h.view(u))
                for p, h in zip(payloads, hosts))
    loops = {
        "encode": (_device_loops(jax, jnp, lambda x, i: zj.encode(x), xs), frames),
        "decode": (_device_loops(jax, jnp, lambda p, i: zj.decode(p, shape=(elems,), dtype=dt), payloads),
                   tuple(jnp.zeros(elems, dt) for _ in range(r))),
        "copy": (_device_loops(jax, jnp, lambda x, i: jax.lax.bitcast_convert_type(
            jax.lax.bitcast_convert_type(x, u) ^ i.astype(u), dt), xs), xs),
    }
    slopes = {k: [] for k in loops}
    for f, carry in loops.values():
      jax.block_until_ready(f(2, carry))  # compile
    for _ in range(reps):
      for k, (f, carry) in loops.items():
        t = []
        for rounds in (2, 10):
          t0 = time.perf_counter()
          jax.block_until_ready(f(rounds, carry))
          t.append(time.perf_counter() - t0)
        slopes[k].append((t[1] - t[0]) / (8 * r))  # raw: noise can make it <= 0 (then `resolved` is False)
    raw = elems * dt.itemsize
    frame_bytes = int(frames[0][1])
    # A rate is only meaningful where the loop length resolved the call's time in most repetitions (on a
    # GPU it does; in the CPU smoke mode, tiny calls drown in noise): otherwise the rates are None.
    resolved = {k: quantile(v, 0.25) > 0 for k, v in slopes.items()}
    rate = lambda k: _gbps(raw, slopes[k]) if resolved[k] else {"gb_per_s": None, "p25_gb_per_s": None,
                                                                "p75_gb_per_s": None}
    for k in ("encode", "decode"):
      ok = resolved[k] and resolved["copy"]
      vs = paired_ratio(slopes["copy"], slopes[k]) if ok else {"ratio": None, "ratio_p25": None, "ratio_p75": None}
      out.append({"kernel": k, "dtype": name, "raw_bytes": raw, "frame_bytes": frame_bytes,
                  "ratio": raw / frame_bytes, "rotating_inputs": r, "timing": "device",
                  "resolved": ok, **summary(slopes[k]), **rate(k), "copy_gb_per_s": rate("copy")["gb_per_s"],
                  "vs_copy": vs["ratio"], "vs_copy_p25": vs["ratio_p25"], "vs_copy_p75": vs["ratio_p75"],
                  "samples_s": slopes[k], "copy_samples_s": slopes["copy"], "bit_exact": exact})
  return out


def bench_step(jax, jnp, np, dev, payload_bytes: int, reps: int, dests: int = 8) -> dict:
  """The codec inside one jitted step: an MoE dispatch payload (`dests` rows of Gaussian bfloat16
  activations, one per destination, as `all_to_all` codes them) encoded at the padded default capacity
  and decoded again in one jitted function on `dev`, against a jitted copy of the same bytes. Its time
  per raw byte is what compression costs the strategy per byte on this device (`codec_s_per_byte`)."""
  import ml_dtypes
  from zipccl_jax import capacity, codec
  m = max(1, payload_bytes // 2 // dests)
  x_host = _tensor(jnp, np, "bfloat16", dests * m, seed=7).reshape(dests, m)
  cap = capacity.padded_capacity(m, ml_dtypes.bfloat16)
  x = jax.device_put(x_host, dev)

  enc = jax.jit(lambda v: codec.encode_frames(v, capacity=cap)[0])
  dec = jax.jit(lambda payload: codec.decode_frames(payload, shape=(m,), dtype=x.dtype))

  @jax.jit
  def step(v):
    return dec(enc(v))

  copy = jax.jit(lambda v: jax.lax.bitcast_convert_type(v, jnp.uint16) + jnp.zeros((), jnp.uint16))
  payload = enc(x)
  exact = bool(np.array_equal(np.asarray(step(x)).view(np.uint16), x_host.view(np.uint16)))
  t_step, t_enc, t_dec, t_copy = _times([lambda: jax.block_until_ready(step(x)),
                                         lambda: jax.block_until_ready(enc(x)),
                                         lambda: jax.block_until_ready(dec(payload)),
                                         lambda: jax.block_until_ready(copy(x))], reps)
  raw = x_host.nbytes
  gb = lambda t: _gbps(raw, t)["gb_per_s"]
  return {"what": "encode+decode of an MoE dispatch payload in one jitted step", "dtype": "bfloat16",
          "rows": dests, "row_elems": m, "raw_bytes": raw, "capacity_bytes": cap, **summary(t_step),
          **_gbps(raw, t_step), "codec_s_per_byte": quantile(t_step, 0.5) / raw,
          "encode_gb_per_s": gb(t_enc), "decode_gb_per_s": gb(t_dec),
          "copy_gb_per_s": gb(t_copy), "bit_exact": exact}


def bench_plumbing(jax, jnp, np, zj, dev, payload_bytes: int, reps: int, transports=("padded", "ragged")) -> list[dict]:
  """What the collective adds to its codec on one GPU: a compressed `all_to_all` of an MoE payload
  (bfloat16, Gaussian, `payload_bytes`) over a one-device mesh with its one row coded
  (`_exchange.code_own_row`: encode, transport, overflow test or size exchange, decode), against the
  codec alone on the same row at the capacity the collective used (encode + decode in one jitted
  function) and a jitted device copy, timed interleaved. `plumbing_s` = collective - codec: the
  collective's own cost (its transfers, conditional, masks and copies) on a device with no link."""
  from zipccl_jax import _exchange, codec
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P
  cols = 1024
  m = max(cols, payload_bytes // 2 // cols * cols)
  x_host = _tensor(jnp, np, "bfloat16", m, seed=11).reshape(-1, cols)
  mesh = Mesh(np.array([dev]), ("i",))
  x = jax.device_put(x_host, NamedSharding(mesh, P("i")))
  copy = jax.jit(lambda v: jax.lax.bitcast_convert_type(v, jnp.uint16) + jnp.zeros((), jnp.uint16))
  out = []
  for transport in transports:
    body = lambda v: zj.all_to_all(v, "i", 0, 0, tiled=True, compress=True, transport=transport, name="plumb")
    zj.reset_stats()
    with _exchange.code_own_row():
      coll = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
      got = coll(x)
    cap = zj.stats()["plumb"].capacity
    row = jax.device_put(x_host.reshape(1, -1), dev)
    alone = jax.jit(lambda v: codec.decode_frames(codec.encode_frames(v, capacity=cap)[0], shape=(m,),
                                                  dtype=v.dtype))
    exact = bool(np.array_equal(np.asarray(got).view(np.uint16), x_host.view(np.uint16))
                 and np.array_equal(np.asarray(alone(row)).view(np.uint16), x_host.reshape(1, -1).view(np.uint16)))
    t_coll, t_codec, t_copy = _times([lambda: jax.block_until_ready(coll(x)),
                                      lambda: jax.block_until_ready(alone(row)),
                                      lambda: jax.block_until_ready(copy(x))], reps)
    plumbing = [a - b for a, b in zip(t_coll, t_codec)]
    out.append({"what": "compressed all_to_all on one device, its row coded, against its codec alone",
                "transport": transport, "raw_bytes": x_host.nbytes, "capacity_bytes": cap,
                "collective": summary(t_coll), "codec": summary(t_codec), "copy": summary(t_copy),
                "plumbing_s": quantile(plumbing, 0.5), "plumbing_p25_s": quantile(plumbing, 0.25),
                "plumbing_p75_s": quantile(plumbing, 0.75),
                "collective_over_codec": paired_ratio(t_coll, t_codec), "bit_exact": exact})
  return out


def memory_probe(variant: str, elems_per_device: int) -> dict:
  """One all_to_all of `elems_per_device` bfloat16 on the first device of the default backend, as a
  one-device mesh (`variant` "lax": jax.lax; "padded"/"ragged": zipccl_jax compress=True with its own
  row coded, `_exchange.code_own_row`): XLA's memory analysis of the compiled program and the
  allocator's peak after one call. Run in a fresh process per variant, so the peak is this call's."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  import zipccl_jax as zj
  from zipccl_jax import _exchange
  dev = jax.devices()[0]
  mesh = Mesh(np.array([dev]), ("i",))
  cols = 1024
  x = jax.device_put(_tensor(jnp, np, "bfloat16", elems_per_device, seed=3).reshape(-1, cols),
                     NamedSharding(mesh, P("i")))
  if variant == "lax":
    body = lambda v: jax.lax.all_to_all(v, "i", 0, 0, tiled=True)
  else:
    body = lambda v: zj.all_to_all(v, "i", 0, 0, tiled=True, compress=True, transport=variant)
  with _exchange.code_own_row():
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    compiled = f.lower(x).compile()
  ma = compiled.memory_analysis()
  before = (dev.memory_stats() or {}).get("peak_bytes_in_use")
  jax.block_until_ready(compiled(x))
  stats = dev.memory_stats() or {}
  return {"variant": variant, "platform": dev.platform, "bytes_per_device": x.nbytes,
          "temp_bytes": getattr(ma, "temp_size_in_bytes", None),
          "argument_bytes": getattr(ma, "argument_size_in_bytes", None),
          "output_bytes": getattr(ma, "output_size_in_bytes", None),
          "peak_bytes_before": before, "peak_bytes_in_use": stats.get("peak_bytes_in_use")}


def bench_memory(platform: str, elems_per_device: int) -> list[dict]:
  """`memory_probe` of each variant, each in a fresh process (JAX's allocator peak is per process)."""
  import subprocess
  out = []
  for variant in ("lax", "padded", "ragged"):
    # No preallocation: this process holds its own pool, and a child that takes what is left of the
    # device's memory leaves none for NCCL (the ragged variant's communicator failed to start on an H200).
    env = dict(os.environ, JAX_PLATFORMS=platform, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    r = subprocess.run([sys.executable, __file__, "--memory-probe", variant, "--probe-elems",
                        str(elems_per_device)], capture_output=True, text=True, timeout=300, env=env)
    if r.returncode != 0:
      out.append({"variant": variant, "error": r.stderr[-2000:]})
      continue
    out.append(json.loads(r.stdout.strip().splitlines()[-1]))
  return out


def _op_pair(zj, lax, jnp, op: str, n: int, transport: str):
  """(compressed call, jax.lax call, exact reference call) on one device's block, axis "i"."""
  bits = lambda v: lax.bitcast_convert_type(v, jnp.uint16)
  ring = [(i, (i + 1) % n) for i in range(n)]
  kw = {"compress": True, "transport": transport}
  if op == "all_to_all":
    return (lambda v: bits(zj.all_to_all(v, "i", 0, 0, tiled=True, **kw)),
            lambda v: lax.all_to_all(bits(v), "i", 0, 0, tiled=True), None)
  if op == "all_gather":
    return (lambda v: bits(zj.all_gather(v, "i", tiled=True, **kw)),
            lambda v: lax.all_gather(bits(v), "i", tiled=True), None)
  if op == "ppermute":
    return (lambda v: bits(zj.ppermute(v, "i", ring, **kw)), lambda v: lax.ppermute(bits(v), "i", ring), None)
  if op == "psum_scatter":
    return (lambda v: bits(zj.psum_scatter(v, "i", tiled=True, **kw)),
            lambda v: bits(lax.psum_scatter(v, "i", tiled=True)),
            lambda v: bits(zj.psum_scatter(v, "i", tiled=True, compress=False, fixed_order=True)))
  if op == "psum":
    return (lambda v: bits(zj.psum(v, "i", **kw)), lambda v: bits(lax.psum(v, "i")),
            lambda v: bits(zj.psum(v, "i", compress=False, fixed_order=True)))
  raise ValueError(op)


def bench_collectives(jax, jnp, np, zj, devs, sizes_bytes, transport: str, reps: int) -> list[dict]:
  from jax import lax
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P
  n = len(devs)
  mesh = Mesh(np.array(devs), ("i",))
  spec = P("i")
  out = []
  for size in sizes_bytes:
    cols = 1024
    rows = max(n, size // (2 * cols) // n * n)  # per device, a multiple of n (tiled all_to_all)
    x_host = _tensor(jnp, np, "bfloat16", n * rows * cols, seed=size % 9973).reshape(n * rows, cols)
    x = jax.device_put(x_host, NamedSharding(mesh, spec))
    for op in OPS:
      ours, theirs, reference = _op_pair(zj, lax, jnp, op, n, transport)
      smap = lambda body: jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
      f_ours, f_lax = smap(ours), smap(theirs)
      got = np.asarray(f_ours(x))
      want = np.asarray(smap(reference)(x) if reference else f_lax(x))
      t_ours, t_lax = _times([lambda: jax.block_until_ready(f_ours(x)),
                              lambda: jax.block_until_ready(f_lax(x))], reps)
      r = paired_ratio(t_ours, t_lax)
      out.append({"op": op, "dtype": "bfloat16", "bytes_per_device": rows * cols * 2, "devices": n,
                  "transport": transport, "compressed": summary(t_ours), "raw": summary(t_lax),
                  "ratio": r["ratio"], "ratio_p25": r["ratio_p25"], "ratio_p75": r["ratio_p75"],
                  "bit_exact": bool(np.array_equal(got, want)),
                  "exact_against": "compress=False (documented order)" if reference else "jax.lax"})
  return out


def _print(rec: dict) -> None:
  print(f"platform {rec['platform']} ({rec['device_kind']}), {rec['devices']} devices, load "
        f"{rec['load']['loadavg_1min']:.1f}")
  print(f"{'kernel':7s} {'dtype':14s} {'MB':>8s} {'ratio':>6s} {'GB/s [p25-p75]':>24s} {'copy GB/s':>10s} "
        f"{'/copy [p25-p75]':>20s} exact")
  for k in rec["kernels"]:
    print(f"{k['kernel']:7s} {k['dtype']:14s} {k['raw_bytes'] / 1e6:8.2f} {k['ratio']:6.3f} "
          f"{k['gb_per_s']:8.2f} [{k['p25_gb_per_s']:.2f}-{k['p75_gb_per_s']:.2f}] {k['copy_gb_per_s']:10.2f} "
          f"{k['vs_copy']:7.3f} [{k['vs_copy_p25']:.3f}-{k['vs_copy_p75']:.3f}] {k['bit_exact']}")
  print(f"\n{rec['device_timing']}")
  for k in rec["kernels_device"]:
    if not k["resolved"]:
      print(f"{k['kernel']:7s} {k['dtype']:14s} {k['raw_bytes'] / 2**20:8.1f} MiB: not resolved (slopes <= 0)")
      continue
    print(f"{k['kernel']:7s} {k['dtype']:14s} {k['raw_bytes'] / 2**20:8.1f} MiB {k['ratio']:6.3f} "
          f"{k['gb_per_s']:8.1f} GB/s [{k['p25_gb_per_s']:.1f}-{k['p75_gb_per_s']:.1f}] copy "
          f"{k['copy_gb_per_s']:8.1f} /copy {k['vs_copy']:.3f} [{k['vs_copy_p25']:.3f}-{k['vs_copy_p75']:.3f}] "
          f"x{k['rotating_inputs']} {k['bit_exact']}")
  st = rec["step"]
  print(f"\nstep: {st['what']}, {st['raw_bytes'] / 1e6:.1f} MB: {st['median_s'] * 1e3:.3f} ms, "
        f"{st['gb_per_s']:.1f} GB/s [{st['p25_gb_per_s']:.1f}-{st['p75_gb_per_s']:.1f}]; alone: encode "
        f"{st['encode_gb_per_s']:.1f}, decode {st['decode_gb_per_s']:.1f} (copy "
        f"{st['copy_gb_per_s']:.1f}), exact {st['bit_exact']}")
  for q in rec["plumbing"]:
    r = q["collective_over_codec"]
    print(f"plumbing {q['transport']:6s}: all_to_all {q['collective']['median_s'] * 1e3:.3f} ms, codec alone "
          f"{q['codec']['median_s'] * 1e3:.3f} ms, copy {q['copy']['median_s'] * 1e3:.3f} ms: plumbing "
          f"{q['plumbing_s'] * 1e3:.3f} ms [{q['plumbing_p25_s'] * 1e3:.3f}-{q['plumbing_p75_s'] * 1e3:.3f}], "
          f"x{r['ratio']:.2f} [{r['ratio_p25']:.2f}-{r['ratio_p75']:.2f}] of the codec, exact {q['bit_exact']}")
  for m in rec["memory"]:
    if "error" in m:
      print(f"memory {m['variant']}: probe failed: {m['error'][-300:]}")
    else:
      print(f"memory {m['variant']:6s}: temp {m['temp_bytes'] / 2**20:8.1f} MiB, peak "
            f"{(m['peak_bytes_in_use'] or 0) / 2**20:8.1f} MiB ({m['bytes_per_device'] / 2**20:.1f} MiB/device)")
  print(f"\n{'collective':13s} {'MB/dev':>8s} {'compressed ms':>14s} {'jax.lax ms':>11s} "
        f"{'ratio [p25-p75]':>22s} exact")
  for c in rec["collectives"]:
    print(f"{c['op']:13s} {c['bytes_per_device'] / 1e6:8.3f} {c['compressed']['median_s'] * 1e3:14.3f} "
          f"{c['raw']['median_s'] * 1e3:11.3f} {c['ratio']:8.3f} [{c['ratio_p25']:.3f}-{c['ratio_p75']:.3f}] "
          f"{c['bit_exact']}")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--platform", choices=("cuda", "cpu"), default="cuda",
                 help="cpu: the smoke mode, the same code on 8 virtual CPU devices")
  p.add_argument("--quick", action="store_true", help="tiny sizes and 3 repetitions (a smoke run)")
  p.add_argument("--reps", type=int, default=None, help="repetitions (default 15, --quick 3)")
  p.add_argument("--kernel-mb", type=float, default=None, help="MB of input per kernel call (default 256)")
  p.add_argument("--sizes-mb", default=None, help="per-device MB of each collective (default 1,4,16,64)")
  p.add_argument("--dtypes", default=",".join(DTYPES))
  p.add_argument("--transport", choices=("auto", "padded", "ragged"), default="auto")
  p.add_argument("--step-mb", type=float, default=None,
                 help="MB of the MoE dispatch payload coded in one jitted step (default 64)")
  p.add_argument("--memory-mb", type=float, default=None,
                 help="MB per device of the all_to_all whose memory is measured (default 64)")
  p.add_argument("--device-mb", default=None,
                 help="bfloat16 call sizes (MB) of the device-timed kernels (default 4,16,64,256; --quick 0.25)")
  p.add_argument("--kernels-only", action="store_true",
                 help="the kernels' GB/s alone (no step, memory or collectives): what a profiler run needs")
  p.add_argument("--device-only", action="store_true",
                 help="the device-timed kernels alone, as JSON (benchmarks/codec_gpu_ab.py compares two builds)")
  p.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)  # one variant, in a child
  p.add_argument("--probe-elems", type=int, default=0, help=argparse.SUPPRESS)
  p.add_argument("--json", default=None)
  a = p.parse_args(argv)
  if a.memory_probe:
    print(json.dumps(memory_probe(a.memory_probe, a.probe_elems)))
    return 0
  reps = a.reps or (3 if a.quick else 15)
  kernel_mb = a.kernel_mb or (0.25 if a.quick else 256.0)
  sizes_mb = [float(s) for s in (a.sizes_mb or ("0.0625" if a.quick else "1,4,16,64")).split(",")]
  if a.platform == "cpu":  # before jax starts: 8 virtual devices, as tests/conftest.py
    flag = "--xla_force_host_platform_device_count"
    if flag not in os.environ.get("XLA_FLAGS", ""):
      os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}=8".strip()
  import jax
  import jax.numpy as jnp
  import numpy as np

  import zipccl_jax as zj
  try:
    devs = jax.devices(a.platform)
  except RuntimeError:
    devs = []
  if not devs:
    print(NO_CUDA, file=sys.stderr)
    return 2
  dtypes = [d for d in a.dtypes.split(",") if d]
  device_mb = [float(s) for s in (a.device_mb or ("0.25" if a.quick else "4,16,64,256")).split(",")]
  cases = [("bfloat16", int(mb * 2**20)) for mb in device_mb if "bfloat16" in dtypes]
  cases += [(d, int(device_mb[min(2, len(device_mb) - 1)] * 2**20)) for d in dtypes if d != "bfloat16"]
  working_set = (1 << 20) if a.quick else (128 << 20)
  if a.device_only:
    kernels_device = bench_kernels_device(jax, jnp, np, zj, devs[0], cases, reps, working_set=working_set)
    print(json.dumps({"platform": a.platform, "device_kind": devs[0].device_kind, "reps": reps,
                      "device_timing": DEVICE_TIMING, "kernels_device": kernels_device}))
    return 0 if all(k["bit_exact"] for k in kernels_device) else 1
  kernels = bench_kernels(jax, jnp, np, zj, devs[0], dtypes, int(kernel_mb * 1e6), reps)
  if a.kernels_only:
    rec = {"platform": a.platform, "device_kind": devs[0].device_kind, "kernels": kernels}
    print(json.dumps(rec, indent=1))
    return 0 if all(k["bit_exact"] for k in kernels) else 1
  kernels_device = bench_kernels_device(jax, jnp, np, zj, devs[0], cases, reps, working_set=working_set)
  step = bench_step(jax, jnp, np, devs[0], int((a.step_mb or (0.25 if a.quick else 64.0)) * 1e6), reps)
  plumbing = bench_plumbing(jax, jnp, np, zj, devs[0], int((a.step_mb or (0.25 if a.quick else 64.0)) * 1e6), reps)
  collectives = (bench_collectives(jax, jnp, np, zj, devs, [int(s * 1e6) for s in sizes_mb], a.transport, reps)
                 if len(devs) > 1 else [])
  memory = bench_memory(a.platform, int((a.memory_mb or (0.25 if a.quick else 64.0)) * 1e6) // 2 // 1024 * 1024)
  rec = {"command": "python benchmarks/codec_gpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
         "platform": a.platform, "devices": len(devs), "device_kind": devs[0].device_kind, "reps": reps,
         "info": zj.info(), "load": machine_load(), "kernels": kernels, "device_timing": DEVICE_TIMING,
         "kernels_device": kernels_device, "step": step, "plumbing": plumbing,
         "collectives": collectives, "memory": memory}
  _print(rec)
  if a.json:
    Path(a.json).write_text(json.dumps(rec, indent=1) + "\n")
  bad = ([k for k in kernels + kernels_device if not k["bit_exact"]] + [c for c in collectives if not c["bit_exact"]]
         + ([step] if not step["bit_exact"] else []) + [q for q in plumbing if not q["bit_exact"]]
         + [m for m in memory if "error" in m])
  if bad:
    print(f"NOT bit-exact: {bad}", file=sys.stderr)
  return 1 if bad else 0


if __name__ == "__main__":
  raise SystemExit(main())
