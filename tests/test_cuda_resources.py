"""Resource gate of the installed extension's CUDA kernels (issue 15, defect 3).

Reads every kernel's registers, stack frame and static shared memory from the cubins inside
zipccl_jax/_zipccl*.so with `cuobjdump --dump-resource-usage` (PATH, or the nvidia-cuda-cuobjdump wheel of the
test extra) and fails on a stack frame over 256 bytes (local memory the driver reserves for every resident
thread, outside XLA's pool) or static shared memory over 48 KB. Spills: cuobjdump does not report them, so
the build makes ptxas refuse them (-Xptxas=-warn-spills,-Werror) and this test checks that the cubins were
built with those options (cuobjdump prints them for each embedded PTX).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import zipccl_jax
from zipccl_jax import _zipccl as ext

MAX_STACK_BYTES = 256
MAX_STATIC_SHARED_BYTES = 48 * 1024
ARCHS = {"sm_80", "sm_90"}

pytestmark = pytest.mark.skipif(not ext.with_cuda, reason="extension built without CUDA kernels (no cubins)")


def _cuobjdump() -> str:
  found = shutil.which("cuobjdump")
  if found:
    return found
  for site in sys.path:
    for rel in ("nvidia/cu13/bin/cuobjdump", "nvidia/cuda_cuobjdump/bin/cuobjdump"):
      p = Path(site) / rel
      if p.is_file() and os.access(p, os.X_OK):
        return str(p)
  pytest.fail("cuobjdump not found: pip install nvidia-cuda-cuobjdump (in the [test] extra)")


def _extension() -> Path:
  return Path(ext.__file__)


def _dump() -> str:
  r = subprocess.run([_cuobjdump(), "--dump-resource-usage", str(_extension())], capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stderr
  return r.stdout


def _kernels(text: str) -> list[dict]:
  """One entry per (arch, function) of the ELF sections."""
  out, arch, in_elf = [], None, False
  lines = text.splitlines()
  for i, line in enumerate(lines):
    if line.startswith("Fatbin elf code"):
      in_elf = True
    elif line.startswith("Fatbin ptx code"):
      in_elf = False
    elif (m := re.match(r"arch = (sm_\d+)", line)):
      arch = m.group(1)
    elif in_elf and (m := re.match(r"\s*Function (\S+):", line)):
      fields = dict(re.findall(r"(\w+(?:\[\d+\])?):(\d+)", lines[i + 1]))
      out.append({"arch": arch, "name": m.group(1), **{k: int(v) for k, v in fields.items()}})
  return out


def _short(mangled: str) -> str:
  m = re.search(r"INS0_\d+(\w+?Kernel)(I[tjh]E)?", mangled)
  if m:
    return m.group(1) + {"ItE": "<u16>", "IjE": "<u32>", "IhE": "<u8>"}.get(m.group(2) or "", "")
  return mangled[:60]


def test_every_kernel_fits_the_resource_gate():
  kernels = _kernels(_dump())
  assert {k["arch"] for k in kernels} == ARCHS, kernels
  ours = [k for k in kernels if "zipccl" in k["name"]]
  assert len(ours) >= 2 * 13, [_short(k["name"]) for k in ours]  # 13 kernels of ours per arch
  table = "\n".join(f"{k['arch']} {_short(k['name']):28s} REG {k['REG']:3d} STACK {k['STACK']:5d} "
                    f"SHARED {k['SHARED']:6d}" for k in kernels)
  print(table)
  bad = [k for k in kernels
         if k["STACK"] > MAX_STACK_BYTES or k["SHARED"] > MAX_STATIC_SHARED_BYTES or k.get("LOCAL", 0)]
  assert not bad, "kernels over the gate:\n" + "\n".join(
      f"{k['arch']} {_short(k['name'])}: stack {k['STACK']} B, static shared {k['SHARED']} B, "
      f"local {k.get('LOCAL', 0)} B" for k in bad)


def test_plan_kernel_has_no_4kb_stack_frame_any_more():
  """Defect 3: BuildCodeLengths' arrays in local memory gave zipccl_plan a 4,640-byte stack frame."""
  plan = [k for k in _kernels(_dump()) if "PlanKernel" in k["name"]]
  assert {k["arch"] for k in plan} == ARCHS
  assert all(k["STACK"] <= MAX_STACK_BYTES for k in plan), plan
  assert all(k["SHARED"] > 5000 for k in plan), plan  # the work arrays moved to shared memory


def test_cubins_were_built_refusing_spills():
  text = _dump()
  opts = re.findall(r"ptxasOptions = (.*)", text)
  assert len(opts) == len(ARCHS), opts
  for o in opts:
    assert "-warn-spills" in o and "-Werror" in o, o


def test_the_gate_parses_a_kernel_over_it():
  """The parser sees what it must fail on (a recorded line of the shipped defect)."""
  sample = ("Fatbin elf code:\n================\narch = sm_90\nResource usage:\n"
            " Function _ZN6zipccl4cuda6KernelINS0_10PlanKernelEEEvNT_6ParamsE:\n"
            "  REG:40 STACK:4640 SHARED:0 LOCAL:0 CONSTANT[2]:8 CONSTANT[0]:472 TEXTURE:0 SURFACE:0 SAMPLER:0\n")
  (k,) = _kernels(sample)
  assert (k["arch"], k["REG"], k["STACK"], k["SHARED"]) == ("sm_90", 40, 4640, 0)
  assert _short(k["name"]) == "PlanKernel" and k["STACK"] > MAX_STACK_BYTES


def test_installed_extension_is_the_one_checked():
  assert Path(zipccl_jax.__file__).parent == _extension().parent
