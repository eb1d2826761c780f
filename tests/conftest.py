"""Shared pytest setup: 8 virtual CPU devices for the in-process collective tests.

XLA reads XLA_FLAGS when its CPU client is created, so the flag must be set
before anything imports jax; conftest.py is imported first. A device count the
caller already put in XLA_FLAGS wins. Suites that spawn their own processes
(tests/mp_launch.py, the examples, the benchmarks) set or strip the flag for
their children themselves.
"""

import os

_DEVICE_FLAG = "--xla_force_host_platform_device_count"
_flags = os.environ.get("XLA_FLAGS", "")
if _DEVICE_FLAG not in _flags:
  os.environ["XLA_FLAGS"] = f"{_flags} {_DEVICE_FLAG}=8".strip()
