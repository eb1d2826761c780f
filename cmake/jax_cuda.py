"""Chooses the NVRTC that compiles the CUDA kernels, so that they match the installed JAX (cmake/cuda_toolkit.cmake).

Prints KEY=VALUE lines:
  PLUGIN=<major>|<distribution>|<version>  of the installed JAX CUDA plugin (jax-cuda12-plugin, ...), or empty
  NVRTC=<path of libnvrtc.so.N>            the choice, or empty
  NVRTC_VERSION=<major.minor>              its CUDA version
  NOTE=<why this one, or why none>
With a plugin of CUDA major N, only an NVRTC N will do: the kernels then need exactly the driver the plugin
needs. Without a plugin, the newest NVRTC found. Candidates, in order: $ZIPCCL_NVRTC (a library path), the
NVIDIA wheels in this Python environment (nvidia-cuda-nvrtc-cu12: nvidia/cuda_nvrtc/lib/libnvrtc.so.12;
nvidia-cuda-nvrtc (13): nvidia/cu13/lib/libnvrtc.so.13), then toolkits ($ZIPCCL_CUDA_HOME, $CUDA_HOME,
$CUDA_PATH, the one of nvcc on PATH, /usr/local/cuda*). CMake runs this with -I, so that under pip's build
isolation it still sees the target environment's packages (the plugin and the wheels), and passes the build
environment's sys.path, where pip put the build requirement nvidia-cuda-nvrtc (CUDA 13), as argv[1].
"""

from __future__ import annotations

import glob
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
from pathlib import Path

MAJORS = (13, 12)
_BUILD = Path(__file__).with_name("nvrtc_build.py")


def plugin() -> tuple[int, str, str] | None:
  for major in MAJORS:
    for dist in (f"jax-cuda{major}-plugin", f"jax_cuda{major}_plugin"):
      try:
        return major, dist.replace("_", "-"), md.version(dist)
      except md.PackageNotFoundError:
        continue
  return None


def _wheel_libs(site: str) -> list[Path]:
  return [Path(site) / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13",
          Path(site) / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"]


def _toolkit_libs(home: str) -> list[Path]:
  out = []
  for lib in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
    out += sorted(Path(p) for p in glob.glob(os.path.join(home, lib, "libnvrtc.so.[0-9]*")))
  return out


def candidates(env: dict[str, str], sys_path: list[str]) -> list[Path]:
  out = [Path(env["ZIPCCL_NVRTC"])] if env.get("ZIPCCL_NVRTC") else []
  for site in sys_path:
    out += _wheel_libs(site)
  homes = [env[k] for k in ("ZIPCCL_CUDA_HOME", "CUDA_HOME", "CUDA_PATH") if env.get(k)]
  nvcc = shutil.which("nvcc", path=env.get("PATH"))
  if nvcc:
    homes.append(str(Path(os.path.realpath(nvcc)).parent.parent))
    # A wrapper script (`exec /usr/local/cuda-13.0/bin/nvcc "$@"`) hides the toolkit behind it.
    try:
      text = Path(nvcc).read_text(errors="ignore")[:4096]
      homes += [str(Path(w).parent.parent) for w in text.split() if w.endswith("/bin/nvcc")]
    except OSError:
      pass
  homes += sorted(glob.glob("/usr/local/cuda*"))
  for home in homes:
    out += _toolkit_libs(home)
  seen, unique = set(), []
  for p in out:
    if p.is_file() and str(p) not in seen:
      seen.add(str(p))
      unique.append(p)
  return unique


def version(lib: Path) -> str | None:
  """NVRTC's CUDA version ("12.9"), asked in a child process (loading it here could clash with another)."""
  r = subprocess.run([sys.executable, "-I", str(_BUILD), "--nvrtc", str(lib), "--version"], capture_output=True,
                     text=True, timeout=120)
  return r.stdout.strip() if r.returncode == 0 else None


def choose(plug: tuple[int, str, str] | None, found: list[tuple[Path, str]]) -> tuple[Path | None, str, str]:
  """(library, version, note) from the plugin and the (library, version) candidates in order."""
  tried = ", ".join(f"{p} ({v})" for p, v in found) or "none found"
  if plug:
    major, dist, ver = plug
    for p, v in found:
      if v.split(".")[0] == str(major):
        return p, v, f"NVRTC {v} to match {dist} {ver}"
    return None, "", (f"{dist} {ver} needs CUDA {major} kernels and no NVRTC {major} was found (tried: {tried}); "
                      f"pip install nvidia-cuda-nvrtc{'-cu12' if major == 12 else ''} (the cuda{major} extra) "
                      f"or set ZIPCCL_NVRTC to a libnvrtc.so.{major}")
  for major in MAJORS:
    for p, v in found:
      if v.split(".")[0] == str(major):
        return p, v, f"NVRTC {v}, the newest found (no JAX CUDA plugin installed)"
  return None, "", (f"no NVRTC found (tried: {tried}): a CPU-only build. For the CUDA kernels install JAX's "
                    "CUDA plugin first (pip install 'jax[cuda12]'), or build with ZIPCCL_CUDA=13 (or 12) "
                    "pip install ., or set ZIPCCL_NVRTC to a libnvrtc.so")


def main() -> None:
  # argv[1], if given: the build environment's sys.path (os.pathsep-joined), searched after this one's. Under
  # pip's build isolation that is where the build requirement nvidia-cuda-nvrtc is (pyproject.toml).
  build_path = sys.argv[1].split(os.pathsep) if len(sys.argv) > 1 and sys.argv[1] else []
  plug = plugin()
  found = [(p, v) for p in candidates(dict(os.environ), sys.path + build_path) if (v := version(p))]
  lib, ver, note = choose(plug, found)
  print("PLUGIN=" + ("|".join(map(str, plug)) if plug else ""))
  print(f"NVRTC={lib or ''}")
  print(f"NVRTC_VERSION={ver}")
  print(f"NOTE={note}")


if __name__ == "__main__":
  main()
