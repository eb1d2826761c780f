"""What compression bought in a training run: the same steps again uncompressed, compared bit for bit.

After the compressed run, `compare` trains the same steps twice more from the same seed: with
``--no-compress`` (zipccl_jax with ``compress=False``: raw bytes, the same fixed-order float32 reductions)
and with ``--backend lax`` (plain ``jax.lax``). It prints whether the losses and parameters are
bit-identical to each, the bytes on the wire against raw, and the time per step against both. On CPU it
says why the codec costs more there than it saves.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

# The measured speedup on a slow link, quoted on CPU (benchmarks/README.md, "Training step").
SLOW_LINK_FIGURE = "1.27x per step at 1 Gbit/s between 4 processes (benchmarks/README.md, Training step)"


def wanted(args, backend: str, compress) -> bool:
    """Compare by default in a single-process compressed run that prints its summary (not under --quiet)."""
    return (args.compare and not args.quiet and jax.process_count() == 1 and backend == "zipccl"
            and compress is not False)


def compare(result: dict, rerun) -> dict:
    """`rerun(compress=..., backend=...)` trains the same steps again (quietly) and returns its result."""
    raw = rerun(compress="off", backend="zipccl")
    lax = rerun(compress="off", backend="lax")
    out = {"no_compress": _against(result, raw), "jax_lax": _against(result, lax)}
    print_comparison(result, out, platform=jax.devices()[0].platform)
    return out


def _against(r: dict, base: dict) -> dict:
    diff = np.abs(np.asarray(r["losses"], np.float64) - np.asarray(base["losses"], np.float64))
    return {"losses_bit_identical": r["loss_bits"] == base["loss_bits"],
            "params_bit_identical": r["params_sha256"] == base["params_sha256"],
            "max_loss_diff": float(diff.max()) if diff.size else 0.0,
            "step_time_s": base["step_time_s"],
            "raw_bytes": base["raw_bytes"]}


def _same(c: dict) -> str:
    if c["losses_bit_identical"] and c["params_bit_identical"]:
        return "yes (every loss and the parameters' sha256)"
    what = "losses and parameters" if not c["losses_bit_identical"] else "parameters"
    return f"no: {what} differ (losses by up to {c['max_loss_diff']:.3g})"


def print_comparison(r: dict, c: dict, *, platform: str) -> None:
    raw, wire = r["raw_bytes"], r["wire_bytes"]
    t, t_raw, t_lax = r["step_time_s"], c["no_compress"]["step_time_s"], c["jax_lax"]["step_time_s"]
    n = len(r["losses"])
    print(f"\nthe same {n} steps again, uncompressed:")
    print(f"  bit-identical to --no-compress (zipccl_jax, compress=False): {_same(c['no_compress'])}")
    lax = _same(c["jax_lax"])
    if not c["jax_lax"]["losses_bit_identical"]:
        lax += ("; the gradients' psum_scatter sums in one fixed float32 order, jax.lax's in XLA's (the "
                "all_to_all and all_gather move the same bits as jax.lax)")
    print(f"  bit-identical to jax.lax (--backend lax): {lax}")
    saved = 100 * (1 - wire / raw) if raw else 0.0
    print(f"  bytes on the wire: {wire / 1e6:.3f} MB against {raw / 1e6:.3f} MB raw "
          f"({raw / wire if wire else math.nan:.3f}x fewer, {saved:.1f}% saved)")
    print(f"  time per step: {t * 1e3:.1f} ms compressed, {t_raw * 1e3:.1f} ms with --no-compress, "
          f"{t_lax * 1e3:.1f} ms with jax.lax (compressed / --no-compress: {t / t_raw:.2f})")
    if platform == "cpu":
        print("  on CPU the devices share this machine's cores and their link is a memory copy at several "
              "GB/s, so coding costs more time than the smaller copy saves; compression pays where the link "
              f"is the bottleneck: {SLOW_LINK_FIGURE}")


def rerun_args(args, **overrides):
    """`args` for a quiet rerun: no output files, no trace, no comparison of its own."""
    new = dataclasses.replace(args) if dataclasses.is_dataclass(args) else type(args)(**vars(args))
    for k, v in dict(quiet=True, json=None, profile=None, compare=False, calibrate_steps=0, **overrides).items():
        setattr(new, k, v)
    return new
