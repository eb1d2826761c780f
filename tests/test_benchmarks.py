"""Smoke tests of the benchmark harness (benchmarks/): tiny sizes, no shaping, no timing asserts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))

import _hlo  # noqa: E402
import _netns  # noqa: E402

REQUIRED = ("collective", "payload", "dtype", "rate_gbit", "raw_s", "compressed_s", "auto_s", "wire_bytes_raw",
            "wire_bytes_compressed")

# A compiled-HLO excerpt (jax 0.10, XLA:CPU): a 200-byte all-to-all and a 4-byte all-reduce always run, and a
# conditional whose second branch is a 1024-byte all-to-all fallback.
HLO_WITH_FALLBACK = """\
HloModule jit_body, is_scheduled=true, entry_computation_layout={(f32[256]{0})->f32[256]{0}}, num_partitions=2

%region_0.0 (a.0: s32[], b.1: s32[]) -> s32[] {
  %a.0 = s32[] parameter(0)
  %b.1 = s32[] parameter(1)
  ROOT %add.0 = s32[] add(%a.0, %b.1)
}

%region_1.0_spmd (param.4: (f32[256])) -> (f32[256]) {
  %param.4 = (f32[256]{0}) parameter(0)
  %get-tuple-element.12 = f32[256]{0} get-tuple-element(%param.4), index=0
  ROOT %tuple.13 = (f32[256]{0}) tuple(%get-tuple-element.12)
}

%wrapped_slice_computation (param_0.38: f32[256]) -> f32[128] {
  %param_0.38 = f32[256]{0} parameter(0)
  ROOT %slice.18 = f32[128]{0} slice(%param_0.38), slice={[0:128]}
}

%region_2.0_spmd (param.5: (f32[256])) -> (f32[256]) {
  %param.5 = (f32[256]{0}) parameter(0)
  %get-tuple-element.13 = f32[256]{0} get-tuple-element(%param.5), index=0
  %wrapped_slice.1 = f32[128]{0} fusion(%get-tuple-element.13), kind=kLoop, calls=%wrapped_slice_computation
  %wrapped_slice = f32[128]{0} fusion(%get-tuple-element.13), kind=kLoop, calls=%wrapped_slice_computation
  %all-to-all = (f32[128]{0}, f32[128]{0}) all-to-all(%wrapped_slice, %wrapped_slice.1), channel_id=1, replica_groups={{0,1}}
  %get-tuple-element.8 = f32[128]{0} get-tuple-element(%all-to-all), index=0
  %get-tuple-element.9 = f32[128]{0} get-tuple-element(%all-to-all), index=1
  %concatenate = f32[256]{0} concatenate(%get-tuple-element.8, %get-tuple-element.9), dimensions={0}
  ROOT %tuple.14 = (f32[256]{0}) tuple(%concatenate)
}

ENTRY %main.0_spmd (param: f32[256]) -> f32[256] {
  %param = f32[256]{0} parameter(0), sharding={devices=[2]<=[2]}
  %slice.a = u8[1,100]{1,0} slice(%param), slice={[0:1], [0:100]}
  %slice.b = u8[1,100]{1,0} slice(%param), slice={[1:2], [0:100]}
  %all-to-all.1 = (u8[1,100]{1,0}, u8[1,100]{1,0}) all-to-all(%slice.a, %slice.b), channel_id=2, replica_groups={{0,1}}
  %flag = s32[] constant(0)
  %all-reduce = s32[] all-reduce(%flag), channel_id=3, replica_groups={{0,1}}, to_apply=%region_0.0
  %pred = pred[] constant(false)
  %tuple.3 = (f32[256]{0}) tuple(%param)
  %conditional = (f32[256]{0}) conditional(%pred, %tuple.3, %tuple.3), true_computation=%region_2.0_spmd, false_computation=%region_1.0_spmd
  ROOT %get-tuple-element.20 = f32[256]{0} get-tuple-element(%conditional), index=0
}
"""


def test_hlo_wire_bytes_fast_path_and_fallback():
    wb = _hlo.wire_bytes(HLO_WITH_FALLBACK)
    assert wb["fast"] == 200 + 4
    assert wb["worst"] == 200 + 4 + 1024
    assert sorted(op["bytes"] for op in wb["ops"]) == [4, 200, 1024]


def test_hlo_shape_bytes():
    assert _hlo.shape_bytes("bf16[8,1280,256]{2,1,0}") == 8 * 1280 * 256 * 2
    assert _hlo.shape_bytes("(u8[2,10]{1,0}, s32[])") == 24
    assert _hlo.shape_bytes("token[]") == 0


def test_parse_rates():
    assert _netns.parse_rates("0.5,1,2.5,10,unshaped") == [0.5, 1.0, 2.5, 10.0, None]
    with pytest.raises(ValueError):
        _netns.parse_rates("0")
    with pytest.raises(ValueError):
        _netns.parse_rates(",")


def test_worker_env_drops_forced_device_count(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_dump_to=/nowhere")
    env = _netns.worker_env()
    assert "device_count" not in env["XLA_FLAGS"]
    assert "--xla_dump_to=/nowhere" in env["XLA_FLAGS"]
    assert env["JAX_PLATFORMS"] == "cpu"


def test_netns_needs_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(_netns.NetNSError, match="needs root"):
        _netns.NetNS()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="network namespaces need root")
def test_netns_shapes_and_is_deleted():
    listed = lambda: subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout  # noqa: E731
    with _netns.NetNS(prefix="zccl_test") as ns:
        assert ns.name in listed()
        ns.set_rate(0.5)
        assert "tbf" in ns.qdisc() and "500Mbit" in ns.qdisc()
        ns.set_rate(None)
        assert "tbf" not in ns.qdisc()
    assert ns.name not in listed()


def _run_bench(tmp_path: Path, *extra: str) -> list[dict]:
    out = tmp_path / "res.json"
    cmd = [sys.executable, str(BENCH / "collectives.py"), "--no-netns", "--rates", "unshaped", "--nproc", "2",
           "--max-elems", "16384", "--reps", "1", "--warmup", "1", "--link-probe-mb", "0", "--timeout", "240",
           "--json", str(out), "--plot", str(tmp_path / "res.png"), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "res.png").stat().st_size > 0
    return json.loads(out.read_text())


def test_collectives_benchmark_smoke(tmp_path):
    sys.path.insert(0, str(BENCH))
    import collectives as bench

    records = _run_bench(tmp_path)
    assert [(r["collective"], r["payload"]) for r in records] == [(c[0], c[1]) for c in bench.CASES]
    for r in records:
        assert all(k in r for k in REQUIRED), r.keys()
        assert r["rate_gbit"] is None and r["n_processes"] == 2
        assert r["raw_s"] > 0 and r["raw_bits_s"] > 0
        assert r["compressed_s"] is not None and r["compressed_s"] > 0, r["errors"]
        assert r["codec_s"] is not None and r["codec_s"] > 0, r["errors"]
        n = 1
        for d in r["shape_per_rank"]:
            n *= d
        assert r["wire_bytes_raw"] == n * (2 if r["dtype"] == "bfloat16" else 4)
        assert r["wire_bytes_compressed"] is not None and r["wire_bytes_compressed"] > 0
        if r["collective"] != "psum_scatter":  # data movement: exact
            assert r["bit_identical"] is True
        if r["dtype"] == "bfloat16":  # Gaussian BF16 must cross the wire smaller than raw
            assert r["wire_bytes_compressed"] < r["wire_bytes_raw"], r
