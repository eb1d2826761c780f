"""The resource gate of the CUDA kernels (issue 15, defect 3), shared by tests/test_cuda_resources.py (the installed
extension's images) and tests/test_nvrtc_build.py (a CUDA 12 build's images).

Reads every kernel's registers, stack frame and static shared memory from CUBINs with
`cuobjdump --dump-resource-usage` (PATH, or the nvidia-cuda-cuobjdump wheel of the test extra) and reports a
stack frame over 256 bytes (local memory the driver reserves for every resident thread, outside XLA's pool),
static shared memory over 48 KB, or local memory. Spills: cuobjdump does not report them; ptxas refuses them
(cmake/nvrtc_build.py passes -warn-spills -Werror) and tests/test_nvrtc_build.py shows that it does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MAX_STACK_BYTES = 256
MAX_STATIC_SHARED_BYTES = 48 * 1024
# The extern "C" entries, per architecture, as the X-macro list of xla_ffi/codec/cuda_kernels.cuh names them.
KERNELS = tuple(re.findall(r"^\s*X\((zipccl_\w+),",
                           (Path(__file__).resolve().parents[1] / "xla_ffi/codec/cuda_kernels.cuh").read_text(),
                           re.M))
N_KERNELS = len(KERNELS)
assert KERNELS, "cuda_kernels.cuh: no X(zipccl_..., ...) entries (did the list change format?)"


def cuobjdump() -> str:
  found = shutil.which("cuobjdump")
  if found:
    return found
  for site in sys.path:
    for rel in ("nvidia/cu13/bin/cuobjdump", "nvidia/cuda_cuobjdump/bin/cuobjdump"):
      p = Path(site) / rel
      if p.is_file() and os.access(p, os.X_OK):
        return str(p)
  pytest.fail("cuobjdump not found: pip install nvidia-cuda-cuobjdump (in the [test] extra)")


def dump(cubin: Path) -> str:
  r = subprocess.run([cuobjdump(), "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stderr
  return r.stdout


def kernels(text: str, arch: str | None = None) -> list[dict]:
  """One entry per (arch, function): a bare CUBIN's dump names no arch (pass it), a fatbinary's does."""
  out, in_elf = [], True
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


def over_the_gate(ks: list[dict]) -> list[str]:
  return [f"{k['arch']} {k['name']}: stack {k['STACK']} B, static shared {k['SHARED']} B, local {k.get('LOCAL', 0)} B"
          for k in ks
          if k["STACK"] > MAX_STACK_BYTES or k["SHARED"] > MAX_STATIC_SHARED_BYTES or k.get("LOCAL", 0)]


def table(ks: list[dict]) -> str:
  return "\n".join(f"{k['arch']} {k['name']:26s} REG {k['REG']:3d} STACK {k['STACK']:5d} SHARED {k['SHARED']:6d}"
                   for k in ks)


def check_images(images: list[tuple[int, str, bytes]], tmp: Path) -> list[dict]:
  """Writes the (arch, kind, bytes) CUBINs to tmp, dumps them, asserts the gate; returns the kernels."""
  ks = []
  for arch, kind, data in images:
    if kind != "cubin":
      continue
    path = tmp / f"sm{arch}.cubin"
    path.write_bytes(data)
    ks += kernels(dump(path), f"sm_{arch}")
  print(table(ks))
  bad = over_the_gate(ks)
  assert not bad, "kernels over the gate:\n" + "\n".join(bad)
  return ks
