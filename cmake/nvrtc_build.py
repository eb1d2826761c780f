"""Compiles the zipccl CUDA kernels with NVRTC (libnvrtc.so.N through ctypes): the build step CMake runs.

    nvrtc_build.py --nvrtc LIB --version
        prints the CUDA version of that NVRTC ("12.9"); exit 1 if the library cannot be loaded.
    nvrtc_build.py --nvrtc LIB --src kernels.cu -I DIR --arch 80 --arch 90 --ptx-arch 80 --out DIR --images FILE.cc
        writes DIR/zipccl_sm80.cubin, DIR/zipccl_sm90.cubin, DIR/zipccl_compute80.ptx and FILE.cc, a C++ source
        that embeds exactly those files (.incbin) and lists them for codec/kernels_host.cc.

NVRTC compiles device code only and ships no C++ standard library, so the three standard headers the kernel
sources include (<cstddef>, <cstdint>, <cstring>) are given to it in memory, with the types they use.
ptxas runs inside NVRTC with -warn-spills -Werror: a kernel that spills fails the build, as nvcc's
-Xptxas=-warn-spills,-Werror did (tests/test_cuda_resources.py checks the options in the shipped PTX).
Needs only the Python standard library (it runs under pip's build isolation with -I).
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

PTXAS_OPTIONS = ("-warn-spills", "-Werror")

# What the kernels use of each header.
_STD_HEADERS = {
    "cstddef": "#pragma once\nnamespace std { using ::size_t; using ::ptrdiff_t; }\n",  # NVRTC declares both
    "cstdint": "#pragma once\n"
               "typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long long int64_t;\n"
               "typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;\n"
               "typedef unsigned long long uint64_t; typedef unsigned long uintptr_t; typedef long intptr_t;\n"
               "namespace std { using ::int8_t; using ::int16_t; using ::int32_t; using ::int64_t;\n"
               "  using ::uint8_t; using ::uint16_t; using ::uint32_t; using ::uint64_t; using ::uintptr_t;\n"
               "  using ::intptr_t; }\n",
    # memcpy/memset are device builtins under NVRTC; the kernels call them only from host-only branches.
    "cstring": "#pragma once\n",
}


class Nvrtc:
  def __init__(self, path: str):
    # libnvrtc dlopens libnvrtc-builtins.so.N.M by name, which the wheels' layout (no RPATH) does not find:
    # loading the one beside it first makes that name resolve to it.
    for builtins in sorted(Path(path).resolve().parent.glob("libnvrtc-builtins.so.*")):
      ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
    self.lib = ctypes.CDLL(path)
    self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p

  def _check(self, rc: int, what: str, log: str = "") -> None:
    if rc != 0:
      msg = self.lib.nvrtcGetErrorString(rc).decode()
      raise SystemExit(f"zipccl: NVRTC {what} failed: {msg}\n{log}")

  def version(self) -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value

  def compile(self, source: str, name: str, options: list[str], target: str) -> bytes:
    """target: "cubin" or "ptx"."""
    prog = ctypes.c_void_p()
    names = list(_STD_HEADERS)
    hdrs = (ctypes.c_char_p * len(names))(*[_STD_HEADERS[n].encode() for n in names])
    incs = (ctypes.c_char_p * len(names))(*[n.encode() for n in names])
    self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), len(names),
                                            hdrs, incs), "nvrtcCreateProgram")
    try:
      opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
      rc = self.lib.nvrtcCompileProgram(prog, len(options), opts)
      log = self._log(prog)
      self._check(rc, f"compile ({' '.join(options)})", log)
      if log.strip():
        print(log, file=sys.stderr)
      get_size, get = ((self.lib.nvrtcGetCUBINSize, self.lib.nvrtcGetCUBIN) if target == "cubin" else
                       (self.lib.nvrtcGetPTXSize, self.lib.nvrtcGetPTX))
      size = ctypes.c_size_t()
      self._check(get_size(prog, ctypes.byref(size)), f"get {target} size")
      buf = ctypes.create_string_buffer(size.value)
      self._check(get(prog, buf), f"get {target}")
      data = buf.raw
      return data.rstrip(b"\0") if target == "ptx" else data
    finally:
      self.lib.nvrtcDestroyProgram(ctypes.byref(prog))

  def _log(self, prog) -> str:
    size = ctypes.c_size_t()
    if self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) != 0 or size.value <= 1:
      return ""
    buf = ctypes.create_string_buffer(size.value)
    self.lib.nvrtcGetProgramLog(prog, buf)
    return buf.value.decode(errors="replace")


def _options(includes: list[str], arch: str) -> list[str]:
  # -default-device: the shared headers' unannotated inline functions (layouts, messages) are host code that
  # no kernel calls; NVRTC refuses host functions unless they count as device functions.
  return ["-std=c++17", "-default-device", f"--gpu-architecture={arch}", *[f"-I{d}" for d in includes],
          *[f"--ptxas-options={o}" for o in PTXAS_OPTIONS]]


def _images_source(images: list[tuple[str, int, Path]]) -> str:
  """C++ source embedding the images: (kind "cubin"/"ptx", arch, file)."""
  asm, decls, rows = [], [], []
  for i, (kind, arch, path) in enumerate(images):
    sym = f"zipccl_kernel_image_{i}"
    asm += [f'  ".globl {sym}\\n.hidden {sym}\\n.balign 64\\n{sym}:\\n"',
            f'  ".incbin \\"{path.resolve().as_posix()}\\"\\n"',
            # PTX is loaded as a NUL-terminated string; a cubin's size is its file's.
            f'  "{sym}_end:\\n.byte 0\\n.globl {sym}_end\\n.hidden {sym}_end\\n"']
    decls.append(f'extern "C" const unsigned char {sym}[], {sym}_end[];')
    rows.append(f'    {{{arch}, {"true" if kind == "ptx" else "false"}, {sym}, size_t({sym}_end - {sym})}},')
  return "\n".join([
      "// Generated by cmake/nvrtc_build.py: the kernel images NVRTC built, embedded byte for byte.",
      '#include "kernel_images.h"', "",
      '__asm__(".section .rodata\\n"', *asm, '  ".text\\n");', "", *decls, "",
      "namespace zipccl::cuda {", "const KernelImage* KernelImages(int* count) {",
      "  static const KernelImage images[] = {", *rows, "  };",
      "  *count = int(sizeof(images) / sizeof(images[0]));", "  return images;", "}",
      "}  // namespace zipccl::cuda", ""])


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--nvrtc", required=True)
  ap.add_argument("--version", action="store_true")
  ap.add_argument("--src")
  ap.add_argument("-I", dest="includes", action="append", default=[])
  ap.add_argument("--arch", action="append", default=[], type=int)
  ap.add_argument("--ptx-arch", type=int)
  ap.add_argument("--out")
  ap.add_argument("--images")
  a = ap.parse_args()
  try:
    nvrtc = Nvrtc(a.nvrtc)
  except OSError as e:
    raise SystemExit(f"zipccl: cannot load NVRTC '{a.nvrtc}': {e}")
  if a.version:
    print("%d.%d" % nvrtc.version())
    return
  src = Path(a.src)
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  source = src.read_text()
  images = []
  for arch in a.arch:
    path = out / f"zipccl_sm{arch}.cubin"
    path.write_bytes(nvrtc.compile(source, src.name, _options(a.includes, f"sm_{arch}"), "cubin"))
    images.append(("cubin", arch, path))
  if a.ptx_arch:
    path = out / f"zipccl_compute{a.ptx_arch}.ptx"
    path.write_bytes(nvrtc.compile(source, src.name, _options(a.includes, f"compute_{a.ptx_arch}"), "ptx"))
    images.append(("ptx", a.ptx_arch, path))
  Path(a.images).write_text(_images_source(images))


if __name__ == "__main__":
  main()
