"""Process setup shared by the examples.  Imports no JAX: it must run before JAX is imported."""
from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time

DEVICE_FLAG = "--xla_force_host_platform_device_count"


class OneLineParser(argparse.ArgumentParser):
    """argparse whose refusal of a flag is one line (not the whole usage): `prog: error: ... (see --help)`."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add_process_args(p) -> None:
    g = p.add_argument_group("processes")
    g.add_argument("--num-processes", type=int, default=1, help="jax.distributed: total number of processes")
    g.add_argument("--process-id", type=int, default=0, help="jax.distributed: index of this process")
    g.add_argument("--coordinator", default="127.0.0.1:12355", help="jax.distributed coordinator host:port")
    g.add_argument("--local-devices", type=int, default=None,
                   help="virtual CPU devices per process (default: 8 / num-processes). Ignored if XLA_FLAGS "
                        f"already sets {DEVICE_FLAG}")
    g.add_argument("--spawn", type=int, default=0, metavar="N",
                   help="launch N local processes of this script under jax.distributed and wait for them")
    g.add_argument("--timeout", type=float, default=600.0, help="--spawn: kill the children after this many s")


def setup_env(args) -> None:
    """Give this process its virtual CPU devices, unless XLA_FLAGS already does."""
    n = args.local_devices or max(1, 8 // max(1, args.num_processes))
    flags = os.environ.get("XLA_FLAGS", "")
    if DEVICE_FLAG not in flags:
        os.environ["XLA_FLAGS"] = (flags + f" {DEVICE_FLAG}={n}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if "jax" in sys.modules:
        print("warning: jax was imported before setup_env; the device count may not apply", file=sys.stderr)


def init_distributed(args) -> None:
    if args.num_processes > 1:
        import jax
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes,
                                   process_id=args.process_id)


def example_main(argv, doc: str, configure, **defaults) -> int:
    """The command line every example shares: process flags, --spawn, devices, jax.distributed.

    `defaults` (mesh, layers, experts) go to trainer.add_common_args; `configure(args, trainer)` then
    checks the example's own arguments and runs it. JAX is imported only after the device count is set.
    """
    argv = sys.argv[1:] if argv is None else argv
    p = OneLineParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_process_args(p)
    pre, _ = p.parse_known_args(argv)  # the process flags first: the device count precedes `import jax`
    if pre.spawn:
        return spawn(pre, argv)
    setup_env(pre)
    from . import trainer  # imports jax
    trainer.add_common_args(p, **defaults)
    args = p.parse_args(argv)
    init_distributed(args)
    configure(args, trainer)
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _strip(argv: list[str], flag: str, has_value: bool) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = has_value
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out


def spawn(args, argv: list[str]) -> int:
    """Run N copies of this script (one per process id) and return the first non-zero exit code."""
    n = args.spawn
    argv = _strip(argv, "--spawn", True)
    for f in ("--num-processes", "--process-id", "--coordinator"):
        argv = _strip(argv, f, True)
    coord = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ)  # each child sets its own device count (--local-devices, default 8 / N)
    env["XLA_FLAGS"] = re.sub(rf"{DEVICE_FLAG}=\S*", "", env.get("XLA_FLAGS", "")).strip()
    procs = []
    for i in range(n):
        cmd = [sys.executable, sys.argv[0], *argv, "--num-processes", str(n), "--process-id", str(i),
               "--coordinator", coord]
        if i > 0:  # only process 0 reports
            cmd += ["--quiet"]
        procs.append(subprocess.Popen(cmd, env=env, start_new_session=True))
    deadline = time.monotonic() + args.timeout
    rc = 0
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                print(f"spawn: timeout after {args.timeout:.0f}s, killing children", file=sys.stderr)
                rc = rc or 124
                break
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed:
                rc = failed[0].returncode
                print(f"spawn: a process exited with {rc}, stopping the others", file=sys.stderr)
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()
    return rc or next((p.returncode for p in procs if p.returncode), 0)
