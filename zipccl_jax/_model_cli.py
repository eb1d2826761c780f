"""The command ``python -m zipccl_jax.model`` around its predictions: the verdict, the text, the plot, and
the checks of its flags (a bad one is one line ``error: ...`` and exit status 2, never a traceback).

A result is the dict :func:`zipccl_jax.model.predict_step` returns; nothing here imports the package.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

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
                 f"GB/s [{c['source']}]")
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


# --------------------------------------------------------------------------- the flags


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
