#!/usr/bin/env bash
# Sets up everything the benchmarks depend on, on a Debian/Ubuntu machine, as root, from the repository root
# inside the venv the benchmarks will run in:
#   python3 -m venv .venv && . .venv/bin/activate && bash benchmarks/setup.sh
# - libtcmalloc-minimal4: the workers' allocator (benchmarks/README.md: glibc page-faults XLA:CPU's per-call
#   arenas back in; shaped runs refuse to measure without tcmalloc unless --allocator glibc is passed);
# - iproute2: `ip netns`, veth, bridge and `tc ... tbf`, the rate-limited links (_netns.py);
# - the `bench` extra: this package plus the peer codecs, matplotlib and the training example's deps.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then echo "benchmarks/setup.sh: run as root (apt-get; the benchmarks need root too)" >&2; exit 1; fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 iproute2
python3 -m pip install -q '.[bench]'
python3 - <<'PY'
import sys
sys.path.insert(0, "benchmarks")
import _netns
assert _netns.find_tcmalloc(), "libtcmalloc_minimal.so.4 not found after apt-get install"
_netns._preflight()  # root, ip, tc
print("benchmarks ready: tcmalloc at", _netns.find_tcmalloc())
PY
