"""Running a training example the way the example tests do: in a subprocess (it sets its own device count
before JAX is imported, so an inherited XLA_FLAGS is dropped), writing its --json result, which is returned.
Shared by tests/test_examples.py and tests/test_moe_nnx.py.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300


def run_example(script: Path, out_dir: Path, *args: str, timeout: int = TIMEOUT) -> dict:
  out = out_dir / "result.json"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["PYTHONUNBUFFERED"] = "1"
  cmd = [sys.executable, str(script), "--json", str(out), *args]
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, f"{' '.join(cmd)}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
  return json.loads(out.read_text())


def loss_bits(losses) -> list[str]:
  """float32 bit patterns of the losses, as hex (losses compare as bits, never approximately)."""
  return [struct.pack("<f", x).hex() for x in losses]
