"""Resource gate of the installed extension's CUDA kernels (issue 15, defect 3): tests/cuda_gate.py applied to
exactly the CUBINs the extension embeds and loads (`_zipccl.cuda_images()`, the bytes cuLibraryLoadData gets).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import zipccl_jax
from zipccl_jax import _zipccl as ext

import cuda_gate

ARCHS = {"sm_80", "sm_90"}

pytestmark = pytest.mark.skipif(not ext.with_cuda, reason="extension built without CUDA kernels (no cubins)")


def test_every_kernel_fits_the_resource_gate(tmp_path):
  ks = cuda_gate.check_images(ext.cuda_images(), tmp_path)
  assert {k["arch"] for k in ks} == ARCHS, ks
  names = {k["name"] for k in ks}
  assert len(ks) == len(ARCHS) * cuda_gate.N_KERNELS and names == set(cuda_gate.KERNELS), names


def test_plan_kernel_has_no_4kb_stack_frame_any_more(tmp_path):
  """Defect 3: BuildCodeLengths' arrays in local memory gave the plan kernel a 4,640-byte stack frame (the
  plan is now a phase of zipccl_analyse)."""
  plan = [k for k in cuda_gate.check_images(ext.cuda_images(), tmp_path) if k["name"].startswith("zipccl_analyse")]
  assert {k["arch"] for k in plan} == ARCHS
  assert all(k["STACK"] <= cuda_gate.MAX_STACK_BYTES for k in plan), plan
  assert all(k["SHARED"] > 5000 for k in plan), plan  # the work arrays moved to shared memory


def test_cubins_for_sm80_and_sm90_and_ptx():
  """The images NVRTC built, as the extension embeds them: CUDA ELF cubins per arch and the PTX fallback."""
  images = ext.cuda_images()
  assert [(a, k) for a, k, _ in images] == [(80, "cubin"), (90, "cubin"), (80, "ptx")]
  for arch, kind, data in images:
    if kind == "cubin":
      assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == 190, arch  # EM_CUDA
    else:
      text = data.decode()
      assert ".target sm_80" in text and ".visible .entry zipccl_scan(" in text
  assert [int(a) for a in ext.build_info()["cuda_archs"].split(",")] == [a for a, k, _ in images if k == "cubin"]


def test_the_gate_parses_a_kernel_over_it():
  """The parser sees what it must fail on (a recorded line of the shipped defect)."""
  sample = ("Resource usage:\n Function zipccl_plan:\n"
            "  REG:40 STACK:4640 SHARED:0 LOCAL:0 CONSTANT[2]:8 CONSTANT[0]:472 TEXTURE:0 SURFACE:0 SAMPLER:0\n")
  (k,) = cuda_gate.kernels(sample, "sm_90")
  assert (k["arch"], k["name"], k["REG"], k["STACK"], k["SHARED"]) == ("sm_90", "zipccl_plan", 40, 4640, 0)
  assert cuda_gate.over_the_gate([k]) == ["sm_90 zipccl_plan: stack 4640 B, static shared 0 B, local 0 B"]


def test_installed_extension_is_the_one_checked():
  assert Path(zipccl_jax.__file__).parent == Path(ext.__file__).parent
