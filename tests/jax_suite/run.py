"""Run JAX's own collective tests against jax.lax and against zipccl_jax swapped in; compare.

    python tests/jax_suite/run.py [--jax-src PATH] [--files a_test.py,...] [--out DIR]

1. Get JAX's test files for the installed jax version (they are never copied into this repository):
   `--jax-src` is a jax git repository (its tag jax-v<version> is used) or a directory holding `tests/`;
   without it, the PyPI sdist (`pip download --no-binary :all: --no-deps jax==<version>`) if it ships
   `tests/` (0.10.2's does not), else `git clone --branch jax-v<version>` from GitHub.
2. Rewrite the working copy so that `lax.NAME` / `jax.lax.NAME` for the swapped collectives read
   `_zs_lax.NAME` (jax_suite_lax.py); jax.lax itself is never patched.
3. Run the files under jax.lax (mode `lax`); the tests that called a swapped collective are the suite.
   Run those again with zipccl_jax: `default` (its default compress), `compressed` (floats compress=True)
   and, for tests that reduce, `raw` (compress=False: the documented summation order).
4. Report per test: outcome per mode, the first error line, and bit mismatches: an assertion whose
   arguments' bits (plugin.py's digests) differ from the jax.lax run's (reductions: from the raw run's).
   "shard_map" tests are those of shard_map_test.py; every other file is "outside".

Writes DIR/results.json and DIR/report.md and prints the summary. Long (tens of minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import jax_suite_lax as shim  # noqa: E402  (the swapped names, the rewritten module's name)

# Files whose tests call the collectives (in jax 0.10.2); multi-process, GPU/TPU-only and Pallas files left out.
FILES = ("shard_map_test.py", "batching_test.py", "pmap_test.py", "api_test.py", "checkify_test.py",
         "custom_api_test.py", "lax_control_flow_test.py", "pjit_test.py", "memories_test.py",
         "roofline_test.py", "shard_alike_test.py", "xla_transform_test.py", "export_test.py",
         "control_deps_test.py")
INSIDE_FILE = "shard_map_test.py"


def jax_version() -> str:
  import jax
  return jax.__version__


class NoJaxTests(RuntimeError):
  """JAX's test files could not be obtained; the message says what was tried and what to pass."""


def check_out_dir(out: str) -> None:
  """The working copy of JAX's tests must stay outside this repository (they are JAX's code)."""
  out, repo = os.path.realpath(out), os.path.realpath(REPO)
  if os.path.commonpath([out, repo]) == repo:
    raise NoJaxTests(f"--out {out} is inside the repository {repo}; JAX's test files are fetched into it "
                     "and must not be stored here: pass a directory outside it (the default is under "
                     f"{tempfile.gettempdir()})")


def fetch_tests(jax_src: str | None, work: str, version: str) -> str:
  """A fresh directory `work/src` holding JAX's `tests/` at `version`; NoJaxTests if none can be had."""
  src = os.path.join(work, "src")
  shutil.rmtree(src, ignore_errors=True)
  os.makedirs(src)
  tag = f"jax-v{version}"
  if jax_src:
    if not os.path.isdir(jax_src):
      raise NoJaxTests(f"--jax-src {jax_src}: no such directory")
    if not _is_git(jax_src):
      if not os.path.isdir(os.path.join(jax_src, "tests")):
        raise NoJaxTests(f"--jax-src {jax_src}: neither a git repository nor a directory holding tests/")
      shutil.copytree(os.path.join(jax_src, "tests"), os.path.join(src, "tests"))
      return src
    return _git_archive(jax_src, tag, src)
  tried = []
  try:
    if _sdist_tests(work, version, src):
      return src
    tried.append(f"the PyPI sdist of jax {version} has no tests/")
  except (subprocess.CalledProcessError, OSError, tarfile.TarError) as e:
    tried.append(f"pip download of the jax {version} sdist failed: {_reason(e)}")
  print(f"{tried[-1]}; cloning {tag} from GitHub", file=sys.stderr)
  clone = os.path.join(work, "jax-git")
  if not os.path.isdir(clone):
    try:
      subprocess.run(["git", "clone", "-q", "--depth", "1", "--branch", tag, "https://github.com/jax-ml/jax",
                      clone], check=True, capture_output=True, text=True)
    except (subprocess.CalledProcessError, OSError) as e:
      tried.append(f"git clone --branch {tag} https://github.com/jax-ml/jax failed: {_reason(e)}")
      raise NoJaxTests("cannot obtain JAX's test files: " + "; ".join(tried) + ". Pass --jax-src PATH (a jax "
                       f"git checkout with the tag {tag}, or a directory holding jax {version}'s tests/).")
  return _git_archive(clone, tag, src)


def _reason(e: Exception) -> str:
  """The last line a failed command printed on stderr, else the exception."""
  err = getattr(e, "stderr", None) or ""
  err = err.decode(errors="replace") if isinstance(err, bytes) else err
  lines = err.strip().splitlines()
  return lines[-1] if lines else str(e)


def _sdist_tests(work: str, version: str, src: str) -> bool:
  """Extracts the jax sdist's tests/ into `src`; False when the sdist ships none."""
  sdist_dir = os.path.join(work, "sdist")
  os.makedirs(sdist_dir, exist_ok=True)
  subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                  "-d", sdist_dir, f"jax=={version}"], check=True, capture_output=True, text=True)
  sdists = glob.glob(os.path.join(sdist_dir, f"jax-{version}.tar.gz"))
  if not sdists:
    return False
  with tarfile.open(sdists[0]) as tf:
    members = [m for m in tf.getmembers() if m.name.startswith(f"jax-{version}/tests/")]
    for m in members:
      m.name = m.name.split("/", 1)[1]
    tf.extractall(src, members=members, filter="data")
  return bool(members)


def _is_git(path: str) -> bool:
  """`path` is the top of a git checkout (not merely a directory inside some other repository)."""
  top = subprocess.run(["git", "-C", path, "rev-parse", "--show-toplevel"], capture_output=True, text=True)
  return top.returncode == 0 and os.path.realpath(top.stdout.strip()) == os.path.realpath(path)


def _git_archive(repo: str, tag: str, dest: str) -> str:
  try:
    archive = subprocess.run(["git", "-C", repo, "archive", "--format=tar", tag, "tests"],
                             capture_output=True, check=True).stdout
  except subprocess.CalledProcessError as e:
    raise NoJaxTests(f"{repo}: git archive {tag} tests failed ({_reason(e)}); the installed jax needs "
                     f"JAX's tests at the tag {tag} (git fetch --tags)") from e
  subprocess.run(["tar", "x", "-C", dest], input=archive, check=True)
  return dest


def rewrite(path: str) -> int:
  """`lax.NAME` / `jax.lax.NAME` -> `_zs_lax.NAME` in code (not in strings or comments); count."""
  import io
  import tokenize
  text = open(path).read()
  toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
  lines = text.splitlines(keepends=True)
  edits = []  # (row, col_start, col_end, name)
  for i, t in enumerate(toks):
    if t.type != tokenize.NAME or t.string not in shim.SWAPPED or i < 2:
      continue
    if toks[i - 1].string != "." or toks[i - 2].string != "lax":
      continue
    start = toks[i - 2].start
    if i >= 4 and toks[i - 3].string == "." and toks[i - 4].string == "jax":
      start = toks[i - 4].start
    if start[0] != t.end[0]:
      continue
    edits.append((start[0], start[1], t.end[1], t.string))
  for row, c0, c1, name in sorted(edits, reverse=True):
    line = lines[row - 1]
    lines[row - 1] = line[:c0] + f"{shim.MODULE_NAME}.{name}" + line[c1:]
  out = "".join(lines)
  future = re.search(r"^from __future__ import [^\n]*\n", out, flags=re.M)
  at = future.end() if future else 0
  out = (out[:at] + f"import {shim.__name__} as {shim.MODULE_NAME}  # zipccl_jax suite: swapped collectives\n"
         + out[at:])
  with open(path, "w") as f:
    f.write(out)
  return len(edits)


def _load(path: str) -> dict:
  with open(path) as f:
    return {r["nodeid"]: r for r in map(json.loads, f)}


def run_mode(mode: str, src: str, files, out_jsonl: str, *, select=None, prefilter=(), reuse=False):
  if reuse and os.path.exists(out_jsonl):
    print(f"[{mode}] reusing {out_jsonl}", file=sys.stderr)
    return _load(out_jsonl)
  if os.path.exists(out_jsonl):
    os.remove(out_jsonl)
  env = dict(os.environ, ZIPCCL_SUITE_MODE=mode, ZIPCCL_SUITE_OUT=out_jsonl,
             PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
             XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                        " --xla_force_host_platform_device_count=8").strip())
  if select is not None:
    sel = out_jsonl + ".select"
    with open(sel, "w") as f:
      f.write("\n".join(select) + "\n")
    env["ZIPCCL_SUITE_SELECT"] = sel
    files = sorted({s.split("::")[0] for s in select})
    if not files:
      return {}
  elif prefilter:
    env["ZIPCCL_SUITE_PREFILTER"] = ",".join(prefilter)
  cmd = [sys.executable, "-m", "pytest", "-q", "-p", "plugin", "-p", "no:cacheprovider",
         "-o", "addopts=", "--rootdir", src] + list(files)
  print(f"[{mode}] {len(select) if select is not None else 'all'} tests in {len(files)} files",
        file=sys.stderr, flush=True)
  proc = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True)
  tail = proc.stdout.strip().splitlines()[-1:] or proc.stderr.strip().splitlines()[-3:]
  print(f"[{mode}] pytest: {' | '.join(tail)}", file=sys.stderr, flush=True)
  return _load(out_jsonl) if os.path.exists(out_jsonl) else {}


def mismatches(ref, ours, raw=None) -> tuple[int, int]:
  """(assertions compared, assertions whose bits differ from jax.lax's, or from raw's for reductions)."""
  a, b = ref.get("digests", []), ours.get("digests", [])
  c = raw.get("digests", []) if raw else None
  n = min(len(a), len(b))
  bad = 0
  for i in range(n):
    if a[i] != b[i] and not (c is not None and i < len(c) and c[i] == b[i]):
      bad += 1
  return n, bad


def summarize(lax_runs, runs, raw_runs) -> dict:
  tests = []
  for nodeid, ref in sorted(lax_runs.items()):
    if not ref.get("calls"):
      continue
    row = {"nodeid": nodeid, "group": "shard_map" if nodeid.split("::")[0].endswith(INSIDE_FILE)
           else "outside", "calls": ref["calls"], "lax": ref["outcome"], "lax_error": ref["error"]}
    reduces = bool(set(ref["calls"]) & set(shim.REDUCTIONS))
    for mode, recs in runs.items():
      r = recs.get(nodeid, {"outcome": "not run", "error": ""})
      compared, bad = mismatches(ref, r, raw_runs.get(nodeid) if reduces else None)
      row[mode] = r["outcome"]
      row[f"{mode}_error"] = r["error"]
      row[f"{mode}_compared"] = compared
      row[f"{mode}_mismatches"] = bad
    tests.append(row)
  summary = {}
  for group in ("shard_map", "outside"):
    g = [t for t in tests if t["group"] == group]
    base = [t for t in g if t["lax"] == "passed"]
    summary[group] = {"tests calling the collectives": len(g), "pass with jax.lax": len(base)}
    for mode in runs:
      summary[group][f"pass with zipccl ({mode})"] = sum(t[mode] == "passed" for t in base)
      summary[group][f"bit mismatches ({mode})"] = sum(t[f"{mode}_mismatches"] for t in g)
      summary[group][f"assertions compared ({mode})"] = sum(t[f"{mode}_compared"] for t in g)
  return {"summary": summary, "tests": tests}


def report_md(result: dict, modes) -> str:
  out = ["# JAX's collective tests with zipccl_jax swapped in", ""]
  for group, s in result["summary"].items():
    out.append(f"## {group}")
    out += [f"- {k}: {v}" for k, v in s.items()]
    out.append("")
  for mode in modes:
    causes = collections.Counter(
        (t["group"], t[f"{mode}_error"]) for t in result["tests"]
        if t["lax"] == "passed" and t[mode] != "passed")
    out += [f"## first error lines ({mode}), tests passing with jax.lax", "",
            "| group | tests | first error line |", "|---|---:|---|"]
    out += [f"| {g} | {n} | `{e}` |" for (g, e), n in causes.most_common()]
    out.append("")
  out += ["## per test", "", "| test | group | lax | " + " | ".join(modes) + " | mismatches |",
          "|---|---|---|" + "---|" * len(modes) + "---:|"]
  for t in result["tests"]:
    bad = sum(t[f"{m}_mismatches"] for m in modes)
    out.append(f"| {t['nodeid']} | {t['group']} | {t['lax']} | " +
               " | ".join(t[m] for m in modes) + f" | {bad} |")
  return "\n".join(out) + "\n"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--jax-src", help="a jax git repository (tag jax-v<version>) or a dir with tests/")
  ap.add_argument("--files", default=",".join(FILES), help="comma-separated test files")
  ap.add_argument("--modes", default="default,compressed", help="zipccl modes to compare")
  ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "zipccl_jax_suite"))
  ap.add_argument("--lax-from", help="reuse this lax.jsonl (an earlier run's jax.lax results)")
  ap.add_argument("--reuse", default="", help="comma-separated modes whose DIR/<mode>.jsonl to reuse")
  args = ap.parse_args(argv)
  version = jax_version()
  try:
    check_out_dir(args.out)
    os.makedirs(args.out, exist_ok=True)
    src = fetch_tests(args.jax_src, args.out, version)
  except NoJaxTests as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  files = [f"tests/{f}" for f in args.files.split(",") if f]
  n_rewritten = {f: rewrite(os.path.join(src, f)) for f in files}
  print(f"jax {version}: rewrote {sum(n_rewritten.values())} call sites in {len(files)} files",
        file=sys.stderr)
  prefilter = [os.path.basename(f) for f in files]  # plugin._mentions_swapped: a static first cut
  reuse = set(args.reuse.split(","))
  if args.lax_from:
    lax_runs = _load(args.lax_from)
  else:
    lax_runs = run_mode("lax", src, files, os.path.join(args.out, "lax.jsonl"), prefilter=prefilter,
                        reuse="lax" in reuse)
  suite = sorted(k for k, r in lax_runs.items() if r.get("calls") and r["outcome"] != "skipped")
  if not suite:  # nothing to compare: a wrong --files, a rewrite that matched nothing, or a broken run
    print(f"error: no test of {files} called a swapped collective under jax.lax ({len(lax_runs)} ran; "
          f"{sum(n_rewritten.values())} call sites rewritten)", file=sys.stderr)
    return 2
  modes = [m for m in args.modes.split(",") if m]
  runs = {m: run_mode(m, src, files, os.path.join(args.out, f"{m}.jsonl"), select=suite,
                      reuse=m in reuse) for m in modes}
  reducing = [k for k in suite if set(lax_runs[k]["calls"]) & set(shim.REDUCTIONS)]
  raw_runs = run_mode("raw", src, files, os.path.join(args.out, "raw.jsonl"), select=reducing,
                      reuse="raw" in reuse)
  result = summarize(lax_runs, runs, raw_runs)
  result.update(jax_version=version, files=files, rewritten=n_rewritten)
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(result, f, indent=1)
  with open(os.path.join(args.out, "report.md"), "w") as f:
    f.write(report_md(result, modes))
  print(json.dumps(result["summary"], indent=1))
  print(f"per-test table: {os.path.join(args.out, 'report.md')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
