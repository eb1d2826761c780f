"""Finds the XLA FFI headers to compile against: those of the jaxlib that will run the extension (CMakeLists.txt).

Prints KEY=VALUE lines:
  INCLUDE=<jaxlib's include directory, holding xla/ffi/api/ffi.h>
  VERSION=<that jaxlib's version>
  FROM=target|build   the target environment's jaxlib, or (none there) the build environment's
XLA checks the sizes of the FFI structs at call time (XLA_FFI_CallFrame and the others) and the API changed between
jaxlib 0.11.0 (FFI API 0.3), 0.11.2 (0.4) and 0.12 (0.5), so the headers must be those of the jaxlib beside which the
extension is installed. Under pip's build isolation the build environment holds its own jaxlib (the build
requirement), which need not be the user's. CMake therefore runs this with -I: PYTHONPATH, through which pip
exposes the build environment, is ignored, and sys.path is the target environment's (the interpreter pip runs
for). The build environment's sys.path comes as argv[1] and is searched only when the target has no jaxlib
(a fresh environment: pip then installs the newest jaxlib in range, as it did for the build).
Nothing is imported from jaxlib: its directory and metadata are enough, and importing it would load XLA.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys
from pathlib import Path


def find(paths: list[str]) -> tuple[Path, str] | None:
  """(include dir, version) of the first jaxlib on `paths` that has the FFI headers."""
  for site in paths:
    inc = Path(site) / "jaxlib" / "include"
    if not (inc / "xla" / "ffi" / "api" / "ffi.h").is_file():
      continue
    for dist in md.distributions(path=[site]):
      if (dist.metadata["Name"] or "").lower() == "jaxlib":
        return inc, dist.version
    return inc, ""
  return None


def main() -> None:
  build_path = sys.argv[1].split(os.pathsep) if len(sys.argv) > 1 and sys.argv[1] else []
  for where, paths in (("target", sys.path), ("build", build_path)):
    got = find([p for p in paths if p])
    if got:
      print(f"INCLUDE={got[0]}\nVERSION={got[1]}\nFROM={where}")
      return
  print("INCLUDE=\nVERSION=\nFROM=")


if __name__ == "__main__":
  main()
