"""The CPU codec's compiled vector tier against its portable loops, on this machine.

Runs `benchmarks/codec.py --codecs zipccl,zstd1` --runs times with the tier this build compiled and as many
with `ZIPCCL_CPU_PORTABLE=1`, interleaved (tier, portable, tier, ...), each in its own process, and reports per
dtype the median [min–max] over the runs of encode and decode GB/s, their ratio to zstd-1 in the same run, and
tier over portable per pair of runs. codec.py's own rule holds inside each run (best of 3 per tensor and codec,
byte-weighted over the corpus).

    python benchmarks/codec_tiers.py --corpus ../shared/corpus --runs 5 --json benchmarks/results/codec_avx2.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _cpu() -> tuple[str, list[str]]:
  """The CPU's model name and its vector flags, from /proc/cpuinfo ("" and [] elsewhere)."""
  try:
    text = Path("/proc/cpuinfo").read_text()
  except OSError:
    return platform.processor(), []
  name = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "")
  flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
  keep = ("avx", "bmi", "gfni", "popcnt")
  return name, sorted(f for f in flags if f.startswith(keep))


def _one_run(corpus: Path, portable: bool, reps: int) -> dict:
  """One codec.py run in a fresh process: {dtype: {"zipccl": row, "zstd-1": row}}."""
  env = dict(os.environ, OMP_NUM_THREADS="1")
  env.pop("ZIPCCL_CPU_PORTABLE", None)
  if portable:
    env["ZIPCCL_CPU_PORTABLE"] = "1"
  with tempfile.TemporaryDirectory() as tmp:
    out = Path(tmp) / "run.json"
    subprocess.run([sys.executable, str(HERE / "codec.py"), "--corpus", str(corpus), "--codecs", "zipccl,zstd1",
                    "--reps", str(reps), "--json", str(out)], env=env, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads(out.read_text())["summary"]
  by_dtype: dict = {}
  for row in summary:
    by_dtype.setdefault(row["dtype"], {})[row["codec"]] = row
  return by_dtype


def _spread(xs: list[float]) -> dict:
  return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def summarise(runs: dict, tier: str) -> list[dict]:
  """Per dtype and speed: each path's spread, its spread over zstd-1's in the same run, tier over portable."""
  out = []
  for dtype in runs[tier][0]:
    for what in ("enc_gbps", "dec_gbps"):
      rec = {"dtype": dtype, "what": what}
      for path in (tier, "portable"):
        mine = [r[dtype]["zipccl"][what] for r in runs[path]]
        over = [r[dtype]["zipccl"][what] / r[dtype]["zstd-1"][what] for r in runs[path]]
        rec[path] = {**_spread(mine), **{f"over_zstd1_{k}": v for k, v in _spread(over).items()}}
      pairs = [a[dtype]["zipccl"][what] / b[dtype]["zipccl"][what] for a, b in zip(runs[tier], runs["portable"])]
      rec[f"{tier}_over_portable"] = _spread(pairs)
      out.append(rec)
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--corpus", type=Path, required=True, help="corpus dir with manifest.json and tensors/")
  ap.add_argument("--runs", type=int, default=5, help="runs of each path, interleaved (default 5)")
  ap.add_argument("--reps", type=int, default=3, help="codec.py's --reps in each run (default 3)")
  ap.add_argument("--json", type=Path, help="write the runs and the summary here")
  args = ap.parse_args(argv)
  if args.runs < 1:
    ap.error("--runs must be at least 1")
  if args.json and not args.json.parent.is_dir():
    ap.error(f"--json: no folder {args.json.parent}")
  import zipccl_jax  # noqa: PLC0415 (the installed build's tier, after the arguments are checked)

  paths = zipccl_jax.info()["cpu"]["code_paths"]
  if not paths:
    sys.exit("this build compiled only the portable loops: there is no tier to compare")
  tier = paths[0]
  runs: dict = {tier: [], "portable": []}
  for i in range(args.runs):
    for path in (tier, "portable"):
      runs[path].append(_one_run(args.corpus, path == "portable", args.reps))
      print(f"run {i + 1}/{args.runs} {path} done", flush=True)
  summary = summarise(runs, tier)
  for rec in summary:
    t, p, x = rec[tier], rec["portable"], rec[f"{tier}_over_portable"]
    print(f"{rec['dtype']:9s} {rec['what'][:3]}: {tier} {t['median']:.2f} GB/s [{t['min']:.2f}-{t['max']:.2f}] "
          f"({t['over_zstd1_median']:.2f}x zstd-1), portable {p['median']:.2f} [{p['min']:.2f}-{p['max']:.2f}] "
          f"({p['over_zstd1_median']:.2f}x), {tier}/portable {x['median']:.2f}x [{x['min']:.2f}-{x['max']:.2f}]")
  if args.json:
    name, flags = _cpu()
    args.json.write_text(json.dumps(dict(
        cpu=name, cpu_flags=flags, code_paths={tier: "default build (-march=native)",
                                               "portable": "ZIPCCL_CPU_PORTABLE=1"},
        command="python benchmarks/codec_tiers.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        note="each run: codec.py's rule (best of 3 per tensor and codec, byte-weighted over the corpus); "
             "figures: median [min, max] over the runs; ratios to zstd-1 are within one run",
        summary=summary, runs=runs), indent=1))


if __name__ == "__main__":
  main()
