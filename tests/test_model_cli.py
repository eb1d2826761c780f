"""The command line of `python -m zipccl_jax.model` (zipccl_jax/model.py, zipccl_jax/strategy/cli.py): one
line `error: ...` and exit status 2 for every bad flag, the verdict line, a host's shared link, and where
the codec's rates come from."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from zipccl_jax import model as zm
from zipccl_jax.strategy import cli as model_cli
from zipccl_jax.strategy.codec_cost import DEFAULT_CODEC, DEFAULT_CODEC_SOURCE
from zipccl_jax.strategy.links import LinkModel

GBIT = 1e9 / 8
KEEPS = ["--hosts", "8", "--per-host", "8", "--intra", "450GB/s", "--inter", "400Gbit/s",
         "--workload", "fsdp", "--bytes", "256MiB"]  # auto 0.817x: zipccl's reductions lose to the ring
COMPRESSES = ["--hosts", "8", "--inter", "25Gbit/s", "--workload", "moe_dispatch", "--bytes", "64MiB"]

BAD = {
    "codec zero": ["--codec", "0,0"],
    "codec negative": ["--codec=-5,10"],
    "codec three": ["--codec", "1,2,3"],
    "codec word": ["--codec", "abc"],
    "codec inf": ["--codec", "inf,1"],
    "codec uncoded dtype": ["--codec", "1,2", "--dtype", "int8"],
    "scales word": ["--scales", "a"],
    "scales zero": ["--scales", "0"],
    "scales one": ["--scales", "1,8"],
    "inter latency": ["--inter-latency-us", "-1"],
    "intra latency": ["--per-host", "2", "--intra", "450GB/s", "--intra-latency-us", "-1"],
    "intra latency nan": ["--intra-latency-us", "nan"],
    "compute": ["--compute-ms", "-3"],
    "layers": ["--layers", "0"],
    "layers word": ["--layers", "two"],
    "hosts": ["--hosts", "0"],
    "one device": ["--hosts", "1"],
    "per host": ["--per-host", "0"],
    "bytes negative": ["--bytes", "-1"],
    "bytes word": ["--bytes", "abc"],
    "bytes zero": ["--bytes", "0.1"],
    "bytes huge": ["--bytes", "1e400"],
    "inter zero": ["--inter", "0Gbit/s"],
    "inter negative": ["--inter", "-5Gbit/s"],
    "inter huge": ["--inter", "1e400Gbit/s"],
    "intra zero": ["--intra", "0GB/s"],  # checked even with one device per host
    "dtype": ["--dtype", "float99"],
    "device": ["--device", "fpga"],
    "shared link": ["--shared-link", "rack"],
    "shared all over two levels": ["--per-host", "2", "--intra", "450GB/s", "--shared-link", "all"],
    "unknown flag": ["--hots", "4"],
    "workload": ["--workload", "nope"],
    "workload file": ["--workload", "/nonexistent/w.json"],
    "profile file": ["--profile", "/nonexistent/p.json"],
}


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"links": 5}', '{"links": {"x": {"*": {"latency_s": 1}}}}'],
                         ids=["not json", "a list", "links a number", "a link short"])
def test_a_profile_that_is_not_one_is_a_one_line_error_naming_it(tmp_path, capsys, text):
  path = tmp_path / "p.json"
  path.write_text(text)
  assert f"--profile {path}: " in _one_line_error(capsys, ["--profile", str(path)])


def _one_line_error(capsys, argv) -> str:
  rc = zm.main(argv)
  cap = capsys.readouterr()
  lines = cap.err.strip().splitlines()
  assert rc == 2, (argv, cap)
  assert len(lines) == 1 and lines[0].startswith("error: "), (argv, cap.err)
  assert "Traceback" not in cap.err and cap.out == "", (argv, cap)
  return lines[0]


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_flag_is_one_line(capsys, name):
  _one_line_error(capsys, BAD[name])


def test_output_into_a_missing_folder_is_refused_before_computing(tmp_path, capsys, monkeypatch):
  def boom(*a, **k):
    raise AssertionError("predicted before checking the output paths")
  monkeypatch.setattr(zm, "predict_step", boom)
  for flag in ("--json", "--png"):
    line = _one_line_error(capsys, ["--hosts", "2", flag, str(tmp_path / "missing" / "out")])
    assert flag in line and "missing" in line
    assert flag in _one_line_error(capsys, ["--hosts", "2", flag, str(tmp_path)])  # a folder


def test_python_dash_m_error_has_no_traceback(tmp_path):
  where = str(pathlib.Path(zm.__file__).parents[1])  # the package this suite tests
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join(filter(None, [where, os.environ.get("PYTHONPATH")])))
  p = subprocess.run([sys.executable, "-m", "zipccl_jax.model", "--codec", "0,0"], cwd=tmp_path,
                     capture_output=True, text=True, timeout=120, env=env)
  assert p.returncode == 2 and p.stdout == ""
  assert p.stderr.strip().splitlines() == [p.stderr.strip()] and p.stderr.startswith("error: ")


def test_help_still_exits_zero(capsys):
  with pytest.raises(SystemExit) as e:
    zm.main(["--help"])
  assert e.value.code == 0
  out = " ".join(capsys.readouterr().out.split())
  assert "450GB/s" in out and "900GB/s" not in out and "one direction" in out


# --------------------------------------------------------------------------- the verdict


@pytest.mark.parametrize("argv,keep", [(KEEPS, True), (COMPRESSES, False)])
def test_verdict_line_and_json(tmp_path, capsys, argv, keep):
  out = tmp_path / "out.json"
  assert zm.main(argv + ["--json", str(out)]) == 0
  text = capsys.readouterr().out.rstrip().splitlines()
  res = json.loads(out.read_text())
  v = res["verdict"]
  step = {s["name"]: s["time_s"] for s in res["step"]["variants"]}
  assert text[-1] == v["line"] and v["keep_lax"] is keep
  assert v["speedup"] == pytest.approx(step["raw"] / step["auto"])
  assert v["saved_s"] == pytest.approx(step["raw"] - step["auto"])
  if keep:  # the FSDP step that lost 0.817x before `auto` could run jax.lax's ring (issue 35)
    assert v["line"] == "verdict: keep jax.lax (auto 1.000x of jax.lax: it runs raw)"
  else:
    assert v["speedup"] > 1.01
    assert v["line"] == f"verdict: compress: {v['speedup']:.2f}x, {v['saved_s'] * 1e3:.3g} ms saved per step"


def test_verdict_words_for_a_slower_auto():
  res = {"step": {"variants": [{"name": "raw", "time_s": 1e-3}, {"name": "auto", "time_s": 1.25e-3}]}}
  v = zm.verdict(res)
  assert v["keep_lax"] and v["saved_s"] == pytest.approx(-0.25e-3)
  assert v["line"].startswith("verdict: keep jax.lax (auto 0.800x of jax.lax: ")
  assert v["line"].endswith("ms slower per step)")


def test_verdict_counts_layers_and_compute(capsys):
  """Per step: --layers multiplies the calls; --compute-ms dilutes the speedup, not the time saved."""
  one, four = zm.verdict(_run(COMPRESSES)), zm.verdict(_run(COMPRESSES + ["--layers", "4"]))
  assert four["saved_s"] == pytest.approx(4 * one["saved_s"])
  slow = zm.verdict(_run(COMPRESSES + ["--compute-ms", "1000"]))
  assert slow["saved_s"] == pytest.approx(one["saved_s"]) and 1 < slow["speedup"] < one["speedup"]


def test_verdict_thresholds():
  def res(raw, auto):
    return {"step": {"variants": [{"name": "raw", "time_s": raw}, {"name": "auto", "time_s": auto}]}}
  assert zm.verdict(res(1.0, 1.0))["line"] == "verdict: keep jax.lax (auto 1.000x of jax.lax: it runs raw)"
  under = zm.verdict(res(1.0, 0.995))
  assert under["keep_lax"] and "saved per step, 1% or less" in under["line"]
  over = zm.verdict(res(1.0, 0.98))
  assert not over["keep_lax"] and over["line"] == "verdict: compress: 1.02x, 20 ms saved per step"


def _run(argv):
  parse = model_cli._parser().parse_args
  a = parse(argv)
  top = model_cli.topology_from_args(a)
  calls = zm.workload(a.workload, zm.parse_bytes(a.bytes), top.devices, layers=a.layers)
  return zm.predict_step(top, calls, compute_s=a.compute_ms * 1e-3, crossovers=False)


# --------------------------------------------------------------------------- shared links


def test_shared_link_per_host_divides_by_the_devices_of_a_host():
  top = zm.Topology(4, 8, LinkModel(1e-5, 400 * GBIT), LinkModel(5e-6, 450e9), shared_link="host")
  links = top.profile().links
  assert links["host"]["*"].bandwidth_Bps == pytest.approx(400 * GBIT / 8)
  assert links["local"]["*"].bandwidth_Bps == 450e9  # the fast level is not shared
  assert top.describe()["inter_Gbit_s"] == pytest.approx(50)
  # the flat all_gather's ring leaves a host through its one link: min(L x inter / L, intra)
  assert links["host,local"]["all_gather"].bandwidth_Bps == pytest.approx(400 * GBIT)
  one = zm.Topology(4, 1, LinkModel(1e-5, GBIT), platform="cpu", shared_link="host")
  assert one.profile().links["host"]["*"].bandwidth_Bps == GBIT  # one device per host: its own


def test_shared_link_all_is_one_link_for_every_device():
  """The flat CPU testbed (benchmarks/collectives.py): N one-device processes in one network namespace
  behind one tbf-shaped loopback; True is "all", as before."""
  for share in (True, "all"):
    top = zm.Topology(4, 1, LinkModel(1e-4, GBIT), platform="cpu", shared_link=share)
    assert top.shared_link == "all" and top.profile().links["host"]["*"].bandwidth_Bps == GBIT / 4
  with pytest.raises(ValueError, match="per_host 1 only"):
    zm.Topology(2, 4, LinkModel(1e-4, GBIT), LinkModel(5e-6, 1e9), shared_link="all")
  assert zm.Topology(4, 1, LinkModel(1e-4, GBIT), shared_link=False).shared_link is False


def test_shared_link_flag(capsys):
  assert _run(["--hosts", "4", "--inter", "1Gbit/s", "--shared-link", "--device", "cpu"])[
      "topology"]["inter_Gbit_s"] == pytest.approx(0.25)
  host = ["--hosts", "2", "--per-host", "4", "--intra", "450GB/s", "--inter", "4Gbit/s", "--shared-link",
          "host"]
  assert _run(host)["topology"]["inter_Gbit_s"] == pytest.approx(1)
  assert zm.main(host + ["--bytes", "1MiB"]) == 0
  assert "inter 1 Gbit/s per device, intra 450 GB/s (each host's link shared by its 4 devices)" in (
      capsys.readouterr().out)


# --------------------------------------------------------------------------- where the codec comes from


def test_codec_provenance_per_dtype():
  """bfloat16 measured on the H200; float16, float32 and float8 scaled from it; one table in strategy/codec_cost.py."""
  assert set(DEFAULT_CODEC_SOURCE) == set(DEFAULT_CODEC)
  for plat, tab in DEFAULT_CODEC.items():
    assert set(DEFAULT_CODEC_SOURCE[plat]) >= set(tab)
  gpu = DEFAULT_CODEC_SOURCE["gpu"]
  assert gpu["bfloat16"].startswith("measured") and "H200" in gpu["bfloat16"]
  assert all(gpu[d].startswith("scaled: bfloat16's measurement x") for d in gpu if d != "bfloat16")
  assert all(s.startswith("assumed") for s in DEFAULT_CODEC_SOURCE["cpu"].values())


@pytest.mark.parametrize("dtype,start", [("bfloat16", "measured"), ("float16", "scaled"),
                                         ("float32", "scaled"), ("float8_e5m2", "scaled")])
def test_codec_labels_in_text_and_json(tmp_path, capsys, dtype, start):
  out = tmp_path / "out.json"
  assert zm.main(["--hosts", "2", "--bytes", "1MiB", "--device", "gpu", "--dtype", dtype,
                  "--json", str(out)]) == 0
  src = json.loads(out.read_text())["assumptions"]["codec"][dtype]["source"]
  assert src.startswith(start) and "the H200's rates, whatever the GPU" in src
  assert src == DEFAULT_CODEC_SOURCE["gpu"][dtype] + " (strategy.codec_cost.DEFAULT_CODEC; the H200's rates, whatever the GPU)"
  text = capsys.readouterr().out
  assert f"codec {dtype}: " in text and f"[{src}]" in text


def test_codec_labels_of_given_rates_and_tables(tmp_path):
  def src(*argv):
    res = _run(["--hosts", "2", "--bytes", "1MiB"] + list(argv))
    return res["assumptions"]["codec"]["bfloat16"]["source"]
  assert src("--codec", "11,7") == "given (--codec)"
  assert src("--device", "cpu") == "assumed: documented default for cpu (strategy.codec_cost.DEFAULT_CODEC)"
  assert src("--device", "cpu", "--codec", "gpu").startswith("given (--codec gpu): measured")
