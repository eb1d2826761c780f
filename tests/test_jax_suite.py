"""tests/jax_suite/run.py, the harness that runs JAX's own collective tests with zipccl_jax swapped in:

- it fails with a clear message (exit 2, no traceback) when it cannot obtain JAX's test files, and refuses
  to fetch them into this repository;
- end to end on a stand-in for JAX's tests/ (one small file, given with --jax-src): the rewritten calls reach
  zipccl_jax, the runs under jax.lax, raw and compressed pass with no bit mismatch, and a test that calls no
  collective is left out of the suite.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUN = HERE / "jax_suite" / "run.py"

TINY_TEST = '''
from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import test_util as jtu
from jax.sharding import NamedSharding, PartitionSpec as P


class TinyTest(jtu.JaxTestCase):

  def test_all_gather(self):
    mesh = jax.make_mesh((8,), ("i",))
    f = jax.jit(jax.shard_map(lambda x: lax.all_gather(x, "i", tiled=True), mesh=mesh, in_specs=P("i"),
                              out_specs=P("i")))
    x = jax.device_put(jnp.arange(8 * 256, dtype=jnp.float32).reshape(8, 256) / 7, NamedSharding(mesh, P("i")))
    self.assertArraysEqual(f(x), np.tile(np.asarray(x), (8, 1)))

  def test_psum(self):
    mesh = jax.make_mesh((8,), ("i",))
    f = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))
    x = jax.device_put(jnp.ones((8, 256), jnp.bfloat16), NamedSharding(mesh, P("i")))
    self.assertAllClose(f(x), np.full((1, 256), 8, jnp.bfloat16))

  def test_no_collective(self):
    self.assertAllClose(jnp.arange(3) + 1, np.array([1, 2, 3]))


if __name__ == "__main__":
  absltest.main()
'''


def _run(*args, timeout=600):
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "ZIPCCL_SUITE_MODE")}
  return subprocess.run([sys.executable, str(RUN), *map(str, args)], capture_output=True, text=True,
                        env=env, timeout=timeout)


def test_missing_jax_src_fails_clearly(tmp_path):
  proc = _run("--jax-src", tmp_path / "nowhere", "--out", tmp_path / "out")
  assert proc.returncode == 2, proc.stderr
  assert "--jax-src" in proc.stderr and "no such directory" in proc.stderr
  assert "Traceback" not in proc.stderr


def test_jax_src_without_tests_or_tag_fails_clearly(tmp_path):
  plain = tmp_path / "plain"
  plain.mkdir()
  proc = _run("--jax-src", plain, "--out", tmp_path / "out")
  assert proc.returncode == 2 and "neither a git repository nor a directory holding tests/" in proc.stderr
  repo = tmp_path / "repo"
  repo.mkdir()
  subprocess.run(["git", "init", "-q", str(repo)], check=True)
  proc = _run("--jax-src", repo, "--out", tmp_path / "out")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
  import jax
  assert f"jax-v{jax.__version__}" in proc.stderr


def test_refuses_to_fetch_into_the_repository(tmp_path):
  out = HERE / "jax_suite" / "fetched_here"
  proc = _run("--jax-src", tmp_path, "--out", out)
  assert proc.returncode == 2 and "inside the repository" in proc.stderr, proc.stderr
  assert not out.exists()


def test_end_to_end_on_a_small_test_file(tmp_path):
  (tmp_path / "jax" / "tests").mkdir(parents=True)
  (tmp_path / "jax" / "tests" / "tiny_test.py").write_text(TINY_TEST)
  out = tmp_path / "out"
  proc = _run("--jax-src", tmp_path / "jax", "--out", out, "--files", "tiny_test.py", "--modes", "compressed")
  assert proc.returncode == 0, proc.stderr[-4000:]
  result = json.loads((out / "results.json").read_text())
  assert result["rewritten"] == {"tests/tiny_test.py": 2}
  rows = {t["nodeid"].rsplit("::", 1)[-1]: t for t in result["tests"]}
  assert sorted(rows) == ["test_all_gather", "test_psum"]  # test_no_collective calls none
  assert rows["test_all_gather"]["calls"] == ["all_gather"] and rows["test_psum"]["calls"] == ["psum"]
  for row in rows.values():
    assert row["lax"] == row["compressed"] == "passed", row
    assert row["compressed_compared"] == 1 and row["compressed_mismatches"] == 0, row
  assert not (Path(RUN).parent / "src").exists()  # nothing fetched next to the harness
