"""The command ``python -m zipccl_jax.model``: its flags, the verdict, the text, the plot.

    python -m zipccl_jax.model --hosts 16 --per-host 8 --intra 450GB/s --inter 400Gbit/s \\
        --workload moe_dispatch --bytes 64MiB --json out.json --png out.png

A bad flag is one line ``error: ...`` and exit status 2, never a traceback (checked before anything
is computed). The predictions are :mod:`.cluster`'s; the topology's links and mesh are described there.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

from zipccl_jax.capacity import CODED_DTYPES
from zipccl_jax.strategy.cluster import (FAST, WORKLOADS, Topology, parse_bytes, parse_rate,
                                         predict_step, sweep, workload)
from zipccl_jax.strategy.codec_cost import DEFAULT_CODEC, CodecModel
from zipccl_jax.strategy.links import LinkModel
from zipccl_jax.strategy.profile import Profile, get_profile, np_dtype, platform_key

__all__ = ["main", "verdict"]


# --------------------------------------------------------------------------- #
# The verdict, the text, the plot
# --------------------------------------------------------------------------- #


WORTH = 1.01  # auto is worth turning on when the step runs more than 1% faster than with jax.lax


def _ms(seconds: float) -> str:
  return f"{seconds * 1e3:.3g} ms"


def verdict(result: dict) -> dict:
  """Whether compression pays for the step of `result`: its ``auto`` variant (every call as
  ``compress="auto"`` runs it) against ``raw`` (jax.lax), per step (every layer, plus the compute).

  Returns ``keep_lax`` (auto not faster than raw by more than 1%), ``speedup`` (raw / auto),
  ``saved_s`` (raw - auto per step; negative where auto is slower) and ``line`` (the command's last)."""
  t = {v["name"]: v["time_s"] for v in result["step"]["variants"]}
  raw, auto = t["raw"], t["auto"]
  speedup, saved = (raw / auto if auto > 0 else math.inf), raw - auto
  keep = not speedup > WORTH
  if not keep:
    line = f"verdict: compress: {speedup:.2f}x, {_ms(saved)} saved per step"
  else:
    why = (f"{_ms(-saved)} slower per step" if saved < 0 else "it runs raw" if saved == 0
           else f"{_ms(saved)} saved per step, {WORTH - 1:.0%} or less")
    line = f"verdict: keep jax.lax (auto {speedup:.3f}x of jax.lax: {why})"
  return {"keep_lax": keep, "speedup": speedup, "saved_s": saved, "line": line}


def table(result: dict) -> str:
  """The text of a prediction: topology, codec (with where its rates come from), calls, step."""
  top = result["topology"]
  shared = {"all": f" (one link shared by all {top['devices']} devices)",
            "host": f" (each host's link shared by its {top['per_host']} devices)"}
  lines = [f"{top['devices']} devices = {top['hosts']} hosts x {top['per_host']} ({top['platform']}); "
           f"inter {top['inter_Gbit_s']:.4g} Gbit/s per device"
           + (f", intra {top['intra_GB_s']:.4g} GB/s" if top["intra_GB_s"] else "")
           + shared.get(top["shared_link"], "")]
  for name, c in result["assumptions"]["codec"].items():
    lines.append(f"codec {name}: encode {c['encode_GB_s']:.4g} GB/s, decode {c['decode_GB_s']:.4g} "
                 + (f"GB/s, mixed-slot passes {c['slot_GB_s']:.4g} " if c.get("slot_GB_s") else "")
                 + f"GB/s [{c['source']}]")
  for r in result["calls"]:
    x = r.get("crossover_inter_Gbit_s")
    lines.append(f"\n{r['name']}: {r['op']} {r['dtype']}, {r['operand_bytes'] / 2**20:.4g} MiB per "
                 f"device, x{r['calls']} per step; auto compresses below "
                 + (f"{x:.4g} Gbit/s" if x is not None else "- (no crossover in 0.08-8e4 Gbit/s)"))
    for v in r["variants"]:
      mark = "  <- auto" if v["name"] == r["auto_choice"] else ""
      lines.append(f"  {v['name']:45s} {v['time_s'] * 1e3:10.3f} ms  {v['speedup_vs_raw']:6.3f}x{mark}")
  st = result["step"]
  lines.append(f"\nstep (compute {st['compute_s'] * 1e3:g} ms, not overlapped):")
  for v in st["variants"]:
    lines.append(f"  {v['name']:45s} {v['time_s'] * 1e3:10.3f} ms  {v['speedup_vs_raw']:6.3f}x")
  return "\n".join(lines)


def write_plot(curves: dict, png: str, title: str, json_path: str | None) -> int:
  """--png: the step's speedup against the inter rate, one curve per scale; or one line saying what
  is missing (exit status 1; the table and --json stand)."""
  try:
    import matplotlib
  except ImportError:
    print("error: --png needs matplotlib: pip install 'zipccl_jax[plot]' (or pip install matplotlib)"
          + (f"; the prediction is in {json_path}" if json_path else ""), file=sys.stderr)
    return 1
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for devices, pts in sorted(curves.items()):
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=f"{devices} devices")
  ax.axhline(1.0, color="grey", lw=0.8)
  ax.set_xscale("log")
  ax.set_xlabel("inter-host bandwidth per device (Gbit/s)")
  ax.set_ylabel("step speedup, compress='auto' over raw")
  ax.set_title(title, fontsize=9)
  ax.legend()
  fig.tight_layout()
  try:
    fig.savefig(png, dpi=120)
  except OSError as e:
    print(f"error: --png {png}: {e}", file=sys.stderr)
    return 1
  finally:
    plt.close(fig)
  return 0


# --------------------------------------------------------------------------- #
# The flags
# --------------------------------------------------------------------------- #


class Parser(argparse.ArgumentParser):
  """argparse, but a bad flag raises ValueError (main prints it as one line) instead of printing the
  usage and exiting."""

  def error(self, message):
    if message.endswith("expected one argument"):  # e.g. --inter -5Gbit/s: a value, read as a flag
      message += " (a value that starts with '-' goes as --flag=VALUE)"
    raise ValueError(message)


def number(kind: type, least: float, *, strict: bool = False):
  """An argparse type: a finite `kind` (int or float) >= `least` (> with `strict`)."""
  def convert(text: str):
    try:
      v = kind(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                       f"got {text!r}") from None
    if not (math.isfinite(v) and (v > least if strict else v >= least)):
      raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {least:g}, got {text!r}")
    return v
  return convert


def scales(text: str) -> list[int]:
  """--scales: devices per curve, integers >= 2, comma-separated."""
  try:
    v = sorted({int(s) for s in text.split(",")})
  except ValueError:
    v = []
  if not v or v[0] < 2:
    raise argparse.ArgumentTypeError(f"a comma-separated list of device counts >= 2, got {text!r}")
  return v


def check_output(flag: str, path: str | None) -> None:
  """ValueError unless `path` (of `flag`) can be written: its folder exists and is writable."""
  if path is None:
    return
  folder = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
    why = "is a folder" if os.path.isdir(path) else f"no writable folder {folder}"
    raise ValueError(f"{flag} {path}: {why}")


def _codec_arg(text: str | None, dtype: str, plat: str):
  """--codec: None, a platform name (its documented table), or "ENCODE,DECODE" GB/s for `dtype`
  (with `plat`'s documented per-call overheads)."""
  if text is None:
    return None
  if text in DEFAULT_CODEC:
    return dict(DEFAULT_CODEC[text])
  try:
    enc, dec = (float(v) * 1e9 for v in text.split(","))
  except ValueError:
    raise ValueError(f"zipccl_jax.model: --codec is cpu, gpu, tpu or 'ENCODE,DECODE' in GB/s, got "
                     f"{text!r}") from None
  if not all(v > 0 and math.isfinite(v) for v in (enc, dec)):
    raise ValueError(f"zipccl_jax.model: --codec's rates must be > 0 GB/s, got {text!r}")
  name = np.dtype(np_dtype(dtype)).name
  base = DEFAULT_CODEC.get(plat, DEFAULT_CODEC["cpu"]).get(name)
  if base is None:
    raise ValueError(f"zipccl_jax.model: --codec ENCODE,DECODE is for a compressed --dtype, got {dtype!r}")
  return {name: CodecModel(enc, dec, base.encode_overhead_s, base.decode_overhead_s)}


def _base_profile(path: str) -> Profile:
  """--profile's profile; ValueError naming the flag and the file for one that cannot be read."""
  try:
    return Profile.load(path)
  except (OSError, ValueError) as e:  # json's decode error is a ValueError
    raise ValueError(f"--profile {path}: {e}") from e


def topology_from_args(a) -> Topology:
  """The topology of the command's flags; what they leave out comes from the base profile."""
  base = _base_profile(a.profile) if a.profile else get_profile()
  plat = platform_key(a.device or base.platform or "gpu")
  link, where = base.link(None, "*", plat)
  inter = LinkModel(a.inter_latency_us * 1e-6 if a.inter_latency_us is not None else link.latency_s,
                    parse_rate(a.inter) if a.inter else link.bandwidth_Bps)
  source = ["inter: " + ("--inter" if a.inter else f"the profile's link ({where})")]
  intra = parse_rate(a.intra) if a.intra else None  # checked even where no host has two devices
  if a.per_host == 1:
    intra = None
  elif intra is not None:
    intra = LinkModel(a.intra_latency_us * 1e-6, intra)
    source.append("intra: --intra")
  elif FAST in base.links:
    intra, where = base.link(FAST, "*", plat)
    source.append(f"intra: the profile's link ({where})")
  else:
    raise ValueError("zipccl_jax.model: --per-host > 1 needs --intra (the base profile has no "
                     f"{FAST!r} link)")
  return Topology(a.hosts, a.per_host, inter, intra, plat, _codec_arg(a.codec, a.dtype, plat),
                  a.shared_link, base, ", ".join(source))


def _dtype_arg(text: str) -> str:
  try:
    np_dtype(text)
  except (TypeError, ValueError):
    raise argparse.ArgumentTypeError(f"not a numpy or ml_dtypes type: {text!r}") from None
  return text


def _parser() -> argparse.ArgumentParser:
  p = Parser(prog="python -m zipccl_jax.model",
                  description="Predict what zipccl_jax's compression buys on a cluster.",
                  epilog=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
  count, at_least_0 = number(int, 1), number(float, 0)
  p.add_argument("--hosts", type=count, default=4, help="hosts (default 4)")
  p.add_argument("--per-host", type=count, default=1, help="devices per host (1: no fast level)")
  p.add_argument("--inter", help="link between hosts per device, e.g. 400Gbit/s (default: the "
                 "profile's link)")
  p.add_argument("--inter-latency-us", type=at_least_0, default=None, help="latency per collective "
                 "between hosts (default: the profile's)")
  p.add_argument("--intra", help="link inside a host: the rate one device sends at, one direction, "
                 "e.g. 450GB/s (H100 NVLink: 900 GB/s both directions together)")
  p.add_argument("--intra-latency-us", type=at_least_0, default=5.0, help="latency inside a host (5)")
  p.add_argument("--shared-link", nargs="?", const="all", default=False, choices=("all", "host"),
                 help="host: the devices of a host share its --inter link (one NIC per host); no "
                 "value or all: every device shares one --inter link (--per-host 1: the flat CPU "
                 "testbed, processes behind one shaped loopback)")
  p.add_argument("--device", choices=("gpu", "cpu", "tpu"), default=None,
                 help="device kind (its codec model); default: the profile's platform, else gpu")
  p.add_argument("--codec", help="cpu, gpu or tpu (that table), or ENCODE,DECODE GB/s for --dtype")
  p.add_argument("--profile", help="base profile JSON (default: $ZIPCCL_PROFILE or the defaults)")
  p.add_argument("--workload", default="moe_dispatch",
                 help="moe_dispatch, fsdp, ddp or a JSON list of calls (" + "; ".join(
                     f"{k}: {v}" for k, v in WORKLOADS.items()) + ")")
  p.add_argument("--bytes", default="64MiB", help="the workload's size (default 64MiB; a JSON "
                 "workload has its own)")
  p.add_argument("--dtype", type=_dtype_arg, default="bfloat16",
                 help="the workload's element type (bfloat16)")
  p.add_argument("--layers", type=count, default=1, help="layers per step (each the workload's calls)")
  p.add_argument("--compute-ms", type=at_least_0, default=0.0, help="work per step not overlapped")
  p.add_argument("--json", help="write the prediction here")
  p.add_argument("--png", help="write the step's speedup against inter bandwidth, per scale, here")
  p.add_argument("--scales", type=scales, default="8,64,512",
                 help="devices per curve of --png (and this one's)")
  return p


def main(argv=None) -> int:
  """The command: the table, notes, and the verdict line last; exit status 2 and one line ``error:``
  on stderr for a bad flag (checked before anything is computed)."""
  try:
    a = _parser().parse_args(argv)
    check_output("--json", a.json)
    check_output("--png", a.png)
    top = topology_from_args(a)
    calls = workload(a.workload, parse_bytes(a.bytes), top.devices, dtype=a.dtype, layers=a.layers)
    result = predict_step(top, calls, compute_s=a.compute_ms * 1e-3)
  except (ValueError, OSError) as e:
    print("error: " + str(e).replace("\n", " "), file=sys.stderr)
    return 2
  result["verdict"] = verdict(result)
  print(table(result))
  for name in sorted({c.dtype for c in calls if np.dtype(np_dtype(c.dtype)) not in CODED_DTYPES}):
    print(f"note: {name} is not compressed (the codec codes bfloat16, float16, float32 and the float8 "
          "types): every variant of its calls is raw")
  print(result["verdict"]["line"])
  curves = None
  if a.png:
    rates = [10 ** (1 + i / 8) * 1e9 / 8 for i in range(0, 21)]  # 10 .. 3162 Gbit/s
    curves = sweep(top, calls, sorted(set(a.scales) | {top.devices}), rates, compute_s=a.compute_ms * 1e-3)
    result["sweep"] = {str(k): v for k, v in curves.items()}
  if a.json:  # before the plot: a plot that fails leaves the prediction written
    try:
      with open(a.json, "w") as f:
        json.dump(result, f, indent=1)
    except OSError as e:
      print(f"error: --json {a.json}: {e}", file=sys.stderr)
      return 2
  if curves is None:
    return 0
  return write_plot(curves, a.png, f"{a.workload}, {a.bytes} ({top.platform}, {top.per_host} per "
                         "host)", a.json)
