"""Private, rate-limited network namespace plus a bounded multi-process launcher.

Used by ``benchmarks/collectives.py`` and ``benchmarks/train_step.py``.

* ``NetNS`` creates a uniquely named namespace (``ip netns add``), brings its loopback up and shapes it with
  ``tc ... tbf``. It is always deleted again: by ``close()``, by the ``with`` block, and by an ``atexit`` hook
  (SIGTERM/SIGHUP are turned into ``SystemExit`` so those run too). Only the namespace's own loopback is used.
* ``Workers`` spawns N processes (optionally inside the namespace, via ``ip netns exec``), each in its own
  session so the whole tree can be killed, with stdout/stderr in log files, and bounds them with a deadline.
* ``ControlDir`` is a tiny file protocol that lets the launcher change the link rate between phases while the
  workers stay alive (JAX start-up and compilation happen once per run, not once per rate).
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

TBF_BURST = "256kb"
TBF_LATENCY = "100ms"


class NetNSError(RuntimeError):
    pass


def _run(cmd: Sequence[str], timeout: float = 20.0) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)


def parse_rates(spec: str) -> list[float | None]:
    """'0.5,1,2.5,10,unshaped' -> [0.5, 1.0, 2.5, 10.0, None] (Gbit/s; None = no shaping)."""
    out: list[float | None] = []
    for tok in spec.split(","):
        tok = tok.strip().lower()
        if not tok:
            continue
        if tok in ("unshaped", "none", "inf"):
            out.append(None)
        else:
            r = float(tok)
            if not r > 0:
                raise ValueError(f"link rate must be > 0 Gbit/s, got {tok!r}")
            out.append(r)
    if not out:
        raise ValueError("no link rates given")
    return out


def rate_label(rate_gbit: float | None) -> str:
    return "unshaped" if rate_gbit is None else f"{rate_gbit:g}Gbit"


_SIGNALS_INSTALLED = False


def _install_signal_exit() -> None:
    """Make SIGTERM/SIGHUP raise SystemExit in the main thread, so finally-blocks and atexit run."""
    global _SIGNALS_INSTALLED
    if _SIGNALS_INSTALLED or threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, _frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, handler)
    _SIGNALS_INSTALLED = True


def _preflight() -> None:
    """Raise NetNSError unless this process can create namespaces and shape links (Linux, root, iproute2)."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        raise NetNSError("network namespaces need Linux")
    if os.geteuid() != 0:
        raise NetNSError(
            "creating a network namespace needs root (ip netns add). Run this benchmark as root, "
            "or pass --no-netns for an unshaped run on the host loopback.")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NetNSError(f"'{tool}' not found on PATH (set up with: bash benchmarks/setup.sh)")


def _tbf(rate_gbit: float) -> list[str]:
    """tc arguments of the token bucket every shaped link uses (rate in Gbit/s)."""
    mbit = max(1, int(round(rate_gbit * 1000)))
    return ["tbf", "rate", f"{mbit}mbit", "burst", TBF_BURST, "latency", TBF_LATENCY]


class NetNS:
    """A private network namespace whose loopback can be rate-limited with tc tbf."""

    def __init__(self, prefix: str = "zccl_bench"):
        _preflight()
        self.name = f"{prefix}_{os.getpid()}_{secrets.token_hex(3)}"
        self._alive = False
        _install_signal_exit()
        r = _run(["ip", "netns", "add", self.name])
        if r.returncode != 0:
            raise NetNSError(f"could not create network namespace {self.name!r}: "
                             f"{(r.stderr or r.stdout).strip()}")
        self._alive = True
        atexit.register(self.close)
        try:
            self._check(["ip", "link", "set", "lo", "up"], "bring loopback up")
        except BaseException:
            self.close()
            raise
        self.rate_gbit: float | None = None

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def _check(self, cmd: Sequence[str], what: str) -> str:
        r = _run(self.exec_prefix() + list(cmd))
        if r.returncode != 0:
            raise NetNSError(f"netns {self.name}: could not {what}: {' '.join(cmd)}: "
                             f"{(r.stderr or r.stdout).strip()}")
        return r.stdout

    def set_rate(self, rate_gbit: float | None) -> None:
        """Shape the namespace's loopback to rate_gbit Gbit/s (None: remove shaping)."""
        if rate_gbit is None:
            qd = _run(self.exec_prefix() + ["tc", "qdisc", "show", "dev", "lo"]).stdout
            if "tbf" in qd:
                self._check(["tc", "qdisc", "del", "dev", "lo", "root"], "remove shaping")
        else:
            self._check(["tc", "qdisc", "replace", "dev", "lo", "root", *_tbf(rate_gbit)],
                        f"shape lo to {rate_gbit:g} Gbit/s")
        self.rate_gbit = rate_gbit

    def qdisc(self) -> str:
        return _run(self.exec_prefix() + ["tc", "qdisc", "show", "dev", "lo"]).stdout.strip()

    def close(self) -> None:
        if not self._alive:
            return
        self._alive = False
        r = _run(["ip", "netns", "del", self.name])
        if r.returncode != 0:
            print(f"warning: could not delete network namespace {self.name}: {r.stderr.strip()}"
                  f" (run: ip netns del {self.name})", file=sys.stderr)
        try:
            atexit.unregister(self.close)
        except Exception:
            pass

    def __enter__(self) -> "NetNS":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Addresses of the fabric's hosts. They exist only inside the namespaces a Fabric creates (each run makes its
# own, so concurrent runs cannot collide), never on the machine's own interfaces.
FABRIC_SUBNET = "10.213.0"


class Fabric:
    """H private namespaces ("hosts") joined by a switch, each host's link rate-limited with tc tbf both ways.

    A switch namespace holds a Linux bridge; host i reaches it through a veth pair (``eth0`` in the host,
    ``p<i>`` on the bridge) and has the address ``FABRIC_SUBNET.<i+1>/24``. Shaping puts a tbf on both ends of
    every pair (the host's egress and the switch's egress towards the host), so each host has a full-duplex
    link of the given rate. Traffic inside a host (a process talking to itself, as XLA:CPU's gloo does between
    the devices of one process) stays on that namespace's own loopback and is never shaped: only traffic
    between hosts crosses the rate-limited link, which one shaped loopback cannot separate (its intra- and
    inter-process flows share addresses). All namespaces are deleted however the run ends.
    """

    def __init__(self, n_hosts: int, prefix: str = "zccl"):
        if not 1 <= n_hosts <= 250:
            raise ValueError(f"n_hosts must be in [1, 250], got {n_hosts}")
        _preflight()
        base = f"{prefix}_{os.getpid()}_{secrets.token_hex(3)}"
        self.switch = f"{base}_sw"
        self.hosts = [f"{base}_h{i}" for i in range(n_hosts)]
        self._made: list[str] = []
        self.rate_gbit: float | None = None
        _install_signal_exit()
        atexit.register(self.close)
        try:
            for name in [self.switch] + self.hosts:
                self._ip(["netns", "add", name], f"create namespace {name}")
                self._made.append(name)
            self._ip(["-n", self.switch, "link", "add", "br0", "type", "bridge"], "create the bridge")
            self._ip(["-n", self.switch, "link", "set", "br0", "up"], "bring the bridge up")
            for i, host in enumerate(self.hosts):
                self._ip(["link", "add", "eth0", "netns", host, "type", "veth", "peer", "name", f"p{i}",
                          "netns", self.switch], f"create the veth pair of host {i}")
                self._ip(["-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up"], f"attach host {i}")
                self._ip(["-n", host, "link", "set", "lo", "up"], f"bring host {i}'s loopback up")
                self._ip(["-n", host, "addr", "add", f"{self.address(i)}/24", "dev", "eth0"], f"address host {i}")
                self._ip(["-n", host, "link", "set", "eth0", "up"], f"bring host {i}'s link up")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _ip(args: Sequence[str], what: str) -> None:
        r = _run(["ip", *args])
        if r.returncode != 0:
            raise NetNSError(f"could not {what}: ip {' '.join(args)}: {(r.stderr or r.stdout).strip()}")

    @staticmethod
    def address(i: int) -> str:
        return f"{FABRIC_SUBNET}.{i + 1}"

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.hosts[i]]

    def _links(self):
        """(namespace, device) of both ends of every host's link."""
        for i, host in enumerate(self.hosts):
            yield host, "eth0"
            yield self.switch, f"p{i}"

    def set_rate(self, rate_gbit: float | None) -> None:
        """Shape every host's link to rate_gbit Gbit/s each way (None: remove shaping)."""
        for ns, dev in self._links():
            if rate_gbit is None:
                if "tbf" in _run(["tc", "-n", ns, "qdisc", "show", "dev", dev]).stdout:
                    self._tc(ns, ["qdisc", "del", "dev", dev, "root"], f"unshape {dev}")
            else:
                self._tc(ns, ["qdisc", "replace", "dev", dev, "root", *_tbf(rate_gbit)], f"shape {dev}")
        self.rate_gbit = rate_gbit

    @staticmethod
    def _tc(ns: str, args: Sequence[str], what: str) -> None:
        r = _run(["tc", "-n", ns, *args])
        if r.returncode != 0:
            raise NetNSError(f"netns {ns}: could not {what}: tc {' '.join(args)}: {(r.stderr or r.stdout).strip()}")

    def qdisc(self) -> str:
        return "\n".join(f"{ns}/{dev}: " + _run(["tc", "-n", ns, "qdisc", "show", "dev", dev]).stdout.strip()
                         for ns, dev in self._links())

    def close(self) -> None:
        while self._made:  # deleting a namespace destroys the veth ends inside it
            name = self._made.pop()
            r = _run(["ip", "netns", "del", name])
            if r.returncode != 0:
                print(f"warning: could not delete network namespace {name}: {r.stderr.strip()}"
                      f" (run: ip netns del {name})", file=sys.stderr)
        try:
            atexit.unregister(self.close)
        except Exception:
            pass

    def __enter__(self) -> "Fabric":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def bind_gloo(hostname: str) -> None:
    """Make this worker's CPU backend run gloo on `hostname` (call after jax.distributed.initialize, before
    the first device is touched).

    jax creates its gloo collectives without a hostname, so gloo binds the address the machine's hostname
    resolves to (127.0.0.1 here), which the other hosts of a Fabric cannot reach. The CPU client factory is
    registered again with the same arguments jax uses (jax._src.xla_bridge.make_cpu_client) plus `hostname`.
    """
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("bind_gloo: call jax.distributed.initialize first")

    def factory():
        coll = _jax.make_gloo_tcp_collectives(distributed_client=client, hostname=hostname)
        return xla_bridge.make_cpu_client(collectives=coll)

    xla_bridge.register_backend_factory("cpu", factory, priority=0, fail_quietly=False)


def free_port() -> int:
    """A free TCP port on the host loopback (only used when no private namespace is used)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# XLA:CPU mallocs each execution's temporary arena (33.7 MB per device for the MoE example's compressed
# step) and frees it afterwards. glibc hands blocks above its mmap threshold (32 MiB at most) back to the
# kernel, so every step page-faults the arena in again: 33k minor faults per step on 4 devices compressed
# vs 11k uncompressed (arena just under 32 MiB) on one configuration, 64k for both on another. That is a
# property of this CPU testbed, not of the collectives (GPU runtimes keep a pooled allocator), so the
# benchmark workers run under tcmalloc, which keeps freed pages: ~0.4k faults per step for both variants.
_TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
             "/usr/local/lib")
ALLOCATORS = ("auto", "tcmalloc", "glibc")
TCMALLOC_INSTALL = "apt-get install -y libtcmalloc-minimal4"


def find_tcmalloc() -> str | None:
    for d in _LIB_DIRS:
        for n in _TCMALLOC_NAMES:
            path = os.path.join(d, n)
            if os.path.exists(path):
                return path
    return None


GLIBC_WARNING = ("workers ran under glibc malloc, not tcmalloc: XLA:CPU's per-execution arenas are page-faulted "
                 "back in on every call, which inflates step times and biases comparisons by arena size")


def resolve_allocator(choice: str, *, measuring: bool = True) -> tuple[str, str | None]:
    """('tcmalloc', path) or ('glibc', None) for --allocator `choice`.

    'tcmalloc' fails if it is missing; so does 'auto' when `measuring` (a shaped run whose figures count):
    glibc would make them depend on arena sizes (see above). Smoke runs (`measuring=False`) fall back to glibc
    with a loud warning; an explicit 'glibc' is honoured (the records say so).
    """
    if choice not in ALLOCATORS:
        raise SystemExit(f"--allocator must be one of {ALLOCATORS}, got {choice!r}")
    path = find_tcmalloc() if choice != "glibc" else None
    if choice == "tcmalloc" and path is None:
        raise SystemExit(f"--allocator tcmalloc: libtcmalloc_minimal.so.4 not found (set up with: "
                         f"bash benchmarks/setup.sh, or {TCMALLOC_INSTALL})")
    if choice == "auto" and path is None:
        if measuring:
            raise SystemExit(f"error: tcmalloc not found. {GLIBC_WARNING}. Set up with: bash benchmarks/setup.sh "
                             f"(or {TCMALLOC_INSTALL}), or pass --allocator glibc to measure anyway (recorded).")
        print(f"{'!' * 100}\nWARNING: {GLIBC_WARNING} ({TCMALLOC_INSTALL})\n{'!' * 100}", file=sys.stderr)
    return ("tcmalloc", path) if path else ("glibc", None)


def worker_env(extra: dict[str, str] | None = None, *, preload: str | None = None) -> dict[str, str]:
    """Environment for one-CPU-device JAX workers: no forced host device count, CPU only, few threads.

    `preload`: a shared library put first in LD_PRELOAD (the allocator, see resolve_allocator).
    """
    env = dict(os.environ)
    if preload:
        env["LD_PRELOAD"] = " ".join(filter(None, [preload, env.get("LD_PRELOAD")]))
    flags = env.get("XLA_FLAGS", "")
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", flags).strip()
    if flags:
        env["XLA_FLAGS"] = flags
    else:
        env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


class WorkerFailed(RuntimeError):
    pass


class Workers:
    """N child processes, each in its own session, with log files and a hard deadline."""

    def __init__(self, argvs: Sequence[Sequence[str]], *, netns: NetNS | Fabric | None, logdir: Path,
                 env: dict[str, str], timeout_s: float, cwd: str | None = None):
        """`netns`: a NetNS runs every worker in it; a Fabric runs worker i in host i."""
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.logdir = Path(logdir)
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        _install_signal_exit()
        atexit.register(self.kill)
        try:
            for i, argv in enumerate(argvs):
                prefix = ([] if netns is None else netns.exec_prefix(i) if isinstance(netns, Fabric)
                          else netns.exec_prefix())
                log = self.logdir / f"worker{i}.log"
                self.logs.append(log)
                with open(log, "wb") as fh:
                    self.procs.append(subprocess.Popen(prefix + list(argv), stdout=fh, stderr=subprocess.STDOUT,
                                                       stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                                       start_new_session=True))
        except BaseException:
            self.kill()
            raise

    def log_tail(self, i: int, n: int = 40) -> str:
        try:
            lines = self.logs[i].read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def check(self) -> None:
        """Raise WorkerFailed if a worker died with an error or the deadline passed."""
        for i, p in enumerate(self.procs):
            rc = p.poll()
            if rc not in (None, 0):
                raise WorkerFailed(f"worker {i} exited with status {rc}; last lines of {self.logs[i]}:\n"
                                   f"{self.log_tail(i)}")
        if time.monotonic() > self.deadline:
            raise WorkerFailed(f"workers still running after the {self.timeout_s:.0f} s timeout; last lines of "
                               f"{self.logs[0]}:\n{self.log_tail(0)}")

    def wait(self) -> None:
        """Wait for all workers to exit cleanly (bounded by the deadline)."""
        while any(p.poll() is None for p in self.procs):
            self.check()
            time.sleep(0.05)
        self.check()

    def kill(self) -> None:
        """Terminate every child's process group (SIGTERM, then SIGKILL). Idempotent."""
        live = [p for p in self.procs if p.poll() is None]
        for p in live:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.monotonic() + 3.0
        for p in live:
            try:
                p.wait(timeout=max(0.05, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                p.wait(timeout=5)
        try:
            atexit.unregister(self.kill)
        except Exception:
            pass

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


class ControlDir:
    """File protocol between a launcher and its workers.

    Launcher: ``go(k, payload)`` starts phase k; ``wait_done(k, n, workers)`` waits for n ``done`` marks;
    ``stop()`` ends the run. Worker: ``wait_go(k)`` returns the payload (or None on stop), ``done(k, rank)``.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def _atomic_write(self, name: str, text: str) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.path / name)

    def go(self, k: int, payload: dict) -> None:
        self._atomic_write(f"go_{k}", json.dumps(payload))

    def stop(self) -> None:
        self._atomic_write("stop", "")

    def wait_done(self, k: int, n: int, workers: Workers, poll_s: float = 0.05) -> None:
        while True:
            workers.check()
            if all((self.path / f"done_{k}_{r}").exists() for r in range(n)):
                return
            time.sleep(poll_s)

    def wait_go(self, k: int, timeout_s: float, poll_s: float = 0.05) -> dict | None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            p = self.path / f"go_{k}"
            if p.exists():
                return json.loads(p.read_text())
            if (self.path / "stop").exists():
                return None
            time.sleep(poll_s)
        raise TimeoutError(f"no go signal for phase {k} within {timeout_s:.0f} s")

    def done(self, k: int, rank: int) -> None:
        self._atomic_write(f"done_{k}_{rank}", "")


def worker_phases(ctl: ControlDir, rank: int, timeout_s: float, barrier, run_phase) -> None:
    """The worker's side of `sweep`: for every phase the launcher starts, `run_phase(go payload)` returns the
    phase's records, which rank 0 writes for the launcher; then a barrier and this rank's done mark. Returns when
    the launcher stops the run."""
    k = 0
    while (go := ctl.wait_go(k, timeout_s=timeout_s)) is not None:
        records = run_phase(go)
        if rank == 0:
            (ctl.path / f"results_{k}.json").write_text(json.dumps(records))
        barrier()
        ctl.done(k, rank)
        k += 1


def measure_loopback_MBps(netns: NetNS | None, nbytes: int = 16 << 20, timeout_s: float = 30.0) -> float | None:
    """TCP throughput over 127.0.0.1 inside the namespace (MB/s), with a small python sender/receiver."""
    code = r"""
import socket, sys, threading, time
n = int(sys.argv[1]); srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
port = srv.getsockname()[1]; got = [0]
def recv():
    c, _ = srv.accept()
    while True:
        b = c.recv(1 << 20)
        if not b: break
        got[0] += len(b)
    c.close()
t = threading.Thread(target=recv); t.start()
s = socket.create_connection(("127.0.0.1", port)); buf = b"\0" * (1 << 20)
t0 = time.perf_counter(); sent = 0
while sent < n:
    s.sendall(buf); sent += len(buf)
s.shutdown(socket.SHUT_WR); t.join(); dt = time.perf_counter() - t0; s.close()
print(got[0] / dt / 1e6)
"""
    cmd = (netns.exec_prefix() if netns is not None else []) + [sys.executable, "-c", code, str(nbytes)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        return float(r.stdout.strip()) if r.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError):
        return None


def measure_fabric_MBps(fabric: Fabric, src: int = 0, dst: int = 1, nbytes: int = 16 << 20,
                        timeout_s: float = 30.0) -> float | None:
    """TCP throughput from host `src` to host `dst` of a Fabric (MB/s): a receiver in `dst`, a sender in `src`."""
    recv = ("import socket, sys\n"
            "s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1); print(s.getsockname()[1], flush=True)\n"
            "c, _ = s.accept()\n"
            "while c.recv(1 << 20): pass\n"
            "c.sendall(b'k')\n")
    send = ("import socket, sys, time\n"
            "n = int(sys.argv[3]); s = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
            "buf = b'\\0' * (1 << 20); t0 = time.perf_counter(); sent = 0\n"
            "while sent < n:\n    s.sendall(buf); sent += len(buf)\n"
            "s.shutdown(socket.SHUT_WR); s.recv(1); print(sent / (time.perf_counter() - t0) / 1e6)\n")
    rx = subprocess.Popen(fabric.exec_prefix(dst) + [sys.executable, "-c", recv, fabric.address(dst)],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        port = rx.stdout.readline().strip()
        r = subprocess.run(fabric.exec_prefix(src) + [sys.executable, "-c", send, fabric.address(dst), port,
                                                      str(nbytes)], capture_output=True, text=True, timeout=timeout_s)
        return float(r.stdout.strip()) if r.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError):
        return None
    finally:
        if rx.poll() is None:
            os.killpg(rx.pid, signal.SIGKILL)
        rx.wait(timeout=5)


def make_tempdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


@contextlib.contextmanager
def run_dir(prefix: str, keep_logs: bool):
    """``with run_dir(prefix, keep) as (tmp, held):`` a log directory, and an ExitStack that tears down what
    the run enters into it (namespaces, then Workers: the workers are killed first) however the run ends.

    A worker's failure ends the run with SystemExit naming the logs, which are kept; after a clean run they are
    deleted unless `keep_logs`.
    """
    tmp = make_tempdir(prefix)
    try:
        with contextlib.ExitStack() as held:
            yield tmp, held
    except WorkerFailed as e:
        raise SystemExit(f"error: {e}\n(worker logs kept in {tmp})") from None
    if not keep_logs:
        shutil.rmtree(tmp, ignore_errors=True)


def open_netns(make):
    """``make()`` (a NetNS or Fabric constructor), its NetNSError turned into SystemExit."""
    try:
        return make()
    except NetNSError as e:
        raise SystemExit(f"error: {e}") from None


# Link probes per phase; the phase's rate is the fastest. A probe is one TCP stream of a few MiB that the
# machine's other work can only slow: it runs while the workers import jax and start up, and on the 2-core 2 x 4
# testbed one probe read 88 MB/s where the link ran as in every other run (107-121 MB/s, the cases' flat
# collectives within 2% of theirs: results/mesh_2x4_all_ops_avx2_slot_rows_whole_once_repeat5.json)
PROBES = 3


def best_probe(probe, n: int = PROBES) -> tuple[float | None, list]:
    """(the fastest of `n` calls of `probe()` (MB/s, or None when none measured), every reading, in order)."""
    samples = [probe() for _ in range(n)]
    measured = [s for s in samples if s]
    return (max(measured) if measured else None), samples


def sweep(ctl: ControlDir, workers: Workers, n_workers: int, rates, set_rate, probe, probe_label: str,
          finish) -> list[dict]:
    """The launcher's side of a run, one phase per rate: shape the link (`set_rate`, None when unshaped),
    measure it (`best_probe(probe)`: `probe()` gives MB/s or None), start phase k, wait for the `n_workers`
    workers, then `finish(records)` completes the records rank 0 wrote. Stops the workers at the end and returns
    every phase's records. The workers see the rate as ``link_MBps`` and the readings as ``link_MBps_probes``."""
    records: list[dict] = []
    for k, rate in enumerate(rates):
        if set_rate is not None:
            set_rate(rate)
        mbps, samples = best_probe(probe)
        print(f"phase {k}: {rate_label(rate)}" + (
            f", {probe_label} {mbps:.0f} MB/s (best of {'/'.join(f'{s:.0f}' if s else '-' for s in samples)})"
            if mbps else ""), flush=True)
        ctl.go(k, {"rate_gbit": rate, "link_MBps": mbps, "link_MBps_probes": samples})
        ctl.wait_done(k, n_workers, workers)
        records += finish(json.loads((ctl.path / f"results_{k}.json").read_text()))
    ctl.stop()
    workers.wait()
    return records
