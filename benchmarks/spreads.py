#!/usr/bin/env python
"""The spreads behind the README's ratios, recomputed from stored results (no new run, no network).

    python benchmarks/spreads.py benchmarks/results/collectives.json      # flat runs of collectives.py
    python benchmarks/spreads.py benchmarks/results/train_step_4p.json    # train_step.py runs

collectives.py: per record, compressed, calibrated and auto time over the best raw path (the raw variant with the
lowest median), as a ratio of medians with [p25-p75] of the per-repetition ratios (each repetition's time is its
slowest rank's; the variants of a repetition ran back to back). train_step.py: per rate, uncompressed over
compressed step time, with [p25-p75] of the per-round ratios (rounds alternate the variants' order). Both use
`_stats`, as the benchmarks do.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _netns  # noqa: E402
import _stats  # noqa: E402

RAW_VARIANTS = ("raw", "raw_bits", "uncompressed")


def _fmt(pr: dict) -> str:
    return f"{pr['ratio']:.3f} [{pr['ratio_p25']:.3f}-{pr['ratio_p75']:.3f}]"


def collectives_rows(records: list[dict]) -> list[str]:
    rows = []
    for r in records:
        reps = {name: [max(col) for col in zip(*ranks)] for name, ranks in r["rank_times_s"].items()}
        best = min((v for v in RAW_VARIANTS if v in reps), key=lambda v: statistics.median(reps[v]))
        cells = [f"{v} {_fmt(_stats.paired_ratio(reps[v], reps[best]))}"
                 for v in ("compressed", "calibrated", "auto") if v in reps]
        rows.append(f"{_netns.rate_label(r['rate_gbit']):>9} {r['collective'] + ':' + r['payload']:<34} "
                    f"over {best:<12} " + "  ".join(cells))
    return rows


def _round_medians(run: dict) -> list[float]:
    """Per round, the median step time after the untimed first step (train_step.py's `median_step_s`)."""
    if "round_step_s" in run:
        return run["round_step_s"]
    return [statistics.median(steps[1:]) for steps in run["run_step_times_s"]]


def train_step_rows(res: dict) -> list[str]:
    rows = []
    for rate in dict.fromkeys(r["rate_gbit"] for r in res["runs"]):
        by = {r["variant"]: _round_medians(r) for r in res["runs"] if r["rate_gbit"] == rate}
        if "compressed" in by and "uncompressed" in by:
            pr = _stats.paired_ratio(by["uncompressed"], by["compressed"])
            rows.append(f"{_netns.rate_label(rate):>9} uncompressed / compressed {_fmt(pr)} "
                        f"({len(by['compressed'])} rounds)")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", help="a JSON file written by collectives.py (flat) or train_step.py")
    data = json.loads(Path(p.parse_args(argv).results).read_text())
    print("\n".join(train_step_rows(data) if isinstance(data, dict) else collectives_rows(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
