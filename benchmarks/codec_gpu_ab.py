#!/usr/bin/env python
"""Two builds of the CUDA kernels on one GPU, interleaved: which is faster, by how much, with its spread.

Each build is a folder holding an installed zipccl_jax (`pip install --no-deps --target DIR WHEEL`), or `-`
for the one this Python imports. Every round runs `codec_gpu.py --device-only` once per build, in a fresh
process, alternating the order (A B, B A, ...), so drift of the GPU's clocks and temperature hits both
alike. Per (kernel, dtype, size): each build's GB/s of raw bytes, median [p25-p75] over every repetition of
every round (device-timed, codec_gpu.py's DEVICE_TIMING), and B over A as the ratio of the medians with
the per-round ratios beside it. Every call is checked bit for bit by codec_gpu.py; a build that is not
bit-exact fails the run (exit 3; a build that does not run at all: exit 1).

    python benchmarks/codec_gpu_ab.py --a /tmp/base --b - --rounds 2 --device-mb 64,256 --json ab.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import quantile  # noqa: E402
from codec_gpu import _gbps  # noqa: E402  (jax is imported only by its main)

CODEC_GPU = Path(__file__).resolve().with_name("codec_gpu.py")


def run_build(site: str, args: list[str]) -> dict:
  """codec_gpu.py --device-only under the build in `site` ('-': the installed one); its JSON."""
  env = dict(os.environ)
  if site != "-":
    env["PYTHONPATH"] = os.pathsep.join([site] + [p for p in [env.get("PYTHONPATH")] if p])
  r = subprocess.run([sys.executable, str(CODEC_GPU), "--device-only", *args], env=env, capture_output=True,
                     text=True)
  if r.returncode not in (0, 1) or not r.stdout.strip():
    raise SystemExit(f"codec_gpu.py under {site} exited {r.returncode}:\n{r.stderr[-3000:]}")
  rec = json.loads(r.stdout.strip().splitlines()[-1])
  rec["exit"] = r.returncode
  return rec


def _key(k: dict) -> tuple:
  return (k["kernel"], k["dtype"], k["raw_bytes"])


def compare(rounds: list[dict[str, dict]]) -> list[dict]:
  """Rows per (kernel, dtype, bytes): each build's GB/s over all samples, and b / a per round."""
  rows = []
  for key in [_key(k) for k in rounds[0]["a"]["kernels_device"]]:
    samples = {"a": [], "b": []}
    per_round = []
    for rnd in rounds:
      med = {}
      for build in ("a", "b"):
        (k,) = [k for k in rnd[build]["kernels_device"] if _key(k) == key]
        samples[build] += k["samples_s"]
        med[build] = quantile(k["samples_s"], 0.5)
      per_round.append(med["a"] / med["b"])
    raw = key[2]
    gbps = {b: {**_gbps(raw, s), "n": len(s)} for b, s in samples.items()}
    rows.append({"kernel": key[0], "dtype": key[1], "mib": raw / 2**20, "a": gbps["a"], "b": gbps["b"],
                 "b_over_a": gbps["b"]["gb_per_s"] / gbps["a"]["gb_per_s"],
                 "b_over_a_rounds": per_round})
  return rows


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--a", required=True, help="site folder of build A (the baseline), or - for the installed one")
  p.add_argument("--b", required=True, help="site folder of build B, or -")
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--reps", type=int, default=7, help="repetitions per build per round")
  p.add_argument("--device-mb", default="64,256")
  p.add_argument("--dtypes", default="bfloat16")
  p.add_argument("--platform", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke run of this script")
  p.add_argument("--json", default=None)
  a = p.parse_args(argv)
  args = ["--reps", str(a.reps), "--device-mb", a.device_mb, "--dtypes", a.dtypes, "--platform", a.platform]
  rounds = []
  for i in range(a.rounds):  # the JSON is rewritten after every round: a run cut short keeps what it has
    order = ("a", "b") if i % 2 == 0 else ("b", "a")
    rounds.append({build: run_build(getattr(a, build), args) for build in order})
    rows = compare(rounds)
    exact = all(r[b]["exit"] == 0 for r in rounds for b in ("a", "b"))
    rec = {"command": "python benchmarks/codec_gpu_ab.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "device_kind": rounds[0]["a"]["device_kind"], "a": a.a, "b": a.b, "rounds_done": len(rounds),
           "bit_exact": exact, "rows": rows, "rounds": rounds}
    if a.json:
      Path(a.json).write_text(json.dumps(rec, indent=1) + "\n")
  print(f"{'kernel':7} {'dtype':9} {'MiB':>5}  {'A GB/s [p25-p75]':>22}  {'B GB/s [p25-p75]':>22}  B/A [rounds]")
  for r in rows:
    ga, gb = r["a"], r["b"]
    print(f"{r['kernel']:7} {r['dtype']:9} {r['mib']:5.1f}  {ga['gb_per_s']:7.1f} "
          f"[{ga['p25_gb_per_s']:6.1f}-{ga['p75_gb_per_s']:6.1f}]  {gb['gb_per_s']:7.1f} "
          f"[{gb['p25_gb_per_s']:6.1f}-{gb['p75_gb_per_s']:6.1f}]  {r['b_over_a']:.3f} "
          f"[{', '.join(f'{x:.3f}' for x in r['b_over_a_rounds'])}]")
  print("bit-exact:", exact)
  return 0 if exact else 3


if __name__ == "__main__":
  sys.exit(main())
