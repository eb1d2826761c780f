"""The GPU proof kit (.ci/gpu_check.sh, issue 27) off the GPU: its verdicts on what the tools printed on an
H200 (tests/data/gpu_kit/, from the kit's runs there), and a rehearsal on this machine, where every GPU stage
must skip for want of a device and the report must still be complete.

The full rehearsal (Python 3.12 + jax 0.11.2, the carried wheel, the network cut) is .ci/gpu_rehearsal.sh.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "gpu_kit"


def _kit():
  spec = importlib.util.spec_from_file_location("gpu_check", ROOT / ".ci" / "gpu_check.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


KIT = _kit()


def test_ncu_kernel_times_from_an_h200_run():
  """ncu prints nanoseconds with thousands separators ("753,792"): one entry per kernel, in us."""
  times = KIT.ncu_kernel_times((DATA / "ncu_h200.csv").read_text())
  assert set(times) >= {"zipccl_decode_block_u16", "zipccl_hist_u16", "zipccl_plan", "zipccl_write_u16"}
  dec = times["zipccl_decode_block_u16"]
  assert dec["launches"] == 1 and dec["median_us"] == 753.792, dec
  assert times["zipccl_scan"]["launches"] == 2  # encode's and decode's
  assert KIT.ncu_kernel_times("==PROF== Disconnected\n") == {}


def test_ncu_section_metrics_keep_each_kernels_first_launch():
  """The stalls run's rows (ncu's --csv details page): metric value and unit per section, first launch only."""
  head = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
  row = ('"{id}","1","python3.12","h","{k}","1","14","(128, 1, 1)","(512, 1, 1)","0","9.0","{sec}","{m}",'
         '"{u}","{v}"')
  text = "\n".join(["==PROF== Connected", head,
                    row.format(id=0, k="zipccl_analyse_u16", sec="Occupancy", m="Achieved Occupancy", u="%", v="10.5"),
                    row.format(id=1, k="zipccl_decode_block_u16", sec="WarpStateStats",
                               m="Stall Long Scoreboard", u="cycle", v="1,234.5"),
                    row.format(id=1, k="zipccl_decode_block_u16", sec="Occupancy", m="Block Limit Registers",
                               u="block", v="7"),
                    row.format(id=2, k="zipccl_decode_block_u16", sec="Occupancy", m="Block Limit Registers",
                               u="block", v="9"),
                    row.format(id=3, k="zipccl_write_u16", sec="SpeedOfLight", m="Duration", u="", v="180")])
  got = KIT.ncu_section_metrics(text)
  assert got == {"zipccl_analyse_u16": {"Occupancy": {"Achieved Occupancy": "10.5 %"}},
                 "zipccl_decode_block_u16": {"WarpStateStats": {"Stall Long Scoreboard": "1,234.5 cycle"},
                                             "Occupancy": {"Block Limit Registers": "7 block"}},
                 "zipccl_write_u16": {"SpeedOfLight": {"Duration": "180"}}}
  assert KIT.ncu_section_metrics("==PROF== Disconnected\n") == {}


@pytest.mark.parametrize("log, rc, output, want", [
    ("racecheck_hazards_h200.log", 86, "", "failed"),   # the Plan kernel's overlap, before its fix
    ("racecheck_clean_h200.log", 0, "", "passed"),
    ("memcheck_clean_h200.log", 0, "", "passed"),
    (None, 1, "========= Error: Device not supported", "unsupported"),  # gVisor machines
    (None, 1, "FAILED test_gpu.py::test_codec_bytes_equal_cpu_driver[cuda-bfloat16]", "failed"),
    (None, 0, "", "failed"),  # no summary line: nothing shows the tool ran
], ids=["hazards", "racecheck-clean", "memcheck-clean", "unsupported", "tests-failed", "no-summary"])
def test_sanitizer_verdicts(log, rc, output, want):
  text = (DATA / log).read_text() if log else ""
  status, summary = KIT.sanitizer_verdict(rc, text, output)
  assert status == want, (status, summary)
  if log:
    assert "SUMMARY" in summary


def test_junit_counts_of_the_h200_run():
  res = KIT.junit_counts(DATA / "pytest_gpu_h200.xml")
  assert (res["passed"], res["failed"], res["errors"], res["skipped"]) == (29, 0, 0, 6), res
  assert res["first_failure"] is None
  assert res["skip_reasons"] == {"needs at least 2 cuda devices, found 1": 5,
                                 "needs at least 2 CUDA devices, found 1": 1}


def test_memory_verdict_differences_in_mib():
  mem = {"lax": {"temp_bytes": 0, "peak_bytes_in_use": 2**20},
         "padded": {"temp_bytes": 3 * 2**20, "peak_bytes_in_use": 5 * 2**20},
         "ragged": {"error": "boom"}}
  v = KIT.memory_verdict(mem)
  assert v["padded_temp_minus_lax_mib"] == 3 and v["padded_peak_minus_lax_mib"] == 4
  assert "ragged_temp_minus_lax_mib" not in v


def test_rehearsal_without_a_gpu(tmp_path):
  """The kit against this Python's zipccl_jax (ZIPCCL_KIT_INSTALLED), no GPU: it exits 0, the GPU stages
  are skipped for want of a device, and the report names this JAX and every stage."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(ZIPCCL_KIT_INSTALLED="1", PYTHON=sys.executable, JAX_PLATFORMS="cpu")
  r = subprocess.run(["bash", str(ROOT / ".ci" / "gpu_check.sh"), str(tmp_path)], capture_output=True,
                     text=True, timeout=600, env=env)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
  rep = json.loads((tmp_path / "gpu_report.json").read_text())
  import jax
  assert rep["ok"] and rep["versions"]["jax"] == jax.__version__ and rep["have_gpu"] is False
  assert set(rep["stages"]) == {"install", "source_build", "info", "pytest", "memcheck", "racecheck",
                                "benchmark", "profile", "graphs"}
  for stage in ("memcheck", "racecheck", "benchmark", "profile", "graphs"):
    assert rep["stages"][stage] == {"status": "skipped", "reason": "no CUDA device"}, stage
  py = rep["stages"]["pytest"]
  assert py["status"] == "passed" and py["passed"] == 0 and py["skipped"] >= 30 and not py["gpu_tests_ran"]
  assert (tmp_path / "gpu_check.log").read_text().count("pytest:") >= 2


@pytest.mark.parametrize("stdout, rc, want", [
    ("7 passed, 6 skipped, 60 deselected in 13.84s\n", 0, "passed"),
    # The first H200 run: a leftover profiler target held the GPU, JAX saw no device, every test skipped.
    ("13 skipped, 60 deselected in 5.97s\n", 0, "failed"),
    ("1 failed, 6 passed in 20.00s\n", 1, "failed"),
])
def test_graphs_stage_fails_unless_its_tests_ran(tmp_path, monkeypatch, stdout, rc, want):
  kit = KIT.Kit(tmp_path)
  monkeypatch.setattr(kit, "run", lambda stage, cmd, **kw: subprocess.CompletedProcess(cmd, rc, stdout, ""))
  assert KIT.graphs(kit, have_gpu=True) is (want == "passed")
  assert kit.report["stages"]["graphs"]["status"] == want


def test_a_timed_out_stage_leaves_no_process_behind(tmp_path, monkeypatch):
  """A stage past its limit is killed with everything it started (ncu's target once held the GPU)."""
  monkeypatch.setattr(KIT, "T0", time.monotonic())  # the kit's budget counts from now, not from the import
  kit = KIT.Kit(tmp_path)
  marker = f"sleep 7{os.getpid() % 1000}"
  r = kit.run("stalls", ["bash", "-c", f"({marker} &); {marker}"], limit=10.5)
  assert r.returncode == 124
  left = subprocess.run(["pgrep", "-f", f"^{marker}$"], capture_output=True, text=True)
  assert left.stdout.strip() == "", left.stdout
