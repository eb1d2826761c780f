"""zipccl_jax collectives across processes: jax.distributed on 127.0.0.1, CPU collectives over gloo.

tests/mp_launch.py starts the ranks (free port, one session per child, bounded by a timeout, children
killed at the end); tests/mp_worker.py runs every collective next to its jax.lax twin and checks the shards
it holds bit for bit. Payloads are modest (8 x 1024 BF16 per device) because 2 cores are shared.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from mp_launch import launch, results

HERE = Path(__file__).resolve().parent
TIMEOUT = 300


@pytest.mark.parametrize("nproc,local_devices", [(2, 2), (4, 1)], ids=["2x2", "4x1"])
def test_collectives_across_processes(nproc, local_devices):
  for res in results(launch(HERE / "mp_worker.py", nproc, local_devices, timeout=TIMEOUT)):
    assert res["devices"] == nproc * local_devices and res["checks"]
    assert all(res["checks"].values()), f"rank {res['rank']}: failed checks {res['checks']}"


def test_launcher_kills_hung_children(tmp_path):
  """A rank that never finishes is killed at the timeout; the others' results are still returned."""
  script = tmp_path / "hang.py"
  script.write_text(
      "import argparse, time\n"
      "ap = argparse.ArgumentParser()\n"
      "for a in ('--rank', '--nproc', '--port', '--local-devices'):\n"
      "  ap.add_argument(a, type=int)\n"
      "a = ap.parse_args()\n"
      "print('started', a.rank, flush=True)\n"
      "if a.rank == 1:\n"
      "  time.sleep(600)\n")
  results = launch(script, 2, 1, timeout=5)
  assert results[0].returncode == 0 and "started 0" in results[0].stdout
  assert results[1].returncode is None and "started 1" in results[1].stdout
