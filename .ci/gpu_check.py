"""The GPU proof kit's stages (`bash .ci/gpu_check.sh OUT` runs this with the machine's Python).

Stages, in order, each in a child process with its own time limit, all inside one wall-clock budget
(ZIPCCL_KIT_BUDGET_S, default 480 s; a stage gets at most what is left). A stage that fails does not stop
the later ones: a first GPU run should bring back everything it can.

  install    the wheel in .gpu_wheels/ for this Python's tag, else a source build; offline, --no-deps,
             and jax, jaxlib and the CUDA plugin must be the same versions after it as before
  source_build  (ZIPCCL_KIT_SOURCE_BUILD=1) the fallback tried as well: a wheel from source, offline
  info       `python -m zipccl_jax.info`: kernels built, the driver, problems
  pytest     `pytest -m gpu -x -rs` (tests/test_gpu.py and every other `gpu`-marked test), JUnit XML
  memcheck   the codec's CUDA tests again under `compute-sanitizer --tool memcheck`, checking only the
  racecheck  zipccl kernels (`--kernel-name kns=zipccl`), one buffer per allocation
             (XLA_PYTHON_CLIENT_ALLOCATOR=platform) so an out-of-bounds access leaves its buffer
  benchmark  benchmarks/codec_gpu.py: encode/decode GB/s per dtype against a device copy, the codec inside
             a jitted step, a one-GPU compressed all_to_all against its codec alone (plumbing), memory
             of a compressed all_to_all against jax.lax's, collectives on 2+ GPUs
  graphs     the collectives' GPU tests again with XLA's command buffers holding custom calls, collectives,
             loops and conditionals (GRAPH_FLAGS): each compressed collective one CUDA graph, its fallback a
             graph conditional (docs/gpu.md, "CUDA graphs"); every selected test must run
  profile    each zipccl kernel's GPU time in a 64 MB bfloat16 encode and decode (Nsight Compute, the clocks
             as found), then the stall reasons, issue rates and occupancy of analyse, write and decode_block;
             where ncu works; informative, never a failure, so last: it gets the time the others left

Without a CUDA device the GPU stages say so and are skipped (a rehearsal on a CPU machine exits 0).
Files written to OUT (at most 8, the device tool's limit): gpu_report.json, gpu_check.log, pytest_gpu.xml,
codec_gpu.json, memcheck.log, racecheck.log, info.json.
"""
from __future__ import annotations

import csv
import glob
import importlib.metadata as md
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = float(os.environ.get("ZIPCCL_KIT_BUDGET_S", "480"))
KEEP_GOING = os.environ.get("ZIPCCL_KIT_KEEP_GOING", "") not in ("", "0")
BENCH_ARGS = os.environ.get("ZIPCCL_KIT_BENCH_ARGS", "").split()  # more codec_gpu.py arguments ("--reps 5")
# Stage limits (s). On an H100 the whole kit, install included, is meant to end inside 8 minutes.
LIMITS = {"install": 240, "source_build": 240, "info": 60, "pytest": 240, "memcheck": 120, "racecheck": 120, "benchmark": 240,
          "profile": 90, "stalls": 60, "graphs": 120}
# The codec's CUDA tests, rerun under the sanitizer: every dtype's bytes, damaged frames, overflow.
SANITIZED_TESTS = ["test_gpu.py", "-k", "cuda and (codec_bytes or damaged or overflow_header)"]
# Every compressed collective captured whole (a deviceless compile of 8 x H100 puts each op, both transports, in
# one command buffer under these: benchmarks/gpu_command_buffers.py), and graphs of any size.
GRAPH_FLAGS = ("--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,COLLECTIVES,WHILE,CONDITIONAL "
               "--xla_gpu_graph_min_graph_size=1")
GRAPH_TESTS = ["test_gpu.py", "-k", "collectives or decode_into or ragged_all_to_all"]
JAX_DISTS = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin", "jax-cuda12-pjrt")

T0 = time.monotonic()


class Kit:
  def __init__(self, out: Path):
    self.out = out
    self.log = open(out / "gpu_check.log", "w", buffering=1)
    self.report: dict = {"kit": "bash .ci/gpu_check.sh", "python": sys.version.split()[0],
                         "executable": sys.executable, "stages": {}}

  def say(self, msg: str) -> None:
    line = f"[{time.monotonic() - T0:6.1f}s] {msg}"
    print(line, flush=True)
    self.log.write(line + "\n")

  def run(self, stage: str, cmd: list[str], *, cwd: Path = ROOT, env: dict | None = None,
          limit: float | None = None) -> subprocess.CompletedProcess | None:
    """cmd's output into the log (and the console); None if the budget left no time for it."""
    left = BUDGET_S - (time.monotonic() - T0)
    limit = min(limit or LIMITS[stage], left - 5)
    if limit < 10:
      self.say(f"{stage}: no time left in the {BUDGET_S:.0f} s budget, not run")
      return None
    self.say(f"{stage}: {' '.join(cmd)}  (limit {limit:.0f} s)")
    t = time.monotonic()
    # A session of its own, so that a timeout ends the whole tree: a profiler's or sanitizer's target left
    # running holds the GPU's memory (JAX preallocates it), and the next stage's JAX then finds no device.
    p = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
      stdout, stderr = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
      os.killpg(p.pid, signal.SIGKILL)
      stdout, stderr = p.communicate()
      self.log.write(stdout + "\n" + stderr + "\n")
      self.say(f"{stage}: TIMED OUT after {limit:.0f} s")
      return subprocess.CompletedProcess(cmd, 124, stdout, stderr)
    r = subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr)
    self.log.write(r.stdout + ("\n" + r.stderr if r.stderr else "") + "\n")
    print((r.stdout + r.stderr)[-4000:], flush=True)
    self.say(f"{stage}: exit {r.returncode} in {time.monotonic() - t:.1f} s")
    return r

  def stage(self, name: str, status: str, **fields) -> None:
    self.report["stages"][name] = {"status": status, **fields}


def _versions() -> dict:
  out = {}
  for d in JAX_DISTS:
    try:
      out[d] = md.version(d)
    except md.PackageNotFoundError:
      pass
  return out


def _cuda_devices() -> list[dict]:
  """The GPUs nvidia-smi lists: name, driver, compute capability (no JAX: this process stays light)."""
  smi = shutil.which("nvidia-smi")
  if not smi:
    return []
  r = subprocess.run([smi, "--query-gpu=name,driver_version,compute_cap,memory.total",
                      "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
  if r.returncode != 0:
    return []
  gpus = []
  for line in r.stdout.strip().splitlines():
    name, driver, cc, mem = [f.strip() for f in line.split(",")]
    gpus.append({"name": name, "driver": driver, "compute_capability": cc, "memory": mem})
  return gpus


def install(kit: Kit) -> bool:
  before = _versions()
  if os.environ.get("ZIPCCL_KIT_INSTALLED", "") not in ("", "0"):  # test what this Python already has
    kit.stage("install", "skipped", reason="ZIPCCL_KIT_INSTALLED: the installed zipccl_jax as it is")
    kit.report["versions"] = before
    return True
  tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
  wheels = sorted(glob.glob(str(ROOT / ".gpu_wheels" / f"zipccl_jax-*-{tag}-{tag}-*.whl")))
  pip = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--force-reinstall",
         "--no-cache-dir", "--disable-pip-version-check", "-q"]
  if wheels:
    how, cmd = f"wheel {Path(wheels[-1]).name}", pip + [wheels[-1]]
  else:  # a source build: NVRTC of the installed plugin's CUDA major compiles the kernels
    how, cmd = "source build", pip[:-2] + ["--no-build-isolation", "-q", str(ROOT)]
  r = kit.run("install", cmd)
  after = _versions()
  ok = r is not None and r.returncode == 0 and before == after
  kit.stage("install", "passed" if ok else "failed", how=how, jax_before=before, jax_after=after,
            error=None if ok else (r.stderr[-2000:] if r else "no time"))
  kit.report["versions"] = after
  if before != after:
    kit.say(f"install: CHANGED the installed JAX: {before} -> {after}")
  return ok


def source_build(kit: Kit) -> bool:
  """The install's fallback, tried beside the wheel (ZIPCCL_KIT_SOURCE_BUILD=1): a wheel built here from
  source, offline, against this Python's jax (its headers included: the build needs Python.h)."""
  if os.environ.get("ZIPCCL_KIT_SOURCE_BUILD", "") in ("", "0"):
    kit.stage("source_build", "skipped", reason="not asked for (ZIPCCL_KIT_SOURCE_BUILD=1)")
    return True
  include = Path(sysconfig.get_paths()["include"])
  dest = kit.out.parent / "zipccl_source_build"
  r = kit.run("source_build", [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                               "--no-index", "--disable-pip-version-check", "-q", "-w", str(dest), str(ROOT)])
  wheels = sorted(p.name for p in dest.glob("*.whl")) if dest.exists() else []
  ok = r is not None and r.returncode == 0 and bool(wheels)
  kit.stage("source_build", "passed" if ok else "failed", python_h=(include / "Python.h").exists(),
            wheels=wheels, error=None if ok else ((r.stdout + r.stderr)[-2000:] if r else "no time"))
  return ok


def info(kit: Kit) -> dict | None:
  r = kit.run("info", [sys.executable, "-m", "zipccl_jax.info"], cwd=Path("/"))
  if r is None or r.returncode != 0:
    kit.stage("info", "failed", error=r.stderr[-2000:] if r else "no time")
    return None
  shown = json.loads(r.stdout)
  (kit.out / "info.json").write_text(json.dumps(shown, indent=1) + "\n")
  problems = shown["cuda"]["problems"]
  kit.stage("info", "failed" if problems else "passed", problems=problems,
            kernels=shown["cuda"]["kernels"], toolkit=shown["cuda"]["toolkit"], driver=shown["cuda"]["driver"],
            archs=shown["cuda"]["archs"])
  return shown


def junit_counts(path: Path) -> dict:
  """passed/failed/skipped/errors and the first failure's text, from pytest's JUnit XML."""
  counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
  first = None
  skips: dict[str, int] = {}
  for case in ET.parse(path).getroot().iter("testcase"):
    kinds = {child.tag: child for child in case}
    name = f"{case.get('classname')}::{case.get('name')}"
    if "failure" in kinds or "error" in kinds:
      counts["failed" if "failure" in kinds else "errors"] += 1
      el = kinds.get("failure", kinds.get("error"))
      if first is None:
        first = {"test": name, "message": (el.get("message") or "")[:2000], "text": (el.text or "")[-4000:]}
    elif "skipped" in kinds:
      counts["skipped"] += 1
      why = kinds["skipped"].get("message") or ""
      skips[why] = skips.get(why, 0) + 1
    else:
      counts["passed"] += 1
  return {**counts, "first_failure": first, "skip_reasons": skips}


def _summary_line(stdout: str) -> str:
  """pytest's last summary line ("N passed, M skipped in T s"), or ""."""
  return next((ln for ln in reversed(stdout.splitlines()) if " in " in ln and ("passed" in ln or
               "failed" in ln or "skipped" in ln or "error" in ln)), "")


def pytest_gpu(kit: Kit, have_gpu: bool) -> bool:
  xml = kit.out / "pytest_gpu.xml"
  cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-rs", "-p", "no:cacheprovider", f"--junitxml={xml}"]
  if not KEEP_GOING:
    cmd.append("-x")
  # From tests/: `python -m pytest` puts the working directory first on sys.path, and the repository root
  # holds the unbuilt package; the installed one must be tested.
  r = kit.run("pytest", cmd, cwd=ROOT / "tests")
  if r is None or not xml.exists():
    kit.stage("pytest", "failed", error=("no time" if r is None else r.stdout[-3000:] + r.stderr[-2000:]))
    return False
  res = junit_counts(xml)
  summary = _summary_line(r.stdout)
  ok = r.returncode == 0 and not res["failed"] and not res["errors"]
  kit.stage("pytest", "passed" if ok else "failed", command=" ".join(cmd[1:]), summary=summary.strip("= "),
            gpu_tests_ran=have_gpu and res["passed"] > 0, **res)
  return ok


def graphs(kit: Kit, have_gpu: bool) -> bool:
  """GRAPH_TESTS under GRAPH_FLAGS: the coded and the fallback paths' bits when XLA runs them as CUDA graphs."""
  if not have_gpu:
    kit.stage("graphs", "skipped", reason="no CUDA device")
    return True
  flags = f"{os.environ.get('XLA_FLAGS', '')} {GRAPH_FLAGS}".strip()
  cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider", *GRAPH_TESTS]
  r = kit.run("graphs", cmd, cwd=ROOT / "tests", env={"XLA_FLAGS": flags})
  if r is None:
    kit.stage("graphs", "not run", reason="no time", xla_flags=flags)
    return False
  summary = _summary_line(r.stdout)
  # On a GPU host every selected test must run: all skipped (JAX found no device) proves nothing.
  ok = r.returncode == 0 and " passed" in summary
  kit.stage("graphs", "passed" if ok else "failed", xla_flags=flags,
            summary=summary.strip("= "), tail=None if ok else (r.stdout + r.stderr)[-3000:])
  return ok


def _sanitizer() -> str | None:
  found = shutil.which("compute-sanitizer")
  if found:
    return found
  cands = ["/usr/local/cuda/bin/compute-sanitizer", *glob.glob("/usr/local/cuda*/bin/compute-sanitizer"),
           *glob.glob("/opt/nvidia/*/compute-sanitizer/compute-sanitizer"),
           *glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "nvidia/cu1*/bin/compute-sanitizer"))]
  return next((c for c in cands if os.access(c, os.X_OK)), None)


def sanitize(kit: Kit, tool: str, have_gpu: bool) -> bool:
  if not have_gpu:
    kit.stage(tool, "skipped", reason="no CUDA device")
    return True
  exe = _sanitizer()
  if exe is None:
    kit.stage(tool, "skipped", reason="compute-sanitizer not found")
    return True
  log = kit.out / f"{tool}.log"
  cmd = [exe, "--tool", tool, "--kernel-name", "kns=zipccl", "--error-exitcode", "86",
         "--log-file", str(log), "--print-limit", "50",
         sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *SANITIZED_TESTS]
  env = {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
  r = kit.run(tool, cmd, cwd=ROOT / "tests", env=env)
  text = log.read_text(errors="replace") if log.exists() else ""
  if r is None:
    kit.stage(tool, "not run", reason="no time")
    return False
  status, summary = sanitizer_verdict(r.returncode, text, r.stdout + r.stderr)
  kit.stage(tool, status, summary=summary, exit=r.returncode,
            tail=(text + r.stdout + r.stderr)[-3000:] if status != "passed" else None)
  return status in ("passed", "unsupported")


# compute-sanitizer's own failures to start on a machine (gVisor's "Device not supported", error 999):
# the tool is unsupported there, which is recorded, not a failure of ours.
_UNSUPPORTED = ("Device not supported", "not supported on this", "Failed to initialize", "LibraryNotLoaded",
                "error 999")


def sanitizer_verdict(rc: int, log: str, output: str) -> tuple[str, str]:
  """("passed" | "failed" | "unsupported", the tool's summary line) of one compute-sanitizer run.

  Failed: the error exit code (86), or a summary naming errors, warnings or hazards (racecheck's
  warnings are hazards too: the one it found on an H200 was a real overlap). Unsupported: the tool
  did not start on this machine. Anything else non-zero (the tests failed under it) is failed.
  """
  summary = next((ln.strip("= ") for ln in reversed(log.splitlines())
                  if "ERROR SUMMARY" in ln or "RACECHECK SUMMARY" in ln), "")
  clean = summary.endswith(" 0 errors") or summary.endswith("(0 errors, 0 warnings)")
  if rc == 86 or (summary and not clean):
    return "failed", summary
  if rc == 0:
    return ("passed", summary) if clean else ("failed", summary or "no summary line")
  if any(s in log + output for s in _UNSUPPORTED):
    return "unsupported", summary
  return "failed", summary


def benchmark(kit: Kit, have_gpu: bool) -> bool:
  js = kit.out / "codec_gpu.json"
  if not have_gpu:
    kit.stage("benchmark", "skipped", reason="no CUDA device")
    return True
  r = kit.run("benchmark", [sys.executable, "benchmarks/codec_gpu.py", "--reps", "15", "--json", str(js),
                            *BENCH_ARGS], env={"JAX_PLATFORMS": "cuda"})
  if r is None or not js.exists():
    kit.stage("benchmark", "failed", error="no time" if r is None else r.stderr[-3000:])
    return False
  rec = json.loads(js.read_text())
  gbps = {}
  for k in rec["kernels"]:
    gbps.setdefault(k["dtype"], {})[k["kernel"]] = {
        "gb_per_s": round(k["gb_per_s"], 1), "p25": round(k["p25_gb_per_s"], 1),
        "p75": round(k["p75_gb_per_s"], 1), "copy_gb_per_s": round(k["copy_gb_per_s"], 1),
        "ratio": round(k["ratio"], 4), "bit_exact": k["bit_exact"]}
  r1 = lambda v: None if v is None else round(v, 1)
  device = [{"kernel": k["kernel"], "dtype": k["dtype"], "mib": round(k["raw_bytes"] / 2**20, 2),
             "resolved": k["resolved"], "gb_per_s": r1(k["gb_per_s"]), "p25": r1(k["p25_gb_per_s"]),
             "p75": r1(k["p75_gb_per_s"]), "copy_gb_per_s": r1(k["copy_gb_per_s"]),
             "ratio": round(k["ratio"], 4), "bit_exact": k["bit_exact"]} for k in rec.get("kernels_device", [])]
  mem = {m["variant"]: m for m in rec["memory"]}
  verdicts = {f"{k['kernel']}:{k['dtype']}": k["bit_exact"] for k in rec["kernels"]}
  verdicts.update({f"device:{k['kernel']}:{k['dtype']}:{k['mib']}": k["bit_exact"] for k in device})
  verdicts["step"] = rec["step"]["bit_exact"]
  verdicts.update({f"plumbing:{q['transport']}": q["bit_exact"] for q in rec.get("plumbing", [])})
  verdicts.update({f"{c['op']}:{c['bytes_per_device']}:{c['transport']}": c["bit_exact"]
                   for c in rec["collectives"]})
  ok = r.returncode == 0 and all(verdicts.values())
  kit.stage("benchmark", "passed" if ok else "failed", command=rec["command"], device_kind=rec["device_kind"])
  kit.report["codec_gb_per_s"] = gbps
  kit.report["codec_device_timed"] = {"method": rec.get("device_timing"), "kernels": device}
  kit.report["codec_in_jitted_step"] = {k: rec["step"][k] for k in (
      "what", "raw_bytes", "capacity_bytes", "median_s", "gb_per_s", "p25_gb_per_s", "p75_gb_per_s",
      "codec_s_per_byte", "encode_gb_per_s", "decode_gb_per_s", "copy_gb_per_s", "bit_exact")}
  kit.report["collective_plumbing"] = [  # one GPU: what a compressed all_to_all adds to its codec
      {k: q[k] for k in ("transport", "raw_bytes", "capacity_bytes", "plumbing_s", "plumbing_p25_s",
                         "plumbing_p75_s", "bit_exact")}
      | {"collective_median_s": q["collective"]["median_s"], "codec_median_s": q["codec"]["median_s"],
         "copy_median_s": q["copy"]["median_s"], "collective_over_codec": q["collective_over_codec"]}
      for q in rec.get("plumbing", [])]
  kit.report["memory"] = memory_verdict(mem)
  kit.report["collectives"] = rec["collectives"]
  kit.report["bit_exact"] = verdicts
  return ok


def _ncu() -> str | None:
  found = shutil.which("ncu")
  cands = [*glob.glob("/usr/local/cuda*/bin/ncu"), *glob.glob("/opt/nvidia/nsight-compute/*/ncu")]
  return found or next((c for c in cands if os.access(c, os.X_OK)), None)


def profile(kit: Kit, have_gpu: bool) -> bool:
  """Where the codec's time goes: each zipccl kernel's GPU time (Nsight Compute, gpu__time_duration) for
  one 64 MB bfloat16 encode and decode. Informative: a machine without a working ncu skips it."""
  exe = _ncu()
  if not have_gpu or exe is None:
    kit.stage("profile", "skipped", reason="no CUDA device" if not have_gpu else "ncu not found")
    return True
  cmd = [exe, "--csv", "--print-units", "base", "--clock-control", "none", "--metrics", "gpu__time_duration.sum",
         "--kernel-name", "regex:zipccl", "--launch-skip", "0", "--launch-count", "200",
         sys.executable, "benchmarks/codec_gpu.py", "--kernels-only", "--dtypes", "bfloat16", "--kernel-mb", "64",
         "--reps", "2"]
  r = kit.run("profile", cmd, env={"JAX_PLATFORMS": "cuda"})
  if r is None or r.returncode != 0:
    kit.stage("profile", "unsupported", tail=(r.stdout + r.stderr)[-2000:] if r else "no time")
    return True
  kit.stage("profile", "passed", what="64 MB bfloat16: zipccl kernels' GPU time per launch (us), median",
            kernels=ncu_kernel_times(r.stdout), clocks="as found (--clock-control none)")
  # Why the three long kernels take that time: their first launch's stall reasons, issue rates and
  # occupancy (Nsight Compute's sections, one replay per section).
  cmd = [exe, "--csv", "--print-units", "base", "--clock-control", "none", *STALL_SECTIONS,
         "--kernel-name", f"regex:{STALL_KERNELS}", "--launch-count", "3",
         sys.executable, "benchmarks/codec_gpu.py", "--kernels-only", "--dtypes", "bfloat16", "--kernel-mb", "64",
         "--reps", "1"]
  # Buffers allocated one by one: with JAX's preallocated pool, ncu saves and restores the whole pool for
  # every replay of a kernel (one per section pass), which took past 90 s on an H200.
  r = kit.run("stalls", cmd, env={"JAX_PLATFORMS": "cuda", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                                  "XLA_PYTHON_CLIENT_ALLOCATOR": "platform"})
  if r is not None and r.returncode == 0:
    kit.report["stages"]["profile"]["stalls"] = ncu_section_metrics(r.stdout)
  return True


# The stalls run: Nsight Compute sections and the kernels they are read for (64 MB bfloat16, as above).
STALL_SECTIONS = ("--section", "SpeedOfLight", "--section", "Occupancy", "--section", "LaunchStats",
                  "--section", "SchedulerStats", "--section", "WarpStateStats")
STALL_KERNELS = "zipccl_(analyse|write|decode_block)"


def ncu_section_metrics(csv_text: str) -> dict:
  """{kernel: {section: {metric: "value unit"}}} of each kernel's first launch, from `ncu --csv` rows."""
  out: dict = {}
  first: dict[str, str] = {}
  rows = [ln for ln in csv_text.splitlines() if ln.startswith('"')]
  for row in csv.DictReader(io.StringIO("\n".join(rows))):
    k = row.get("Kernel Name")
    if not k or first.setdefault(k, row["ID"]) != row["ID"]:
      continue
    unit = row.get("Metric Unit") or ""
    out.setdefault(k, {}).setdefault(row["Section Name"], {})[row["Metric Name"]] = (
        f"{row['Metric Value']} {unit}".strip())
  return out


def ncu_kernel_times(csv_text: str) -> dict:
  """{kernel: {"launches", "median_us"}} from `ncu --csv --print-units base` rows of
  gpu__time_duration.sum (nanoseconds, printed with thousands separators: "752,000")."""
  per: dict[str, list[float]] = {}
  rows = [ln for ln in csv_text.splitlines() if ln.startswith('"')]
  for row in csv.DictReader(io.StringIO("\n".join(rows))):
    if row.get("Metric Name") == "gpu__time_duration.sum":
      per.setdefault(row["Kernel Name"], []).append(float(row["Metric Value"].replace(",", "")) / 1e3)
  return {k: {"launches": len(v), "median_us": sorted(v)[len(v) // 2]} for k, v in per.items()}


def memory_verdict(mem: dict) -> dict:
  """Each compressed variant's temp and peak against jax.lax's plus its frames (its capacity bytes)."""
  lax = mem.get("lax", {})
  out = {"variants": mem}
  for v in ("padded", "ragged"):
    m = mem.get(v, {})
    if "error" in m or "error" in lax or not m or not lax:
      continue
    out[f"{v}_temp_minus_lax_mib"] = ((m["temp_bytes"] or 0) - (lax["temp_bytes"] or 0)) / 2**20
    if m.get("peak_bytes_in_use") and lax.get("peak_bytes_in_use"):
      out[f"{v}_peak_minus_lax_mib"] = (m["peak_bytes_in_use"] - lax["peak_bytes_in_use"]) / 2**20
  return out


def main() -> int:
  out = Path(sys.argv[1]).resolve()
  out.mkdir(parents=True, exist_ok=True)
  kit = Kit(out)
  gpus = _cuda_devices()
  kit.report["gpus"] = gpus
  kit.report["versions_before"] = _versions()
  kit.say(f"python {sys.version.split()[0]} at {sys.executable}; GPUs: {gpus or 'none'}; "
          f"jax stack: {kit.report['versions_before']}")
  results = {"install": install(kit), "source_build": source_build(kit)}
  if results["install"]:
    shown = info(kit)
    results["info"] = shown is not None and not shown["cuda"]["problems"]
    have_gpu = bool(gpus) and shown is not None and bool(shown["cuda"]["kernels"])
    if gpus and not have_gpu:
      kit.say("a GPU is present but the build has no CUDA kernels: the GPU stages fail")
      results["kernels"] = False
    kit.report["have_gpu"] = have_gpu
    results["pytest"] = pytest_gpu(kit, have_gpu)
    results["memcheck"] = sanitize(kit, "memcheck", have_gpu)
    results["racecheck"] = sanitize(kit, "racecheck", have_gpu)
    results["benchmark"] = benchmark(kit, have_gpu)
    results["graphs"] = graphs(kit, have_gpu)
    results["profile"] = profile(kit, have_gpu)  # informative, never a failure: it gets what time is left
  kit.report["wall_s"] = round(time.monotonic() - T0, 1)
  kit.report["ok"] = all(results.values())
  kit.report["failed_stages"] = [k for k, v in results.items() if not v]
  (out / "gpu_report.json").write_text(json.dumps(kit.report, indent=1) + "\n")
  kit.say(f"{'OK' if kit.report['ok'] else 'FAILED: ' + ', '.join(kit.report['failed_stages'])} "
          f"in {kit.report['wall_s']} s; report: {out / 'gpu_report.json'}")
  return 0 if kit.report["ok"] else 1


if __name__ == "__main__":
  raise SystemExit(main())
