"""Launches N local processes under ``jax.distributed`` (CPU, gloo) and collects what they print.

    python tests/mp_launch.py --nproc 2 --local-devices 2 tests/mp_worker.py [worker args...]

Each child runs ``python SCRIPT --rank R --nproc N --port P --local-devices D [worker args...]`` with
``XLA_FLAGS=--xla_force_host_platform_device_count=D`` (any other XLA flags kept) and ``PYTHONPATH`` led by
the directory of the ``zipccl_jax`` package this launcher imports, so the children test the same copy.

A worker starts with ``start_worker()`` (those four arguments and its own, then ``jax.distributed``) and
prints one line with ``report(dict)``; the test reads every rank's with ``results(launch(...))``.

Safety: the coordinator port is a free port on 127.0.0.1 picked by the OS; every child gets its own
session (process group) and is killed, with its group, when the run ends, fails or exceeds the timeout.
Nothing else is touched.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

DEVICE_FLAG = "--xla_force_host_platform_device_count"
RESULT = "RESULT "  # the prefix of a worker's one result line
LAUNCHER_ARGS = ("--rank", "--nproc", "--port", "--local-devices")


@dataclasses.dataclass
class ChildResult:
  rank: int
  returncode: int | None  # None: killed (timeout, or another rank failed first)
  stdout: str
  stderr: str


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def child_env(local_devices: int, platform: str = "cpu") -> dict:
  """The children's environment. platform "cpu": `local_devices` virtual CPU devices each (gloo between
  processes); "cuda": JAX on CUDA (NCCL between processes), the GPUs given by `rank_env`."""
  env = dict(os.environ)
  flags = re.sub(rf"{DEVICE_FLAG}=\S+", "", env.get("XLA_FLAGS", "")).strip()
  env["XLA_FLAGS"] = (f"{flags} {DEVICE_FLAG}={local_devices}" if platform == "cpu" else flags).strip()
  env["JAX_PLATFORMS"] = platform
  if platform == "cuda":  # the parent (pytest) may hold 75% of each GPU already: allocate on demand
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  env["PYTHONUNBUFFERED"] = "1"
  try:  # children import the zipccl_jax this process would import
    import importlib.util
    spec = importlib.util.find_spec("zipccl_jax")
    if spec is not None and spec.origin:
      pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(spec.origin)))
      env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + [p for p in env.get("PYTHONPATH", "").split(
          os.pathsep) if p])
  except Exception:  # noqa: BLE001 - fall back to the inherited path
    pass
  return env


def _kill(proc: subprocess.Popen) -> None:
  if proc.poll() is not None:
    return
  try:
    os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and its descendants only
  except (ProcessLookupError, PermissionError):
    pass
  try:
    proc.wait(timeout=10)
  except subprocess.TimeoutExpired:
    pass


def rank_env(platform: str, rank: int, local_devices: int) -> dict:
  """Per-rank variables: on "cuda", rank r sees GPUs [r * local_devices, (r + 1) * local_devices)."""
  if platform != "cuda":
    return {}
  return {"CUDA_VISIBLE_DEVICES": ",".join(str(rank * local_devices + i) for i in range(local_devices))}


def launch(script, nproc: int, local_devices: int, args=(), *, timeout: float = 300.0,
           port: int | None = None, platform: str = "cpu") -> list[ChildResult]:
  """Runs `script` in `nproc` processes; returns one ChildResult per rank.

  The whole run is bounded by `timeout` seconds. If a rank exits with an error the others are
  killed at once (they would wait for it in a collective). platform: "cpu" (virtual devices, gloo) or
  "cuda" (local_devices GPUs per process, NCCL).
  """
  port = port or free_port()
  env = child_env(local_devices, platform)
  procs, outs = [], []
  with tempfile.TemporaryDirectory(prefix="zipccl_mp_") as tmp:
    try:
      for rank in range(nproc):
        out = open(os.path.join(tmp, f"{rank}.out"), "w+")
        err = open(os.path.join(tmp, f"{rank}.err"), "w+")
        outs.append((out, err))
        cmd = [sys.executable, str(script), "--rank", str(rank), "--nproc", str(nproc), "--port",
               str(port), "--local-devices", str(local_devices), *map(str, args)]
        procs.append(subprocess.Popen(cmd, env={**env, **rank_env(platform, rank, local_devices)},
                                      stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                      start_new_session=True))
      deadline = time.monotonic() + timeout
      while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
          break
        time.sleep(0.1)
    finally:
      for p in procs:
        _kill(p)
    results = []
    for rank, (p, (out, err)) in enumerate(zip(procs, outs)):
      out.seek(0)
      err.seek(0)
      results.append(ChildResult(rank, p.returncode if p.returncode is not None and p.returncode >= 0
                                 else None, out.read(), err.read()))
      out.close()
      err.close()
  return results


def start_worker(ap: argparse.ArgumentParser | None = None) -> argparse.Namespace:
  """In a worker script: parses the launcher's arguments (and `ap`'s own), joins jax.distributed."""
  ap = ap or argparse.ArgumentParser()
  for flag in LAUNCHER_ARGS:
    ap.add_argument(flag, type=int, required=True)
  a = ap.parse_args()
  import jax
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{a.port}", num_processes=a.nproc,
                             process_id=a.rank, initialization_timeout=120)
  return a


def report(result: dict) -> None:
  """In a worker script: prints its one result line."""
  print(RESULT + json.dumps(result), flush=True)


def results(children: list[ChildResult]) -> list[dict]:
  """Every rank's reported dict, in rank order; AssertionError naming each rank that exited non-zero
  or reported nothing, with the tail of its output."""
  out, failed = [], []
  for r in children:
    lines = [l for l in r.stdout.splitlines() if l.startswith(RESULT)]
    if r.returncode != 0 or not lines:
      failed.append(f"rank {r.rank}: returncode {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    else:
      out.append(json.loads(lines[-1][len(RESULT):]))
  if failed:
    raise AssertionError("\n".join(failed))
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--nproc", type=int, default=2)
  ap.add_argument("--local-devices", type=int, default=1)
  ap.add_argument("--timeout", type=float, default=300.0)
  ap.add_argument("script")
  ap.add_argument("args", nargs=argparse.REMAINDER)
  a = ap.parse_args(argv)
  results = launch(a.script, a.nproc, a.local_devices, a.args, timeout=a.timeout)
  ok = True
  for r in results:
    print(f"--- rank {r.rank}: returncode {r.returncode}")
    print(r.stdout, end="")
    if r.returncode != 0:
      ok = False
      print(r.stderr[-4000:], file=sys.stderr)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
